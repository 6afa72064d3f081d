// Fancy upsampling and colour conversion of YCbCr 4:2:0 planes (see jpeg_color.h). The
// arithmetic is libjpeg-turbo's: jdsample.c's h2v2_fancy_upsample (a 3:1 triangle on each axis,
// rounded by +8 and +7 alternately) and jdcolor.c's ycc_rgb_convert (16-bit fixed point,
// clamped to [0, 255]); its SIMD versions give the same bytes.
#include "jpeg_color.h"

#include <algorithm>
#include <cstring>

#include "simd.h"

#if TBLJAX_SIMD_X86
#include <immintrin.h>
#endif

namespace tbljax {

namespace {

// jdcolor.c's constants: FIX(x) with SCALEBITS = 16.
constexpr int kScaleBits = 16;
constexpr int32_t Fix(double x) { return static_cast<int32_t>(x * (1 << kScaleBits) + 0.5); }
constexpr int32_t kCrR = Fix(1.40200), kCbB = Fix(1.77200);
constexpr int32_t kCbG = Fix(0.34414), kCrG = Fix(0.71414);
constexpr int32_t kHalf = 1 << (kScaleBits - 1);

inline uint8_t Clamp255(int v) { return static_cast<uint8_t>(std::clamp(v, 0, 255)); }

// One upsampled chroma sample of output pixel x on a row whose own chroma row is `t` and whose
// nearer neighbour row is `o`: libjpeg's column sums 3 * t + o, then 3 * this + the nearer
// column's sum, + 8 for an even pixel (its left neighbour) and + 7 for an odd one (its right).
// The padding (PadChromaEdges) stands in for the column past either edge.
inline int Upsampled(const uint8_t* t, const uint8_t* o, int x) {
  const int j = x >> 1, n = x & 1 ? j + 1 : j - 1;
  return (3 * (3 * t[j] + o[j]) + 3 * t[n] + o[n] + (x & 1 ? 7 : 8)) >> 4;
}

inline void ToRgb(int y, int cb, int cr, uint8_t* out) {
  cb -= 128;
  cr -= 128;
  out[0] = Clamp255(y + ((kCrR * cr + kHalf) >> kScaleBits));
  out[1] = Clamp255(y + ((-kCbG * cb + kHalf - kCrG * cr) >> kScaleBits));
  out[2] = Clamp255(y + ((kCbB * cb + kHalf) >> kScaleBits));
}

// Columns [x0, x1) of one output row, a pixel at a time.
void RowScalar(const uint8_t* y, const uint8_t* cbt, const uint8_t* cbo, const uint8_t* crt,
               const uint8_t* cro, int x0, int x1, uint8_t* out) {
  for (int x = x0; x < x1; ++x, out += 3)
    ToRgb(y[x], Upsampled(cbt, cbo, x), Upsampled(crt, cro, x), out);
}

#if TBLJAX_SIMD_X86
// 32 pixels at a time as 16-bit lanes. The upsampled chroma comes out as pixels (0-7, 16-23)
// and (8-15, 24-31) of the 32, two 128-bit halves each: the order of the luma unpacked from
// bytes, and the one the final pack to bytes puts back in sequence.

// 16 column sums 3 * t + o, of chroma columns [j, j + 16).
TBLJAX_TARGET_AVX2 inline __m256i ColumnSums(const uint8_t* t, const uint8_t* o, int j) {
  const __m256i a = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(t + j)));
  const __m256i b = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(o + j)));
  return _mm256_add_epi16(_mm256_add_epi16(a, _mm256_slli_epi16(a, 1)), b);
}

TBLJAX_TARGET_AVX2 inline void UpsampleAvx2(const uint8_t* t, const uint8_t* o, int j, __m256i* a,
                                            __m256i* b) {
  const __m256i here = ColumnSums(t, o, j);
  const __m256i three = _mm256_add_epi16(here, _mm256_slli_epi16(here, 1));
  const __m256i even = _mm256_srli_epi16(
      _mm256_add_epi16(_mm256_add_epi16(three, ColumnSums(t, o, j - 1)), _mm256_set1_epi16(8)), 4);
  const __m256i odd = _mm256_srli_epi16(
      _mm256_add_epi16(_mm256_add_epi16(three, ColumnSums(t, o, j + 1)), _mm256_set1_epi16(7)), 4);
  *a = _mm256_unpacklo_epi16(even, odd);
  *b = _mm256_unpackhi_epi16(even, odd);
}

// floor((c * x + 2^15) / 2^16) for 16-bit x and c, exactly: the product's high half, plus one
// where its low half is 2^15 or more.
TBLJAX_TARGET_AVX2 inline __m256i MulRound(__m256i x, int16_t c) {
  const __m256i k = _mm256_set1_epi16(c);
  return _mm256_add_epi16(_mm256_mulhi_epi16(x, k),
                          _mm256_srli_epi16(_mm256_mullo_epi16(x, k), 15));
}

// R, G, B of 16 pixels (16-bit lanes) from their luma and chroma.
TBLJAX_TARGET_AVX2 inline void RgbAvx2(__m256i y, __m256i cb, __m256i cr, __m256i* r, __m256i* g,
                                       __m256i* b) {
  const __m256i bias = _mm256_set1_epi16(128);
  cb = _mm256_sub_epi16(cb, bias);
  cr = _mm256_sub_epi16(cr, bias);
  // kCrR = 2^16 + 26345 and kCbB = 2^17 - 14942: the multiples of 2^16 are whole lanes of cr, cb.
  static_assert(kCrR - (1 << 16) == 26345 && (2 << 16) - kCbB == 14942, "jdcolor.c's constants");
  *r = _mm256_add_epi16(y, _mm256_add_epi16(cr, MulRound(cr, 26345)));
  *b = _mm256_add_epi16(y, _mm256_add_epi16(_mm256_add_epi16(cb, cb), MulRound(cb, -14942)));
  // G: -kCbG * cb - kCrG * cr = -kCbG * cb + (2^16 - kCrG) * cr - 2^16 * cr, the first two as
  // one 32-bit multiply-add of the lanes paired.
  static_assert(kCbG <= 32768 && (1 << 16) - kCrG < 32768, "the pair's factors fit 16 bits");
  const __m256i k = _mm256_set1_epi32(static_cast<int32_t>(
      static_cast<uint32_t>((1 << 16) - kCrG) << 16 | static_cast<uint16_t>(-kCbG)));
  const __m256i half = _mm256_set1_epi32(kHalf);
  const __m256i lo = _mm256_srai_epi32(
      _mm256_add_epi32(_mm256_madd_epi16(_mm256_unpacklo_epi16(cb, cr), k), half), kScaleBits);
  const __m256i hi = _mm256_srai_epi32(
      _mm256_add_epi32(_mm256_madd_epi16(_mm256_unpackhi_epi16(cb, cr), k), half), kScaleBits);
  *g = _mm256_add_epi16(y, _mm256_sub_epi16(_mm256_packs_epi32(lo, hi), cr));
}

// The shuffles that interleave 16 bytes each of R, G, B into 48: kInterleave[k][c][i] is the
// byte of channel c's 16 that lands at byte 16 * k + i of the 48, or 0x80 (none).
struct InterleaveMasks {
  alignas(16) uint8_t m[3][3][16];
  constexpr InterleaveMasks() : m() {
    for (int k = 0; k < 3; ++k)
      for (int i = 0; i < 16; ++i)
        for (int c = 0; c < 3; ++c)
          m[k][c][i] = (16 * k + i) % 3 == c ? static_cast<uint8_t>((16 * k + i) / 3) : 0x80;
  }
};
constexpr InterleaveMasks kInterleave;

TBLJAX_TARGET_AVX2 inline __m256i Mask(int k, int c) {
  return _mm256_broadcastsi128_si256(
      _mm_load_si128(reinterpret_cast<const __m128i*>(kInterleave.m[k][c])));
}

TBLJAX_TARGET_AVX2 inline __m256i Part(__m256i r, __m256i g, __m256i b, int k) {
  return _mm256_or_si256(
      _mm256_or_si256(_mm256_shuffle_epi8(r, Mask(k, 0)), _mm256_shuffle_epi8(g, Mask(k, 1))),
      _mm256_shuffle_epi8(b, Mask(k, 2)));
}

// 32 pixels from column x (even) to out.
TBLJAX_TARGET_AVX2 inline void Pixels32(const uint8_t* y, const uint8_t* cbt, const uint8_t* cbo,
                                        const uint8_t* crt, const uint8_t* cro, int x,
                                        uint8_t* out) {
  const __m256i zero = _mm256_setzero_si256();
  __m256i cba, cbb, cra, crb;
  UpsampleAvx2(cbt, cbo, x >> 1, &cba, &cbb);
  UpsampleAvx2(crt, cro, x >> 1, &cra, &crb);
  const __m256i luma = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y + x));
  __m256i ra, ga, ba, rb, gb, bb;
  RgbAvx2(_mm256_unpacklo_epi8(luma, zero), cba, cra, &ra, &ga, &ba);
  RgbAvx2(_mm256_unpackhi_epi8(luma, zero), cbb, crb, &rb, &gb, &bb);
  // Bytes, clamped to [0, 255] as libjpeg's range limit does, pixels 0-31 in order.
  const __m256i r = _mm256_packus_epi16(ra, rb), g = _mm256_packus_epi16(ga, gb),
                b = _mm256_packus_epi16(ba, bb);
  // Each 128-bit half interleaved: part k holds bytes [16k, 16k + 16) of each half's 48.
  const __m256i p0 = Part(r, g, b, 0), p1 = Part(r, g, b, 1), p2 = Part(r, g, b, 2);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm256_permute2x128_si256(p0, p1, 0x20));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 32),
                      _mm256_permute2x128_si256(p2, p0, 0x30));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 64),
                      _mm256_permute2x128_si256(p1, p2, 0x31));
}

TBLJAX_TARGET_AVX2 void RowAvx2(const uint8_t* y, const uint8_t* cbt, const uint8_t* cbo,
                                const uint8_t* crt, const uint8_t* cro, int x0, int x1,
                                uint8_t* out) {
  int x = x0;
  for (; x + 32 <= x1; x += 32, out += 96) Pixels32(y, cbt, cbo, crt, cro, x, out);
  if (x == x1) return;
  // The last 1-31 pixels: 32 made (from samples past the row's end, which only pixels past
  // x1 depend on: kYccSlack), the ones wanted copied.
  alignas(32) uint8_t last[96];
  Pixels32(y, cbt, cbo, crt, cro, x, last);
  std::memcpy(out, last, static_cast<size_t>(x1 - x) * 3);
}

#endif  // TBLJAX_SIMD_X86

}  // namespace

void PadChromaEdges(uint8_t* plane, ptrdiff_t stride, int rows, int samples) {
  for (int i = 0; i < rows; ++i) {
    uint8_t* row = plane + i * stride;
    row[-1] = row[0];
    row[samples] = row[samples - 1];
  }
}

void Ycc420ToRgb(const Ycc420Planes& p, int y0, int y1, int x0, int x1, uint8_t* out,
                 ptrdiff_t out_stride) {
  auto row = &RowScalar;
#if TBLJAX_SIMD_X86
  // The avx512 target runs the AVX2 rows: a 512-bit version measured no faster on a Zen 4
  // (benchmarks/README.md, "Colour from the planes").
  if (ActiveSimdTargetAtLeast(SimdTarget::kAvx2)) row = &RowAvx2;
#endif
  const int last = ChromaSize(p.height) - 1;
  for (int y = y0; y < y1; ++y) {
    // The row's own chroma row and its nearer neighbour (above for an even row, below for an
    // odd one); past the top or bottom, the edge row again.
    const int t = y >> 1, o = y & 1 ? std::min(t + 1, last) : std::max(t - 1, 0);
    const ptrdiff_t ts = t * p.c_stride, os = o * p.c_stride;
    row(p.y + y * p.y_stride, p.cb + ts, p.cb + os, p.cr + ts, p.cr + os, x0, x1,
        out + (y - y0) * out_stride);
  }
}

}  // namespace tbljax
