// Antialiased, fixed-point, separable resize of RGB uint8 images (see resize.h).
#include "resize.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "names.h"
#include "simd.h"  // the SIMD target, shared with every kernel

namespace tbljax {
namespace resize_detail {

constexpr int kWeightBits = 14;  // weights <= 1.0 must fit int16
constexpr int kMidBits = 7;      // fractional bits kept between the two passes
constexpr int kMidMax = 255 << kMidBits;
constexpr int kVShift = kWeightBits - kMidBits;  // vertical: keep kMidBits fractional bits
constexpr int kHShift = kWeightBits + kMidBits;  // horizontal: back to integers

// The horizontal taps of the SIMD passes (HBlocks, below), as plain pointers.
struct HBlockView {
  const int32_t* offset;
  const int32_t* npairs;
  const int32_t* weights;
  int stride;
};

// One output row for the two passes of resize.inc.
struct RowJob {
  // Vertical: `taps` source rows (SIMD: 2 * npairs, an odd count repeating the last) with
  // weights yw (SIMD: packed in pairs, ypairs), over mid_w bytes into mid; acc: mid_w int32.
  const uint8_t* const* rows;
  const int16_t* yw;
  const int32_t* ypairs;
  int taps, mid_w;
  int16_t* mid;
  int32_t* acc;
  // Horizontal: mid starts at source column col0; out_w pixels into dst. Scalar: output ox
  // reads count[ox] pixels from column first[ox] with weights xw[ox * xstride ...]. SIMD: blocks.
  int col0;
  const int32_t* first;
  const int32_t* count;
  const int16_t* xw;
  int xstride;
  HBlockView blocks;
  int out_w;
  uint8_t* dst;
};

}  // namespace resize_detail
}  // namespace tbljax

// ---- the two passes, the same source compiled for each SIMD target (simd_dispatch.h) ----
#define TBLJAX_SIMD_INC "resize.inc"
#include "simd_dispatch.h"

namespace tbljax::resize_detail {
TBLJAX_SIMD_EXPORT(ResizeRow);
}  // namespace tbljax::resize_detail

namespace tbljax {
namespace {

using resize_detail::kWeightBits;
using resize_detail::RowJob;

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
  return ParseByName(name, kResizeModes, ResizeModeName, "resize mode", mode);
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

  void (*resize_row)(const RowJob&) = TBLJAX_SIMD_DISPATCH_FOR(target, resize_detail::ResizeRow);
  RowJob job{};
  job.rows = s.rows.data();
  job.mid_w = mid_w;
  job.mid = s.mid.data();
  job.acc = s.acc.data();
  job.col0 = col0;
  job.first = s.tx.first.data();
  job.count = s.tx.count.data();
  job.xw = s.tx.w.data();
  job.xstride = s.tx.stride;
  job.blocks = {s.blocks.offset.data(), s.blocks.npairs.data(), s.blocks.weights.data(),
                s.blocks.stride};
  job.out_w = plan.out_w;
  for (int oy = 0; oy < plan.out_h; ++oy) {
    const int n = s.ty.count[oy];
    for (int k = 0; k < n; ++k)
      s.rows[k] = origin + static_cast<ptrdiff_t>(s.ty.first[oy] + k - window.y0) * src_stride;
    if (target != SimdTarget::kScalar) {
      if (n % 2) s.rows[n] = s.rows[n - 1];  // its weight is 0
      job.ypairs = &s.ypairs[static_cast<size_t>(oy) * ypair_stride];
    }
    job.yw = &s.ty.w[static_cast<size_t>(oy) * s.ty.stride];
    job.taps = n;
    job.dst = dst + oy * dst_stride;
    resize_row(job);
  }
  // Per-thread scratch should not pin memory after a huge image.
  if (s.mid.capacity() > (size_t{8} << 20)) s.mid = {};
  if (s.acc.capacity() > (size_t{8} << 20)) s.acc = {};
  return Status::Ok();
}

}  // namespace tbljax
