// Fancy upsampling and colour conversion of YCbCr 4:2:0 planes (see jpeg_color.h). The
// arithmetic is libjpeg-turbo's: jdsample.c's h2v2_fancy_upsample (a 3:1 triangle on each axis,
// rounded by +8 and +7 alternately) and jdcolor.c's ycc_rgb_convert (16-bit fixed point,
// clamped to [0, 255]); its SIMD versions (jpeg_color.inc) give the same bytes.
#include "jpeg_color.h"

#include <algorithm>
#include <cstring>

namespace tbljax {
namespace color_detail {
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

}  // namespace
}  // namespace color_detail
}  // namespace tbljax

#define TBLJAX_SIMD_INC "jpeg_color.inc"
#define TBLJAX_SIMD_TOP 1
#include "simd_dispatch.h"

namespace tbljax {
namespace color_detail {
TBLJAX_SIMD_EXPORT(Row);
}  // namespace color_detail

void PadChromaEdges(uint8_t* plane, ptrdiff_t stride, int rows, int samples) {
  for (int i = 0; i < rows; ++i) {
    uint8_t* row = plane + i * stride;
    row[-1] = row[0];
    row[samples] = row[samples - 1];
  }
}

void Ycc420ToRgb(const Ycc420Planes& p, int y0, int y1, int x0, int x1, uint8_t* out,
                 ptrdiff_t out_stride) {
  // The avx512 target runs the AVX2 rows (jpeg_color.inc).
  const auto row = TBLJAX_SIMD_DISPATCH(color_detail::Row);
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
