// tbljax._ffi_cuda: registers the CUDA gather handlers (gather_cuda.cu) with XLA. Built only
// with -DTBLJAX_CUDA=ON, as its own module, so the same wheel imports on machines without CUDA;
// tbljax.ops (_src/jax/registration.py) registers it for platform "CUDA" when it imports.
#include <nanobind/nanobind.h>

#include "gather_call.h"

XLA_FFI_DECLARE_HANDLER_SYMBOL(TbljaxGatherCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(TbljaxGatherPackedCuda);

NB_MODULE(_ffi_cuda, m) {
  namespace nb = nanobind;
  m.doc() = "tbljax XLA FFI handlers for CUDA. Registered by tbljax.ops at import; use that.";
  m.def(
      "registrations",
      [] {
        nb::dict d;
        d[tbljax::xla_ffi::kGatherTarget] = nb::capsule(reinterpret_cast<void*>(&TbljaxGatherCuda));
        d[tbljax::xla_ffi::kGatherPackedTarget] =
            nb::capsule(reinterpret_cast<void*>(&TbljaxGatherPackedCuda));
        return d;
      },
      "{target name: PyCapsule of its XLA FFI handler}, for jax.ffi.register_ffi_target.");
}
