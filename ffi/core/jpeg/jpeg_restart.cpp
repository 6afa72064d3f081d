// Restart segments of a baseline JPEG: finding them and cutting a part out (see jpeg_restart.h).
#include "jpeg_restart.h"

#include <algorithm>
#include <cstring>
#include <string>

namespace tbljax {

namespace {

constexpr uint8_t kDht = 0xC4, kRst0 = 0xD0, kRst7 = 0xD7, kEoi = 0xD9, kSos = 0xDA;

bool IsRestart(uint8_t marker) { return marker >= kRst0 && marker <= kRst7; }

}  // namespace

bool FindJpegScan(const uint8_t* p, size_t n, JpegScanLayout* layout) {
  if (n < 4 || p[0] != 0xFF || p[1] != 0xD8) return false;
  size_t pos = 2;
  bool have_sof = false;
  while (pos < n && p[pos] == 0xFF) {
    while (pos < n && p[pos] == 0xFF) ++pos;  // fill bytes may precede a marker
    if (pos + 3 > n) return false;
    const uint8_t marker = p[pos];
    const size_t length_at = pos + 1, length = size_t{p[pos + 1]} << 8 | p[pos + 2];
    // Markers without a length (TEM, RSTn, SOI, EOI) have no place in a header.
    if (marker == 0x01 || (marker >= kRst0 && marker <= kEoi) || marker == 0x00) return false;
    if (length < 2 || length_at + length > n) return false;
    if (marker == 0xC0 || marker == 0xC1) {  // baseline or extended sequential, Huffman
      if (length < 8) return false;
      layout->sof = length_at;
      have_sof = true;
    } else if (marker >= 0xC2 && marker <= 0xCF && marker != 0xC4 && marker != 0xC8 &&
               marker != 0xCC) {
      return false;  // progressive, lossless, hierarchical or arithmetic: not ours to cut
    } else if (marker == kSos) {
      layout->scan = length_at + length;
      return have_sof;
    }
    pos = length_at + length;
  }
  return false;
}

Status FindRestartSegments(const uint8_t* p, size_t n, const JpegScanLayout& layout,
                           int64_t expect_segments, std::vector<size_t>* bounds, bool* usable) {
  bounds->clear();
  *usable = true;
  size_t start = layout.scan, i = layout.scan, end = n;
  int64_t markers = 0;
  while (i < n) {
    const void* ff = std::memchr(p + i, 0xFF, n - i);
    if (ff == nullptr) break;
    i = static_cast<size_t>(static_cast<const uint8_t*>(ff) - p);
    if (i + 1 >= n) break;  // a lone 0xFF as the last byte: the data just ends
    const uint8_t m = p[i + 1];
    if (m == 0x00 || m == 0xFF) {  // a stuffed 0xFF, or fill before a marker
      i += m == 0x00 ? 2 : 1;
      continue;
    }
    if (m == kEoi) {
      end = i;
      break;
    }
    if (!IsRestart(m)) {
      *usable = false;
      return Status::Ok();
    }
    if (m != kRst0 + markers % 8)
      return DecodeError("corrupt JPEG data: restart marker " + std::to_string(markers + 1) +
                         " is RST" + std::to_string(m - kRst0) + ", expected RST" +
                         std::to_string(markers % 8));
    if (++markers >= expect_segments) break;  // more markers than segments: counted below
    bounds->push_back(start);
    bounds->push_back(i);
    start = i += 2;
  }
  if (markers + 1 != expect_segments)
    return DecodeError("truncated or corrupt JPEG data: the scan holds " +
                       std::to_string(markers + 1) +
                       (markers >= expect_segments ? " or more" : "") +
                       " restart intervals, its header implies " + std::to_string(expect_segments));
  bounds->push_back(start);
  bounds->push_back(std::max(start, end));
  return Status::Ok();
}

namespace {

// The (class, slot) of every table a DHT segment's body [p, end) defines; false when its
// lengths do not add up (the segment is then copied as it is).
bool DhtTables(const uint8_t* p, const uint8_t* end, bool defined[2][4]) {
  while (p < end) {
    if (end - p < 17) return false;
    const int tc = p[0] >> 4, th = p[0] & 15;
    size_t n = 0;
    for (int l = 1; l <= 16; ++l) n += p[l];
    if (tc > 1 || th > 3 || static_cast<size_t>(end - p) < 17 + n) return false;
    defined[tc][th] = true;
    p += 17 + n;
  }
  return true;
}

}  // namespace

void CutJpegHeader(const uint8_t* data, const JpegScanLayout& layout, const JpegPart& part,
                   std::vector<uint8_t>* out) {
  // The header's segments as they are, but for the Huffman tables: each becomes a one-code
  // stub (code 0 of length 1 for symbol 0). Our entropy decoder takes the record's own tables
  // (InstallPartEntropy), so libjpeg's derived tables of the part were never used, and
  // building them (jpeg_make_d_derived_tbl) was 19 K of the 100 K instructions a box costs
  // before its pixels (cachegrind, compact records at shorter side 256).
  out->assign(data, data + 2);  // SOI
  size_t sof = 0, stubs_at = 0, pos = 2;
  bool defined[2][4] = {}, stubs = false;
  while (pos < layout.scan) {
    const size_t begin = pos;
    while (data[pos] == 0xFF) ++pos;  // fill bytes (FindJpegScan walked these same bytes)
    const uint8_t marker = data[pos];
    const size_t length_at = pos + 1,
                 next = length_at + (size_t{data[pos + 1]} << 8 | data[pos + 2]);
    if (marker == kDht && DhtTables(data + length_at + 2, data + next, defined)) {
      if (!stubs) stubs_at = out->size();
      stubs = true;
    } else {
      if (length_at == layout.sof) sof = out->size() + (length_at - begin);
      out->insert(out->end(), data + begin, data + next);
    }
    pos = next;
  }
  if (stubs) {
    std::vector<uint8_t> dht = {0xFF, kDht, 0, 0};
    for (int tc = 0; tc < 2; ++tc)
      for (int th = 0; th < 4; ++th) {
        if (!defined[tc][th]) continue;
        dht.push_back(static_cast<uint8_t>(tc << 4 | th));
        dht.push_back(1);  // one code of length 1 ...
        dht.insert(dht.end(), 15, 0);
        dht.push_back(0);  // ... for symbol 0 (DC: difference 0; AC: end of block)
      }
    dht[2] = static_cast<uint8_t>((dht.size() - 2) >> 8);
    dht[3] = static_cast<uint8_t>(dht.size() - 2);
    out->insert(out->begin() + static_cast<ptrdiff_t>(stubs_at), dht.begin(), dht.end());
    if (sof > stubs_at) sof += dht.size();
  }
  uint8_t* h = out->data() + sof;
  h[3] = static_cast<uint8_t>(part.height >> 8);
  h[4] = static_cast<uint8_t>(part.height);
  h[5] = static_cast<uint8_t>(part.width >> 8);
  h[6] = static_cast<uint8_t>(part.width);
  out->push_back(0xFF);
  out->push_back(kEoi);
}

}  // namespace tbljax
