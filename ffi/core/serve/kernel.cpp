// The serve kernel (see kernel.h): validation, the choice of normalization path and the
// parallel driver. The per-pixel work lives in kernel.inc, compiled once per SIMD target
// (simd_dispatch.h; the active target, simd.h, chooses which one runs).
#include "kernel.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <string>
#include <type_traits>

#include "names.h"
#include "pixel_program.h"
#include "simd.h"
#include "thread_pool.h"

namespace tbljax {
namespace kernel_detail {

// Everything a unit of work needs, built once per Gather call on the caller's stack.
// Outputs at least this large are written with non-temporal stores (see Plan::stream).
constexpr int64_t kStreamMinBytes = int64_t{32} << 20;

// The float32 affine path's constants for one channel: y = x * A + B computed as
// fmaf(x - x0, hi, fmaf(x - x0, lo, c)). x0 is the channel's zero crossing (255 * mean) on a
// grid of 2^-16 where that lies in [0, 255] (coarser beyond), so x - x0 is exact in float32
// for every x in [0, 255]; hi + lo is A to about 48 bits; c is the value at x0, so small
// (|c| <= A * 2^-17 on that grid) that the inner FMA's rounding error is ~2^-24 of it. The
// outer FMA then rounds a value within ~1e-13 of x * A + B once (ChooseAffine checks it).
struct Affine32 {
  float x0, hi, lo, c;
};

struct Plan {
  SimdTarget target;
  const uint8_t* flips;
  OutDType dtype;
  Layout layout;
  uint8_t* out;
  int64_t elem_bytes;
  int64_t out_h, out_w;
  // Exact lookup tables (bit patterns), channel-major: table[c * 256 + x].
  alignas(64) float table_f32[3 * 256];
  alignas(64) uint16_t table_bf16[3 * 256];
  // y = round(fma(x, affine_a[c], affine_b[c])) in float64, used by the SIMD targets only
  // when it was checked to equal the table for all 3 x 256 inputs (use_affine).
  double affine_a[3], affine_b[3];
  bool use_affine;
  // y = round(fmaf(x - x0, hi, fmaf(x - x0, lo, c))) in float32 (Affine32), where that too was
  // checked to equal the table (twice the lanes of the float64 path, and no conversions
  // between float64 and the rest: on AMD Zen 4 the float32 output took 1.2x the time of uint8
  // on the float64 path, see benchmarks/README.md).
  Affine32 affine32[3];
  bool use_affine_f32;
  // Write the float32 output with non-temporal stores (SIMD targets): set for outputs well
  // past the last-level cache, which is every training batch (256 x 160 x 160 x 3 floats is
  // 78 MB). Measured +8% on a float32 NHWC gather of that size (benchmarks/README.md).
  bool stream;
  // The same constants repeated along the interleaved RGB order, seq[k] = const[k % 3], so
  // SIMD code loads its per-lane constants instead of building them per row.
  alignas(64) double seq_a64[48], seq_b64[48];
  alignas(64) float seq_x0_32[48], seq_hi32[48], seq_lo32[48], seq_c32[48];
  // The per-image ops (pixel_program.h); has_ops false: none, today's pass.
  bool has_ops;
  OpsRequest ops;
  // NaFlex rows (GatherRequest::patch; 0: none): each sample's row of `tokens` patches of
  // patch x patch pixels. The batch's plan holds the largest size (out_h, out_w); a unit runs
  // on a copy holding its sample's own (SamplePlan).
  int64_t patch;
  int64_t tokens;
  const int32_t* out_sizes;
};

// One horizontal tap: byte offsets of the two source pixels within a record row, weights.
struct XTap {
  int32_t o0, o1, w0, w1;
};

// 16 output pixels of the AVX-512 horizontal resampler: their taps all lie in one window of
// at most 64 source bytes, loaded once; word permutes then place each (left, right) tap pair
// next to its (w0, w1) weight pair for one vpmaddwd.
constexpr int kBlockPixels = 16;
struct alignas(64) HBlock {
  int16_t pair_index[6 * kBlockPixels];  // 48 elements x (left, right): word index in window
  int16_t weights[6 * kBlockPixels];     // 48 elements x (w0, w1)
  int64_t base;                          // window start, bytes from the row start
  uint64_t mask;                         // window bytes to load (never past the tap span)
};

// 8 elements (2 x 4) of a resampled row for the AVX2 resampler: each 128-bit half loads a
// 16-byte window that holds the taps of its 4 elements, and one byte shuffle places each
// (left, right) tap pair, zero-extended to words, next to its (w0, w1) pair for vpmaddwd.
struct alignas(32) LanePair {
  uint8_t shuffle[32];  // per half: 4 x (left byte, 0x80, right byte, 0x80)
  int16_t weights[16];  // 8 x (w0, w1)
  int64_t base[2];      // window start of each half, bytes from the row start
};

// Per-thread working memory, carved from one buffer that only ever grows.
struct Scratch {
  uint8_t* row;      // out_w * 3 u8: the resized / flipped row
  uint8_t* planes;   // 3 * out_w u8: a row split into channel planes (NCHW)
  int32_t* hrow[2];  // 2 x out_w * 3: horizontally resampled source rows
  XTap* xtaps;       // out_w
  HBlock* hblocks;   // out_w / kBlockPixels
  LanePair* lanes;   // 3 * out_w / 8
  // The general resize (any box; antialiased shrink), sized per batch (GeneralScratchInts):
  int32_t* mid;      // 3 * box width: the box's rows combined with one output row's weights
  int32_t* gx;       // 3 * out_w * (1 + taps): per output element its first element in mid
                     // and the weight of each tap (tap-major)
  int32_t* gy;       // taps: one output row's weights
  int32_t* gblocks;  // ColumnBlockInts(out_w): per 16 output elements, their lowest first
                     // element in mid and the span of mid their taps read (ColumnTaps)
  int64_t gx_stride;
};

// The most taps one output coordinate can have on an axis of `len` box pixels resized to
// `out` (kernel.h: at most 2*M/out + 1), plus one for safety.
inline int64_t MaxTaps(int64_t len, int64_t out) { return 2 * (len > out ? len : out) / out + 2; }

// The general resize's column-pass blocks (Scratch::gblocks) for an output row of out_w pixels.
inline int64_t ColumnBlockInts(int64_t out_w) { return 2 * (3 * out_w / 16 + 1); }

using UnitFn = void (*)(const Plan&, int64_t sample, const SamplePixels&, int64_t row_begin,
                        int64_t row_end, const Scratch&);

}  // namespace kernel_detail
}  // namespace tbljax

// ---- the per-target kernels: the same source compiled for each target ----
#define TBLJAX_SIMD_INC "kernel.inc"
#include "simd_dispatch.h"

namespace tbljax::kernel_detail {
TBLJAX_SIMD_EXPORT(RunUnit);
}  // namespace tbljax::kernel_detail

namespace tbljax {

using kernel_detail::Affine32;
using kernel_detail::Plan;
using kernel_detail::Scratch;
using kernel_detail::UnitFn;
using kernel_detail::XTap;

// ---------------------------------------------------------------------------------------
// Normalization paths of the SIMD targets
// ---------------------------------------------------------------------------------------

namespace {

// Whether y = x * a + b (one float64 FMA, then the rounding the SIMD targets use) reproduces
// channel c of the exact table for all 256 inputs. The SIMD code performs the same correctly
// rounded operations, so agreement here means bit-identical output.
bool AffineMatches(const Plan& p, int c, double a, double b) {
  for (int x = 0; x < 256; ++x) {
    const double y = std::fma(static_cast<double>(x), a, b);
    if (p.dtype == OutDType::kFloat32) {
      const float f = static_cast<float>(y), want = p.table_f32[c * 256 + x];
      if (std::memcmp(&f, &want, 4) != 0) return false;
    } else if (DoubleToBfloat16(y) != p.table_bf16[c * 256 + x]) {
      return false;
    }
  }
  return true;
}

// The same for the float32 path (Affine32), rounded to the output type as the SIMD targets
// round it: float32 as it is, bfloat16 to nearest even from the float32.
bool AffineF32Matches(const Plan& p, int c, const Affine32& k) {
  for (int x = 0; x < 256; ++x) {
    const float xc = static_cast<float>(x) - k.x0;
    const float y = std::fma(xc, k.hi, std::fma(xc, k.lo, k.c));
    uint32_t bits;
    std::memcpy(&bits, &y, 4);
    if (p.dtype == OutDType::kFloat32) {
      uint32_t want;
      std::memcpy(&want, &p.table_f32[c * 256 + x], 4);
      if (bits != want) return false;
    } else if (static_cast<uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16) !=
               p.table_bf16[c * 256 + x]) {
      return false;
    }
  }
  return true;
}

template <class F>
F StepUlps(F v, int k) {
  for (int i = 0; i < std::abs(k); ++i) v = std::nextafter(v, k > 0 ? F(HUGE_VAL) : F(-HUGE_VAL));
  return v;
}

// Picks float64 constants for the affine path, channel by channel. The obvious pair
// (1/(255 std), -mean/std) almost always matches the table; a few neighbouring doubles are
// tried before giving up, and then the exact table lookup is used instead.
void ChooseAffine(Plan* p, const double mean[3], const double std[3]) {
  p->use_affine = true;
  for (int c = 0; c < 3 && p->use_affine; ++c) {
    const double a0 = 1.0 / (255.0 * std[c]), b0 = -mean[c] / std[c];
    static constexpr int kSteps[] = {0, 1, -1, 2, -2};
    bool found = false;
    for (int da : kSteps) {
      for (int db : kSteps) {
        const double a = StepUlps(a0, da), b = StepUlps(b0, db);
        if (!found && AffineMatches(*p, c, a, b)) {
          p->affine_a[c] = a;
          p->affine_b[c] = b;
          found = true;
        }
      }
    }
    p->use_affine = found;
  }
  // Float32 constants, centred on the zero crossing z = 255 * mean rounded to a grid of 2^-(24-e),
  // fine enough that c is tiny yet coarse enough that x - x0 stays exact: |x - x0| < 2^e for
  // every x in [0, 255], so x - x0 needs at most 24 significant bits.
  p->use_affine_f32 = true;
  for (int c = 0; c < 3 && p->use_affine_f32; ++c) {
    const double a = 1.0 / (255.0 * std[c]), z = 255.0 * mean[c];
    const double reach = std::max(std::fabs(z), std::fabs(255.0 - z)) + 1.0;
    int e = 8;
    while (e <= 24 && std::ldexp(1.0, e) < reach) ++e;
    if (!std::isfinite(a) || !std::isfinite(z) || e > 24) {  // x - x0 could not be exact
      p->use_affine_f32 = false;
      break;
    }
    const double x0 = std::ldexp(std::round(std::ldexp(z, 24 - e)), e - 24);
    Affine32 k;
    k.x0 = static_cast<float>(x0);  // exact: at most 24 significant bits
    k.hi = static_cast<float>(a);
    const float lo = static_cast<float>(a - static_cast<double>(k.hi));
    const float c0 = static_cast<float>((x0 / 255.0 - mean[c]) / std[c]);
    static constexpr int kSteps[] = {0, 1, -1, 2, -2};
    bool found = false;
    for (int dl : kSteps) {
      for (int dc : kSteps) {
        k.lo = StepUlps(lo, dl);
        k.c = StepUlps(c0, dc);
        if (!found && AffineF32Matches(*p, c, k)) {
          p->affine32[c] = k;
          found = true;
        }
      }
    }
    p->use_affine_f32 = found;
  }
}

}  // namespace

namespace {
std::atomic<int> g_norm_path_limit{static_cast<int>(NormPath::kAffineF32)};
}  // namespace

const char* NormPathName(NormPath p) {
  switch (p) {
    case NormPath::kTable: return "table";
    case NormPath::kAffineF64: return "affine-f64";
    case NormPath::kAffineF32: return "affine-f32";
  }
  return "?";
}

Status ParseNormPath(std::string_view name, NormPath* out, const char* arg) {
  return ParseByName(name, kNormPaths, NormPathName, arg, out);
}

void SetNormPathLimit(NormPath limit) { g_norm_path_limit.store(static_cast<int>(limit)); }

NormPath ChooseNormPath(const double mean[3], const double std[3], OutDType dtype) {
  if (dtype == OutDType::kUint8) return NormPath::kTable;
  Plan p;
  p.dtype = dtype;
  if (dtype == OutDType::kFloat32) NormalizeTableF32(mean, std, p.table_f32);
  if (dtype == OutDType::kBfloat16) NormalizeTableBf16(mean, std, p.table_bf16);
  ChooseAffine(&p, mean, std);
  if (p.use_affine_f32) return NormPath::kAffineF32;
  return p.use_affine ? NormPath::kAffineF64 : NormPath::kTable;
}

namespace {

UnitFn UnitFor(SimdTarget t) { return TBLJAX_SIMD_DISPATCH_FOR(t, kernel_detail::RunUnit); }

}  // namespace

// ---------------------------------------------------------------------------------------
// RawSource
// ---------------------------------------------------------------------------------------

Status RawSource::Create(std::vector<RawShard> shards, int64_t height, int64_t width,
                         RawSource* out) {
  if (height < 1 || width < 1)
    return InvalidArgument("records must be at least 1x1 pixels, got " + std::to_string(height) +
                           "x" + std::to_string(width));
  if (width > (int64_t{1} << 31) / 3 - 1)  // byte offsets within a row are int32
    return InvalidArgument("records " + std::to_string(width) + " pixels wide are not supported");
  if (shards.empty()) return InvalidArgument("a RawSource needs at least one shard");
  RawSource s;
  s.height_ = height;
  s.width_ = width;
  return s.TakeShards(std::move(shards), out);
}

Status RawSource::CreateVariable(std::vector<RawShard> shards, RecordTable table, RawSource* out) {
  if (shards.empty()) return InvalidArgument("a RawSource needs at least one shard");
  if (!(table.offsets || (table.pages && table.page_bytes > 0)) || !table.heights ||
      !table.widths || table.stride < 1)
    return InvalidArgument("a RawSource of records of different sizes needs its record table");
  RawSource s;
  s.table_ = table;
  return s.TakeShards(std::move(shards), out);
}

Status RawSource::TakeShards(std::vector<RawShard> shards, RawSource* out) {
  for (size_t k = 0; k < shards.size(); ++k) {
    if (shards[k].num_records < 0)
      return InvalidArgument("shard " + std::to_string(k) + " has a negative record count");
    if (shards[k].bytes < 0)
      return InvalidArgument("shard " + std::to_string(k) + " has a negative size");
    if (shards[k].num_records > 0 && shards[k].data == nullptr)
      return InvalidArgument("shard " + std::to_string(k) + " has records but no data");
    starts_.push_back(num_records_);
    num_records_ += shards[k].num_records;
  }
  starts_.push_back(num_records_);
  shards_ = std::move(shards);
  *out = std::move(*this);
  return Status::Ok();
}

Status RawSource::CheckRecord(int64_t i) const {
  if (uniform()) return Status::Ok();
  const size_t k = ShardOf(i);
  const int64_t h = Height(i), w = Width(i), off = Offset(i), bytes = shards_[k].bytes;
  if (h < 1 || w < 1 || w > (int64_t{1} << 31) / 3 - 1 || off < 0 || off > bytes ||
      h * w * 3 > bytes - off)
    return InvalidArgument("record " + std::to_string(i) + " (" + std::to_string(h) + "x" +
                           std::to_string(w) + " pixels at byte " + std::to_string(off) +
                           ") does not lie inside its shard of " + std::to_string(bytes) +
                           " bytes");
  return Status::Ok();
}

size_t RawSource::ShardOf(int64_t i) const {
  // The last shard whose first record is <= i; empty shards share a start and are skipped.
  const auto it = std::upper_bound(starts_.begin(), starts_.end() - 1, i);
  return static_cast<size_t>(it - starts_.begin()) - 1;
}

const uint8_t* RawSource::Record(int64_t i) const {
  const size_t k = ShardOf(i);
  if (!uniform()) return shards_[k].data + Offset(i);
  return shards_[k].data + (i - starts_[k]) * height_ * width_ * 3;
}

// ---------------------------------------------------------------------------------------
// Gather
// ---------------------------------------------------------------------------------------

namespace {

std::string ShapeStr(const int64_t s[4]) {
  return "(" + std::to_string(s[0]) + ", " + std::to_string(s[1]) + ", " + std::to_string(s[2]) +
         ", " + std::to_string(s[3]) + ")";
}

// Thread-local scratch, grown (never shrunk) to the largest row seen; a pool thread lives for
// the process, so steady-state batches allocate nothing.
struct ThreadScratch {
  std::unique_ptr<uint8_t[]> buf;
  size_t capacity = 0;
};

bool PrepareScratch(int64_t out_w, int64_t general_ints, int64_t gx_stride, Scratch* s) {
  thread_local ThreadScratch ts;
  const size_t row = static_cast<size_t>(out_w) * 3;
  auto up = [](size_t n) { return (n + 63) & ~size_t{63}; };
  // +64 slack after each piece: SIMD loops may read (never write) a few bytes past a row.
  const size_t row_b = up(row + 64), planes_b = up(row + 64), h_b = up(row * 4 + 64),
               taps_b = up(static_cast<size_t>(out_w) * sizeof(XTap) + 64),
               blocks_b = up(static_cast<size_t>(out_w / kernel_detail::kBlockPixels) *
                             sizeof(kernel_detail::HBlock));
  const size_t lanes_b = up(static_cast<size_t>(3 * out_w / 8) * sizeof(kernel_detail::LanePair));
  const size_t gen_b = up(static_cast<size_t>(general_ints) * 4 + 64);
  const size_t need = row_b + planes_b + 2 * h_b + taps_b + blocks_b + lanes_b + gen_b + 64;
  if (ts.capacity < need) {
    ts.buf.reset(new (std::nothrow) uint8_t[need]);
    ts.capacity = ts.buf ? need : 0;
    if (!ts.buf) return false;
  }
  uint8_t* p =
      reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(ts.buf.get()) + 63) & ~uintptr_t{63});
  s->row = p;
  p += row_b;
  s->planes = p;
  p += planes_b;
  s->hrow[0] = reinterpret_cast<int32_t*>(p);
  p += h_b;
  s->hrow[1] = reinterpret_cast<int32_t*>(p);
  p += h_b;
  s->xtaps = reinterpret_cast<XTap*>(p);
  p += taps_b;
  s->hblocks = reinterpret_cast<kernel_detail::HBlock*>(p);
  p += blocks_b;
  s->lanes = reinterpret_cast<kernel_detail::LanePair*>(p);
  p += lanes_b;
  s->gx_stride = gx_stride;
  s->gx = reinterpret_cast<int32_t*>(p);
  s->gy = s->gx + 3 * out_w * (1 + gx_stride);
  s->gblocks = s->gy + gx_stride;  // gx_stride >= the row taps too (see Gather)
  s->mid = s->gblocks + kernel_detail::ColumnBlockInts(out_w);
  return true;
}

}  // namespace

namespace {

// A NaFlex request (patch > 0): out (B, T, patch^2, 3) NHWC, a box per sample, and each sample's
// size a grid of at most T patches. *oh, *ow: the largest height and width of the batch.
Status CheckPatches(const GatherRequest& r, int64_t* oh, int64_t* ow) {
  const int64_t P = r.patch, T = r.out_shape[1];
  if (r.layout != Layout::kNHWC || r.out_shape[2] != P * P)
    return InvalidArgument("patches of " + std::to_string(P) + "x" + std::to_string(P) +
                           " need out of shape (B, T, " + std::to_string(P * P) +
                           ", 3) in layout NHWC, got " + ShapeStr(r.out_shape));
  if (r.batch > 0 && (r.out_sizes == nullptr || r.crops == nullptr))
    return InvalidArgument("patches need an output size and a crop box per sample");
  *oh = *ow = P;
  for (int64_t b = 0; b < r.batch; ++b) {
    const int64_t h = r.out_sizes[2 * b], w = r.out_sizes[2 * b + 1];
    const std::string size =
        "sizes[" + std::to_string(b) + "] = (" + std::to_string(h) + ", " + std::to_string(w) + ")";
    if (h < P || w < P || h % P != 0 || w % P != 0 || (h / P) * (w / P) > T)
      return InvalidArgument(size + " is not a grid of at most " + std::to_string(T) +
                             " patches of " + std::to_string(P) + "x" + std::to_string(P));
    *oh = std::max(*oh, h);
    *ow = std::max(*ow, w);
    if (r.ops != nullptr && r.ops->num_erase > 0) {  // the row's boxes inside its own size
      const OpsRequest& o = *r.ops;
      OpsRequest row;
      row.num_erase = o.num_erase;
      row.erase_boxes = o.erase_boxes ? o.erase_boxes + b * o.num_erase * 4 : nullptr;
      row.erase_keys = o.erase_keys ? o.erase_keys + b : nullptr;
      row.erase_mode = o.erase_mode;
      row.normal_table = o.normal_table;
      const Status s = CheckOps(row, 1, r.dtype, h, w);
      if (!s.ok()) return InvalidArgument(size + ": " + s.message());
    }
  }
  return Status::Ok();
}

// The output of a request: shape for its layout, dtype, alignment and normalization (not the
// indices or boxes). *oh, *ow: the output size.
Status CheckOutput(const GatherRequest& r, int64_t* oh, int64_t* ow) {
  if (r.batch < 0)
    return InvalidArgument("batch size must be >= 0, got " + std::to_string(r.batch));
  if (r.out == nullptr && r.batch > 0) return InvalidArgument("out is null");
  const bool nchw = r.layout == Layout::kNCHW;
  const int64_t* s = r.out_shape;
  const char* layout_name = LayoutName(nchw ? Layout::kNCHW : Layout::kNHWC);
  const int64_t ch = nchw ? s[1] : s[3];
  *oh = nchw ? s[2] : s[1];
  *ow = nchw ? s[3] : s[2];
  if (ch != 3 || *oh < 1 || *ow < 1)
    return InvalidArgument("out has shape " + ShapeStr(s) + " but layout " + layout_name +
                           " needs " + (nchw ? "(B, 3, OH, OW)" : "(B, OH, OW, 3)") +
                           " with OH, OW >= 1");
  if (s[0] != r.batch)
    return InvalidArgument("out has shape " + ShapeStr(s) + " (batch " + std::to_string(s[0]) +
                           ") but indices has " + std::to_string(r.batch) + " entries");
  const int64_t elem = OutDTypeBytes(r.dtype);
  if (elem == 0)
    return InvalidArgument("unknown output dtype " + std::to_string(static_cast<int>(r.dtype)));
  if (reinterpret_cast<uintptr_t>(r.out) % static_cast<uintptr_t>(elem) != 0)
    return InvalidArgument("out is not aligned to its element size (" + std::to_string(elem) +
                           " bytes)");
  if (r.dtype != OutDType::kUint8) TBLJAX_RETURN_IF_ERROR(CheckNormalization(r.mean, r.std));
  if (r.patch > 0) return CheckPatches(r, oh, ow);
  return Status::Ok();
}

// The per-call tables (~5 KB; built per call, a few microseconds, so nothing is shared or
// cached) for a request CheckOutput accepted.
Status FillPlan(const GatherRequest& r, int64_t oh, int64_t ow, Plan* p) {
  TBLJAX_RETURN_IF_ERROR(ActiveSimdTarget(&p->target));
  const int64_t elem = OutDTypeBytes(r.dtype);
  p->flips = r.flips;
  p->dtype = r.dtype;
  p->layout = r.layout;
  p->out = static_cast<uint8_t*>(r.out);
  p->elem_bytes = elem;
  p->out_h = oh;
  p->out_w = ow;
  p->use_affine = false;
  p->use_affine_f32 = false;
  p->stream = r.batch * oh * ow * 3 * elem >= kernel_detail::kStreamMinBytes;
  p->patch = r.patch;
  p->tokens = r.patch > 0 ? r.out_shape[1] : 0;
  p->out_sizes = r.out_sizes;
  if (r.patch > 0)
    p->stream =
        r.batch * p->tokens * r.patch * r.patch * 3 * elem >= kernel_detail::kStreamMinBytes;
  p->has_ops = r.ops != nullptr && (r.ops->num_ops > 0 || r.ops->num_erase > 0);
  if (p->has_ops) p->ops = *r.ops;
  if (r.dtype == OutDType::kFloat32) NormalizeTableF32(r.mean, r.std, p->table_f32);
  if (r.dtype == OutDType::kBfloat16) NormalizeTableBf16(r.mean, r.std, p->table_bf16);
  if (r.dtype != OutDType::kUint8 && p->target != SimdTarget::kScalar) {
    ChooseAffine(p, r.mean, r.std);
    const int limit = g_norm_path_limit.load();
    if (limit < static_cast<int>(NormPath::kAffineF32)) p->use_affine_f32 = false;
    if (limit < static_cast<int>(NormPath::kAffineF64)) p->use_affine = false;
    for (int k = 0; k < 48; ++k) {
      p->seq_a64[k] = p->affine_a[k % 3];
      p->seq_b64[k] = p->affine_b[k % 3];
      p->seq_x0_32[k] = p->affine32[k % 3].x0;
      p->seq_hi32[k] = p->affine32[k % 3].hi;
      p->seq_lo32[k] = p->affine32[k % 3].lo;
      p->seq_c32[k] = p->affine32[k % 3].c;
    }
  }
  return Status::Ok();
}

// The general resize's scratch (PrepareScratch's general_ints) for boxes at most max_cw wide
// and with at most `taps` taps per axis: mid (3 * max_cw), the per-element tables, the row
// taps, the column pass's blocks, and 3 * taps + 64 elements past mid's last (the column pass
// reads up to that far: ColumnTaps). 0 when no box takes the general path (max_cw 0).
int64_t GeneralInts(int64_t max_cw, int64_t taps, int64_t ow) {
  return max_cw == 0 ? 0
                     : 3 * max_cw + 3 * ow * (1 + taps) + 4 * taps + 64 +
                           kernel_detail::ColumnBlockInts(ow);
}

// Whether a ch x cw box resized to oh x ow takes the general path, and its most taps per axis.
bool TakesGeneralPath(int64_t ch, int64_t cw, int64_t oh, int64_t ow, int64_t* taps) {
  if (ch <= oh && cw <= ow) return false;  // the 2-tap path
  *taps = std::max({*taps, kernel_detail::MaxTaps(cw, ow), kernel_detail::MaxTaps(ch, oh)});
  return true;
}

// A row with ops, whole (its plan has one band): resize and flip into a uint8 image of this
// thread's, the pixel program on it, then normalize and write it as a plain copy (today's
// no-resize path, so the same bits as a row without ops would get from those pixels; NaFlex
// rows: into the sample's patches). The copy is the program's sink: its last op hands on its
// rows as it makes them, so their stores overlap the op's work (the copy as one pass after the
// program was ~45% of an Invert row's CPU at 224 px float32 (perf), ~23 us: a burst of 600 KB of
// stores with no work beside it; the resize of a row without ops hides the same stores).
struct OpsSink {
  const Plan* plan;  // the row's plan, flips cleared (flipped already)
  int64_t b;
  const Scratch* scratch;
  static void Put(void* ctx, const uint8_t* result, int64_t y0, int64_t y1) {
    const OpsSink& s = *static_cast<const OpsSink*>(ctx);
    SamplePixels image;
    image.pixels = result;
    image.height = image.h = s.plan->out_h;
    image.width = image.w = s.plan->out_w;
    UnitFor(s.plan->target)(*s.plan, s.b, image, y0, y1, *s.scratch);
  }
};

bool RunRowWithOps(const Plan& p, int64_t b, const SamplePixels& px, const Scratch& scratch) {
  thread_local std::unique_ptr<uint8_t[]> buf;
  thread_local size_t capacity = 0;
  const size_t n = static_cast<size_t>(p.out_h * p.out_w * 3);
  if (capacity < 2 * n) {
    buf.reset(new (std::nothrow) uint8_t[2 * n]);
    capacity = buf ? 2 * n : 0;
    if (!buf) return false;
  }
  thread_local std::unique_ptr<Plan> copy;  // ~6 KB: off the pool thread's stack, made once
  if (!copy) copy.reset(new (std::nothrow) Plan);
  if (!copy) return false;
  Plan* plan = copy.get();
  *plan = p;
  plan->dtype = OutDType::kUint8;
  plan->layout = Layout::kNHWC;
  plan->elem_bytes = 1;
  plan->stream = false;
  plan->patch = 0;  // the image, at the sample's own size (its plan's)
  plan->out = buf.get();
  plan->flips = p.flips ? p.flips + b : nullptr;  // its sample 0 is row b
  UnitFor(p.target)(*plan, 0, px, 0, p.out_h, scratch);
  *plan = p;
  plan->flips = nullptr;  // flipped already
  OpsSink sink{plan, b, &scratch};
  const OpsRequest& o = p.ops;
  ops_detail::ProgramJob job{buf.get(),
                             buf.get() + n,
                             p.out_h,
                             p.out_w,
                             o.num_ops,
                             o.codes + b * o.num_ops,
                             o.args + b * o.num_ops,
                             o.matrices + b * o.num_ops * 6,
                             o.fill,
                             o.nearest,
                             {&OpsSink::Put, &sink}};
  RunPixelProgram(p.target, job);  // every row through the sink
  return true;
}

// The plan of NaFlex sample b: the batch's with the sample's own output size, on a copy of
// this thread's (~6 KB, off the pool thread's stack); the batch's plan as it is otherwise.
// Band 0 of the sample also zeroes its tokens past its grid.
const Plan* SamplePlan(const Plan& p, int64_t b, int64_t row_begin) {
  if (p.patch == 0) return &p;
  thread_local std::unique_ptr<Plan> copy;
  if (!copy) copy.reset(new (std::nothrow) Plan);
  if (!copy) return nullptr;
  *copy = p;
  copy->out_h = p.out_sizes[2 * b];
  copy->out_w = p.out_sizes[2 * b + 1];
  if (row_begin == 0) {
    const int64_t token = p.patch * p.patch * 3 * p.elem_bytes;
    const int64_t used = (copy->out_h / p.patch) * (copy->out_w / p.patch);
    std::memset(p.out + (b * p.tokens + used) * token, 0,
                static_cast<size_t>((p.tokens - used) * token));
  }
  return copy.get();
}

// Erasing on NaFlex row b (its plan's size): the row's patches put together as an NHWC image
// of this thread's, erased there (RunErase: the rule's one home) and put back.
bool ErasePatchRow(const Plan& p, int64_t b) {
  thread_local std::unique_ptr<uint8_t[]> buf;
  thread_local size_t capacity = 0;
  const int64_t P = p.patch, gw = p.out_w / P, piece = P * 3 * p.elem_bytes, token = P * piece;
  const size_t n = static_cast<size_t>(p.out_h * p.out_w * 3 * p.elem_bytes);
  if (capacity < n) {
    buf.reset(new (std::nothrow) uint8_t[n]);
    capacity = buf ? n : 0;
    if (!buf) return false;
  }
  uint8_t* row = p.out + b * p.tokens * token;
  const auto copy = [&](bool back) {
    for (int64_t oy = 0; oy < p.out_h; ++oy) {
      for (int64_t gx = 0; gx < gw; ++gx) {
        uint8_t* image = buf.get() + oy * gw * piece + gx * piece;
        uint8_t* patch = row + ((oy / P) * gw + gx) * token + (oy % P) * piece;
        std::memcpy(back ? patch : image, back ? image : patch, static_cast<size_t>(piece));
      }
    }
  };
  copy(false);
  const OpsRequest& o = p.ops;
  RunErase(p.target,
           {buf.get(), p.dtype, Layout::kNHWC, 0, p.out_h, p.out_w, o.num_erase,
            o.erase_boxes + b * o.num_erase * 4, o.erase_keys[b], o.erase_mode, o.normal_table});
  copy(true);
  return true;
}

// Output rows [row_begin, row_end) of sample b from its pixels, on this thread's scratch.
bool RunRows(const Plan& batch_plan, int64_t b, const SamplePixels& px, int64_t general_ints,
             int64_t taps, int64_t row_begin, int64_t row_end) {
  Scratch scratch;
  if (!PrepareScratch(batch_plan.out_w, general_ints, taps, &scratch)) return false;
  const Plan* sample_plan = SamplePlan(batch_plan, b, row_begin);
  if (!sample_plan) return false;
  const Plan& p = *sample_plan;
  if (p.has_ops && p.ops.num_ops > 0 && RowHasOps(p.ops, b)) {
    if (!RunRowWithOps(p, b, px, scratch)) return false;
  } else {
    UnitFor(p.target)(p, b, px, row_begin, row_end, scratch);
  }
#if TBLJAX_SIMD_X86
  if (p.stream) _mm_sfence();  // the non-temporal stores land before the pool's "done"
#endif
  if (p.has_ops && p.ops.num_erase > 0 && RowHasErase(p.ops, b) && p.patch > 0) {
    if (!ErasePatchRow(p, b)) return false;
  } else if (p.has_ops && p.ops.num_erase > 0 && RowHasErase(p.ops, b)) {
    const OpsRequest& o = p.ops;
    RunErase(p.target,
             {p.out, p.dtype, p.layout, b, p.out_h, p.out_w, o.num_erase,
              o.erase_boxes + b * o.num_erase * 4, o.erase_keys[b], o.erase_mode, o.normal_table});
  }
  return true;
}

}  // namespace

Status Gather(const RawSource& src, const GatherRequest& r, ThreadPool* pool) {
  if (src.uniform() && src.height() < 1) return InvalidArgument("RawSource is not initialized");
  if (r.batch > 0 && r.indices == nullptr) return InvalidArgument("indices is null");
  int64_t oh = 0, ow = 0;
  TBLJAX_RETURN_IF_ERROR(CheckOutput(r, &oh, &ow));
  TBLJAX_RETURN_IF_ERROR(CheckIndices(r.indices, r.batch, src.num_records()));
  if (r.ops) TBLJAX_RETURN_IF_ERROR(CheckOps(*r.ops, r.batch, r.dtype, oh, ow));
  if (r.patch > 0) {  // each box against its record and its sample's own size
    for (int64_t b = 0; b < r.batch; ++b) {
      TBLJAX_RETURN_IF_ERROR(src.CheckRecord(r.indices[b]));
      TBLJAX_RETURN_IF_ERROR(CheckCropBox(b, r.crops + 4 * b, src.Height(r.indices[b]),
                                          src.Width(r.indices[b]), r.out_sizes[2 * b],
                                          r.out_sizes[2 * b + 1]));
    }
  } else if (src.uniform()) {
    TBLJAX_RETURN_IF_ERROR(CheckOutputSize(r.crops != nullptr, oh, ow, src.height(), src.width()));
    if (r.crops != nullptr)
      TBLJAX_RETURN_IF_ERROR(CheckCrops(r.crops, r.batch, src.height(), src.width(), oh, ow));
  } else {
    if (r.crops == nullptr && r.batch > 0)
      return InvalidArgument(
          "the records differ in size: the output size is fixed only by a crop box per sample "
          "(crop=...; e.g. augment=tbljax.Augment(size=(H, W)))");
    for (int64_t b = 0; b < r.batch; ++b) {
      TBLJAX_RETURN_IF_ERROR(src.CheckRecord(r.indices[b]));
      TBLJAX_RETURN_IF_ERROR(CheckCropBox(b, r.crops + 4 * b, src.Height(r.indices[b]),
                                          src.Width(r.indices[b]), oh, ow));
    }
  }
  // The general resize's scratch: the widest box and the most taps of the batch.
  int64_t max_cw = 0, taps = 2;
  for (int64_t b = 0; r.crops != nullptr && b < r.batch; ++b) {
    const int64_t ch = r.crops[4 * b + 2], cw = r.crops[4 * b + 3];
    int64_t sh, sw;
    SampleOutSize(r, b, oh, ow, &sh, &sw);
    if (TakesGeneralPath(ch, cw, sh, sw, &taps)) max_cw = std::max(max_cw, cw);
  }
  const int64_t general_ints = GeneralInts(max_cw, taps, ow);
  if (r.batch == 0) return Status::Ok();
  Plan p;
  TBLJAX_RETURN_IF_ERROR(FillPlan(r, oh, ow, &p));

  TBLJAX_RETURN_IF_ERROR(DefaultPool(&pool));
  ThreadPool& tp = *pool;
  // Samples are the unit of work; small batches are also split into row bands so every
  // thread has work (about 4 units per thread, as the pool hands out chunks).
  const int64_t want_units = 4 * static_cast<int64_t>(tp.num_threads());
  // A row with ops is one unit (its program needs the whole image).
  const int64_t bands =
      r.batch >= want_units || p.has_ops ? 1 : std::min(oh, (want_units + r.batch - 1) / r.batch);
  // The work item captures one pointer, so std::function keeps it inline (no allocation).
  struct Job {
    const Plan* plan;
    const RawSource* src;
    const GatherRequest* r;
    int64_t bands, general_ints, taps;
    std::atomic<bool> no_memory{false};
  } job{&p, &src, &r, bands, general_ints, taps};
  tp.ParallelFor(r.batch * bands, [j = &job](int64_t u) {
    const int64_t b = u / j->bands, band = u % j->bands;
    const int64_t oh = j->plan->patch > 0 ? j->plan->out_sizes[2 * b] : j->plan->out_h;
    const int64_t index = j->r->indices[b];
    SamplePixels px;
    px.pixels = j->src->Record(index);
    px.height = j->src->Height(index);
    px.width = j->src->Width(index);
    px.h = px.height;
    px.w = px.width;
    if (const int32_t* c = j->r->crops) {
      px.y0 = c[4 * b];
      px.x0 = c[4 * b + 1];
      px.h = c[4 * b + 2];
      px.w = c[4 * b + 3];
    }
    if (!RunRows(*j->plan, b, px, j->general_ints, j->taps, band * oh / j->bands,
                 (band + 1) * oh / j->bands))
      j->no_memory.store(true, std::memory_order_relaxed);
  });
  if (job.no_memory.load()) return IOError("out of memory for the kernel's per-thread scratch");
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------
// SampleKernel
// ---------------------------------------------------------------------------------------

SampleKernel::SampleKernel() = default;
SampleKernel::~SampleKernel() = default;
SampleKernel::SampleKernel(SampleKernel&&) noexcept = default;
SampleKernel& SampleKernel::operator=(SampleKernel&&) noexcept = default;

Status SampleKernel::Prepare(const GatherRequest& r, SampleKernel* out) {
  int64_t oh = 0, ow = 0;
  TBLJAX_RETURN_IF_ERROR(CheckOutput(r, &oh, &ow));
  if (r.ops) TBLJAX_RETURN_IF_ERROR(CheckOps(*r.ops, r.batch, r.dtype, oh, ow));
  auto p = std::make_unique<Plan>();
  TBLJAX_RETURN_IF_ERROR(FillPlan(r, oh, ow, p.get()));
  out->plan_ = std::move(p);
  return Status::Ok();
}

int64_t SampleKernel::out_h() const { return plan_ ? plan_->out_h : 0; }
int64_t SampleKernel::out_w() const { return plan_ ? plan_->out_w : 0; }
int64_t SampleKernel::out_h(int64_t b) const {
  return plan_ && plan_->patch > 0 ? plan_->out_sizes[2 * b] : out_h();
}
int64_t SampleKernel::out_w(int64_t b) const {
  return plan_ && plan_->patch > 0 ? plan_->out_sizes[2 * b + 1] : out_w();
}

Status SampleKernel::Run(int64_t b, const SamplePixels& px) const {
  if (!plan_) return InvalidArgument("SampleKernel is not prepared");
  const int32_t box[4] = {static_cast<int32_t>(px.y0), static_cast<int32_t>(px.x0),
                          static_cast<int32_t>(px.h), static_cast<int32_t>(px.w)};
  if (px.pixels == nullptr || px.height > (int64_t{1} << 31) || px.width > (int64_t{1} << 31) / 3 ||
      (px.stride != 0 && px.stride < px.width * 3))
    return InvalidArgument("sample pixels are null, too large or their rows overlap");
  const int64_t oh = out_h(b), ow = out_w(b);
  TBLJAX_RETURN_IF_ERROR(CheckCropBox(b, box, px.height, px.width, oh, ow));
  int64_t taps = 2;
  const bool general = TakesGeneralPath(px.h, px.w, oh, ow, &taps);
  if (!RunRows(*plan_, b, px, GeneralInts(general ? px.w : 0, taps, plan_->out_w), taps, 0, oh))
    return IOError("out of memory for the kernel's per-thread scratch");
  return Status::Ok();
}

}  // namespace tbljax
