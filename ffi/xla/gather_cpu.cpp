// The serve kernel as an XLA FFI handler for the CPU platform, compiled into tbljax._core
// (ffi/python/bind_xla.cpp hands it to JAX). A thin wrapper: it checks the call
// (gather_call.h) and runs the same tbljax::Gather, on the same thread pool and SIMD target,
// as the host loader, so the in-jit path and the loader agree bit for bit by construction.
#include <cstdint>
#include <memory>
#include <string>

#include "gather_call.h"
#include "kernel.h"

namespace tbljax::xla_ffi {
namespace {

// int32 indices (JAX without x64) widened for the kernel, in per-thread memory that only
// grows, so steady-state calls allocate nothing.
const int64_t* WidenIndices(const int32_t* idx, int64_t n) {
  thread_local std::unique_ptr<int64_t[]> buf;
  thread_local int64_t capacity = 0;
  if (capacity < n) {
    buf.reset(new int64_t[n]);
    capacity = n;
  }
  for (int64_t i = 0; i < n; ++i) buf[i] = idx[i];
  return buf.get();
}

// The request's indices as the kernel takes them (int64).
void SetIndices(const Call& call, GatherRequest* r) {
  r->indices = call.indices_are_64bit
                   ? static_cast<const int64_t*>(call.indices)
                   : WidenIndices(static_cast<const int32_t*>(call.indices), r->batch);
}

ffi::Error GatherCpu(DataArg data, IndexArg indices, CropArg crops, FlipArg flips,
                     ffi::RemainingArgs /*aliased output, if any*/, ffi::Span<const double> mean,
                     ffi::Span<const double> stdev, std::string_view layout,
                     ffi::Result<ffi::AnyBuffer> out) {
  SourceShape shape;
  if (ffi::Error e = ShapeOfData(data, &shape); e.failure()) return e;
  Call call;
  if (ffi::Error e = PrepareCall(shape, indices, crops, flips, mean, stdev, layout, *out, &call);
      e.failure())
    return e;
  SetIndices(call, &call.request);
  RawSource source;
  if (Status s = RawSource::Create({RawShard{data.typed_data(), call.num_records}}, call.height,
                                   call.width, &source);
      !s.ok())
    return ToError(s);
  return ToError(Gather(source, call.request));
}

// Records of different sizes, packed at page starts: the kernel reads each record's own
// height and width from the table (and checks that the records it reads lie in the pages).
ffi::Error GatherPackedCpu(PagesArg pages, TableArg table, IndexArg indices, CropArg crops,
                           FlipArg flips, ffi::RemainingArgs /*aliased output, if any*/,
                           ffi::Span<const double> mean, ffi::Span<const double> stdev,
                           std::string_view layout, ffi::Result<ffi::AnyBuffer> out) {
  SourceShape shape;
  if (ffi::Error e = ShapeOfPacked(pages, table, &shape); e.failure()) return e;
  Call call;
  if (ffi::Error e = PrepareCall(shape, indices, crops, flips, mean, stdev, layout, *out, &call);
      e.failure())
    return e;
  SetIndices(call, &call.request);
  const auto pd = pages.dimensions();
  RecordTable t;
  t.pages = table.typed_data();
  t.page_bytes = pd[1];
  t.heights = table.typed_data() + 1;
  t.widths = table.typed_data() + 2;
  t.stride = 3;
  RawSource source;
  if (Status s = RawSource::CreateVariable(
          {RawShard{pages.typed_data(), call.num_records, pd[0] * pd[1]}}, t, &source);
      !s.ok())
    return ToError(s);
  return ToError(Gather(source, call.request));
}

}  // namespace
}  // namespace tbljax::xla_ffi

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    TbljaxGatherCpu, tbljax::xla_ffi::GatherCpu,
    tbljax::xla_ffi::BindGatherCall(xla::ffi::Ffi::Bind().Arg<tbljax::xla_ffi::DataArg>()));

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    TbljaxGatherPackedCpu, tbljax::xla_ffi::GatherPackedCpu,
    tbljax::xla_ffi::BindGatherCall(
        xla::ffi::Ffi::Bind().Arg<tbljax::xla_ffi::PagesArg>().Arg<tbljax::xla_ffi::TableArg>()));
