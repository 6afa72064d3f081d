// The XLA CPU handlers of this module, handed to JAX: xla_registrations() gives {target name:
// PyCapsule}, which _src/jax/registration.py registers for platform "cpu" at import. Compiled
// in only when the build found XLA's FFI headers (jax.ffi.include_dir()); the handlers live in
// ffi/xla/gather_cpu.cpp and run the same core, pool and SIMD target as the rest of _core.
#include "common.h"
#include "gather_call.h"

XLA_FFI_DECLARE_HANDLER_SYMBOL(TbljaxGatherCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(TbljaxGatherPackedCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(TbljaxGatherOpsCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(TbljaxGatherPackedOpsCpu);

namespace tbljax::py {

void BindXla(nb::module_& m) {
  m.def(
      "xla_registrations",
      [] {
        nb::dict d;
        d[xla_ffi::kGatherTarget] = nb::capsule(reinterpret_cast<void*>(&TbljaxGatherCpu));
        d[xla_ffi::kGatherPackedTarget] =
            nb::capsule(reinterpret_cast<void*>(&TbljaxGatherPackedCpu));
        d[xla_ffi::kGatherOpsTarget] = nb::capsule(reinterpret_cast<void*>(&TbljaxGatherOpsCpu));
        d[xla_ffi::kGatherPackedOpsTarget] =
            nb::capsule(reinterpret_cast<void*>(&TbljaxGatherPackedOpsCpu));
        return d;
      },
      "{target name: PyCapsule of its XLA FFI handler for CPU}, for "
      "jax.ffi.register_ffi_target(name, capsule, platform='cpu').");
}

const char* XlaFfiApiVersion() {
#define TBLJAX_STR2(x) #x
#define TBLJAX_STR(x) TBLJAX_STR2(x)
  return TBLJAX_STR(XLA_FFI_API_MAJOR) "." TBLJAX_STR(XLA_FFI_API_MINOR);
#undef TBLJAX_STR
#undef TBLJAX_STR2
}

}  // namespace tbljax::py
