// EXIF orientation: read from an APP1 payload, what it does to the axes, and the displayed
// image made from the stored one. Private to the jpeg room.
#pragma once
#include <cstddef>
#include <cstdint>

namespace tbljax::jpeg_detail {

// Orientation from an APP1 "Exif" payload: TIFF header, IFD0, tag 0x0112. Everything is
// bounds-checked; anything malformed means "no orientation" (1), never a failure.
int ExifOrientation(const uint8_t* p, size_t n);

// For EXIF orientation o, which axes of the displayed image run backwards through the
// stored one (orientations 5-8 also swap the axes).
inline bool SwapsAxes(int o) { return o >= 5; }
inline bool ReversesX(int o) { return o == 2 || o == 3 || o == 6 || o == 7; }
inline bool ReversesY(int o) { return o == 3 || o == 4 || o == 7 || o == 8; }

// Writes the displayed image for orientation o of a stored w x h RGB image. Displayed pixel
// (r, c) reads stored pixel base + r * step_r + c * step_c (in pixels).
void Orient(const uint8_t* src, int w, int h, int o, uint8_t* dst);

}  // namespace tbljax::jpeg_detail
