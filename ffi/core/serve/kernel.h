// The serve kernel: one fused, parallel pass that gathers RAW uint8 RGB records by index,
// optionally crops + resizes and flips them, normalizes, and writes a batch in the caller's
// dtype (uint8, float32, bfloat16) and layout (NHWC, NCHW). Framework-free; returns Status.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "contract.h"  // OutDType, Layout, the normalization contract, the argument checks
#include "status.h"

namespace tbljax {

class ThreadPool;

// ---------------------------------------------------------------------------------------
// Crop + resize: the exact integer arithmetic (every path must reproduce it bit-exactly)
// ---------------------------------------------------------------------------------------
//
// A crop box (y0, x0, h, w) in source pixels of a record P (H x W x 3, uint8) is resized to
// the output (OH, OW) with the triangle ("bilinear") filter, antialiased when shrinking: the
// filter of Pillow's BILINEAR and torchvision's antialiased bilinear, applied to the box
// alone (as `img.crop(box).resize(size, BILINEAR)`), with weights quantized to S = 11 bits
// (ONE = 2048). Per axis, with start = y0 | x0, len = h | w, out = OH | OW and
// M = max(len, out), output coordinate o in [0, out) reads the box's pixels j in [0, len)
// with the integer filter values
//
//   D_j = (2*j + 1) * out - (2*o + 1) * len    # 2*out * (pixel centre - sampling position)
//   u_j = max(0, 2*M - |D_j|)                  # the triangle of half-width max(1, len/out)
//
// (the sampling position of o is (o + 1/2) * len/out - 1/2 in box pixels). The taps are the
// j with u_j > 0, a run [lo, hi) of at most 2*M/out + 1 pixels. With sum = sum of u_j,
//
//   w_j = round(u_j * ONE / sum)                # nearest, halves up, in exact integers
//
// and ONE - sum of w_j (a few units at most) is added to the largest w_j (the first of equal
// ones), so the weights sum to exactly ONE. When len <= out (upscaling, or a plain crop) this
// is ordinary 2-tap bilinear interpolation, and len == out gives the pixel itself. With the
// weights wy of output row oy and wx of output column ox, the uint8 pixel of channel c is
// the exact integer sum, rounded half up once at the end:
//
//   acc = sum over (j, i) of wy_j * wx_i * P[y0 + j, x0 + i, c]   # 0 <= acc <= 255 * 2^22
//   out[oy, ox, c] = (acc + 2^21) >> 22                              # always in [0, 255]
//
// Every intermediate is an exact integer (weights are >= 0 and sum to ONE), so the order of
// the sums does not matter, and all of them fit in int32 when, per axis, 2 * out * len and
// 2 * M * (2 * M / out + 2) are below 2^31 (CheckResize; e.g. any box of a record with sides
// <= 65535 resized to an output side >= 9). Horizontal flip is applied after the resize:
// flipped[oy, ox] = out[oy, OW - 1 - ox]. Without a crop box the output size must equal the
// source size (no resize).

// The CUDA handler (ffi/xla/gather_cuda.cu) calls these from device code, so the formula has
// exactly one definition.
#if defined(__CUDACC__)
#define TBLJAX_HOST_DEVICE __host__ __device__
#else
#define TBLJAX_HOST_DEVICE
#endif

constexpr int kResizeWeightBits = 11;
constexpr int32_t kResizeOne = 1 << kResizeWeightBits;

// The taps of one output coordinate on one axis: box pixels [lo, hi), the sum of their
// filter values, which tap takes the rounding remainder and how much it is.
struct AxisTaps {
  int64_t lo, hi, sum, big;
  int32_t rest;
};

TBLJAX_HOST_DEVICE inline int64_t FloorDiv(int64_t a, int64_t b) {  // b > 0
  return a >= 0 ? a / b : -((-a + b - 1) / b);
}

// u_j of the formula above.
TBLJAX_HOST_DEVICE inline int64_t TapValue(int64_t j, int64_t o, int64_t len, int64_t out) {
  const int64_t m2 = 2 * (len > out ? len : out);
  int64_t d = (2 * j + 1) * out - (2 * o + 1) * len;
  d = d < 0 ? -d : d;
  return d < m2 ? m2 - d : 0;
}

// round(u * ONE / sum), halves up, without overflow.
TBLJAX_HOST_DEVICE inline int32_t RoundedWeight(int64_t u, int64_t sum) {
  const int64_t n = u * kResizeOne, q = n / sum, r = n % sum;
  return static_cast<int32_t>(q + (r >= sum - r ? 1 : 0));
}

TBLJAX_HOST_DEVICE inline AxisTaps ComputeAxisTaps(int64_t o, int64_t len, int64_t out) {
  const int64_t m2 = 2 * (len > out ? len : out), c = (2 * o + 1) * len - out;
  AxisTaps t;
  t.lo = FloorDiv(c - m2, 2 * out) + 1;  // |2*out*j - c| < 2*M
  t.hi = FloorDiv(c + m2 - 1, 2 * out) + 1;
  if (t.lo < 0) t.lo = 0;
  if (t.hi > len) t.hi = len;
  t.sum = 0;
  for (int64_t j = t.lo; j < t.hi; ++j) t.sum += TapValue(j, o, len, out);
  int32_t total = 0, best = -1;
  t.big = t.lo;
  for (int64_t j = t.lo; j < t.hi; ++j) {
    const int32_t w = RoundedWeight(TapValue(j, o, len, out), t.sum);
    total += w;
    if (w > best) {
      best = w;
      t.big = j;
    }
  }
  t.rest = kResizeOne - total;
  return t;
}

// The weight of box pixel j (in [t.lo, t.hi)) of output coordinate o.
TBLJAX_HOST_DEVICE inline int32_t TapWeight(const AxisTaps& t, int64_t j, int64_t o, int64_t len,
                                            int64_t out) {
  return RoundedWeight(TapValue(j, o, len, out), t.sum) + (j == t.big ? t.rest : 0);
}

// ---------------------------------------------------------------------------------------
// Normalization on the SIMD targets (the contract and its tables: contract.h)
// ---------------------------------------------------------------------------------------
// How the SIMD targets normalize. They compute y = x * a[c] + b[c] and round it, in float32
// with two FMAs about the channel's zero crossing ("affine-f32": kernel.cpp's Affine32), else
// in float64 with one FMA ("affine-f64", half the lanes and two conversions), each used only
// after checking at setup that it equals the table for all 3 x 256 inputs (trying a few
// neighbouring constants); otherwise they look the table up ("table"). The scalar target
// always uses the table. All three give the same bits.
enum class NormPath : int { kTable = 0, kAffineF64 = 1, kAffineF32 = 2 };
inline constexpr NormPath kNormPaths[] = {NormPath::kTable, NormPath::kAffineF64,
                                          NormPath::kAffineF32};
const char* NormPathName(NormPath p);  // "table", "affine-f64", "affine-f32"
// By name, or InvalidArgument "<arg>='x' is not one of: table, affine-f64, affine-f32".
Status ParseNormPath(std::string_view name, NormPath* out, const char* arg);
// The path the SIMD targets take for these parameters (ignoring the test cap below).
NormPath ChooseNormPath(const double mean[3], const double std[3], OutDType dtype);
// Tests only: caps the path the SIMD targets may take (default kAffineF32: no cap).
void SetNormPathLimit(NormPath limit);

// ---------------------------------------------------------------------------------------
// Sources and the gather
// ---------------------------------------------------------------------------------------

// A contiguous run of `num_records` records. Uniform sources: height*width*3 bytes each, back
// to back. Sources of records of different sizes: `bytes` long, records where the offset
// table says.
struct RawShard {
  const uint8_t* data = nullptr;
  int64_t num_records = 0;
  int64_t bytes = 0;  // sources of records of different sizes only
};

// Where each record of a source of records of different sizes lies: per record, its byte
// offset within its shard (offsets[i], or pages[i * stride] * page_bytes for records packed
// at page starts, as the in-jit op's operands hold them) and its height and width
// (heights[i * stride], widths[i * stride]). Not owned (the caller keeps it alive).
struct RecordTable {
  const int64_t* offsets = nullptr;
  const int32_t* pages = nullptr;
  int64_t page_bytes = 0;
  const int32_t* heights = nullptr;
  const int32_t* widths = nullptr;
  int64_t stride = 1;
};

// N records of uint8 RGB (HWC) spread over one or more shards, read as one sequence: record
// i lives in the shard whose range holds it. Either uniform (every record H x W) or of
// records of different sizes (a RecordTable). Does not own the memory.
class RawSource {
 public:
  RawSource() = default;
  static Status Create(std::vector<RawShard> shards, int64_t height, int64_t width, RawSource* out);
  // Records of different sizes. Nothing per record is checked here (O(1), so a handler can
  // build one per call): CheckRecord checks the records a batch reads.
  static Status CreateVariable(std::vector<RawShard> shards, RecordTable table, RawSource* out);
  // Record i (in range) has sides >= 1 and lies inside its shard, or InvalidArgument.
  Status CheckRecord(int64_t i) const;

  int64_t num_records() const { return num_records_; }
  bool uniform() const { return table_.heights == nullptr; }
  // Uniform sources only (0 otherwise).
  int64_t height() const { return height_; }
  int64_t width() const { return width_; }
  // Record i, which must be in [0, num_records()), and its size.
  const uint8_t* Record(int64_t i) const;
  int64_t Height(int64_t i) const {
    return uniform() ? height_ : table_.heights[i * table_.stride];
  }
  int64_t Width(int64_t i) const { return uniform() ? width_ : table_.widths[i * table_.stride]; }

 private:
  // Checks the shards, takes them and moves this source (geometry already set) into `out`.
  Status TakeShards(std::vector<RawShard> shards, RawSource* out);
  size_t ShardOf(int64_t i) const;
  int64_t Offset(int64_t i) const {
    return table_.offsets ? table_.offsets[i] : table_.pages[i * table_.stride] * table_.page_bytes;
  }
  std::vector<RawShard> shards_;
  std::vector<int64_t> starts_;  // first record index of each shard, plus num_records_
  RecordTable table_;
  int64_t num_records_ = 0, height_ = 0, width_ = 0;
};

// The per-image ops of issue 47 (docs/transforms-design.md), per sample b: the pixel program
// (K ops applied in order to the uint8 image after the resize and flip, before normalizing) and
// random erasing (E boxes set on the written float32/bfloat16 values). The rules, byte for byte,
// are src/tbljax/_src/rules/pixel_ops.py's; the op codes are its CODES. Not owned.
constexpr int kOpNone = 0, kOpAutoContrast = 1, kOpEqualize = 2, kOpInvert = 3, kOpPosterize = 4,
              kOpSolarize = 5, kOpSolarizeAdd = 6, kOpColor = 7, kOpContrast = 8, kOpBrightness = 9,
              kOpSharpness = 10, kOpRotate = 11, kOpTranslateYRel = 17, kOpCutout = 18,
              kOpGrayscale = 19, kOpGaussianBlur = 20, kOpTvRotate = 21, kOpTvTranslateY = 25,
              kOpHue = 26;
// 11..17: the affine ops (Rotate, ShearX/Y, TranslateX/Y[Rel]); 21..25 torchvision's (TvRotate,
// TvShearX/Y, TvTranslateX/Y): all resampled alike from their host-built matrices. 26: Hue
// (torchvision's adjust_hue through Pillow's HSV; arg the hue shift 0..255).
constexpr int kMaxOps = 64, kMaxEraseBoxes = 16, kNormalTableSize = 4096;
enum class EraseMode : int { kPixel = 0, kRand = 1, kConst = 2 };  // pixel_ops.erase's modes

struct OpsRequest {
  int64_t num_ops = 0;             // K (0: no pixel program)
  const uint8_t* codes = nullptr;  // (batch, K) op codes, 0 = none
  const int32_t* args = nullptr;   // (batch, K) each op's integer argument
  // (batch, K, 6) float64 for the affine ops: Pillow's (a, b, c, d, e, f), input point =
  // (a x + b y + c, d x + e y + f) at output pixel centre (x, y) -- built on the host
  // (pixel_ops.affine_matrix), so this core never rounds a cosine.
  const double* matrices = nullptr;
  const uint8_t* fill = nullptr;         // (K, 3): each slot's fill (affine, Cutout)
  const uint8_t* nearest = nullptr;      // (K,): nonzero: the slot's affine op resamples nearest
  int64_t num_erase = 0;                 // E (0: no erasing)
  const int32_t* erase_boxes = nullptr;  // (batch, E, 4) y0, x0, h, w in the output; h 0: none
  const uint32_t* erase_keys = nullptr;  // (batch,) the noise key of each row
  EraseMode erase_mode = EraseMode::kPixel;
  const float* normal_table = nullptr;  // (kNormalTableSize,) pixel_ops.normal_table()
};

struct GatherRequest {
  const int64_t* indices = nullptr;  // (batch,) record indices, each in [0, N)
  int64_t batch = 0;
  const int32_t* crops = nullptr;    // (batch, 4) boxes y0, x0, h, w; null: no crop (then a
                                     // source of records of different sizes cannot be served)
  const uint8_t* flips = nullptr;    // (batch,) nonzero: flip horizontally; null: none
  double mean[3] = {0.0, 0.0, 0.0};  // ignored for uint8 output
  double std[3] = {1.0, 1.0, 1.0};
  OutDType dtype = OutDType::kFloat32;
  Layout layout = Layout::kNHWC;
  void* out = nullptr;                  // C-contiguous, aligned to its element size
  int64_t out_shape[4] = {0, 0, 0, 0};  // (B, OH, OW, 3) for NHWC, (B, 3, OH, OW) for NCHW
  const OpsRequest* ops = nullptr;      // null: no per-image ops (today's pass, unchanged)
  // NaFlex rows (issue 49) when patch > 0: sample b is resized to its own size
  // out_sizes[2b] x out_sizes[2b + 1] (multiples of patch; crops required) and written as its
  // gh x gw patches in NHWC: out is (B, T, patch * patch, 3), patch (gy, gx) is token
  // gy * gw + gx, its pixels (py, px) in row-major order; tokens gh * gw .. T - 1 are zeros.
  // The pixel program and erasing run at the sample's size (its erasing boxes inside it).
  int64_t patch = 0;
  const int32_t* out_sizes = nullptr;  // (batch, 2)
};

// The output size of sample b: its own under patches, else the batch's (oh, ow).
inline void SampleOutSize(const GatherRequest& r, int64_t b, int64_t oh, int64_t ow, int64_t* h,
                          int64_t* w) {
  *h = r.patch > 0 ? r.out_sizes[2 * b] : oh;
  *w = r.patch > 0 ? r.out_sizes[2 * b + 1] : ow;
}

// Runs the fused pass over the pool (ThreadPool::Default() when null). Validates everything
// before touching `out`; on error `out` is unchanged. Allocates nothing per call once each
// pool thread's scratch has grown to the largest output row seen.
Status Gather(const RawSource& source, const GatherRequest& request, ThreadPool* pool = nullptr);

namespace kernel_detail {
struct Plan;
}

// One sample's pixels as the kernel reads them: `height` packed rows of `width` RGB pixels,
// and the box (y0, x0, h, w) inside them that is resized to the output.
struct SamplePixels {
  const uint8_t* pixels = nullptr;
  int64_t height = 0, width = 0;
  int64_t y0 = 0, x0 = 0, h = 0, w = 0;
  int64_t stride = 0;  // bytes from one row to the next: width * 3 when 0
};

// The fused pass prepared once for a batch whose samples' pixels the caller supplies one at a
// time, from its own threads (serving compact records: each sample is decoded in a pool thread
// and run at once, while its pixels are still in cache). Prepare checks everything about the
// output (shape, dtype, alignment, normalization) and builds the per-batch tables; `indices`
// and `crops` of the request are not read. Run writes sample b's row of `out` (flipped when
// flips[b]), from any thread, each b at most once; it allocates nothing once the thread's
// scratch has grown to the largest box seen.
class SampleKernel {
 public:
  SampleKernel();
  ~SampleKernel();
  SampleKernel(SampleKernel&&) noexcept;
  SampleKernel& operator=(SampleKernel&&) noexcept;
  static Status Prepare(const GatherRequest& request, SampleKernel* out);
  int64_t out_h() const;
  int64_t out_w() const;
  // Sample b's output size: its own under patches (GatherRequest::out_sizes), else out_h/out_w.
  int64_t out_h(int64_t b) const;
  int64_t out_w(int64_t b) const;
  // InvalidArgument when the box does not lie inside the pixels or the output is past the
  // exact range (CheckCropBox); IOError when the thread's scratch cannot grow.
  Status Run(int64_t b, const SamplePixels& pixels) const;

 private:
  std::unique_ptr<kernel_detail::Plan> plan_;
};

}  // namespace tbljax
