// Antialiased, fixed-point, separable resize of RGB uint8 images (see resize.h).
#include "resize.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "simd.h"  // the SIMD target, shared with the serve kernel and the CRC

#if TBLJAX_SIMD_X86
#include <immintrin.h>
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

// std::lround for v >= 0 (half away from zero), without the libm call: v - trunc(v), the
// fraction, is exact in doubles.
inline int64_t RoundHalfUp(double v) {
  const int64_t f = static_cast<int64_t>(v);
  return f + (v - static_cast<double>(f) >= 0.5 ? 1 : 0);
}

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
      w[j] = static_cast<int16_t>(RoundHalfUp((*tmp)[j] / sum * (1 << kWeightBits)));
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

// ---------------------------------------------------------------- the two passes ---------
// Each pass exists as portable C++ (SIMD target "scalar", and every build off x86-64) and,
// on x86-64, with AVX2 and AVX-512 intrinsics, chosen at run time by the one SIMD target of
// the core (simd.h: the best the CPU has, capped by TBLJAX_SIMD). Every version computes the same
// integer sums, so they give the same bits; the tests run every target.

constexpr int kVShift = kWeightBits - kMidBits;  // vertical: keep kMidBits fractional bits
constexpr int kHShift = kWeightBits + kMidBits;  // horizontal: back to integers

// One output row of the vertical pass over n bytes: mid[x] = sum_k w[k] * rows[k][x], kept
// with kMidBits fractional bits and clamped to [0, kMidMax]. Tap by tap over the whole row
// into 32-bit sums in `acc` (n of them): loops that compilers vectorize.
void VerticalRowScalar(const uint8_t* const* rows, const int16_t* w, int taps, int n, int16_t* mid,
                       int32_t* acc) {
  for (int x = 0; x < n; ++x) acc[x] = 1 << (kVShift - 1);
  for (int k = 0; k < taps; ++k) {
    const int32_t wk = w[k];
    const uint8_t* r = rows[k];
    for (int x = 0; x < n; ++x) acc[x] += wk * r[x];
  }
  for (int x = 0; x < n; ++x)
    mid[x] = static_cast<int16_t>(std::min(std::max(acc[x] >> kVShift, 0), kMidMax));
}

// One output row of the horizontal pass: RGB pixels from the intermediate row, which starts
// at source column col0 (output ox reads count[ox] pixels from column first[ox], with weights
// w[ox * stride ...]), rounded to nearest and clamped to uint8.
void HorizontalRowScalar(const int16_t* mid, int col0, const int32_t* first, const int32_t* count,
                         const int16_t* w, int stride, int out_w, uint8_t* dst) {
  for (int ox = 0; ox < out_w; ++ox, w += stride) {
    const int16_t* p = mid + static_cast<size_t>(first[ox] - col0) * 3;
    int32_t r = 1 << (kHShift - 1), g = r, b = r;
    for (int k = 0; k < count[ox]; ++k, p += 3) {
      r += w[k] * p[0];
      g += w[k] * p[1];
      b += w[k] * p[2];
    }
    dst[3 * ox] = static_cast<uint8_t>(std::min(std::max(r >> kHShift, 0), 255));
    dst[3 * ox + 1] = static_cast<uint8_t>(std::min(std::max(g >> kHShift, 0), 255));
    dst[3 * ox + 2] = static_cast<uint8_t>(std::min(std::max(b >> kHShift, 0), 255));
  }
}

// The horizontal taps as the SIMD passes take them: output pixels in blocks of 4 (the last
// padded with zero weights), and per block and pair of taps 16 int32: the 4 pixels' weight
// pairs, each repeated over the 4 int32 lanes an RGB pixel's sums occupy (R, G, B, unused).
struct HBlocks {
  std::vector<int32_t> offset;   // per (padded) output pixel: mid element of its first tap
  std::vector<int32_t> npairs;   // per block: the most pairs any of its pixels has
  std::vector<int32_t> weights;  // per block: stride x 16
  int stride = 0;
};

void BuildHBlocks(int col0, const std::vector<int32_t>& first, const std::vector<int32_t>& count,
                  const std::vector<int32_t>& pairs, int pair_stride, HBlocks* h) {
  const int out_w = static_cast<int>(first.size());
  const int blocks = (out_w + 3) / 4;
  h->stride = pair_stride;
  h->offset.assign(static_cast<size_t>(blocks) * 4, 3 * (first[out_w - 1] - col0));
  h->npairs.assign(blocks, 0);
  h->weights.assign(static_cast<size_t>(blocks) * pair_stride * 16, 0);
  for (int ox = 0; ox < out_w; ++ox) {
    const int b = ox / 4, i = ox % 4;
    h->offset[ox] = 3 * (first[ox] - col0);
    h->npairs[b] = std::max(h->npairs[b], (count[ox] + 1) / 2);
    for (int j = 0; j < pair_stride; ++j)
      for (int c = 0; c < 4; ++c)
        h->weights[(static_cast<size_t>(b) * pair_stride + j) * 16 + 4 * i + c] =
            pairs[static_cast<size_t>(ox) * pair_stride + j];
  }
}

#if TBLJAX_SIMD_X86
// The SIMD passes take weights as (w[2j], w[2j+1]) int16 pairs packed in 32 bits, an odd
// count padded with a zero weight, so that one multiply-add (vpmaddwd) applies two taps;
// the vertical ones take 2 * npairs row pointers (an odd count repeats the last row).
// Function attributes (simd.h), not a target region: see there why.
#if defined(__GNUC__) && !defined(__clang__)
// GCC 12's AVX-512 headers trip these on _mm512_undefined_* (GCC PR105593).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

// Vertical pass, 32 bytes a step: each row's bytes widen to 16-bit words (in order), the
// words of two rows interleave within each 128-bit lane, so that one vpmaddwd applies a pair
// of taps; per lane the sums come out as pixels [0-3], [4-7], and packing them back lane by
// lane restores the order. The sums of a step stay in registers over all taps; the last
// step overlaps the one before where n is not a multiple of 32 (same values again).
TBLJAX_TARGET_AVX2 void VerticalRowAvx2(const uint8_t* const* rows, const int32_t* pairs,
                                        int npairs, int n, int16_t* mid, const int16_t* w, int taps,
                                        int32_t* acc) {
  if (n < 32) return VerticalRowScalar(rows, w, taps, n, mid, acc);
  const __m256i round = _mm256_set1_epi32(1 << (kVShift - 1));
  const __m256i zero = _mm256_setzero_si256(), top = _mm256_set1_epi16(kMidMax);
  for (int x = 0;; x += 32) {
    if (x + 32 > n) x = n - 32;
    __m256i s0 = round, s1 = round, s2 = round, s3 = round;
    for (int j = 0; j < npairs; ++j) {
      const __m256i c = _mm256_set1_epi32(pairs[j]);
      const uint8_t* ra = rows[2 * j] + x;
      const uint8_t* rb = rows[2 * j + 1] + x;
      const __m256i a0 =
          _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(ra)));
      const __m256i b0 =
          _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rb)));
      const __m256i a1 =
          _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(ra + 16)));
      const __m256i b1 =
          _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rb + 16)));
      s0 = _mm256_add_epi32(s0, _mm256_madd_epi16(_mm256_unpacklo_epi16(a0, b0), c));
      s1 = _mm256_add_epi32(s1, _mm256_madd_epi16(_mm256_unpackhi_epi16(a0, b0), c));
      s2 = _mm256_add_epi32(s2, _mm256_madd_epi16(_mm256_unpacklo_epi16(a1, b1), c));
      s3 = _mm256_add_epi32(s3, _mm256_madd_epi16(_mm256_unpackhi_epi16(a1, b1), c));
    }
    // Shift, then clamp to [0, kMidMax]: packs saturates to int16, max/min do the rest.
    __m256i m0 = _mm256_packs_epi32(_mm256_srai_epi32(s0, kVShift), _mm256_srai_epi32(s1, kVShift));
    __m256i m1 = _mm256_packs_epi32(_mm256_srai_epi32(s2, kVShift), _mm256_srai_epi32(s3, kVShift));
    m0 = _mm256_min_epi16(_mm256_max_epi16(m0, zero), top);
    m1 = _mm256_min_epi16(_mm256_max_epi16(m1, zero), top);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(mid + x), m0);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(mid + x + 16), m1);
    if (x + 32 >= n) return;
  }
}

// The same, 64 bytes a step.
TBLJAX_TARGET_AVX512 void VerticalRowAvx512(const uint8_t* const* rows, const int32_t* pairs,
                                            int npairs, int n, int16_t* mid, const int16_t* w,
                                            int taps, int32_t* acc) {
  if (n < 64) return VerticalRowAvx2(rows, pairs, npairs, n, mid, w, taps, acc);
  const __m512i round = _mm512_set1_epi32(1 << (kVShift - 1));
  const __m512i zero = _mm512_setzero_si512(), top = _mm512_set1_epi16(kMidMax);
  for (int x = 0;; x += 64) {
    if (x + 64 > n) x = n - 64;
    __m512i s0 = round, s1 = round, s2 = round, s3 = round;
    for (int j = 0; j < npairs; ++j) {
      const __m512i c = _mm512_set1_epi32(pairs[j]);
      const uint8_t* ra = rows[2 * j] + x;
      const uint8_t* rb = rows[2 * j + 1] + x;
      const __m512i a0 =
          _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(ra)));
      const __m512i b0 =
          _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(rb)));
      const __m512i a1 =
          _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(ra + 32)));
      const __m512i b1 =
          _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(rb + 32)));
      s0 = _mm512_add_epi32(s0, _mm512_madd_epi16(_mm512_unpacklo_epi16(a0, b0), c));
      s1 = _mm512_add_epi32(s1, _mm512_madd_epi16(_mm512_unpackhi_epi16(a0, b0), c));
      s2 = _mm512_add_epi32(s2, _mm512_madd_epi16(_mm512_unpacklo_epi16(a1, b1), c));
      s3 = _mm512_add_epi32(s3, _mm512_madd_epi16(_mm512_unpackhi_epi16(a1, b1), c));
    }
    __m512i m0 = _mm512_packs_epi32(_mm512_srai_epi32(s0, kVShift), _mm512_srai_epi32(s1, kVShift));
    __m512i m1 = _mm512_packs_epi32(_mm512_srai_epi32(s2, kVShift), _mm512_srai_epi32(s3, kVShift));
    m0 = _mm512_min_epi16(_mm512_max_epi16(m0, zero), top);
    m1 = _mm512_min_epi16(_mm512_max_epi16(m1, zero), top);
    _mm512_storeu_si512(mid + x, m0);
    _mm512_storeu_si512(mid + x + 32, m1);
    if (x + 64 >= n) return;
  }
}

// Writes the first 3 * n bytes of px (n <= 4 RGB pixels) at dst; a 16-byte store where the
// row has room for it (the next block overwrites the extra bytes).
TBLJAX_TARGET_AVX2 inline void StoreRgb(__m128i px, uint8_t* dst, int n, bool room) {
  if (room) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), px);
  } else {
    alignas(16) uint8_t tmp[16];
    _mm_store_si128(reinterpret_cast<__m128i*>(tmp), px);
    std::memcpy(dst, tmp, static_cast<size_t>(3 * (n < 4 ? n : 4)));
  }
}

// Horizontal pass, 4 output pixels a step, each in a 128-bit lane: per pair of taps, the 8
// words at its first tap [r0 g0 b0 r1 g1 b1 . .] shuffle to [r0 r1 g0 g1 b0 b1 0 0], so one
// vpmaddwd with that pixel's weight pair gives its R, G, B sums. AVX2 holds 2 pixels a
// register, AVX-512 4.
#define TBLJAX_PAIR_SHUFFLE 0, 1, 6, 7, 2, 3, 8, 9, 4, 5, 10, 11, -128, -128, -128, -128
#define TBLJAX_RGB0_TO_RGB 0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -128, -128, -128, -128

TBLJAX_TARGET_AVX2 void HorizontalRowAvx2(const int16_t* mid, const HBlocks& h, int out_w,
                                          uint8_t* dst) {
  const __m256i pick = _mm256_setr_epi8(TBLJAX_PAIR_SHUFFLE, TBLJAX_PAIR_SHUFFLE);
  const __m128i compact = _mm_setr_epi8(TBLJAX_RGB0_TO_RGB);
  const __m256i round = _mm256_set1_epi32(1 << (kHShift - 1));
  for (int b = 0, ox = 0; ox < out_w; ++b, ox += 4) {
    const int32_t* o = &h.offset[ox];
    const int32_t* w = &h.weights[static_cast<size_t>(b) * h.stride * 16];
    __m256i s01 = round, s23 = round;
    for (int j = 0, step = 0; j < h.npairs[b]; ++j, step += 6, w += 16) {
      const __m256i v01 = _mm256_inserti128_si256(
          _mm256_castsi128_si256(
              _mm_loadu_si128(reinterpret_cast<const __m128i*>(mid + o[0] + step))),
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(mid + o[1] + step)), 1);
      const __m256i v23 = _mm256_inserti128_si256(
          _mm256_castsi128_si256(
              _mm_loadu_si128(reinterpret_cast<const __m128i*>(mid + o[2] + step))),
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(mid + o[3] + step)), 1);
      s01 = _mm256_add_epi32(
          s01, _mm256_madd_epi16(_mm256_shuffle_epi8(v01, pick),
                                 _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w))));
      s23 = _mm256_add_epi32(
          s23, _mm256_madd_epi16(_mm256_shuffle_epi8(v23, pick),
                                 _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 8))));
    }
    // packs + packus saturate to [0, 255]. Lanes: [p0 p2 p0 p2 | p1 p3 p1 p3], 4 bytes each.
    const __m256i m =
        _mm256_packs_epi32(_mm256_srai_epi32(s01, kHShift), _mm256_srai_epi32(s23, kHShift));
    const __m256i u8 = _mm256_packus_epi16(m, m);
    const __m128i px =
        _mm_unpacklo_epi32(_mm256_castsi256_si128(u8), _mm256_extracti128_si256(u8, 1));
    StoreRgb(_mm_shuffle_epi8(px, compact), dst + 3 * ox, out_w - ox, 3 * ox + 16 <= 3 * out_w);
  }
}

TBLJAX_TARGET_AVX512 void HorizontalRowAvx512(const int16_t* mid, const HBlocks& h, int out_w,
                                              uint8_t* dst) {
  const __m512i pick = _mm512_broadcast_i32x4(_mm_setr_epi8(TBLJAX_PAIR_SHUFFLE));
  const __m128i compact = _mm_setr_epi8(TBLJAX_RGB0_TO_RGB);
  const __m512i round = _mm512_set1_epi32(1 << (kHShift - 1));
  const __m512i zero = _mm512_setzero_si512();
  for (int b = 0, ox = 0; ox < out_w; ++b, ox += 4) {
    const int32_t* o = &h.offset[ox];
    const int32_t* w = &h.weights[static_cast<size_t>(b) * h.stride * 16];
    __m512i s = round;
    for (int j = 0, step = 0; j < h.npairs[b]; ++j, step += 6, w += 16) {
      __m512i v = _mm512_castsi128_si512(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(mid + o[0] + step)));
      v = _mm512_inserti32x4(
          v, _mm_loadu_si128(reinterpret_cast<const __m128i*>(mid + o[1] + step)), 1);
      v = _mm512_inserti32x4(
          v, _mm_loadu_si128(reinterpret_cast<const __m128i*>(mid + o[2] + step)), 2);
      v = _mm512_inserti32x4(
          v, _mm_loadu_si128(reinterpret_cast<const __m128i*>(mid + o[3] + step)), 3);
      s = _mm512_add_epi32(s,
                           _mm512_madd_epi16(_mm512_shuffle_epi8(v, pick), _mm512_loadu_si512(w)));
    }
    // Clamp to [0, 255]: max with 0, then vpmovusdb saturates above.
    const __m128i px =
        _mm512_cvtusepi32_epi8(_mm512_max_epi32(_mm512_srai_epi32(s, kHShift), zero));
    StoreRgb(_mm_shuffle_epi8(px, compact), dst + 3 * ox, out_w - ox, 3 * ox + 16 <= 3 * out_w);
  }
}
#undef TBLJAX_PAIR_SHUFFLE
#undef TBLJAX_RGB0_TO_RGB
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif  // TBLJAX_SIMD_X86

// Packs a Taps' int16 weights into (w[2j], w[2j+1]) pairs, (t.stride + 1) / 2 per output,
// and returns that stride.
int PackPairs(const Taps& t, std::vector<int32_t>* pairs) {
  const int stride = (t.stride + 1) / 2;
  pairs->assign(t.first.size() * stride, 0);
  for (size_t i = 0; i < t.first.size(); ++i) {
    const int16_t* w = &t.w[i * t.stride];
    for (int k = 0; k < t.count[i]; ++k) {
      const uint32_t bits = static_cast<uint16_t>(w[k]);
      (*pairs)[i * stride + k / 2] |= static_cast<int32_t>(bits << (16 * (k % 2)));
    }
  }
  return stride;
}

struct Scratch {
  // The taps for (taps_h, taps_w, taps_plan): ComputeTaps is a pure function of these, and a
  // decode asks for the same taps twice (ResizeSourceRect, then the resize), as do images of
  // one size in a row.
  Taps tx, ty;
  int taps_h = 0, taps_w = 0;
  ResizePlan taps_plan;
  std::vector<double> tmp;
  std::vector<int16_t> mid;
  std::vector<int32_t> acc, xpairs, ypairs;
  std::vector<const uint8_t*> rows;
  HBlocks blocks;
};

// Per-thread, reused between calls.
Scratch& ThreadScratch() {
  static thread_local Scratch s;
  return s;
}

// s->tx and s->ty for this image and plan (computed unless they already are).
void UpdateTaps(Scratch* s, int src_h, int src_w, const ResizePlan& plan) {
  const ResizePlan& p = s->taps_plan;
  if (s->taps_h == src_h && s->taps_w == src_w && p.out_h == plan.out_h && p.out_w == plan.out_w &&
      p.box_x == plan.box_x && p.box_y == plan.box_y && p.box_w == plan.box_w &&
      p.box_h == plan.box_h)
    return;
  ComputeTaps(src_w, plan.box_x, plan.box_w, plan.out_w, &s->tx, &s->tmp);
  ComputeTaps(src_h, plan.box_y, plan.box_h, plan.out_h, &s->ty, &s->tmp);
  s->taps_h = src_h;
  s->taps_w = src_w;
  s->taps_plan = plan;
}

// round(a * b / c) for positive a, b, c, half up, in integers.
int64_t MulDivRound(int64_t a, int64_t b, int64_t c) { return (2 * a * b + c) / (2 * c); }

}  // namespace

Status ParseResizeMode(std::string_view name, ResizeMode* mode) {
  if (name == "center_crop") *mode = ResizeMode::kCenterCrop;
  else if (name == "squash") *mode = ResizeMode::kSquash;
  else if (name == "max_side") *mode = ResizeMode::kMaxSide;
  else if (name == "shorter_side") *mode = ResizeMode::kShorterSide;
  else
    return InvalidArgument(
        "resize mode must be 'center_crop', 'squash', 'max_side' or 'shorter_side', got '" +
        std::string(name) + "'");
  return Status::Ok();
}

const char* ResizeModeName(ResizeMode mode) {
  switch (mode) {
    case ResizeMode::kCenterCrop: return "center_crop";
    case ResizeMode::kSquash: return "squash";
    case ResizeMode::kMaxSide: return "max_side";
    case ResizeMode::kShorterSide: return "shorter_side";
  }
  return "?";
}

Status PlanResize(int src_h, int src_w, int size, ResizeMode mode, ResizePlan* plan, int max_long) {
  if (src_h < 1 || src_w < 1)
    return InvalidArgument("cannot resize an empty image (" + std::to_string(src_h) + "x" +
                           std::to_string(src_w) + ")");
  if (size < 1 || size > kMaxResizeSize)
    return InvalidArgument("size must be in [1, " + std::to_string(kMaxResizeSize) + "], got " +
                           std::to_string(size));
  if (max_long != 0 &&
      (mode != ResizeMode::kShorterSide || max_long < size || max_long > kMaxResizeSize))
    return InvalidArgument(
        mode != ResizeMode::kShorterSide
            ? std::string("a cap on the longer side applies to mode 'shorter_side' only, not '") +
                  ResizeModeName(mode) + "'"
            : "the cap on the longer side must be in [size, " + std::to_string(kMaxResizeSize) +
                  "] = [" + std::to_string(size) + ", " + std::to_string(kMaxResizeSize) +
                  "], got " + std::to_string(max_long));
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
    case ResizeMode::kShorterSide: {
      const int64_t lng = std::max(src_h, src_w), shrt = std::min(src_h, src_w);
      int64_t out_short = size, out_long = MulDivRound(lng, size, shrt);
      if (max_long > 0 && out_long > max_long) {
        out_long = max_long;
        out_short = std::max<int64_t>(1, MulDivRound(shrt, max_long, lng));
      }
      if (out_long > kMaxResizeSize)
        return InvalidArgument("resize 'shorter_side' " + std::to_string(size) + " of a " +
                               std::to_string(src_h) + "x" + std::to_string(src_w) +
                               " image gives a longer side of " + std::to_string(out_long) +
                               ", over the limit of " + std::to_string(kMaxResizeSize) +
                               ": cap it (max_long_side)");
      const bool wide = src_w >= src_h;
      p.out_w = static_cast<int>(wide ? out_long : out_short);
      p.out_h = static_cast<int>(wide ? out_short : out_long);
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
  UpdateTaps(&s, src_h, src_w, plan);
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
  UpdateTaps(&s, src_h, src_w, plan);
  PixelRect need;
  TapSpan(s.tx, &need.x0, &need.x1);
  TapSpan(s.ty, &need.y0, &need.y1);
  if (need.x0 < window.x0 || need.x1 > window.x1 || need.y0 < window.y0 || need.y1 > window.y1)
    return InvalidArgument("resize: the source window does not hold the pixels the filter reads");

  SimdTarget target = SimdTarget::kScalar;
  TBLJAX_RETURN_IF_ERROR(ActiveSimdTarget(&target));

  // Only the columns the horizontal taps touch go through the vertical pass (a centre crop
  // of a landscape photo skips the sides).
  const int col0 = need.x0;
  const int mid_w = (need.x1 - col0) * 3;
  // The SIMD horizontal passes read whole pairs of taps, 8 values at a time, for the most
  // taps in a block of 4 pixels: up to 3 * stride + 8 values past the span, with weight 0.
  s.mid.assign(static_cast<size_t>(mid_w) + 3 * s.tx.stride + 16, 0);
  s.acc.resize(mid_w);
  const int ypair_stride = (s.ty.stride + 1) / 2;
  s.rows.resize(2 * static_cast<size_t>(ypair_stride));
  if (target != SimdTarget::kScalar) {
    PackPairs(s.ty, &s.ypairs);
    const int xpair_stride = PackPairs(s.tx, &s.xpairs);
    BuildHBlocks(col0, s.tx.first, s.tx.count, s.xpairs, xpair_stride, &s.blocks);
  }
  const uint8_t* origin = src + (col0 - window.x0) * 3;

  for (int oy = 0; oy < plan.out_h; ++oy) {
    const int n = s.ty.count[oy];
    for (int k = 0; k < n; ++k)
      s.rows[k] = origin + static_cast<ptrdiff_t>(s.ty.first[oy] + k - window.y0) * src_stride;
    const int16_t* yw = &s.ty.w[static_cast<size_t>(oy) * s.ty.stride];
    uint8_t* out = dst + oy * dst_stride;
    switch (target) {
#if TBLJAX_SIMD_X86
      case SimdTarget::kAvx512:
      case SimdTarget::kAvx2: {
        if (n % 2) s.rows[n] = s.rows[n - 1];  // its weight is 0
        const int32_t* ypairs = &s.ypairs[static_cast<size_t>(oy) * ypair_stride];
        if (target == SimdTarget::kAvx512) {
          VerticalRowAvx512(s.rows.data(), ypairs, (n + 1) / 2, mid_w, s.mid.data(), yw, n,
                            s.acc.data());
          HorizontalRowAvx512(s.mid.data(), s.blocks, plan.out_w, out);
        } else {
          VerticalRowAvx2(s.rows.data(), ypairs, (n + 1) / 2, mid_w, s.mid.data(), yw, n,
                          s.acc.data());
          HorizontalRowAvx2(s.mid.data(), s.blocks, plan.out_w, out);
        }
        break;
      }
#endif
      default:
        VerticalRowScalar(s.rows.data(), yw, n, mid_w, s.mid.data(), s.acc.data());
        HorizontalRowScalar(s.mid.data(), col0, s.tx.first.data(), s.tx.count.data(), s.tx.w.data(),
                            s.tx.stride, plan.out_w, out);
        break;
    }
  }
  // Per-thread scratch should not pin memory after a huge image.
  if (s.mid.capacity() > (size_t{8} << 20)) s.mid = {};
  if (s.acc.capacity() > (size_t{8} << 20)) s.acc = {};
  return Status::Ok();
}

}  // namespace tbljax
