// Boxes through the image's crop, resize and flip (boxes.h).
#include "boxes.h"

#include <string>

namespace tbljax {

Status ServeBoxes(const BoxesRequest& r) {
  if (r.max_boxes < 0) return InvalidArgument("max_boxes must be >= 0");
  for (int64_t b = 0; b < r.batch; ++b) {
    if (r.counts[b] < 0 || r.counts[b] > r.n)
      return InvalidArgument("row " + std::to_string(b) + ": count " + std::to_string(r.counts[b]) +
                             " is not in [0, " + std::to_string(r.n) + "]");
    if (!(r.crops[4 * b + 2] > 0) || !(r.crops[4 * b + 3] > 0))
      return InvalidArgument("row " + std::to_string(b) + ": crop sides must be positive");
  }
  for (int64_t b = 0; b < r.batch; ++b) {
    const double y0 = r.crops[4 * b], x0 = r.crops[4 * b + 1];
    const double oh = r.out_hw[2 * b], ow = r.out_hw[2 * b + 1];
    const double sy = oh / r.crops[4 * b + 2], sx = ow / r.crops[4 * b + 3];
    const bool flip = r.flips != nullptr && r.flips[b] != 0;
    const double x1 = x0 + r.crops[4 * b + 3];  // the crop's right edge
    float* out = r.boxes + 4 * r.max_boxes * b;
    uint8_t* valid = r.valid + r.max_boxes * b;
    int32_t* lab = r.labels != nullptr ? r.out_labels + r.max_boxes * b : nullptr;
    int64_t kept = 0;
    for (int64_t j = 0; j < r.counts[b] && kept < r.max_boxes; ++j) {
      const double* s = r.xyxy + 4 * (r.n * b + j);
      // A flip mirrors x to out_w - x, computed as (x0 + w - x) * sx like rules/geometry.py
      // (no multiply feeding an add, so jit's fused multiply-adds cannot change it).
      const double xa = flip ? (x1 - s[0]) * sx : (s[0] - x0) * sx;
      const double xb = flip ? (x1 - s[2]) * sx : (s[2] - x0) * sx;
      const double ya = (s[1] - y0) * sy, yb = (s[3] - y0) * sy;
      // NumPy's min/max/clip: a NaN propagates (and then fails every test below).
      const double m[4] = {xa < xb || xa != xa ? xa : xb, ya < yb || ya != ya ? ya : yb,
                           xa > xb || xa != xa ? xa : xb, ya > yb || ya != ya ? ya : yb};
      const double hi[4] = {ow, oh, ow, oh};
      double c[4];
      for (int k = 0; k < 4; ++k) {
        c[k] = m[k] < 0 ? 0 : m[k];
        c[k] = c[k] > hi[k] ? hi[k] : c[k];
      }
      const double ws = c[2] - c[0], hs = c[3] - c[1], area = ws * hs;
      const double before = (m[2] - m[0]) * (m[3] - m[1]);
      if (!(ws >= r.min_size && hs >= r.min_size && area >= r.min_area &&
            area >= r.min_visibility * before))
        continue;
      for (int k = 0; k < 4; ++k) out[4 * kept + k] = static_cast<float>(c[k]);
      valid[kept] = 1;
      if (lab != nullptr) lab[kept] = static_cast<int32_t>(r.labels[r.n * b + j]);
      ++kept;
    }
    for (int64_t k = kept; k < r.max_boxes; ++k) {
      for (int i = 0; i < 4; ++i) out[4 * k + i] = 0;
      valid[k] = 0;
      if (lab != nullptr) lab[k] = -1;
    }
  }
  return Status::Ok();
}

}  // namespace tbljax
