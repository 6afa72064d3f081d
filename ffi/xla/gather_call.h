// What the CPU and CUDA gather handlers share: the operand list of the custom call, the
// checks that turn one call into a tbljax::GatherRequest, the one switch from the result's
// element type to the kernel's output dtype, and Status -> ffi::Error. _src/jax/ffi_call.py
// builds the calls; ffi/core/kernel.h documents the arithmetic.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "kernel.h"
#include "xla/ffi/api/ffi.h"

namespace tbljax::xla_ffi {

namespace ffi = ::xla::ffi;

// The target names both platforms register are contract.h's kGatherTarget and
// kGatherPackedTarget (exported to Python by _core).
using ::tbljax::kGatherOpsTarget;
using ::tbljax::kGatherPackedOpsTarget;
using ::tbljax::kGatherPackedTarget;
using ::tbljax::kGatherTarget;

// Operands, in order. The dataset is an operand (never a pointer baked into the program).
using DataArg = ffi::Buffer<ffi::U8, 4>;  // (N, H, W, 3) uint8 records
// Packed records (the packed target): record i is table[i] = (first page, height, width),
// its height*width*3 bytes starting at pages[first page, 0].
using PagesArg = ffi::Buffer<ffi::U8, 2>;   // (P, page bytes) uint8
using TableArg = ffi::Buffer<ffi::S32, 2>;  // (N, 3) int32
using IndexArg = ffi::AnyBuffer;            // (B,) int32 (JAX without x64) or int64
using CropArg = ffi::Buffer<ffi::S32, 2>;   // (B, 4) boxes (y0, x0, h, w), or (0, 4): no crop
using FlipArg = ffi::Buffer<ffi::U8, 1>;    // (B,) nonzero = flip, or (0,): no flip
// The ops targets only (CPU), after flip: the per-image ops, kernel.h's OpsRequest.
using CodesArg = ffi::Buffer<ffi::U8, 2>;         // (B, K) op codes, 0 = none
using OpArgsArg = ffi::Buffer<ffi::S32, 2>;       // (B, K) each op's integer argument
using MatricesArg = ffi::Buffer<ffi::U32, 4>;     // (B, K, 6, 2) the float64 matrices as their
                                                  // bits, [low word, high word] (JAX: no x64)
using FillArg = ffi::Buffer<ffi::U8, 2>;          // (K, 3) each slot's fill
using NearestArg = ffi::Buffer<ffi::U8, 1>;       // (K,) nonzero: the slot resamples nearest
using EraseBoxesArg = ffi::Buffer<ffi::S32, 3>;   // (B, E, 4) y0, x0, h, w; h 0: none
using EraseKeysArg = ffi::Buffer<ffi::U32, 1>;    // (B,) each row's noise key
using NormalTableArg = ffi::Buffer<ffi::F32, 1>;  // (kNormalTableSize,) pixel_ops.normal_table()
// The ops targets only, after the ops: NaFlex rows (kernel.h's GatherRequest::patch), each
// row's (h, w), or (0, 2) with the attribute patch 0 (no patches). With patches the result is
// (B, T, patch * patch, 3) NHWC; an empty program (K = 0, E = 0) runs no ops.
using SizesArg = ffi::Buffer<ffi::S32, 2>;  // (B, 2) or (0, 2)
// Any further operand is a buffer aliased to the result (a donated output); it is not read.
// Attributes: mean, std (3 float64 each; ignored for uint8), layout ("NHWC" | "NCHW"), and
// for the ops targets erase_mode (int32, EraseMode) and patch (int64, 0: none).
// Result: the batch, uint8 / float32 / bfloat16, (B, OH, OW, 3) or (B, 3, OH, OW).

// The operands after the records, alike in every gather handler's binding:
// BindGatherCall(ffi::Ffi::Bind()[.Ctx<...>()].Arg<records>()...).
// Bindings cannot be moved into a parameter, only chained: the helpers take them by reference.
template <class Binding>
auto BindRows(Binding&& b) {
  return std::move(b).template Arg<IndexArg>().template Arg<CropArg>().template Arg<FlipArg>();
}

template <class Binding>
auto BindAttrs(Binding&& b) {
  return std::move(b)
      .RemainingArgs()
      .template Attr<ffi::Span<const double>>("mean")
      .template Attr<ffi::Span<const double>>("std")
      .template Attr<std::string_view>("layout");
}

template <class Binding>
auto BindGatherCall(Binding b) {
  return BindAttrs(BindRows(std::move(b))).template Ret<ffi::AnyBuffer>();
}

// The ops targets: the rows' operands, the per-image ops', the patch sizes, the attributes,
// erase_mode and patch.
template <class Binding>
auto BindGatherOpsCall(Binding b) {
  return BindAttrs(BindRows(std::move(b))
                       .template Arg<CodesArg>()
                       .template Arg<OpArgsArg>()
                       .template Arg<MatricesArg>()
                       .template Arg<FillArg>()
                       .template Arg<NearestArg>()
                       .template Arg<EraseBoxesArg>()
                       .template Arg<EraseKeysArg>()
                       .template Arg<NormalTableArg>()
                       .template Arg<SizesArg>())
      .template Attr<int32_t>("erase_mode")
      .template Attr<int64_t>("patch")
      .template Attr<int32_t>("size_free")
      .template Ret<ffi::AnyBuffer>();
}

inline ffi::Error ToError(const Status& s) {
  switch (s.code()) {
    case Code::kOk: return ffi::Error::Success();
    case Code::kInvalidArgument: return ffi::Error(ffi::ErrorCode::kInvalidArgument, s.message());
    case Code::kOutOfRange: return ffi::Error(ffi::ErrorCode::kOutOfRange, s.message());
    case Code::kUnimplemented: return ffi::Error(ffi::ErrorCode::kUnimplemented, s.message());
    default: return ffi::Error::Internal(s.message());
  }
}

// The one dtype switch: the result buffer's element type decides what the kernel writes.
inline ffi::Error OutDTypeOf(ffi::DataType t, OutDType* out) {
  switch (t) {
    case ffi::DataType::U8: *out = OutDType::kUint8; return ffi::Error::Success();
    case ffi::DataType::F32: *out = OutDType::kFloat32; return ffi::Error::Success();
    case ffi::DataType::BF16: *out = OutDType::kBfloat16; return ffi::Error::Success();
    default:
      return ffi::Error::InvalidArgument("tbljax gather: the result must be one of " +
                                         OutDTypeNames() + ", got XLA type " +
                                         std::to_string(static_cast<int>(t)));
  }
}

// One call, checked: the request (its pointers are host memory on CPU, device memory on
// CUDA; `indices` is left to the handler, which may have to widen int32), the source's shape
// and the raw indices.
struct Call {
  GatherRequest request;
  int64_t num_records = 0, height = 0, width = 0;
  const void* indices = nullptr;
  bool indices_are_64bit = false;
};

inline std::string Dims(ffi::Span<const int64_t> d) {
  std::string s = "(";
  for (size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + (d.size() == 1 ? ",)" : ")");
}

// The source's shape: uniform records from the data operand, or packed ones from the table.
struct SourceShape {
  int64_t num_records = 0, height = 0, width = 0;  // height = width = 0: packed
};

inline ffi::Error ShapeOfData(const DataArg& data, SourceShape* shape) {
  const auto dd = data.dimensions();
  auto fail = [](std::string m) { return ffi::Error::InvalidArgument("tbljax gather: " + m); };
  if (dd[3] != 3) return fail("data must be (N, H, W, 3) uint8 RGB, got " + Dims(dd));
  if (dd[0] < 1 || dd[1] < 1 || dd[2] < 1) return fail("data is empty: " + Dims(dd));
  *shape = {dd[0], dd[1], dd[2]};
  return ffi::Error::Success();
}

inline ffi::Error ShapeOfPacked(const PagesArg& pages, const TableArg& table, SourceShape* shape) {
  auto fail = [](std::string m) { return ffi::Error::InvalidArgument("tbljax gather: " + m); };
  const auto td = table.dimensions(), pd = pages.dimensions();
  if (td[1] != 3 || td[0] < 1)
    return fail("the record table must be (N, 3) int32 (first page, height, width), got " +
                Dims(td));
  if (pd[1] < 1) return fail("pages must be (P, page bytes) uint8, got " + Dims(pd));
  *shape = {td[0], 0, 0};
  return ffi::Error::Success();
}

// Checks everything the shapes and attributes decide (the data-dependent checks, index range,
// records and crop boxes, are the kernel's). Never touches device memory, so CUDA can call it.
inline ffi::Error PrepareCall(const SourceShape& src, const IndexArg& indices, const CropArg& crops,
                              const FlipArg& flips, ffi::Span<const double> mean,
                              ffi::Span<const double> stdev, std::string_view layout,
                              const ffi::AnyBuffer& out, Call* call) {
  auto fail = [](std::string m) { return ffi::Error::InvalidArgument("tbljax gather: " + m); };
  const auto id = indices.dimensions();
  if (id.size() != 1) return fail("indices must be 1-D (B,), got " + Dims(id));
  const ffi::DataType it = indices.element_type();
  if (it != ffi::DataType::S32 && it != ffi::DataType::S64)
    return fail("indices must be int32 or int64, got XLA type " +
                std::to_string(static_cast<int>(it)));
  const int64_t batch = id[0];
  const auto cd = crops.dimensions();
  if (cd[1] != 4 || (cd[0] != 0 && cd[0] != batch))
    return fail("crop must be (B, 4) = (" + std::to_string(batch) + ", 4) or (0, 4), got " +
                Dims(cd));
  const auto fd = flips.dimensions();
  if (fd[0] != 0 && fd[0] != batch)
    return fail("flip must be (B,) = (" + std::to_string(batch) + ",) or (0,), got " + Dims(fd));
  if (mean.size() != 3 || stdev.size() != 3)
    return fail("mean and std need 3 values each, got " + std::to_string(mean.size()) + " and " +
                std::to_string(stdev.size()));

  GatherRequest& r = call->request;
  if (Status s = ParseLayout(layout, &r.layout); !s.ok()) return fail(s.message());
  if (ffi::Error e = OutDTypeOf(out.element_type(), &r.dtype); e.failure()) return e;
  const auto od = out.dimensions();
  if (od.size() != 4) return fail("the result must be 4-D, got " + Dims(od));
  const bool nchw = r.layout == Layout::kNCHW;
  const int64_t oh = nchw ? od[2] : od[1], ow = nchw ? od[3] : od[2];
  if (od[0] != batch || (nchw ? od[1] : od[3]) != 3 || oh < 1 || ow < 1)
    return fail("the result is " + Dims(od) + " but " + std::string(layout) + " with " +
                std::to_string(batch) + " indices needs " +
                (nchw ? "(B, 3, OH, OW)" : "(B, OH, OW, 3)") +
                " with B = " + std::to_string(batch));
  if (src.height > 0) {
    if (Status s = CheckOutputSize(cd[0] != 0, oh, ow, src.height, src.width); !s.ok())
      return fail(s.message());
  } else if (cd[0] == 0 && batch > 0) {
    return fail(
        "the records differ in size: the output size is fixed only by a crop box per "
        "sample (crop=...)");
  }
  for (int c = 0; c < 3; ++c) {
    r.mean[c] = mean[c];
    r.std[c] = stdev[c];
  }
  if (r.dtype != OutDType::kUint8) {
    if (Status s = CheckNormalization(r.mean, r.std); !s.ok()) return fail(s.message());
  }
  for (int d = 0; d < 4; ++d) r.out_shape[d] = od[d];
  r.batch = batch;
  r.crops = cd[0] ? crops.typed_data() : nullptr;
  r.flips = fd[0] ? flips.typed_data() : nullptr;
  r.out = out.untyped_data();
  call->num_records = src.num_records;
  call->height = src.height;
  call->width = src.width;
  call->indices = indices.untyped_data();
  call->indices_are_64bit = it == ffi::DataType::S64;
  return ffi::Error::Success();
}

}  // namespace tbljax::xla_ffi
