// Boxes through the image's crop, resize and flip, clipped and sanitized: the C++ twin of
// tbljax/_src/rules/geometry.py's serve_boxes_batch, which states the rule and stays the
// reference (the same float64 operations in the same order, so the same bytes). One pass over
// (batch, n): the host loader's per-batch NumPy cost was a tenth of the image kernel's.
#pragma once
#include <cstdint>

#include "status.h"

namespace tbljax {

struct BoxesRequest {
  int64_t batch = 0, n = 0;         // rows, boxes per row (each row's first counts[r] are real)
  const double* xyxy = nullptr;     // (batch, n, 4) source pixels, x0 y0 x1 y1
  const int64_t* counts = nullptr;  // (batch,)
  const int64_t* labels = nullptr;  // (batch, n), or null: no labels to carry
  const double* crops = nullptr;    // (batch, 4) y0, x0, h, w of each row's crop
  const double* out_hw = nullptr;   // (batch, 2) each row's output (h, w)
  const uint8_t* flips = nullptr;   // (batch,) nonzero = mirrored, or null
  int64_t max_boxes = 0;
  double min_size = 1, min_area = 1, min_visibility = 0;
  float* boxes = nullptr;         // (batch, max_boxes, 4) xyxy output pixels, zeros past kept
  uint8_t* valid = nullptr;       // (batch, max_boxes) 1 for a kept box
  int32_t* out_labels = nullptr;  // (batch, max_boxes) -1 past kept; ignored without labels
};

// Fills r.boxes, r.valid and (with labels) r.out_labels; InvalidArgument for a count outside
// [0, n] or a crop side that is not positive.
Status ServeBoxes(const BoxesRequest& r);

}  // namespace tbljax
