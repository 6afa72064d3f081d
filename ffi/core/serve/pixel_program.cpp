// The per-image op stages (see pixel_program.h): the checks and the dispatch. The per-pixel work
// lives in pixel_program.inc, compiled once per SIMD target (simd_dispatch.h).
#include "pixel_program.h"

#include <cstring>
#include <string>

#define TBLJAX_SIMD_INC "pixel_program.inc"
#include "simd_dispatch.h"

namespace tbljax::ops_detail {
TBLJAX_SIMD_EXPORT(Program);
TBLJAX_SIMD_EXPORT(Erase);
}  // namespace tbljax::ops_detail

namespace tbljax {

uint8_t* RunPixelProgram(SimdTarget t, const ops_detail::ProgramJob& job) {
  return TBLJAX_SIMD_DISPATCH_FOR(t, ops_detail::Program)(job);
}

void RunErase(SimdTarget t, const ops_detail::EraseJob& job) {
  TBLJAX_SIMD_DISPATCH_FOR(t, ops_detail::Erase)(job);
}

bool RowHasOps(const OpsRequest& o, int64_t b) {
  for (int64_t k = 0; k < o.num_ops; ++k)
    if (o.codes[b * o.num_ops + k] != kOpNone) return true;
  return false;
}

bool RowHasErase(const OpsRequest& o, int64_t b) {
  for (int64_t e = 0; e < o.num_erase; ++e)
    if (o.erase_boxes[(b * o.num_erase + e) * 4 + 2] > 0) return true;
  return false;
}

namespace {
std::string Row(int64_t b, int64_t k) {
  return "row " + std::to_string(b) + ", slot " + std::to_string(k);
}

float F32Bits(int32_t arg) {
  float r;
  std::memcpy(&r, &arg, 4);
  return r;
}
}  // namespace

Status CheckOps(const OpsRequest& o, int64_t batch, OutDType dtype, int64_t oh, int64_t ow) {
  if (o.num_ops < 0 || o.num_ops > kMaxOps)
    return InvalidArgument("ops: at most " + std::to_string(kMaxOps) + " ops per row, got " +
                           std::to_string(o.num_ops));
  if (o.num_erase < 0 || o.num_erase > kMaxEraseBoxes)
    return InvalidArgument("erasing: at most " + std::to_string(kMaxEraseBoxes) +
                           " boxes per row, got " + std::to_string(o.num_erase));
  if (batch > 0 && o.num_ops > 0 && (!o.codes || !o.args || !o.matrices || !o.fill || !o.nearest))
    return InvalidArgument("ops: codes, args, matrices, fill and nearest are all needed");
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t k = 0; k < o.num_ops; ++k) {
      const int code = o.codes[b * o.num_ops + k];
      const int32_t arg = o.args[b * o.num_ops + k];
      if (code > kOpHue)
        return InvalidArgument("ops: " + Row(b, k) + ": unknown op code " + std::to_string(code));
      const bool bad = (code == kOpPosterize && (arg < 0 || arg > 8)) ||
                       (code == kOpSolarize && (arg < 0 || arg > 256)) ||
                       (code == kOpSolarizeAdd && (arg < 0 || arg > 255)) ||
                       (code == kOpHue && (arg < 0 || arg > 255));
      if (bad)
        return InvalidArgument("ops: " + Row(b, k) + ": argument " + std::to_string(arg) +
                               " out of range for op code " + std::to_string(code));
      // GaussianBlur's sigma range: no NaN, no box wider than any image.
      const float radius = F32Bits(arg);
      if (code == kOpGaussianBlur && !(radius >= 0.0f && radius <= 1000.0f))
        return InvalidArgument("ops: " + Row(b, k) + ": GaussianBlur radius " +
                               std::to_string(radius) + " is not in [0, 1000]");
    }
  }
  if (o.num_erase == 0 || batch == 0) return Status::Ok();
  if (dtype == OutDType::kUint8)
    return InvalidArgument(
        "erasing needs a float32 or bfloat16 output: it sets normalized values, as timm's "
        "RandomErasing does (uint8 output with erasing is not supported)");
  if (!o.erase_boxes || !o.erase_keys || !o.normal_table)
    return InvalidArgument("erasing: boxes, keys and the normal table are all needed");
  if (o.erase_mode != EraseMode::kPixel && o.erase_mode != EraseMode::kRand &&
      o.erase_mode != EraseMode::kConst)
    return InvalidArgument("erasing: unknown mode");
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t e = 0; e < o.num_erase; ++e) {
      const int32_t* x = o.erase_boxes + (b * o.num_erase + e) * 4;
      if (x[2] <= 0) continue;
      if (x[0] < 0 || x[1] < 0 || x[3] <= 0 || x[0] + int64_t{x[2]} > oh ||
          x[1] + int64_t{x[3]} > ow)
        return InvalidArgument("erasing: row " + std::to_string(b) + ", box " + std::to_string(e) +
                               " (" + std::to_string(x[0]) + ", " + std::to_string(x[1]) + ", " +
                               std::to_string(x[2]) + ", " + std::to_string(x[3]) +
                               ") does not lie inside the " + std::to_string(oh) + "x" +
                               std::to_string(ow) + " output");
    }
  }
  return Status::Ok();
}

}  // namespace tbljax
