// Antialiased, fixed-point, separable resize of RGB uint8 images (see resize.h).
#include "resize.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace tbljax {
namespace {

constexpr int kWeightBits = 14;  // weights <= 1.0 must fit int16
constexpr int kMidBits = 7;      // fractional bits kept between the two passes
constexpr int kMidMax = 255 << kMidBits;

// The triangle kernel on [-1, 1]; its support widens with the downscale factor.
double Triangle(double x) {
  x = std::fabs(x);
  return x < 1.0 ? 1.0 - x : 0.0;
}
constexpr double kSupport = 1.0;

// Per-axis taps: output i reads source samples [first[i], first[i] + count[i]) with the
// integer weights w[i * stride ...], which sum to exactly 1 << kWeightBits.
struct Taps {
  std::vector<int32_t> first, count;
  std::vector<int16_t> w;
  int stride = 0;
};

// The standard antialiasing resampler: output sample i is centred at box0 + (i + 0.5) * scale
// in source coordinates; the kernel is stretched by max(scale, 1), clipped to the image and
// renormalised there, so edges need no padding. All doubles here run without FMA contraction
// (see CMakeLists.txt) so the integer weights are the same on every machine.
void ComputeTaps(int in_len, double box0, double box_len, int out_len, Taps* t,
                 std::vector<double>* tmp) {
  const double scale = box_len / out_len;
  const double fscale = std::max(scale, 1.0);
  const double support = kSupport * fscale;
  t->stride = static_cast<int>(std::ceil(support)) * 2 + 1;
  t->first.assign(out_len, 0);
  t->count.assign(out_len, 0);
  t->w.assign(static_cast<size_t>(out_len) * t->stride, 0);
  tmp->resize(t->stride + 2);
  for (int i = 0; i < out_len; ++i) {
    const double center = box0 + (i + 0.5) * scale;
    int lo = std::max(0, static_cast<int>(std::floor(center - support + 0.5)));
    int hi = std::min(in_len, static_cast<int>(std::floor(center + support + 0.5)));
    double sum = 0;
    for (int j = lo; j < hi; ++j) sum += ((*tmp)[j - lo] = Triangle((j + 0.5 - center) / fscale));
    // Drop zero-weight taps at both ends: they cost time and change nothing.
    while (hi > lo + 1 && (*tmp)[0] == 0.0) {
      std::copy(tmp->begin() + 1, tmp->begin() + (hi - lo), tmp->begin());
      ++lo;
    }
    while (hi > lo + 1 && (*tmp)[hi - lo - 1] == 0.0) --hi;
    if (hi <= lo || sum <= 0.0) {  // cannot happen for a box inside the image; stay safe
      lo = std::min(std::max(0, static_cast<int>(center)), in_len - 1);
      hi = lo + 1;
      (*tmp)[0] = sum = 1.0;
    }
    int16_t* w = &t->w[static_cast<size_t>(i) * t->stride];
    int total = 0, biggest = 0;
    for (int j = 0; j < hi - lo; ++j) {
      w[j] = static_cast<int16_t>(std::lround((*tmp)[j] / sum * (1 << kWeightBits)));
      total += w[j];
      if (w[j] > w[biggest]) biggest = j;
    }
    // Rounded weights may miss 1.0 by a few units; putting the rest on the biggest weight
    // keeps flat areas exactly flat.
    w[biggest] = static_cast<int16_t>(w[biggest] + ((1 << kWeightBits) - total));
    t->first[i] = lo;
    t->count[i] = hi - lo;
  }
}

// One output row of the vertical pass over n bytes: mid = sum_k w[k] * rows[k], kept with
// kMidBits fractional bits. The SSE2 path interleaves the bytes of two rows so that one
// multiply-add applies a pair of taps, and keeps the sums of a 16-byte strip in registers
// over all taps. Same integer sums on both paths, so the same bits.
void VerticalRow(const uint8_t* const* rows, const int16_t* w, int taps, int n, int16_t* mid) {
  constexpr int kShift = kWeightBits - kMidBits;
  int x = 0;
#if defined(__SSE2__)
  if (n >= 16) {
    const __m128i zero = _mm_setzero_si128();
    const __m128i round = _mm_set1_epi32(1 << (kShift - 1));
    const __m128i top = _mm_set1_epi16(kMidMax);
    for (;; x += 16) {
      if (x + 16 > n) x = n - 16;  // last strip overlaps the previous one: same values again
      __m128i s0 = round, s1 = round, s2 = round, s3 = round;
      for (int k = 0; k < taps; k += 2) {
        const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[k] + x));
        const bool two = k + 1 < taps;
        const __m128i b = two ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[k + 1] + x)) : zero;
        const uint32_t pair = static_cast<uint16_t>(w[k]) | (two ? static_cast<uint32_t>(static_cast<uint16_t>(w[k + 1])) << 16 : 0u);
        const __m128i c = _mm_set1_epi32(static_cast<int32_t>(pair));
        const __m128i lo = _mm_unpacklo_epi8(a, b), hi = _mm_unpackhi_epi8(a, b);  // a0 b0 a1 b1 ...
        s0 = _mm_add_epi32(s0, _mm_madd_epi16(_mm_unpacklo_epi8(lo, zero), c));
        s1 = _mm_add_epi32(s1, _mm_madd_epi16(_mm_unpackhi_epi8(lo, zero), c));
        s2 = _mm_add_epi32(s2, _mm_madd_epi16(_mm_unpacklo_epi8(hi, zero), c));
        s3 = _mm_add_epi32(s3, _mm_madd_epi16(_mm_unpackhi_epi8(hi, zero), c));
      }
      // Shift, then clamp to [0, kMidMax]: packs saturates to int16, max/min do the rest.
      __m128i m0 = _mm_packs_epi32(_mm_srai_epi32(s0, kShift), _mm_srai_epi32(s1, kShift));
      __m128i m1 = _mm_packs_epi32(_mm_srai_epi32(s2, kShift), _mm_srai_epi32(s3, kShift));
      m0 = _mm_min_epi16(_mm_max_epi16(m0, zero), top);
      m1 = _mm_min_epi16(_mm_max_epi16(m1, zero), top);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(mid + x), m0);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(mid + x + 8), m1);
      if (x + 16 >= n) return;
    }
  }
#endif
  for (; x < n; ++x) {
    int32_t acc = 1 << (kShift - 1);
    for (int k = 0; k < taps; ++k) acc += w[k] * rows[k][x];
    mid[x] = static_cast<int16_t>(std::min(std::max(acc >> kShift, 0), kMidMax));
  }
}

// One output row of the horizontal pass: RGB pixels from the intermediate row, rounded to
// nearest and clamped to uint8. `pairs` holds each output's weights as int16 pairs
// (w[2j], w[2j+1]) packed in 32 bits, an odd count padded with a zero weight, so SSE2's
// multiply-add sums two taps of all three channels in one instruction. Both paths compute
// the same integer sums, so they give the same bits.
void HorizontalRow(const int16_t* mid, const int32_t* first, const int32_t* count,
                   const int32_t* pairs, int stride, int out_w, uint8_t* dst) {
  constexpr int kShift = kWeightBits + kMidBits;
#if defined(__SSE2__)
  const __m128i round = _mm_set1_epi32(1 << (kShift - 1));
  for (int ox = 0; ox < out_w; ++ox) {
    const int32_t* w = pairs + static_cast<size_t>(ox) * stride;
    const int16_t* p = mid + static_cast<size_t>(first[ox]) * 3;
    __m128i acc = round;
    for (int j = 0; j < (count[ox] + 1) / 2; ++j, p += 6) {
      // [r0 g0 b0 r1] and [r1 g1 b1 r2] interleave to [r0 r1 g0 g1 b0 b1 . .]
      const __m128i a = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
      const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 3));
      acc = _mm_add_epi32(acc, _mm_madd_epi16(_mm_unpacklo_epi16(a, b), _mm_set1_epi32(w[j])));
    }
    acc = _mm_srai_epi32(acc, kShift);
    const __m128i px = _mm_packus_epi16(_mm_packs_epi32(acc, acc), acc);  // saturates to [0, 255]
    const uint32_t rgb = static_cast<uint32_t>(_mm_cvtsi128_si32(px));
    dst[3 * ox] = static_cast<uint8_t>(rgb);
    dst[3 * ox + 1] = static_cast<uint8_t>(rgb >> 8);
    dst[3 * ox + 2] = static_cast<uint8_t>(rgb >> 16);
  }
#else
  for (int ox = 0; ox < out_w; ++ox) {
    const int32_t* w = pairs + static_cast<size_t>(ox) * stride;
    const int16_t* p = mid + static_cast<size_t>(first[ox]) * 3;
    int32_t r = 1 << (kShift - 1), g = r, b = r;
    for (int k = 0; k < count[ox]; ++k) {
      const int32_t c = static_cast<int16_t>(static_cast<uint32_t>(w[k / 2]) >> (16 * (k % 2)));
      r += c * p[3 * k];
      g += c * p[3 * k + 1];
      b += c * p[3 * k + 2];
    }
    dst[3 * ox] = static_cast<uint8_t>(std::min(std::max(r >> kShift, 0), 255));
    dst[3 * ox + 1] = static_cast<uint8_t>(std::min(std::max(g >> kShift, 0), 255));
    dst[3 * ox + 2] = static_cast<uint8_t>(std::min(std::max(b >> kShift, 0), 255));
  }
#endif
}

// Packs a Taps' int16 weights into (w[2j], w[2j+1]) pairs for HorizontalRow.
void PackPairs(const Taps& t, std::vector<int32_t>* pairs, int* stride) {
  *stride = (t.stride + 1) / 2;
  pairs->assign(t.first.size() * *stride, 0);
  for (size_t i = 0; i < t.first.size(); ++i) {
    const int16_t* w = &t.w[i * t.stride];
    for (int k = 0; k < t.count[i]; ++k) {
      const uint32_t bits = static_cast<uint16_t>(w[k]);
      (*pairs)[i * *stride + k / 2] |= static_cast<int32_t>(bits << (16 * (k % 2)));
    }
  }
}

struct Scratch {
  Taps tx, ty;
  std::vector<double> tmp;
  std::vector<int16_t> mid;
  std::vector<int32_t> pairs;
  std::vector<const uint8_t*> rows;
};

// Per-thread, reused between calls.
Scratch& ThreadScratch() {
  static thread_local Scratch s;
  return s;
}

}  // namespace

Status ParseResizeMode(std::string_view name, ResizeMode* mode) {
  if (name == "center_crop") *mode = ResizeMode::kCenterCrop;
  else if (name == "squash") *mode = ResizeMode::kSquash;
  else if (name == "max_side") *mode = ResizeMode::kMaxSide;
  else
    return InvalidArgument("resize mode must be 'center_crop', 'squash' or 'max_side', got '" +
                           std::string(name) + "'");
  return Status::Ok();
}

const char* ResizeModeName(ResizeMode mode) {
  switch (mode) {
    case ResizeMode::kCenterCrop: return "center_crop";
    case ResizeMode::kSquash: return "squash";
    case ResizeMode::kMaxSide: return "max_side";
  }
  return "?";
}

Status PlanResize(int src_h, int src_w, int size, ResizeMode mode, ResizePlan* plan) {
  if (src_h < 1 || src_w < 1)
    return InvalidArgument("cannot resize an empty image (" + std::to_string(src_h) + "x" +
                           std::to_string(src_w) + ")");
  if (size < 1 || size > kMaxResizeSize)
    return InvalidArgument("size must be in [1, " + std::to_string(kMaxResizeSize) + "], got " +
                           std::to_string(size));
  ResizePlan p;
  p.box_w = src_w;
  p.box_h = src_h;
  p.out_h = p.out_w = size;
  switch (mode) {
    case ResizeMode::kCenterCrop: {
      const int side = std::min(src_h, src_w);
      p.box_x = (src_w - side) / 2.0;
      p.box_y = (src_h - side) / 2.0;
      p.box_w = p.box_h = side;
      break;
    }
    case ResizeMode::kSquash: break;
    case ResizeMode::kMaxSide: {
      // Integer round-half-up of short * size / long, so the size never depends on floats.
      const int64_t lng = std::max(src_h, src_w), shrt = std::min(src_h, src_w);
      const int other = static_cast<int>(std::max<int64_t>(1, (2 * shrt * size + lng) / (2 * lng)));
      if (src_w >= src_h) p.out_h = other;
      else p.out_w = other;
      break;
    }
  }
  *plan = p;
  return Status::Ok();
}

namespace {

Status CheckPlan(int src_h, int src_w, const ResizePlan& plan) {
  if (src_h < 1 || src_w < 1 || plan.out_h < 1 || plan.out_w < 1 || !(plan.box_w > 0) ||
      !(plan.box_h > 0) || plan.box_x < 0 || plan.box_y < 0 || plan.box_x + plan.box_w > src_w ||
      plan.box_y + plan.box_h > src_h)
    return InvalidArgument("resize: box or sizes outside the source image");
  return Status::Ok();
}

// [lo, hi): the source samples that the taps of one axis read.
void TapSpan(const Taps& t, int* lo, int* hi) {
  *lo = t.first[0];
  *hi = t.first[0] + t.count[0];
  for (size_t i = 1; i < t.first.size(); ++i) {
    *lo = std::min(*lo, t.first[i]);
    *hi = std::max(*hi, t.first[i] + t.count[i]);
  }
}

}  // namespace

Status ResizeSourceRect(int src_h, int src_w, const ResizePlan& plan, PixelRect* rect) {
  TBLJAX_RETURN_IF_ERROR(CheckPlan(src_h, src_w, plan));
  Scratch& s = ThreadScratch();
  ComputeTaps(src_w, plan.box_x, plan.box_w, plan.out_w, &s.tx, &s.tmp);
  ComputeTaps(src_h, plan.box_y, plan.box_h, plan.out_h, &s.ty, &s.tmp);
  TapSpan(s.tx, &rect->x0, &rect->x1);
  TapSpan(s.ty, &rect->y0, &rect->y1);
  return Status::Ok();
}

Status ResizeRgb(const uint8_t* src, int src_h, int src_w, ptrdiff_t src_stride,
                 const ResizePlan& plan, uint8_t* dst, ptrdiff_t dst_stride) {
  PixelRect all;
  all.x1 = src_w;
  all.y1 = src_h;
  return ResizeRgbWindow(src, src_h, src_w, all, src_stride, plan, dst, dst_stride);
}

Status ResizeRgbWindow(const uint8_t* src, int src_h, int src_w, const PixelRect& window,
                       ptrdiff_t src_stride, const ResizePlan& plan, uint8_t* dst,
                       ptrdiff_t dst_stride) {
  TBLJAX_RETURN_IF_ERROR(CheckPlan(src_h, src_w, plan));
  Scratch& s = ThreadScratch();
  // The taps are laid out over the whole image, never over the window: the same doubles,
  // so the same integer weights, wherever the window lies.
  ComputeTaps(src_w, plan.box_x, plan.box_w, plan.out_w, &s.tx, &s.tmp);
  ComputeTaps(src_h, plan.box_y, plan.box_h, plan.out_h, &s.ty, &s.tmp);
  PixelRect need;
  TapSpan(s.tx, &need.x0, &need.x1);
  TapSpan(s.ty, &need.y0, &need.y1);
  if (need.x0 < window.x0 || need.x1 > window.x1 || need.y0 < window.y0 || need.y1 > window.y1)
    return InvalidArgument("resize: the source window does not hold the pixels the filter reads");

  // Only the columns the horizontal taps touch go through the vertical pass (a centre crop
  // of a landscape photo skips the sides).
  const int col0 = need.x0;
  const int mid_w = (need.x1 - col0) * 3;
  // The horizontal pass reads up to 4 values past the last pixel it weights (with weight 0).
  s.mid.assign(static_cast<size_t>(mid_w) + 8, 0);
  int pair_stride = 0;
  PackPairs(s.tx, &s.pairs, &pair_stride);
  s.rows.resize(s.ty.stride);
  for (int32_t& f : s.tx.first) f -= col0;
  const uint8_t* origin = src + (col0 - window.x0) * 3;

  for (int oy = 0; oy < plan.out_h; ++oy) {
    const int n = s.ty.count[oy];
    for (int k = 0; k < n; ++k)
      s.rows[k] = origin + static_cast<ptrdiff_t>(s.ty.first[oy] + k - window.y0) * src_stride;
    VerticalRow(s.rows.data(), &s.ty.w[static_cast<size_t>(oy) * s.ty.stride], n, mid_w, s.mid.data());
    HorizontalRow(s.mid.data(), s.tx.first.data(), s.tx.count.data(), s.pairs.data(), pair_stride,
                  plan.out_w, dst + oy * dst_stride);
  }
  // Per-thread scratch should not pin memory after a huge image.
  if (s.mid.capacity() > (size_t{8} << 20)) s.mid = {};
  return Status::Ok();
}

}  // namespace tbljax
