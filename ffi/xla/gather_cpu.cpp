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

ffi::Error GatherCpu(DataArg data, IndexArg indices, CropArg crops, FlipArg flips,
                     ffi::RemainingArgs /*aliased output, if any*/, ffi::Span<const double> mean,
                     ffi::Span<const double> stdev, std::string_view layout,
                     ffi::Result<ffi::AnyBuffer> out) {
  Call call;
  if (ffi::Error e = PrepareCall(data, indices, crops, flips, mean, stdev, layout, *out, &call);
      e.failure())
    return e;
  GatherRequest& r = call.request;
  r.indices = call.indices_are_64bit
                  ? static_cast<const int64_t*>(call.indices)
                  : WidenIndices(static_cast<const int32_t*>(call.indices), r.batch);
  RawSource source;
  if (Status s = RawSource::Create({RawShard{data.typed_data(), call.num_records}}, call.height,
                                   call.width, &source);
      !s.ok())
    return ToError(s);
  return ToError(Gather(source, r));
}

}  // namespace
}  // namespace tbljax::xla_ffi

XLA_FFI_DEFINE_HANDLER_SYMBOL(TbljaxGatherCpu, tbljax::xla_ffi::GatherCpu,
                              xla::ffi::Ffi::Bind()
                                  .Arg<tbljax::xla_ffi::DataArg>()
                                  .Arg<tbljax::xla_ffi::IndexArg>()
                                  .Arg<tbljax::xla_ffi::CropArg>()
                                  .Arg<tbljax::xla_ffi::FlipArg>()
                                  .RemainingArgs()
                                  .Attr<xla::ffi::Span<const double>>("mean")
                                  .Attr<xla::ffi::Span<const double>>("std")
                                  .Attr<std::string_view>("layout")
                                  .Ret<xla::ffi::AnyBuffer>());
