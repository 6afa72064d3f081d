// The serve kernel: one fused, parallel pass that gathers RAW uint8 RGB records by index,
// optionally crops + resizes and flips them, normalizes, and writes a batch in the caller's
// dtype (uint8, float32, bfloat16) and layout (NHWC, NCHW). Framework-free; returns Status.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "contract.h"  // OutDType, Layout, the normalization contract, the argument checks
#include "simd.h"      // the SIMD target the kernel runs
#include "status.h"

namespace tbljax {

class ThreadPool;

// ---------------------------------------------------------------------------------------
// Crop + resize: the exact integer arithmetic (every path must reproduce it bit-exactly)
// ---------------------------------------------------------------------------------------
//
// A crop box (y0, x0, h, w) in source pixels of a record P (H x W x 3, uint8) is resized to
// the output (OH, OW) by bilinear interpolation with pixel centres at half-integers (the
// "align_corners=False" source coordinates of OpenCV INTER_LINEAR; no antialiasing when
// shrinking), with weights quantized to S = 11 bits (ONE = 2048). Per axis, with
// start = y0 | x0, len = h | w and out = OH | OW, output coordinate o in [0, out) maps to two
// source taps and weights:
//
//   n  = max(0, (2*o + 1) * len - out)     # 2*out * (source position inside the box),
//                                          # source position = (o + 1/2) * len/out - 1/2
//   i  = n // (2*out)                      # integer part; always 0 <= i <= len - 1
//   f  = n %  (2*out)                      # fractional part, in units of 1/(2*out)
//   w1 = (f * ONE + out) // (2*out)        # weight of the next pixel, rounded half up,
//   w0 = ONE - w1                          #   0 <= w1 <= ONE
//   s0 = start + i
//   s1 = start + min(i + 1, len - 1)       # clamp at the box's last pixel
//
// (// and % are floor division and remainder of non-negative integers.) With the taps
// (sy0, sy1, wy0, wy1) of row oy and (sx0, sx1, wx0, wx1) of column ox, the uint8 pixel of
// channel c is the exact integer bilinear sum, rounded half up once at the end:
//
//   acc = wy0 * (wx0 * P[sy0, sx0, c] + wx1 * P[sy0, sx1, c])
//       + wy1 * (wx0 * P[sy1, sx0, c] + wx1 * P[sy1, sx1, c])      # 0 <= acc <= 255 * 2^22
//   out[oy, ox, c] = (acc + 2^21) >> 22                              # always in [0, 255]
//
// Every intermediate is an exact integer, so the order of the sums does not matter, and all
// of them fit in int32 when 2*out*len < 2^31 and out < 2^19 (e.g. every side <= 32767). A
// box of the output's size (h == OH, w == OW) gives w1 = 0 everywhere: a plain crop, exactly.
// Horizontal flip is applied after the resize: flipped[oy, ox] = out[oy, OW - 1 - ox].
// Without a crop box the output size must equal the source size (no resize).

// The CUDA handler (ffi/xla/gather_cuda.cu) calls ComputeAxisTap from device code, so the
// formula has exactly one definition.
#if defined(__CUDACC__)
#define TBLJAX_HOST_DEVICE __host__ __device__
#else
#define TBLJAX_HOST_DEVICE
#endif

constexpr int kResizeWeightBits = 11;
constexpr int32_t kResizeOne = 1 << kResizeWeightBits;

// The taps of output coordinate `o` on one axis (the formula above).
struct AxisTap {
  int64_t s0, s1;  // absolute source coordinates
  int32_t w0, w1;  // weights, w0 + w1 == kResizeOne
};
TBLJAX_HOST_DEVICE inline AxisTap ComputeAxisTap(int64_t o, int64_t start, int64_t len,
                                                 int64_t out) {
  int64_t n = (2 * o + 1) * len - out;
  if (n < 0) n = 0;
  const int64_t i = n / (2 * out), f = n % (2 * out);
  const int32_t w1 = static_cast<int32_t>((f * kResizeOne + out) / (2 * out));
  return {start + i, start + (i + 1 < len ? i + 1 : len - 1), kResizeOne - w1, w1};
}

// ---------------------------------------------------------------------------------------
// Normalization on the SIMD targets (the contract and its tables: contract.h)
// ---------------------------------------------------------------------------------------
// How the SIMD targets normalize. They compute y = x * a[c] + b[c] with one FMA and round
// it -- in float64 ("affine-f64"), or for bfloat16 output in float32 ("affine-f32", twice
// the lanes) -- after checking at setup that this equals the table for all 3 x 256 inputs
// (trying a few neighbouring constants); otherwise they look the table up ("table"). The
// scalar target always uses the table. All three give the same bits.
enum class NormPath : int { kTable = 0, kAffineF64 = 1, kAffineF32 = 2 };
const char* NormPathName(NormPath p);
// The path the SIMD targets take for these parameters (ignoring the test cap below).
NormPath ChooseNormPath(const double mean[3], const double std[3], OutDType dtype);
// Tests only: caps the path the SIMD targets may take (default kAffineF32: no cap).
void SetNormPathLimit(NormPath limit);

// ---------------------------------------------------------------------------------------
// Sources and the gather
// ---------------------------------------------------------------------------------------

// A contiguous run of `num_records` records of height*width*3 bytes each.
struct RawShard {
  const uint8_t* data = nullptr;
  int64_t num_records = 0;
};

// N records of H x W x 3 uint8 (RGB, HWC) spread over one or more shards, read as one
// sequence: record i lives in the shard whose range holds it. Does not own the memory.
class RawSource {
 public:
  RawSource() = default;
  static Status Create(std::vector<RawShard> shards, int64_t height, int64_t width, RawSource* out);

  int64_t num_records() const { return num_records_; }
  int64_t height() const { return height_; }
  int64_t width() const { return width_; }
  int64_t record_bytes() const { return height_ * width_ * 3; }
  // Record i, which must be in [0, num_records()).
  const uint8_t* Record(int64_t i) const;

 private:
  std::vector<RawShard> shards_;
  std::vector<int64_t> starts_;  // first record index of each shard, plus num_records_
  int64_t num_records_ = 0, height_ = 0, width_ = 0;
};

struct GatherRequest {
  const int64_t* indices = nullptr;  // (batch,) record indices, each in [0, N)
  int64_t batch = 0;
  const int32_t* crops = nullptr;    // (batch, 4) boxes y0, x0, h, w; null: no crop
  const uint8_t* flips = nullptr;    // (batch,) nonzero: flip horizontally; null: none
  double mean[3] = {0.0, 0.0, 0.0};  // ignored for uint8 output
  double std[3] = {1.0, 1.0, 1.0};
  OutDType dtype = OutDType::kFloat32;
  Layout layout = Layout::kNHWC;
  void* out = nullptr;                  // C-contiguous, aligned to its element size
  int64_t out_shape[4] = {0, 0, 0, 0};  // (B, OH, OW, 3) for NHWC, (B, 3, OH, OW) for NCHW
};

// Runs the fused pass over the pool (ThreadPool::Default() when null). Validates everything
// before touching `out`; on error `out` is unchanged. Allocates nothing per call once each
// pool thread's scratch has grown to the largest output row seen.
Status Gather(const RawSource& source, const GatherRequest& request, ThreadPool* pool = nullptr);

}  // namespace tbljax
