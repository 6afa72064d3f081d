// Serving a dense map declared interpolation="linear" through the image's crop, resize and
// flip (tbljax/_src/rules/geometry.py states the rule and stays the reference): per axis,
// output o of `out` over a crop of `length` sits at p = ((2o + 1) * length - out) / (2 * out)
// past the crop's start, clamped to [0, length - 1]; taps floor(p) and the next (clamped),
// the second weighing (p - floor(p)) rounded half up to a multiple of 2^-14, all in integers.
// The four taps are summed in double in a fixed order, a tap equal to `invalid` given no
// weight and the rest renormalised (no valid weight: invalid), rounded once to float. Each
// product weight * value is exact in double, so contraction into fma changes nothing.
#pragma once
#include <cstdint>

#include "status.h"
#include "thread_pool.h"

namespace tbljax {

constexpr int kLinearWeightBits = 14;

struct LinearRequest {
  int64_t batch = 0;
  const float* const* rows = nullptr;  // row b's map: heights[b] x widths[b] x channels floats
  const int32_t* heights = nullptr;
  const int32_t* widths = nullptr;
  const int32_t* crops = nullptr;  // (batch, 4) y0, x0, h, w inside the map, or null: the whole
  const uint8_t* flips = nullptr;  // (batch,) nonzero = mirror the output, or null
  int64_t out_h = 0, out_w = 0, channels = 1;
  bool has_invalid = false;
  float invalid = 0.0f;
  float* out = nullptr;  // (batch, out_h, out_w, channels)
};

// Fills r.out; InvalidArgument naming the row whose crop is not inside its map. pool: null
// for the process-wide pool.
Status ServeLinear(const LinearRequest& r, ThreadPool* pool);

}  // namespace tbljax
