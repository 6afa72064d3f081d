// Dense maps through the image's crop, resize and flip by the linear rule (linear_map.h).
#include "linear_map.h"

#include "nearest.h"

#include <algorithm>
#include <exception>
#include <string>
#include <vector>

namespace tbljax {
namespace {

struct Tap {
  int64_t i0, i1;  // source indices inside the map
  double w1;       // the weight of i1, a multiple of 2^-14
};

// One axis of the rule (linear_map.h), geometry.crop_taps in integers.
void AxisTaps(int64_t start, int64_t length, int64_t out, Tap* taps) {
  const int64_t den = 2 * out;
  for (int64_t o = 0; o < out; ++o) {
    const int64_t num = std::max<int64_t>((2 * o + 1) * length - out, 0);
    int64_t i0 = num / den;
    int64_t q = ((num % den) * (int64_t{1} << kLinearWeightBits) + out) / den;
    if (i0 >= length - 1) i0 = length - 1, q = 0;
    taps[o] = {start + i0, start + std::min(i0 + 1, length - 1),
               static_cast<double>(q) / static_cast<double>(int64_t{1} << kLinearWeightBits)};
  }
}

}  // namespace

Status ServeLinear(const LinearRequest& r, ThreadPool* pool) {
  if (r.out_h < 1 || r.out_w < 1 || r.channels < 1)
    return InvalidArgument("out must have rows and columns of at least one element");
  if (Status s = CheckMapCrops(r.batch, r.heights, r.widths, r.crops); !s.ok()) return s;
  if (r.batch == 0) return Status::Ok();
  if (Status s = DefaultPool(&pool); !s.ok()) return s;
  std::vector<Tap> ys(static_cast<size_t>(r.batch * r.out_h));
  std::vector<Tap> xs(static_cast<size_t>(r.batch * r.out_w));
  for (int64_t b = 0; b < r.batch; ++b) {
    const int32_t* c = r.crops != nullptr ? r.crops + 4 * b : nullptr;
    AxisTaps(c ? c[0] : 0, c ? c[2] : r.heights[b], r.out_h, ys.data() + b * r.out_h);
    Tap* xb = xs.data() + b * r.out_w;
    AxisTaps(c ? c[1] : 0, c ? c[3] : r.widths[b], r.out_w, xb);
    if (r.flips != nullptr && r.flips[b] != 0) std::reverse(xb, xb + r.out_w);  // mirrored output
  }
  const int64_t ch = r.channels;
  pool->ParallelFor(r.batch * r.out_h, [&](int64_t unit) {
    const int64_t b = unit / r.out_h;
    const Tap& ty = ys[static_cast<size_t>(unit)];
    const int64_t stride = int64_t{r.widths[b]} * ch;
    const float* lines[2] = {r.rows[b] + ty.i0 * stride, r.rows[b] + ty.i1 * stride};
    const double wys[2] = {1.0 - ty.w1, ty.w1};
    float* dst = r.out + unit * r.out_w * ch;
    for (int64_t ox = 0; ox < r.out_w; ++ox) {
      const Tap& tx = xs[static_cast<size_t>(b * r.out_w + ox)];
      const int64_t cols[2] = {tx.i0 * ch, tx.i1 * ch};
      const double wxs[2] = {1.0 - tx.w1, tx.w1};
      for (int64_t k = 0; k < ch; ++k) {
        double total = 0.0, weight = 0.0;
        for (int i = 0; i < 2; ++i) {
          for (int j = 0; j < 2; ++j) {
            const float v = lines[i][cols[j] + k];
            if (r.has_invalid && v == r.invalid) continue;  // no weight (NaN != anything: kept)
            const double wgt = wys[i] * wxs[j];
            total = total + wgt * static_cast<double>(v);
            weight = weight + wgt;
          }
        }
        double o = weight > 0 ? total / weight : 0.0;
        if (r.has_invalid && weight == 0) o = r.invalid;
        dst[ox * ch + k] = static_cast<float>(o);
      }
    }
  });
  return Status::Ok();
}

}  // namespace tbljax
