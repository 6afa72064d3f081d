// The kernel's per-image op stages (issue 47): the pixel program on a row's uint8 image after
// the resize and flip, and random erasing on its written values. The rules are
// src/tbljax/_src/rules/pixel_ops.py's, byte for byte; kernel.cpp runs them for the rows that
// have ops (the rest take today's pass unchanged).
#pragma once
#include <cstdint>

#include "kernel.h"
#include "simd.h"
#include "status.h"

namespace tbljax {
namespace ops_detail {

// Where the program hands its result on, a band of rows at a time (the kernel's normalize and
// write): called for rows [y0, y1) of `result` (h x w x 3) once they are final, every row once,
// in order. The last op calls it row by row as it makes them where it makes a new image (the
// affine ops, Sharpness), so the output's stores overlap the op's work instead of stalling in
// one pass over the whole image afterwards; after the other ops, once for the whole image.
struct RowSink {
  void (*put)(void* ctx, const uint8_t* result, int64_t y0, int64_t y1) = nullptr;
  void* ctx = nullptr;
};

// One row's pixel program on `image` (h x w x 3, packed), with `tmp` (the same size, not
// overlapping it) as the other buffer: the result ends in one of the two (RunPixelProgram says
// which), the other is scratch.
struct ProgramJob {
  uint8_t* image;
  uint8_t* tmp;
  int64_t h, w;
  int64_t k;
  const uint8_t* codes;    // (k,)
  const int32_t* args;     // (k,)
  const double* matrices;  // (k, 6)
  const uint8_t* fill;     // (k, 3)
  const uint8_t* nearest;  // (k,)
  RowSink sink;            // put nullptr: none
};

// One row's erasing, on sample b of the written output.
struct EraseJob {
  uint8_t* out;
  OutDType dtype;  // float32 or bfloat16
  Layout layout;
  int64_t b, oh, ow;
  int64_t e;
  const int32_t* boxes;  // (e, 4)
  uint32_t key;
  EraseMode mode;
  const float* table;  // (kNormalTableSize,)
};

}  // namespace ops_detail

// Whether the request's ops are well formed for a batch of `batch` rows of oh x ow in `dtype`:
// known codes, arguments in range, erasing boxes inside the output and a float output (timm
// erases normalized values: erasing with uint8 output is refused).
Status CheckOps(const OpsRequest& o, int64_t batch, OutDType dtype, int64_t oh, int64_t ow);
// Whether row b has anything to do (an op or an erasing box).
bool RowHasOps(const OpsRequest& o, int64_t b);
bool RowHasErase(const OpsRequest& o, int64_t b);
// The stages on target t (every target gives the same bytes). RunPixelProgram returns the buffer
// that holds the result: job.image or job.tmp; with a sink, every row went through it.
uint8_t* RunPixelProgram(SimdTarget t, const ops_detail::ProgramJob& job);
void RunErase(SimdTarget t, const ops_detail::EraseJob& job);

}  // namespace tbljax
