// Antialiased resize of RGB uint8 images: the geometry of the three resize modes and one
// deterministic, fixed-point, separable convolution that serves them all.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "sizes.h"  // kMaxImageSide
#include "status.h"

namespace tbljax {

// How an image becomes size S:
//   kCenterCrop  shorter side to S, then the central S x S (the default).
//   kSquash      S x S, aspect ignored (what turboloader does).
//   kMaxSide     aspect kept, longer side S; the shorter side is round(short * S / long) >= 1.
//   kShorterSide aspect kept, shorter side S; the longer side is round(long * S / short). With a
//                cap L (max_long > 0) a longer side above L becomes L and the shorter side
//                round(short * L / long) >= 1 instead (torchvision's Resize(S, max_size=L)).
// Every mode scales small images up as well: the output size depends only on
// (H, W, S, mode, max_long). Rounding is integer round-half-up, never a float comparison.
enum class ResizeMode { kCenterCrop = 0, kSquash = 1, kMaxSide = 2, kShorterSide = 3 };
inline constexpr ResizeMode kResizeModes[] = {ResizeMode::kCenterCrop, ResizeMode::kSquash,
                                              ResizeMode::kMaxSide, ResizeMode::kShorterSide};

// "center_crop", "squash", "max_side", "shorter_side" ("?" for a value that is not a mode):
// each name is spelled here once, and exported to Python as _core.RESIZE_MODES.
const char* ResizeModeName(ResizeMode mode);
// By name, or InvalidArgument "resize mode='x' is not one of: center_crop, ...".
Status ParseResizeMode(std::string_view name, ResizeMode* mode);
inline constexpr ResizeMode kDefaultResizeMode = ResizeMode::kCenterCrop;
// Whether every output of the mode is S x S (the others keep the aspect).
inline constexpr bool ResizeModeIsSquare(ResizeMode mode) {
  return mode == ResizeMode::kCenterCrop || mode == ResizeMode::kSquash;
}

// The filter: the triangle ("bilinear") kernel, widened by the downscale factor so that it
// antialiases, exactly as Pillow's Image.BILINEAR and torchvision's Resize(antialias=True)
// define it. Chosen because it is the training-recipe default, has no negative lobes (no
// halos, no overshoot to clamp) and is the cheapest antialiased filter.
inline constexpr const char* kResizeFilterName = "bilinear";

// Largest S accepted: the largest side the core handles (and a TBL record can have).
inline constexpr int kMaxResizeSize = static_cast<int>(kMaxImageSide);

// What region of the source, in continuous pixel coordinates, maps onto what output size.
// center_crop maps the centred min(H,W) square straight to S x S in one pass (no rounded
// intermediate image), which is the continuous form of "resize shorter side, then crop".
struct ResizePlan {
  int out_h = 0, out_w = 0;
  double box_x = 0, box_y = 0, box_w = 0, box_h = 0;
};

// max_long: the cap on the longer side of kShorterSide (0: none; else >= size). Other modes
// take 0 only. A size whose longer side would exceed kMaxResizeSize is an error.
Status PlanResize(int src_h, int src_w, int size, ResizeMode mode, ResizePlan* plan,
                  int max_long = 0);

// Resamples the box of `plan` (coordinates in the source's pixels) from an RGB source of
// src_h rows of src_w pixels (src_stride bytes apart) into out_h rows of out_w pixels
// (dst_stride bytes apart). Pure function of its inputs: bit-identical on every machine,
// thread count and SIMD target (it runs on the serve kernel's, see kernel.h). Arithmetic:
// weights are 14-bit integers that sum exactly to 1 per output pixel; the vertical pass runs
// first and keeps 7 fractional bits, the horizontal pass rounds to nearest. Scratch memory
// is per thread and reused.
Status ResizeRgb(const uint8_t* src, int src_h, int src_w, ptrdiff_t src_stride,
                 const ResizePlan& plan, uint8_t* dst, ptrdiff_t dst_stride);

// Source pixels: columns [x0, x1), rows [y0, y1).
struct PixelRect {
  int x0 = 0, y0 = 0, x1 = 0, y1 = 0;
};

// The source pixels ResizeRgb reads (the span of its filter taps) for `plan` over a
// src_h x src_w image, so that a decoder can decode only those.
Status ResizeSourceRect(int src_h, int src_w, const ResizePlan& plan, PixelRect* rect);

// ResizeRgb of a src_h x src_w image of which only `window` is in memory: src points at the
// window's first pixel (row window.y0, column window.x0). The filter is laid out over the
// whole image exactly as ResizeRgb lays it out, so the output is the same bytes whenever the
// window holds ResizeSourceRect; a window that does not is an error.
Status ResizeRgbWindow(const uint8_t* src, int src_h, int src_w, const PixelRect& window,
                       ptrdiff_t src_stride, const ResizePlan& plan, uint8_t* dst,
                       ptrdiff_t dst_stride);

}  // namespace tbljax
