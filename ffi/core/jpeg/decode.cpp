// The whole-image decode over libjpeg-turbo (see decode.h): the header, the decode recipe,
// the pixel phase in a window of the stored image, EXIF orientation, and decode + resize.
// libjpeg reports errors by calling back into us; we leave its frames with longjmp, so the
// functions that call setjmp hold only trivially destructible locals and everything with a
// destructor lives in their callers.
#include "decode.h"

#include <algorithm>
#include <csetjmp>
#include <cstring>
#include <string>
#include <utility>

#include <jerror.h>

#include "decoder.h"
#include "exif.h"

namespace tbljax {
namespace jpeg_detail {
namespace {

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

}  // namespace

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
                      std::vector<uint8_t>* row, PixelRect* shown, RowsAt* at, bool whole_stream) {
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

namespace {

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

}  // namespace
}  // namespace jpeg_detail

using namespace jpeg_detail;

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

}  // namespace tbljax
