// The box decode (DecodeJpegBox, decode.h): a compact record cut down to the restart segments
// a crop box needs, entropy-decoded by our own decoder (jpeg_entropy.h) and turned into pixels
// by libjpeg (or, for YCbCr 4:2:0 at scale 1, by libjpeg's IDCT into planes and jpeg_color.h);
// any other record decoded in a window by the whole-image decode's steps (decoder.h). The one
// file that reaches into libjpeg's modules, through libjpeg_internals.h.
#include <algorithm>
#include <cmath>
#include <csetjmp>
#include <string>
#include <vector>

#include <jerror.h>

#include "decode.h"
#include "decoder.h"
#include "exif.h"
#include "jpeg_color.h"
#include "jpeg_entropy.h"
#include "jpeg_restart.h"
#include "libjpeg_internals.h"

namespace tbljax {
namespace jpeg_detail {

// The coefficients of a part of a record made of whole restart segments (DecodeRestartPart),
// decoded by our SegmentDecoder (jpeg_entropy.h) a row of MCUs at a time, and handed to libjpeg
// MCU by MCU in place of its own entropy decoder (Next), or (DecodePartPlanes) transformed by
// its IDCT block by block from the row: libjpeg sees a header of the part's size and never its
// data.
struct PartEntropy {
  const uint8_t* data = nullptr;  // the record
  // The record's header as libjpeg read it, for its Huffman tables (the part's are stubs,
  // CutJpegHeader).
  const jpeg_decompress_struct* record = nullptr;
  const std::vector<size_t>* bounds = nullptr;  // its restart segments (FindRestartSegments)
  JpegPart part;
  McuLayout layout;
  SegmentDecoder decoders[SegmentDecoder::kMaxLockstep] = {SegmentDecoder{layout},
                                                           SegmentDecoder{layout}};
  std::vector<int16_t>* row_coefs = nullptr;  // the MCU row being served (kept by the caller)
  // The MCU columns that reach libjpeg, of the part's: all of them, or (DecodePartPlanes) those
  // of the window its header describes.
  int win_col0 = 0, win_col1 = 0;
  int row = 0, col = 0;  // the next MCU, in the record's grid of MCUs
  Status status;         // why the decode stopped, when this stopped it

  // Decodes MCU row `row` of the part into row_coefs, up to kMaxLockstep segments at a time.
  Status DecodeRow() {
    constexpr int kGroup = SegmentDecoder::kMaxLockstep;
    const int R = part.restart_mcus, n = (part.col1 - part.col0) / R;
    const size_t mcu = static_cast<size_t>(layout.blocks) * 64;
    if (row_coefs->size() < mcu * R * n) row_coefs->resize(mcu * R * n);  // zeroed as decoded
    const size_t first = (static_cast<size_t>(row) * part.mcus_per_row + part.col0) / R;
    auto blocks_of = [&](int m, int16_t** out) {  // MCU m of the row
      for (int b = 0; b < layout.blocks; ++b) out[b] = row_coefs->data() + mcu * m + 64 * b;
    };
    auto start = [&](SegmentDecoder& d, int j) {
      d.Start(data + (*bounds)[2 * (first + j)], data + (*bounds)[2 * (first + j) + 1]);
    };
    SegmentDecoder* group[kGroup];
    int16_t* blocks[kGroup][McuLayout::kMaxBlocks];
    int16_t* const* block_ptrs[kGroup];
    for (int g = 0; g < kGroup; ++g) {
      group[g] = &decoders[g];
      block_ptrs[g] = blocks[g];
    }
    for (int j = 0; j < n; j += kGroup) {
      const int k = std::min(kGroup, n - j);
      for (int g = 0; g < k; ++g) start(decoders[g], j + g);
      bool ok = true;
      for (int m = 0; m < R && ok; ++m) {
        for (int g = 0; g < k; ++g) blocks_of((j + g) * R + m, blocks[g]);
        ok = SegmentDecoder::DecodeMcus(group, block_ptrs, k);
      }
      for (int g = 0; g < k && ok; ++g) ok = decoders[g].Finish().ok();
      if (ok) continue;
      // A failure (damaged data: rare): the segments again one by one, for the first failure
      // in the record's order and its message.
      for (int g = 0; g < k; ++g) {
        start(decoders[0], j + g);
        for (int m = 0; m < R; ++m) {
          blocks_of((j + g) * R + m, blocks[0]);
          TBLJAX_RETURN_IF_ERROR(decoders[0].DecodeMcu(blocks[0]));
        }
        TBLJAX_RETURN_IF_ERROR(decoders[0].Finish());
      }
      return DecodeError("internal: restart segments failed together and then decoded one by one");
    }
    return Status::Ok();
  }

  Status Next(JBLOCKROW* mcu) {
    if (row >= part.row1) return DecodeError("internal: libjpeg asked for MCUs past the part");
    if (col == win_col0) TBLJAX_RETURN_IF_ERROR(DecodeRow());
    static_assert(sizeof(JCOEF) == sizeof(int16_t), "JCOEF is libjpeg's 16-bit coefficient");
    // The blocks are handed over where they lie, not copied: libjpeg's single-scan
    // coefficient controller (decompress_onepass, jdcoefct.c) runs its IDCT on the blocks that
    // the array it passes here points at after the call. Before the next MCU it zeroes the
    // blocks_in_MCU blocks at mcu[0], which are then this MCU's, contiguous and used. (The copy
    // was 2% of serving compact records: benchmarks/README.md, "Per-record costs".)
    JCOEF* from = row_coefs->data() + static_cast<size_t>(col - part.col0) * layout.blocks * 64;
    for (int b = 0; b < layout.blocks; ++b) mcu[b] = reinterpret_cast<JBLOCKROW>(from + 64 * b);
    if (++col == win_col1) {
      col = win_col0;
      ++row;
    }
    return Status::Ok();
  }
};

namespace {

// Huffman tables by class and slot, kept per thread: a file's records share theirs.
struct HuffmanCache {
  HuffmanTable tables[2][NUM_HUFF_TBLS];
  bool built[2][NUM_HUFF_TBLS] = {};
  Status Get(const JHUFF_TBL* t, bool dc, int slot, const HuffmanTable** out) {
    HuffmanTable& h = tables[dc][slot];
    if (!built[dc][slot] || !h.Same(t->bits, t->huffval, dc)) {
      built[dc][slot] = false;
      TBLJAX_RETURN_IF_ERROR(HuffmanTable::Build(t->bits, t->huffval, dc, &h));
      built[dc][slot] = true;
    }
    *out = &h;
    return Status::Ok();
  }
};

boolean PartDecodeMcu(j_decompress_ptr c, JBLOCKROW* mcu) {
  auto* f = static_cast<PartEntropy*>(c->client_data);
  f->status = f->Next(mcu);
  if (!f->status.ok()) ERREXIT(c, JERR_BAD_HUFF_TABLE);  // DecodeRestartPart reports f->status
  return TRUE;
}

}  // namespace

void InstallPartEntropy(j_decompress_ptr c, PartEntropy* f) {
  static thread_local HuffmanCache cache;
  f->layout.blocks = c->blocks_in_MCU;
  int bits = 0;
  for (int b = 0; b < c->blocks_in_MCU; ++b) {
    const int ci = c->MCU_membership[b];
    const jpeg_component_info* comp = c->cur_comp_info[ci];
    // The record's own tables (the part's are stubs); where the record defines none, the
    // part has libjpeg's default.
    const auto table = [](JHUFF_TBL* const* record, JHUFF_TBL* const* part, int no) {
      return record[no] != nullptr ? record[no] : part[no];
    };
    const JHUFF_TBL* dc = table(f->record->dc_huff_tbl_ptrs, c->dc_huff_tbl_ptrs, comp->dc_tbl_no);
    const JHUFF_TBL* ac = table(f->record->ac_huff_tbl_ptrs, c->ac_huff_tbl_ptrs, comp->ac_tbl_no);
    f->layout.component[b] = ci;
    f->status = dc == nullptr || ac == nullptr
                    ? DecodeError("cannot decode JPEG: a Huffman table is missing")
                    : cache.Get(dc, true, comp->dc_tbl_no, &f->layout.dc[b]);
    if (f->status.ok()) f->status = cache.Get(ac, false, comp->ac_tbl_no, &f->layout.ac[b]);
    if (!f->status.ok()) ERREXIT(c, JERR_BAD_HUFF_TABLE);
    bits = std::max({bits, f->layout.dc[b]->symbol_bits(), f->layout.ac[b]->symbol_bits()});
  }
  f->layout.symbol_bits = bits;
  c->client_data = f;
  ReplaceEntropyDecodeMcu(c, PartDecodeMcu);
}

namespace {

// Pixel phase of a YCbCr 4:2:0 image at scale 1 (DecodeRestartPart): libjpeg's IDCT output as
// planes into *planes, which *got then describes, chroma edges padded for Ycc420ToRgb. Every
// iMCU row is decoded. libjpeg is set up for raw output (raw_data_out: its upsampler and colour
// converter never run) so that its IDCT methods are chosen and their tables filled, and then
// this drives them: each MCU row of the part from our entropy decoder (PartEntropy::DecodeRow),
// each block of the window's MCUs through libjpeg's own inverse_DCT, straight into the planes.
// jpeg_read_raw_data's coefficient controller (decompress_onepass, jdcoefct.c), its call back
// per MCU and its zeroing of blocks that our decoder zeroes anyway were 4-5% of serving compact
// records (benchmarks/README.md, "libjpeg's IDCT driven directly"). The blocks and their order
// are the controller's: per component, MCU_height rows of MCU_width blocks, skipping those past
// the component's last block column or row (the MCU's dummy blocks). Returns false after a
// libjpeg error or warning; a damaged segment leaves d->entropy->status not ok.
bool DecodePartPlanes(Decoder* d, std::vector<uint8_t>* planes, Ycc420Planes* got) {
  if (setjmp(d->err.jump)) return false;
  jpeg_decompress_struct* c = &d->cinfo;
  c->raw_data_out = TRUE;
  jpeg_start_decompress(c);
  PartEntropy* f = d->entropy;
  InstallPartEntropy(c, f);
  const int w = static_cast<int>(c->output_width), h = static_cast<int>(c->output_height);
  const int luma_rows = DCTSIZE * c->max_v_samp_factor;  // an iMCU row: 16 luma, 8 chroma
  const int imcu_rows = static_cast<int>(c->total_iMCU_rows);
  const int rows = imcu_rows * luma_rows;
  // Rows of whole blocks; chroma rows with room for a copy of the edge sample on either side.
  constexpr ptrdiff_t kFront = 16;
  const auto ys =
      static_cast<ptrdiff_t>(RoundUp64(c->comp_info[0].width_in_blocks * size_t{DCTSIZE}));
  const auto cs = static_cast<ptrdiff_t>(
      RoundUp64(kFront + c->comp_info[1].width_in_blocks * size_t{DCTSIZE} + 1));
  planes->resize(static_cast<size_t>(ys * rows + cs * rows + 63 + kYccSlack));
  uint8_t* const y_plane = planes->data() + BytesToPhase(planes->data());
  uint8_t* const cb_plane = y_plane + ys * rows + kFront;
  uint8_t* const cr_plane = cb_plane + cs * (rows / 2);
  uint8_t* const plane[3] = {y_plane, cb_plane, cr_plane};
  const ptrdiff_t stride[3] = {ys, cs, cs};
  const size_t mcu_coefs = static_cast<size_t>(c->blocks_in_MCU) * DCTSIZE2;
  // libjpeg's IDCT of each component, as jpeg_start_decompress set it up (libjpeg_internals.h).
  InverseDct inverse_dct[MAX_COMPONENTS] = {};
  for (int ci = 0; ci < c->comps_in_scan; ++ci) {
    const int k = c->cur_comp_info[ci]->component_index;
    inverse_dct[k] = ComponentInverseDct(c, k);
  }
  // The output rows of each component's block rows in the current iMCU row (at most
  // MAX_SAMP_FACTOR block rows a component), set once per iMCU row.
  JSAMPROW block_rows[MAX_COMPONENTS][MAX_SAMP_FACTOR][DCTSIZE];
  for (int r = 0; r < imcu_rows; ++r) {
    f->row = f->part.row0 + r;
    f->status = f->DecodeRow();
    if (!f->status.ok()) return true;
    for (int ci = 0; ci < c->comps_in_scan; ++ci) {
      const jpeg_component_info* comp = c->cur_comp_info[ci];
      const int k = comp->component_index;
      for (int yi = 0; yi < comp->MCU_height; ++yi)
        for (int i = 0; i < DCTSIZE; ++i)
          block_rows[k][yi][i] = plane[k] + ((r * comp->MCU_height + yi) * DCTSIZE + i) * stride[k];
    }
    for (int m = f->win_col0; m < f->win_col1; ++m) {
      JCOEF* blocks = f->row_coefs->data() + static_cast<size_t>(m - f->part.col0) * mcu_coefs;
      for (int ci = 0; ci < c->comps_in_scan; ++ci) {
        jpeg_component_info* comp = c->cur_comp_info[ci];
        const int k = comp->component_index;
        const InverseDct idct = inverse_dct[k];
        for (int yi = 0; yi < comp->MCU_height; ++yi) {
          const int by = r * comp->MCU_height + yi;
          for (int xi = 0; xi < comp->MCU_width; ++xi, blocks += DCTSIZE2) {
            const int bx = (m - f->win_col0) * comp->MCU_width + xi;
            if (by < static_cast<int>(comp->height_in_blocks) &&
                bx < static_cast<int>(comp->width_in_blocks))
              idct(c, comp, blocks, block_rows[k][yi], static_cast<JDIMENSION>(bx * DCTSIZE));
          }
        }
      }
    }
  }
  jpeg_abort_decompress(c);  // the scan was never read through libjpeg: nothing to finish
  PadChromaEdges(cb_plane, cs, ChromaSize(h), ChromaSize(w));
  PadChromaEdges(cr_plane, cs, ChromaSize(h), ChromaSize(w));
  got->y = y_plane;
  got->cb = cb_plane;
  got->cr = cr_plane;
  got->y_stride = ys;
  got->c_stride = cs;
  got->height = h;
  got->width = w;
  return true;
}

// Pixels next to a cut edge that fancy chroma upsampling makes differ from a whole decode: it
// reads one chroma neighbour on each side (h2v1, h2v2, h1v2), so one pixel row or column at a
// part's inner edge is off. At 1/k it is one pixel at that scale (k stored pixels): libjpeg
// upsamples the scaled chroma the same way, or not at all where its IDCT scales chroma up to
// the luma size. Checked by tests/test_restart_decode.py: every box class for 4:2:0, 4:2:2,
// 4:4:4 and grayscale, at scales 1, 2, 4 and 8, equals Pillow's whole decode with this margin.
constexpr int kUpsampleMargin = 1;

// libjpeg upsamples a chroma component this many samples wide or less by repeating them, not
// smoothly (jdsample.c: fancy upsampling needs downsampled_width > 2).
constexpr int kMaxRepeatedChroma = 2;

// The restart path of DecodeJpegBox (decode.h): when the record is a single-scan Huffman JPEG
// of 8-bit samples with a restart interval dividing its MCUs per row, shown unrotated, decodes
// just the restart segments that cover `need` (pixels at 1/scale_denom, plus kUpsampleMargin of
// them), at the same scale: libjpeg reads a header of the part's size and takes the part's
// coefficients from our entropy decoder (PartEntropy). *taken is false when the record is not
// such a one (nothing done).
Status DecodeRestartPart(const Decoder& d, const uint8_t* data, size_t size, const PixelRect& need,
                         int scale_denom, JpegBoxScratch* s, JpegBoxRegion* region, bool* taken) {
  *taken = false;
  const jpeg_decompress_struct& c = d.cinfo;
  const int R = static_cast<int>(c.restart_interval);
  if (R <= 0 || d.orientation != 1 || c.progressive_mode || c.arith_code || c.data_precision != 8 ||
      c.comps_in_scan != c.num_components)
    return Status::Ok();
  // An MCU: one block of a single-component scan, else max_samp_factor blocks on each axis.
  const bool one = c.num_components == 1;
  const int mcu_w = DCTSIZE * (one ? 1 : c.max_h_samp_factor);
  const int mcu_h = DCTSIZE * (one ? 1 : c.max_v_samp_factor);
  const int W = static_cast<int>(c.image_width), H = static_cast<int>(c.image_height);
  const int per_row = (W + mcu_w - 1) / mcu_w, rows = (H + mcu_h - 1) / mcu_h;
  if (per_row % R != 0) return Status::Ok();  // segments would span rows
  // `need` with its margin, in stored pixels: scaled pixel i is stored pixels [k*i, k*(i+1)).
  const int k = scale_denom;
  const int top = std::max(0, (need.y0 - kUpsampleMargin) * k);
  const int bottom = std::min(H, (need.y1 + kUpsampleMargin) * k);
  const int left = std::max(0, (need.x0 - kUpsampleMargin) * k);
  const int right = std::min(W, (need.x1 + kUpsampleMargin) * k);
  JpegPart part;
  part.mcus_per_row = per_row;
  part.restart_mcus = R;
  part.row0 = top / mcu_h;
  part.row1 = (bottom + mcu_h - 1) / mcu_h;
  part.col0 = left / mcu_w / R * R;
  const int last_col = (right + mcu_w - 1) / mcu_w;
  part.col1 = std::min(per_row, (last_col + R - 1) / R * R);
  // A part at most 4 pixels wide at 1/k has half-width chroma of at most kMaxRepeatedChroma
  // samples, which libjpeg upsamples otherwise than the whole image's: widen it by whole
  // intervals.
  const auto part_w = [&] {
    return (part.col1 == per_row ? W : part.col1 * mcu_w) - part.col0 * mcu_w;
  };
  while (part_w() <= kMaxRepeatedChroma * 2 * k && (part.col0 > 0 || part.col1 < per_row)) {
    if (part.col0 > 0) part.col0 -= R;
    else part.col1 = std::min(per_row, part.col1 + R);
  }
  // The part starts on an MCU edge (a multiple of 8 or 16, so of k), and where it meets the
  // image's right or bottom edge ends there, so libjpeg's rounded-up scaled size of the part
  // ends where the whole image's does.
  const int y0 = part.row0 * mcu_h, x0 = part.col0 * mcu_w;
  part.height = (part.row1 == rows ? H : part.row1 * mcu_h) - y0;
  part.width = part_w();
  JpegScanLayout layout;
  if (!FindJpegScan(data, size, &layout)) return Status::Ok();
  bool usable = false;
  TBLJAX_RETURN_IF_ERROR(
      FindRestartSegments(data, size, layout, int64_t{rows} * per_row / R, &s->segments, &usable));
  // A part of the whole image takes this path too: libjpeg's own entropy decoder re-decodes
  // an MCU on its slow path at every restart marker it sees coming (jpeg_entropy.h).
  if (!usable) return Status::Ok();
  // YCbCr 4:2:0 at scale 1 (compact records by default) is decoded to planes, and its pixels
  // made by Ycc420ToRgb for the box alone. Then libjpeg sees only the MCU columns that hold
  // `need` and its margin, its header made that window's size (what jpeg_crop_scanline does on
  // the other path). An image at most 4 pixels wide has its chroma upsampled by repeating.
  const auto sampling = [&](int ci, int h, int v) {
    return c.comp_info[ci].h_samp_factor == h && c.comp_info[ci].v_samp_factor == v;
  };
  const bool planar = k == 1 && c.num_components == 3 && c.jpeg_color_space == JCS_YCbCr &&
                      sampling(0, 2, 2) && sampling(1, 1, 1) && sampling(2, 1, 1) &&
                      ChromaSize(W) > kMaxRepeatedChroma;
  int win0 = part.col0, win1 = part.col1;
  JpegPart window = part;
  if (planar) {
    win0 = std::max(0, need.x0 - kUpsampleMargin) / mcu_w;
    win1 = std::min(per_row, (std::min(W, need.x1 + kUpsampleMargin) + mcu_w - 1) / mcu_w);
    window.width = (win1 == per_row ? W : win1 * mcu_w) - win0 * mcu_w;
  }
  CutJpegHeader(data, layout, window, &s->part);

  Decoder p;
  PartEntropy entropy;
  entropy.data = data;
  entropy.record = &d.cinfo;
  entropy.bounds = &s->segments;
  entropy.row_coefs = &s->coefficients;
  entropy.part = part;
  entropy.win_col0 = win0;
  entropy.win_col1 = win1;
  entropy.row = part.row0;
  entropy.col = win0;
  p.entropy = &entropy;
  // The messages of libjpeg speak of the part: say which part of the record it is.
  const auto failed = [&](const Status& st) {
    return DecodeError((entropy.status.ok() ? st : entropy.status).message() +
                       " (in the restart segments of MCU rows " + std::to_string(part.row0) + "-" +
                       std::to_string(part.row1 - 1) + ", columns " + std::to_string(part.col0) +
                       "-" + std::to_string(part.col1 - 1) + ")");
  };
  JpegInfo info;
  TBLJAX_RETURN_IF_ERROR(Open(&p, s->part.data(), s->part.size(), &info));
  Geometry g;
  if (!SetUpDecode(&p, k, &g)) return DecodeFailure(p.err, p.src.eof_hit);
  if (planar) {
    Ycc420Planes planes;
    if (!DecodePartPlanes(&p, &s->planes, &planes))
      return failed(DecodeFailure(p.err, p.src.eof_hit));
    if (!entropy.status.ok()) return failed(entropy.status);
    // The box's rows and columns in the window, from an even column (the upsampler's pairs).
    const int wx = win0 * mcu_w;
    const int ry0 = need.y0 - y0, ry1 = need.y1 - y0;
    const int rx0 = (need.x0 - wx) & ~1, rx1 = need.x1 - wx;
    const size_t stride = RoundUp64(static_cast<size_t>(rx1 - rx0) * 3);
    s->pixels.resize(stride * static_cast<size_t>(ry1 - ry0) + 63);
    uint8_t* out = s->pixels.data() + BytesToPhase(s->pixels.data());
    Ycc420ToRgb(planes, ry0, ry1, rx0, rx1, out, static_cast<ptrdiff_t>(stride));
    region->pixels = out;
    region->stride = static_cast<int64_t>(stride);
    region->width = rx1 - rx0;
    region->height = ry1 - ry0;
    region->box[0] = 0;
    region->box[1] = need.x0 - wx - rx0;
    region->box[2] = ry1 - ry0;
    region->box[3] = need.x1 - need.x0;
    region->scale_denom = 1;
    *taken = true;
    return Status::Ok();
  }
  // Every MCU of the part is entropy-decoded; libjpeg transforms (IDCT, upsampling, colour)
  // only the iMCU columns that hold `need` and its margin (jpeg_crop_scanline), ending on an
  // iMCU edge or the part's end (a narrower crop would upsample its chroma by repeating). The
  // rows are padded (`pad_rows`): a crop's rows are whole iMCUs (16 pixels, 48 bytes, in
  // 4:2:0), so packed, every other row would start 32-byte aligned, where libjpeg-turbo's
  // upsampler stalls (kRowsPhase): the crop with packed rows measured 1.06x the time of none.
  Window want;
  want.w = g.w;
  want.h = g.h;
  {
    const int iw = g.imcu_w;
    const int a = std::max(0, need.x0 - kUpsampleMargin - x0 / k);
    const int b = std::min(g.w, need.x1 + kUpsampleMargin - x0 / k);
    want.x = a / iw * iw;
    want.w = std::min(g.w, (b + iw - 1) / iw * iw) - want.x;
  }
  PixelRect shown;
  RowsAt at;
  Status st = DecodeOriented(&p, g, want, /*pad_rows=*/true, &s->pixels, &s->spare, &s->row, &shown,
                             &at, /*whole_stream=*/true);
  if (!st.ok() || !entropy.status.ok()) return failed(st);
  region->pixels = s->pixels.data() + at.offset;
  region->stride = static_cast<int64_t>(at.stride);
  region->width = shown.x1 - shown.x0;
  region->height = g.h;
  region->box[0] = need.y0 - y0 / k;
  region->box[1] = need.x0 - x0 / k - shown.x0;
  region->box[2] = need.y1 - need.y0;
  region->box[3] = need.x1 - need.x0;
  region->scale_denom = k;
  *taken = true;
  return Status::Ok();
}

}  // namespace
}  // namespace jpeg_detail

using namespace jpeg_detail;

Status DecodeJpegBox(const uint8_t* data, size_t size, const JpegBoxRequest& r,
                     JpegBoxScratch* scratch, JpegBoxRegion* region) {
  Decoder d;
  JpegInfo info;
  TBLJAX_RETURN_IF_ERROR(Open(&d, data, size, &info));
  if (r.expect_h > 0 && (info.height != r.expect_h || info.width != r.expect_w))
    return Corrupt("the JPEG is " + std::to_string(info.width) + "x" + std::to_string(info.height) +
                   ", the index says " + std::to_string(r.expect_w) + "x" +
                   std::to_string(r.expect_h));
  const int64_t y0 = r.box[0], x0 = r.box[1], bh = r.box[2], bw = r.box[3];
  if (bh < 1 || bw < 1 || y0 < 0 || x0 < 0 || y0 + bh > info.height || x0 + bw > info.width)
    return InvalidArgument(
        "crop box (y0, x0, h, w) = (" + std::to_string(y0) + ", " + std::to_string(x0) + ", " +
        std::to_string(bh) + ", " + std::to_string(bw) + ") does not lie inside the " +
        std::to_string(info.height) + "x" + std::to_string(info.width) + " image");
  const int k = r.dct_scale ? ChooseDctScale(static_cast<double>(bw), static_cast<double>(bh),
                                             r.out_w, r.out_h)
                            : 1;
  Geometry g;
  if (!SetUpDecode(&d, k, &g)) return DecodeFailure(d.err, d.src.eof_hit);
  const int o = info.orientation;
  const int w = SwapsAxes(o) ? g.h : g.w, h = SwapsAxes(o) ? g.w : g.h;  // displayed, at 1/k
  // The box at 1/k, rounded outwards to whole scaled pixels (see DecodeResizeImpl for the
  // shift on a reversed axis); at k = 1 it is the box itself.
  PixelRect need;
  need.x0 = static_cast<int>(x0);
  need.y0 = static_cast<int>(y0);
  need.x1 = static_cast<int>(x0 + bw);
  need.y1 = static_cast<int>(y0 + bh);
  if (k > 1) {
    const double sx = ReversesX(o) ? w - static_cast<double>(info.width) / k : 0.0;
    const double sy = ReversesY(o) ? h - static_cast<double>(info.height) / k : 0.0;
    need.x0 = std::max(0, static_cast<int>(std::floor(x0 / static_cast<double>(k) + sx)));
    need.y0 = std::max(0, static_cast<int>(std::floor(y0 / static_cast<double>(k) + sy)));
    need.x1 = std::min(w, static_cast<int>(std::ceil((x0 + bw) / static_cast<double>(k) + sx)));
    need.y1 = std::min(h, static_cast<int>(std::ceil((y0 + bh) / static_cast<double>(k) + sy)));
  }
  bool taken = false;
  TBLJAX_RETURN_IF_ERROR(DecodeRestartPart(d, data, size, need, k, scratch, region, &taken));
  if (taken) return Status::Ok();
  Window want;
  want.w = g.w;
  want.h = g.h;
  if (g.windowable) want = StoredWindow(need, g, o);
  PixelRect shown;
  RowsAt at;
  TBLJAX_RETURN_IF_ERROR(DecodeOriented(&d, g, want, /*pad_rows=*/true, &scratch->pixels,
                                        &scratch->spare, &scratch->row, &shown, &at,
                                        /*whole_stream=*/false));
  region->pixels = scratch->pixels.data() + at.offset;
  region->stride = static_cast<int64_t>(at.stride);
  region->width = shown.x1 - shown.x0;
  region->height = shown.y1 - shown.y0;
  region->box[0] = need.y0 - shown.y0;
  region->box[1] = need.x0 - shown.x0;
  region->box[2] = need.y1 - need.y0;
  region->box[3] = need.x1 - need.x0;
  region->scale_denom = k;
  return Status::Ok();
}

}  // namespace tbljax
