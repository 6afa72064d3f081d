// Serving a label map or dense map through the image's crop, resize and flip by the nearest
// rule (tbljax/_src/rules/geometry.py states it and stays the reference): output index o of
// an axis of `out` samples over a crop of `length` starting at `start` reads
//   start + min(floor(float32(o) * (float32(length) / float32(out))), length - 1)
// in float32, exactly as torchvision v2 resizes a tv_tensors.Mask. A gather: one-byte maps by
// byte shuffles (nearest.inc), the source lines prefetched ahead.
#pragma once
#include <cstdint>

#include "status.h"
#include "thread_pool.h"

namespace tbljax {

// Each row's crop (y0, x0, h, w; crops null: the whole map) inside its heights[b] x widths[b]
// map, or InvalidArgument naming the row: the check the map stages (nearest, linear) share.
Status CheckMapCrops(int64_t batch, const int32_t* heights, const int32_t* widths,
                     const int32_t* crops);

struct NearestRequest {
  int64_t batch = 0;
  const uint8_t* const* rows = nullptr;  // row b's map: heights[b] x widths[b] elements
  const int32_t* heights = nullptr;
  const int32_t* widths = nullptr;
  const int32_t* crops = nullptr;  // (batch, 4) y0, x0, h, w inside the map, or null: the whole
  const uint8_t* flips = nullptr;  // (batch,) nonzero = mirror the output, or null
  int64_t out_h = 0, out_w = 0;
  int64_t elem_bytes = 0;  // one element: the item size times the channels
  uint8_t* out = nullptr;  // (batch, out_h, out_w) elements
};

// The source index of each of `out` samples over [start, start + length) (the rule above).
void NearestIndex(int64_t start, int64_t length, int64_t out, int64_t* idx);

// Fills r.out; InvalidArgument naming the row whose crop is not inside its map. pool: null
// for the process-wide pool.
Status ServeNearest(const NearestRequest& r, ThreadPool* pool);

}  // namespace tbljax
