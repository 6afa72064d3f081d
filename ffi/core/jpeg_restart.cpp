// Restart segments of a baseline JPEG: finding them and cutting a part out (see jpeg_restart.h).
#include "jpeg_restart.h"

#include <algorithm>
#include <cstring>
#include <string>

namespace tbljax {

namespace {

constexpr uint8_t kRst0 = 0xD0, kRst7 = 0xD7, kEoi = 0xD9, kSos = 0xDA;

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

void CutJpegHeader(const uint8_t* data, const JpegScanLayout& layout, const JpegPart& part,
                   std::vector<uint8_t>* out) {
  out->assign(data, data + layout.scan);
  uint8_t* sof = out->data() + layout.sof;
  sof[3] = static_cast<uint8_t>(part.height >> 8);
  sof[4] = static_cast<uint8_t>(part.height);
  sof[5] = static_cast<uint8_t>(part.width >> 8);
  sof[6] = static_cast<uint8_t>(part.width);
  out->push_back(0xFF);
  out->push_back(kEoi);
}

}  // namespace tbljax
