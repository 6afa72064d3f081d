// RGB pixels from the decoded planes of a YCbCr 4:2:0 JPEG (libjpeg's raw IDCT output):
// libjpeg-turbo's fancy (triangle) chroma upsampling, h2v2, and its YCbCr -> RGB conversion,
// bit for bit, in one pass and for a rectangle of the image only. DecodeJpegBox (decode.h) uses
// it for compact records, where libjpeg's two passes over every row of a box's part took 11% of
// serving them (benchmarks/README.md, "Colour from the planes").
#pragma once
#include <cstddef>
#include <cstdint>

namespace tbljax {

// An image's planes: luma `height` x `width`, chroma (cb, cr) ceil(height / 2) x
// ceil(width / 2), rows `stride` bytes apart. Each chroma row must also hold a copy of its first
// sample just before it and of its last just after it (PadChromaEdges): the image's edges
// repeat, as libjpeg's upsampler treats them. The SIMD targets read up to kYccSlack bytes past
// the end of any row (the values there change no pixel of the image): that many must be
// readable past each plane's last row.
struct Ycc420Planes {
  const uint8_t* y = nullptr;
  const uint8_t* cb = nullptr;
  const uint8_t* cr = nullptr;
  ptrdiff_t y_stride = 0, c_stride = 0;
  int height = 0, width = 0;
};

inline constexpr int kYccSlack = 32;

inline int ChromaSize(int luma) { return (luma + 1) / 2; }

// Writes the edge copies of `rows` chroma rows of `samples` samples each, `stride` apart.
void PadChromaEdges(uint8_t* plane, ptrdiff_t stride, int rows, int samples);

// Writes the RGB pixels of rows [y0, y1) and columns [x0, x1) of the image (x0 even) to `out`:
// row y at out + (y - y0) * out_stride, 3 bytes a pixel, nothing past column x1. Each is the
// pixel libjpeg-turbo's whole decode of an image of this size gives (ISLOW planes, fancy
// upsampling, RGB out) when the image is more than 2 chroma samples wide (narrower ones it
// upsamples by repeating). Runs on the active SIMD target (simd.h).
void Ycc420ToRgb(const Ycc420Planes& p, int y0, int y1, int x0, int x1, uint8_t* out,
                 ptrdiff_t out_stride);

}  // namespace tbljax
