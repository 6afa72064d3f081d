// JPEG decode and encode over libjpeg-turbo (see decode.h). libjpeg reports errors by calling
// back into us; we leave its frames with longjmp, so the functions that call setjmp hold only
// trivially destructible locals and everything with a destructor lives in their callers.
#include "decode.h"

#include <algorithm>
#include <cmath>
#include <csetjmp>
#include <cstdio>  // jpeglib.h needs FILE
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

#include <jerror.h>
#include <jpeglib.h>

#include "jpeg_color.h"
#include "jpeg_entropy.h"
#include "jpeg_restart.h"
#include "names.h"
#include "simd.h"

// libjpeg's entropy-decoder module, whose decode_mcu DecodeRestartPart replaces with ours. The
// definition is libjpeg's internal jpegint.h (not installed); its first two members have been
// these since libjpeg 6b and in every libjpeg-turbo (3.x adds members after them).
struct jpeg_entropy_decoder {
  void (*start_pass)(j_decompress_ptr cinfo);
  boolean (*decode_mcu)(j_decompress_ptr cinfo, JBLOCKROW* MCU_data);
};
// libjpeg's inverse-DCT module (jpegint.h too), whose per-component method DecodePartPlanes
// calls itself: its first two members, the same in libjpeg 6b and every libjpeg-turbo.
struct jpeg_inverse_dct {
  void (*start_pass)(j_decompress_ptr cinfo);
  void (*inverse_DCT[MAX_COMPONENTS])(j_decompress_ptr cinfo, jpeg_component_info* compptr,
                                      JCOEFPTR coef_block, JSAMPARRAY output_buf,
                                      JDIMENSION output_col);
};

namespace tbljax {
namespace {

// ---------------------------------------------------------------- errors -----------------

struct ErrorMgr {
  jpeg_error_mgr pub;  // first, so a j_common_ptr's err can be cast back to ErrorMgr
  jmp_buf jump;
  bool warning;
  char message[JMSG_LENGTH_MAX];
};

[[noreturn]] void Fail(j_common_ptr cinfo, bool warning) {
  auto* e = reinterpret_cast<ErrorMgr*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, e->message);
  e->warning = warning;
  std::longjmp(e->jump, 1);
}

void OnError(j_common_ptr cinfo) { Fail(cinfo, false); }

// libjpeg "warns" about corrupt data and carries on with grey fill; for a dataset that is a
// silently wrong image, so every warning fails the decode. The one exception says nothing
// about the pixels: an unknown JFIF version number.
void OnMessage(j_common_ptr cinfo, int level) {
  if (level >= 0) return;  // trace messages
  if (cinfo->err->msg_code == JWRN_JFIF_MAJOR) return;
  Fail(cinfo, true);
}

void InitErrorMgr(ErrorMgr* e) {
  jpeg_std_error(&e->pub);
  e->pub.error_exit = OnError;
  e->pub.emit_message = OnMessage;
  e->pub.output_message = [](j_common_ptr) {};  // the core never prints
  e->warning = false;
  e->message[0] = '\0';
}

Status DecodeFailure(const ErrorMgr& e, bool input_ended) {
  const char* what = input_ended ? "truncated JPEG (the data ends before the image does): "
                     : e.warning ? "corrupt JPEG data: "
                                 : "cannot decode JPEG: ";
  return DecodeError(what + std::string(e.message));
}

// Cheap check before libjpeg sees the bytes, naming the format when it is a common one so a
// caller can fall back (to Pillow) and a report says what the file really was.
Status CheckJpegMagic(const uint8_t* p, size_t n) {
  if (n == 0 || p == nullptr) return DecodeError("not a JPEG: input is empty (0 bytes)");
  if (n >= 3 && p[0] == 0xFF && p[1] == 0xD8 && p[2] == 0xFF) return Status::Ok();
  const char* kind = nullptr;
  if (n >= 8 && std::memcmp(p, "\x89PNG\r\n\x1a\n", 8) == 0) kind = "PNG";
  else if (n >= 6 && (std::memcmp(p, "GIF87a", 6) == 0 || std::memcmp(p, "GIF89a", 6) == 0))
    kind = "GIF";
  else if (n >= 12 && std::memcmp(p, "RIFF", 4) == 0 && std::memcmp(p + 8, "WEBP", 4) == 0)
    kind = "WebP";
  else if (n >= 4 && (std::memcmp(p, "II*\0", 4) == 0 || std::memcmp(p, "MM\0*", 4) == 0))
    kind = "TIFF";
  else if (n >= 12 && std::memcmp(p + 4, "ftyp", 4) == 0) kind = "ISO-BMFF (HEIF/AVIF)";
  else if (n >= 2 && p[0] == 'B' && p[1] == 'M') kind = "BMP";
  std::string head;
  char hex[4];
  for (size_t i = 0; i < n && i < 4; ++i) {
    std::snprintf(hex, sizeof(hex), i ? " %02x" : "%02x", p[i]);
    head += hex;
  }
  return DecodeError(std::string("not a JPEG") +
                     (kind ? std::string(" (looks like ") + kind + ")" : "") + ": " +
                     std::to_string(n) + " bytes starting " + head);
}

// ---------------------------------------------------------------- input ------------------

// Reads from memory like jpeg_mem_src, but where the bytes end it supplies an EOI marker
// without a warning and notes it. Data that really is missing still fails: the entropy
// decoder warns ("premature end of data segment") when it needs bits beyond that marker, and
// a multi-scan image is checked after decoding. So a file that lacks only its final EOI
// (complete pixel data) decodes, and a cut-off one does not.
struct MemSource {
  jpeg_source_mgr pub;  // first, so cinfo->src can be cast back
  bool eof_hit;
};

const JOCTET kEoi[2] = {0xFF, JPEG_EOI};

boolean FillInput(j_decompress_ptr cinfo) {
  auto* s = reinterpret_cast<MemSource*>(cinfo->src);
  s->eof_hit = true;
  s->pub.next_input_byte = kEoi;
  s->pub.bytes_in_buffer = sizeof(kEoi);
  return TRUE;
}

void SkipInput(j_decompress_ptr cinfo, long n) {
  jpeg_source_mgr* src = cinfo->src;
  if (n <= 0) return;
  while (static_cast<size_t>(n) > src->bytes_in_buffer) {
    n -= static_cast<long>(src->bytes_in_buffer);
    FillInput(cinfo);
  }
  src->next_input_byte += n;
  src->bytes_in_buffer -= static_cast<size_t>(n);
}

void InitMemSource(MemSource* s, const uint8_t* data, size_t size) {
  s->pub.init_source = [](j_decompress_ptr) {};
  s->pub.fill_input_buffer = FillInput;
  s->pub.skip_input_data = SkipInput;
  s->pub.resync_to_restart = jpeg_resync_to_restart;
  s->pub.term_source = [](j_decompress_ptr) {};
  s->pub.next_input_byte = data;
  s->pub.bytes_in_buffer = size;
  s->eof_hit = false;
}

// ---------------------------------------------------------------- EXIF -------------------

// Orientation from an APP1 "Exif" payload: TIFF header, IFD0, tag 0x0112. Everything is
// bounds-checked; anything malformed means "no orientation" (1), never a failure.
int ExifOrientation(const uint8_t* p, size_t n) {
  if (n < 6 + 8 || std::memcmp(p, "Exif\0\0", 6) != 0) return 1;
  const uint8_t* t = p + 6;
  const size_t tn = n - 6;
  bool le;
  if (t[0] == 'I' && t[1] == 'I') le = true;
  else if (t[0] == 'M' && t[1] == 'M') le = false;
  else return 1;
  auto u16 = [&](size_t o) -> uint32_t { return le ? t[o] | t[o + 1] << 8 : t[o] << 8 | t[o + 1]; };
  auto u32 = [&](size_t o) -> uint32_t {
    return le ? u16(o) | u16(o + 2) << 16 : u16(o) << 16 | u16(o + 2);
  };
  if (u16(2) != 42) return 1;
  const size_t ifd = u32(4);
  if (ifd > tn || tn - ifd < 2) return 1;
  const size_t count = u16(ifd);
  for (size_t i = 0; i < count; ++i) {
    const size_t e = ifd + 2 + 12 * i;
    if (e + 12 > tn) break;
    if (u16(e) != 0x0112) continue;
    const uint32_t type = u16(e + 2);
    const uint32_t v = type == 3 ? u16(e + 8) : type == 4 ? u32(e + 8) : 0;  // SHORT or LONG
    return v >= 1 && v <= 8 ? static_cast<int>(v) : 1;
  }
  return 1;
}

// For EXIF orientation o, which axes of the displayed image run backwards through the
// stored one (orientations 5-8 also swap the axes).
bool SwapsAxes(int o) { return o >= 5; }
bool ReversesX(int o) { return o == 2 || o == 3 || o == 6 || o == 7; }
bool ReversesY(int o) { return o == 3 || o == 4 || o == 7 || o == 8; }

// Writes the displayed image for orientation o of a stored w x h RGB image. Displayed pixel
// (r, c) reads stored pixel base + r * step_r + c * step_c (in pixels).
void Orient(const uint8_t* src, int w, int h, int o, uint8_t* dst) {
  const ptrdiff_t W = w;
  ptrdiff_t base = 0, step_r = W, step_c = 1;
  switch (o) {
    case 2:
      base = W - 1;
      step_r = W;
      step_c = -1;
      break;
    case 3:
      base = (h - 1) * W + W - 1;
      step_r = -W;
      step_c = -1;
      break;
    case 4:
      base = (h - 1) * W;
      step_r = -W;
      step_c = 1;
      break;
    case 5:
      base = 0;
      step_r = 1;
      step_c = W;
      break;
    case 6:
      base = (h - 1) * W;
      step_r = 1;
      step_c = -W;
      break;
    case 7:
      base = (h - 1) * W + W - 1;
      step_r = -1;
      step_c = -W;
      break;
    case 8:
      base = W - 1;
      step_r = -1;
      step_c = W;
      break;
    default: break;
  }
  const int dh = SwapsAxes(o) ? w : h, dw = SwapsAxes(o) ? h : w;
  for (int r = 0; r < dh; ++r) {
    const uint8_t* s = src + 3 * (base + r * step_r);
    for (int c = 0; c < dw; ++c, s += 3 * step_c, dst += 3) {
      dst[0] = s[0];
      dst[1] = s[1];
      dst[2] = s[2];
    }
  }
}

// ---------------------------------------------------------------- decode -----------------

struct PartEntropy;

struct Decoder {
  jpeg_decompress_struct cinfo;
  ErrorMgr err;
  MemSource src;
  bool created = false;
  int orientation = 1;
  PartEntropy* entropy = nullptr;  // when set, the coefficients come from it (DecodeRestartPart)
  Decoder() { InitErrorMgr(&err); }
  ~Decoder() {
    if (created) jpeg_destroy_decompress(&cinfo);
  }
};

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

// After jpeg_start_decompress (which has checked the scan's tables): our decoder in place of
// libjpeg's, for the scan's MCU layout.
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
  c->entropy->decode_mcu = PartDecodeMcu;
}

// round(a * b / 255) for a, b in [0, 255], exactly.
inline uint8_t MulDiv255(int a, int b) {
  const int t = a * b + 128;
  return static_cast<uint8_t>((t + (t >> 8)) >> 8);
}

// Header phase. Returns false after a libjpeg error (message in d->err).
bool ReadHeader(Decoder* d, const uint8_t* data, size_t size) {
  if (setjmp(d->err.jump)) return false;
  d->cinfo.err = &d->err.pub;
  jpeg_create_decompress(&d->cinfo);
  d->created = true;
  InitMemSource(&d->src, data, size);
  d->cinfo.src = &d->src.pub;
  jpeg_save_markers(&d->cinfo, JPEG_APP0 + 1, 0xFFFF);
  jpeg_read_header(&d->cinfo, TRUE);
  for (jpeg_saved_marker_ptr m = d->cinfo.marker_list; m; m = m->next) {
    if (m->marker == JPEG_APP0 + 1 && m->data_length >= 6 &&
        std::memcmp(m->data, "Exif\0\0", 6) == 0) {
      d->orientation = ExifOrientation(m->data, m->data_length);
      break;
    }
  }
  return true;
}

// The stored (unoriented) image at the decode scale, as libjpeg will emit it.
struct Geometry {
  int w = 0, h = 0;            // stored size at 1/scale_denom
  int imcu_w = 0, imcu_h = 0;  // an iMCU (the unit libjpeg crops and skips by), in those pixels
  bool windowable = false;     // whether Decompress may crop and skip (see SetUpDecode)
};

// Sets the fixed decode recipe and the scale, and says what libjpeg will emit. Returns false
// after a libjpeg error (message in d->err).
bool SetUpDecode(Decoder* d, int scale_denom, Geometry* g) {
  if (setjmp(d->err.jump)) return false;
  jpeg_decompress_struct* c = &d->cinfo;
  // Fixed for reproducibility: the accurate integer IDCT and the smooth ("fancy") chroma
  // upsampling, which is also what Pillow and most decoders use by default.
  c->dct_method = JDCT_ISLOW;
  c->do_fancy_upsampling = TRUE;
  c->scale_num = 1;
  c->scale_denom = static_cast<unsigned int>(scale_denom);
  const bool cmyk = c->jpeg_color_space == JCS_CMYK || c->jpeg_color_space == JCS_YCCK;
  c->out_color_space = cmyk ? JCS_CMYK : JCS_RGB;  // libjpeg turns YCCK into CMYK, gray into RGB
  jpeg_calc_output_dimensions(c);
  g->w = static_cast<int>(c->output_width);
  g->h = static_cast<int>(c->output_height);
  // A block is DCTSIZE / scale_denom pixels at this scale; an iMCU is max_samp_factor blocks
  // on each axis (a single-component scan crops by single blocks, which is finer).
  g->imcu_w = DCTSIZE / scale_denom * c->max_h_samp_factor;
  g->imcu_h = DCTSIZE / scale_denom * c->max_v_samp_factor;
  // Only single-scan Huffman images are decoded in a window. A multi-scan (progressive)
  // image is entropy-decoded whole inside jpeg_start_decompress anyway, crop and skip have
  // had most of their libjpeg-turbo bugs there, and arithmetic coding is rare: both are
  // decoded whole, as before.
  g->windowable = !jpeg_has_multiple_scans(c) && !c->arith_code;
  return true;
}

// Columns [x, x + w), rows [y, y + h) of the stored image at the decode scale.
struct Window {
  int x = 0, y = 0, w = 0, h = 0;
};

// n rounded up to a multiple of 64 (a cache line: decoded rows and planes start on one).
inline size_t RoundUp64(size_t n) { return (n + 63) / 64 * 64; }

// Bytes from p to the first address at `phase` bytes past a 64-byte boundary (buffers are
// allocated 63 bytes over for it).
inline size_t BytesToPhase(const void* p, size_t phase = 0) {
  return (phase - reinterpret_cast<uintptr_t>(p)) & 63;
}

// Where decoded rows lie in their buffer: the first `offset` bytes in, `stride` bytes apart.
struct RowsAt {
  size_t offset = 0, stride = 0;
};

// [a, b) on an axis of length n, counted from its other end when `reverse`.
void FlipSpan(int n, bool reverse, int* a, int* b) {
  if (!reverse) return;
  const int a0 = *a;
  *a = n - *b;
  *b = n - a0;
}

// Rectangles between displayed and stored coordinates for EXIF orientation o of an image
// stored g.w x g.h: the displayed x axis runs along the stored y axis when the axes swap,
// and ReversesX/Y say which displayed axes run backwards.
PixelRect ToStored(PixelRect r, const Geometry& g, int o) {
  if (SwapsAxes(o)) {
    std::swap(r.x0, r.y0);
    std::swap(r.x1, r.y1);
  }
  FlipSpan(g.w, SwapsAxes(o) ? ReversesY(o) : ReversesX(o), &r.x0, &r.x1);
  FlipSpan(g.h, SwapsAxes(o) ? ReversesX(o) : ReversesY(o), &r.y0, &r.y1);
  return r;
}

PixelRect ToDisplayed(PixelRect r, const Geometry& g, int o) {
  FlipSpan(g.w, SwapsAxes(o) ? ReversesY(o) : ReversesX(o), &r.x0, &r.x1);
  FlipSpan(g.h, SwapsAxes(o) ? ReversesX(o) : ReversesY(o), &r.y0, &r.y1);
  if (SwapsAxes(o)) {
    std::swap(r.x0, r.y0);
    std::swap(r.x1, r.y1);
  }
  return r;
}

// The stored window to decode so that the displayed pixels `need` come out exactly as a
// whole-image decode gives them. Where a window edge lies inside the image, the pixels next
// to it can differ from a whole decode: at a cropped column edge the chroma upsampler sees an
// image edge instead of the next samples, and after skipped rows its context rows are not
// those of the rows above. So the window reaches one iMCU past `need` to the left, to the
// right and above (the effect is 1-2 pixels deep), and starts on an iMCU row. Below, rows
// come out in order and nothing later changes them, so it only runs on to an iMCU row
// boundary, where skipping the rest starts cleanly (libjpeg-turbo's skip has mishandled
// starts inside a row group: issue #915).
Window StoredWindow(const PixelRect& need, const Geometry& g, int o) {
  const PixelRect r = ToStored(need, g, o);
  Window win;
  win.x = std::max(0, r.x0 - g.imcu_w);
  win.w = std::min(g.w, r.x1 + g.imcu_w) - win.x;
  win.y = std::max(0, r.y0 - g.imcu_h) / g.imcu_h * g.imcu_h;
  win.h = std::min(g.h, (r.y1 + g.imcu_h - 1) / g.imcu_h * g.imcu_h) - win.y;
  return win;
}

// Pixel phase: decodes the stored window `want` into `pixels` as RGB, got->h rows of got->w
// pixels. Columns outside it are not transformed (jpeg_crop_scanline, which may move the
// left edge down to an iMCU column: *got is the window decoded); rows outside it are
// entropy-decoded only (jpeg_skip_scanlines), so damaged or truncated data anywhere still
// fails, unless `whole_stream` is false: then decoding stops after the window's last row.
// The rows start at->offset bytes into *pixels (kRowsPhase past a 64-byte boundary) and lie
// at->stride bytes apart: w * 3, or with `pad_rows` that rounded up to 64 bytes, so that every
// row starts at kRowsPhase. `row` is scratch. Returns false after a libjpeg error or warning.
bool Decompress(Decoder* d, const Window& want, bool whole_stream, bool pad_rows,
                std::vector<uint8_t>* pixels, std::vector<uint8_t>* row, Window* got, RowsAt* at) {
  if (setjmp(d->err.jump)) return false;
  jpeg_decompress_struct* c = &d->cinfo;
  const bool cmyk = c->out_color_space == JCS_CMYK;
  const bool multi_scan = jpeg_has_multiple_scans(c);
  jpeg_start_decompress(c);
  if (d->entropy != nullptr) InstallPartEntropy(c, d->entropy);
  const JDIMENSION full_h = c->output_height;
  JDIMENSION x0 = static_cast<JDIMENSION>(want.x), width = static_cast<JDIMENSION>(want.w);
  if (width < c->output_width) jpeg_crop_scanline(c, &x0, &width);
  const JDIMENSION y0 = static_cast<JDIMENSION>(want.y), y1 = y0 + static_cast<JDIMENSION>(want.h);
  if (y0 > 0 && jpeg_skip_scanlines(c, y0) != y0) ERREXIT(c, JERR_INPUT_EMPTY);
  const size_t w = c->output_width, h = y1 - y0;
  // The buffer is reserved (no page touched) and grown row by row as rows arrive: a
  // 600-byte file whose header claims 16384 x 16384 fails at its first missing row having
  // touched only that much, not after zero-filling 800 MB. (Keeping a reused buffer's size, so
  // that nothing is zero-filled, measured no faster over 8 memory layouts: benchmarks/README.md,
  // "Per-record costs".)
  const size_t stride = pad_rows ? RoundUp64(w * 3) : w * 3;
  pixels->clear();
  pixels->reserve(63 + stride * h);
  const size_t skip = BytesToPhase(pixels->data(), kRowsPhase);
  at->offset = skip;
  at->stride = stride;
  uint8_t* base = pixels->data() + skip;
  row->resize(w * 4);
  while (c->output_scanline < y1) {
    const size_t y = c->output_scanline - y0;
    pixels->resize(skip + std::min<size_t>(h, y + 16) * stride);  // within capacity: base stays put
    if (!cmyk) {
      JSAMPROW rows[16];
      const size_t n = std::min<size_t>(16, h - y);
      for (size_t i = 0; i < n; ++i) rows[i] = base + (y + i) * stride;
      if (jpeg_read_scanlines(c, rows, static_cast<JDIMENSION>(n)) == 0)
        ERREXIT(c, JERR_INPUT_EMPTY);
    } else {
      JSAMPROW r = row->data();
      if (jpeg_read_scanlines(c, &r, 1) == 0) ERREXIT(c, JERR_INPUT_EMPTY);
      // Adobe's writers store CMYK inverted and say so with an APP14 marker; without it the
      // values are plain ink amounts. RGB = (1 - C)(1 - K), the usual naive conversion
      // (Pillow's too), rounded exactly.
      const bool inverted = c->saw_Adobe_marker;
      uint8_t* out = base + y * stride;
      for (size_t x = 0; x < w; ++x) {
        const uint8_t* s = r + 4 * x;
        const int k = inverted ? s[3] : 255 - s[3];
        for (int ch = 0; ch < 3; ++ch)
          out[3 * x + ch] = MulDiv255(inverted ? s[ch] : 255 - s[ch], k);
      }
    }
  }
  got->x = static_cast<int>(x0);
  got->y = want.y;
  got->w = static_cast<int>(w);
  got->h = want.h;
  if (!whole_stream && y1 < full_h) return true;  // the decoder is destroyed mid-image
  // Rows below the window. Skipping to the end would not entropy-decode them at all (damage
  // or truncation there would pass, and the unread data would then raise an "extraneous
  // bytes" warning), so all but the last are skipped and the last is read, into scratch.
  if (y1 < full_h) {
    const JDIMENSION rest = full_h - 1 - y1;
    if (rest > 0 && jpeg_skip_scanlines(c, rest) != rest) ERREXIT(c, JERR_INPUT_EMPTY);
    JSAMPROW r = row->data();
    if (jpeg_read_scanlines(c, &r, 1) == 0) ERREXIT(c, JERR_INPUT_EMPTY);
  }
  jpeg_finish_decompress(c);  // reads to EOI: damage after the last row still fails
  // A multi-scan image (progressive, or one scan per component) cut between two scans looks
  // complete to libjpeg once it meets our stand-in EOI; the missing scans' coefficients
  // would silently stay zero. Only a single-scan image may lack its EOI.
  if (d->src.eof_hit && multi_scan) ERREXIT(c, JERR_INPUT_EOF);
  return true;
}

Status Open(Decoder* d, const uint8_t* data, size_t size, JpegInfo* info) {
  TBLJAX_RETURN_IF_ERROR(CheckJpegMagic(data, size));
  if (!ReadHeader(d, data, size)) return DecodeFailure(d->err, d->src.eof_hit);
  const jpeg_decompress_struct& c = d->cinfo;
  const int64_t pixels = int64_t{c.image_width} * c.image_height;
  if (pixels > kMaxJpegPixels)
    return DecodeError("JPEG too large: " + std::to_string(c.image_width) + "x" +
                       std::to_string(c.image_height) + " is over the limit of " +
                       std::to_string(kMaxJpegPixels) + " pixels");
  const bool swap = SwapsAxes(d->orientation);
  info->width = static_cast<int>(swap ? c.image_height : c.image_width);
  info->height = static_cast<int>(swap ? c.image_width : c.image_height);
  info->components = c.num_components;
  switch (c.jpeg_color_space) {
    case JCS_GRAYSCALE: info->color_space = "grayscale"; break;
    case JCS_RGB: info->color_space = "rgb"; break;
    case JCS_YCbCr: info->color_space = "ycbcr"; break;
    case JCS_CMYK: info->color_space = "cmyk"; break;
    case JCS_YCCK: info->color_space = "ycck"; break;
    default: info->color_space = "unknown"; break;
  }
  info->orientation = d->orientation;
  info->progressive = c.progressive_mode;
  return Status::Ok();
}

// Decodes the stored window `want` (at the scale SetUpDecode set) into *pixels and applies
// the EXIF orientation (through *spare, swapped in: an image without orientation is never
// copied). *shown: where the pixels lie in the displayed image at that scale; rows of
// shown->x1 - shown->x0 pixels, placed in *pixels as *at says (see Decompress; `pad_rows` only
// pads an image shown as stored).
Status DecodeOriented(Decoder* d, const Geometry& g, const Window& want, bool pad_rows,
                      std::vector<uint8_t>* pixels, std::vector<uint8_t>* spare,
                      std::vector<uint8_t>* row, PixelRect* shown, RowsAt* at,
                      bool whole_stream = true) {
  Window got;
  const int o = d->orientation;
  if (!Decompress(d, want, whole_stream, pad_rows && o == 1, pixels, row, &got, at))
    return DecodeFailure(d->err, d->src.eof_hit);
  if (o != 1) {
    spare->resize(pixels->size() - at->offset);
    Orient(pixels->data() + at->offset, got.w, got.h, o, spare->data());
    pixels->swap(*spare);
    at->offset = 0;
    at->stride = static_cast<size_t>(SwapsAxes(o) ? got.h : got.w) * 3;
  }
  PixelRect r;
  r.x0 = got.x;
  r.x1 = got.x + got.w;
  r.y0 = got.y;
  r.y1 = got.y + got.h;
  *shown = ToDisplayed(r, g, o);
  return Status::Ok();
}

// Per-thread decode buffers for the hot path, kept between images.
struct DecodeScratch {
  std::vector<uint8_t> pixels, spare, row;
  void Trim() {
    // A huge image should not pin its buffers in every pool thread for ever.
    constexpr size_t kKeep = size_t{32} << 20;
    if (pixels.capacity() > kKeep) pixels = {};
    if (spare.capacity() > kKeep) spare = {};
  }
};

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
        const auto idct = c->idct->inverse_DCT[k];
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

// Decode + resize into dst (plan.out_h rows of plan.out_w * 3 bytes).
Status DecodeResizeImpl(const uint8_t* data, size_t size, int out_size, ResizeMode mode,
                        int max_long, RgbImage* to_image, uint8_t* to_dst) {
  Decoder d;
  JpegInfo info;
  TBLJAX_RETURN_IF_ERROR(Open(&d, data, size, &info));
  ResizePlan plan;
  TBLJAX_RETURN_IF_ERROR(PlanResize(info.height, info.width, out_size, mode, &plan, max_long));
  if (to_dst != nullptr && (plan.out_h != out_size || plan.out_w != out_size))
    return InvalidArgument(std::string("resize mode '") + ResizeModeName(mode) +
                           "' gives a size that depends on the image; use DecodeResize");
  const int k = ChooseDctScale(plan.box_w, plan.box_h, plan.out_w, plan.out_h);
  Geometry g;
  if (!SetUpDecode(&d, k, &g)) return DecodeFailure(d.err, d.src.eof_hit);
  const int o = info.orientation;
  const int w = SwapsAxes(o) ? g.h : g.w, h = SwapsAxes(o) ? g.w : g.h;  // displayed, at 1/k

  // The box in the scaled image. libjpeg's scaled pixel i covers stored pixels
  // [k*i, k*(i+1)), so coordinates divide by k. The scaled size is rounded up, so the last
  // stored pixel may cover less than k; on a displayed axis that runs backwards through the
  // stored one (a flip or rotation) that partial pixel comes first, so the box shifts by
  // the part of it that is padding. k is a power of two: all of this is exact in doubles.
  if (k > 1) {
    const double full_w = info.width, full_h = info.height;
    plan.box_x = plan.box_x / k + (ReversesX(o) ? w - full_w / k : 0.0);
    plan.box_y = plan.box_y / k + (ReversesY(o) ? h - full_h / k : 0.0);
    plan.box_w /= k;
    plan.box_h /= k;
  }
  // Decode only what the filter reads (a centre crop of a landscape photo skips its sides,
  // of a portrait one its top and bottom rows), with the same bytes there as a whole decode.
  Window want;
  want.w = g.w;
  want.h = g.h;
  if (g.windowable) {
    PixelRect need;
    TBLJAX_RETURN_IF_ERROR(ResizeSourceRect(h, w, plan, &need));
    want = StoredWindow(need, g, o);
  }

  static thread_local DecodeScratch s;
  PixelRect shown;
  RowsAt at;
  Status st =
      DecodeOriented(&d, g, want, /*pad_rows=*/true, &s.pixels, &s.spare, &s.row, &shown, &at);
  if (st.ok()) {
    uint8_t* dst = to_dst;
    if (to_image != nullptr) {
      to_image->height = plan.out_h;
      to_image->width = plan.out_w;
      to_image->pixels.resize(static_cast<size_t>(plan.out_h) * plan.out_w * 3);
      dst = to_image->pixels.data();
    }
    st =
        ResizeRgbWindow(s.pixels.data() + at.offset, h, w, shown, static_cast<ptrdiff_t>(at.stride),
                        plan, dst, static_cast<ptrdiff_t>(plan.out_w) * 3);
  }
  s.Trim();
  return st;
}

// ---------------------------------------------------------------- encode -----------------

struct Encoder {
  jpeg_compress_struct cinfo;
  ErrorMgr err;
  bool created = false;
  unsigned char* buf = nullptr;  // malloc'ed by libjpeg's memory destination
  unsigned long len = 0;
  Encoder() { InitErrorMgr(&err); }
  ~Encoder() {
    if (created) jpeg_destroy_compress(&cinfo);
    std::free(buf);
  }
};

bool Compress(Encoder* e, const uint8_t* pixels, int height, int width, int channels,
              ptrdiff_t row_stride, const EncodeOptions& o) {
  if (setjmp(e->err.jump)) return false;
  jpeg_compress_struct* c = &e->cinfo;
  c->err = &e->err.pub;
  jpeg_create_compress(c);
  e->created = true;
  jpeg_mem_dest(c, &e->buf, &e->len);
  c->image_width = static_cast<JDIMENSION>(width);
  c->image_height = static_cast<JDIMENSION>(height);
  c->input_components = channels;
  c->in_color_space = channels == 3 ? JCS_RGB : JCS_GRAYSCALE;
  jpeg_set_defaults(c);
  jpeg_set_quality(c, o.quality, TRUE);
  c->dct_method = JDCT_ISLOW;
  if (channels == 3) {
    const int h = o.subsampling == ChromaSubsampling::k444 ? 1 : 2;
    const int v = o.subsampling == ChromaSubsampling::k420 ? 2 : 1;
    c->comp_info[0].h_samp_factor = h;
    c->comp_info[0].v_samp_factor = v;
    for (int i = 1; i < 3; ++i) c->comp_info[i].h_samp_factor = c->comp_info[i].v_samp_factor = 1;
  }
  c->restart_interval = static_cast<unsigned int>(o.restart_mcus);
  if (o.progressive) jpeg_simple_progression(c);
  jpeg_start_compress(c, TRUE);
  while (c->next_scanline < c->image_height) {
    // libjpeg takes non-const rows but only reads them.
    JSAMPROW r =
        const_cast<JSAMPROW>(pixels + static_cast<ptrdiff_t>(c->next_scanline) * row_stride);
    jpeg_write_scanlines(c, &r, 1);
  }
  jpeg_finish_compress(c);
  return true;
}

}  // namespace

// ---------------------------------------------------------------- public -----------------

int ChooseDctScale(double box_w, double box_h, int out_w, int out_h) {
  for (int k : {8, 4, 2})
    if (box_w / k >= kDctScaleMinRatio * out_w && box_h / k >= kDctScaleMinRatio * out_h) return k;
  return 1;
}

Status ReadJpegInfo(const uint8_t* data, size_t size, JpegInfo* info) {
  Decoder d;
  return Open(&d, data, size, info);
}

Status DecodeJpeg(const uint8_t* data, size_t size, RgbImage* out, int scale_denom) {
  Decoder d;
  JpegInfo info;
  TBLJAX_RETURN_IF_ERROR(Open(&d, data, size, &info));
  if (scale_denom != 1 && scale_denom != 2 && scale_denom != 4 && scale_denom != 8)
    return InvalidArgument("scale_denom must be 1, 2, 4 or 8, got " + std::to_string(scale_denom));
  Geometry g;
  if (!SetUpDecode(&d, scale_denom, &g)) return DecodeFailure(d.err, d.src.eof_hit);
  Window all;
  all.w = g.w;
  all.h = g.h;
  std::vector<uint8_t> spare, row;
  PixelRect shown;
  RowsAt at;
  TBLJAX_RETURN_IF_ERROR(
      DecodeOriented(&d, g, all, /*pad_rows=*/false, &out->pixels, &spare, &row, &shown, &at));
  out->offset = at.offset;
  out->width = shown.x1 - shown.x0;
  out->height = shown.y1 - shown.y0;
  return Status::Ok();
}

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

Status DecodeResize(const uint8_t* data, size_t size, int out_size, ResizeMode mode, RgbImage* out,
                    int max_long) {
  return DecodeResizeImpl(data, size, out_size, mode, max_long, out, nullptr);
}

Status DecodeResizeInto(const uint8_t* data, size_t size, int out_size, ResizeMode mode,
                        uint8_t* dst) {
  Status st = DecodeResizeImpl(data, size, out_size, mode, 0, nullptr, dst);
  if (!st.ok() && out_size > 0) std::memset(dst, 0, static_cast<size_t>(out_size) * out_size * 3);
  return st;
}

const char* ChromaSubsamplingName(ChromaSubsampling s) {
  switch (s) {
    case ChromaSubsampling::k444: return "444";
    case ChromaSubsampling::k422: return "422";
    case ChromaSubsampling::k420: return "420";
  }
  return "?";
}

Status ParseChromaSubsampling(std::string_view name, ChromaSubsampling* out) {
  return ParseByName(name, kChromaSubsamplings, ChromaSubsamplingName, "subsampling", out);
}

Status EncodeJpeg(const uint8_t* pixels, int height, int width, int channels, ptrdiff_t row_stride,
                  const EncodeOptions& options, std::vector<uint8_t>* out) {
  if (channels != 1 && channels != 3)
    return InvalidArgument("encode_jpeg takes 1 (gray) or 3 (RGB) channels, got " +
                           std::to_string(channels));
  if (height < 1 || width < 1 || height > JPEG_MAX_DIMENSION || width > JPEG_MAX_DIMENSION)
    return InvalidArgument("encode_jpeg: image size " + std::to_string(height) + "x" +
                           std::to_string(width) + " outside [1, " +
                           std::to_string(JPEG_MAX_DIMENSION) + "]");
  if (options.quality < 1 || options.quality > 100)
    return InvalidArgument("encode_jpeg: quality must be in [1, 100], got " +
                           std::to_string(options.quality));
  if (options.restart_mcus < 0 || options.restart_mcus > 65535)
    return InvalidArgument("encode_jpeg: restart_mcus must be in [0, 65535] (0: none), got " +
                           std::to_string(options.restart_mcus));
  Encoder e;
  if (!Compress(&e, pixels, height, width, channels, row_stride, options))
    return InvalidArgument(std::string("cannot encode JPEG: ") + e.err.message);
  out->assign(e.buf, e.buf + e.len);
  return Status::Ok();
}

}  // namespace tbljax
