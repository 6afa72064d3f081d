// tbljax._core: the one native module. The nanobind front end over the C++ core (each
// bind_*.cpp adds one room) and, where XLA's FFI headers were found, the XLA CPU handlers
// (bind_xla.cpp), so the loader and the in-jit op share one thread pool and one SIMD target.
#include <lz4.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstddef>
#include <cstdio>
#include <string>
#include <vector>

#include <jpeglib.h>  // after <cstddef> and <cstdio>: it needs size_t and FILE

#include "common.h"
#include "decode.h"
#include "kernel.h"
#include "linked_versions.h"
#include "simd.h"
#include "thread_pool.h"

namespace tbljax::py {

PyObject* g_corrupt_file_error = nullptr;
PyObject* g_decode_error = nullptr;

void Raise(const Status& s) {
  PyObject* type = PyExc_RuntimeError;
  switch (s.code()) {
    case Code::kInvalidArgument: type = PyExc_ValueError; break;
    case Code::kOutOfRange: type = PyExc_IndexError; break;
    case Code::kIOError: type = PyExc_OSError; break;
    case Code::kCorrupt: type = g_corrupt_file_error; break;
    case Code::kDecodeError: type = g_decode_error; break;
    case Code::kUnimplemented: type = PyExc_NotImplementedError; break;
    case Code::kCancelled: type = PyExc_KeyboardInterrupt; break;
    case Code::kOk: break;
  }
  PyErr_SetString(type, s.message().c_str());
  throw nb::python_error();
}

}  // namespace tbljax::py

#define TBLJAX_STR2(x) #x
#define TBLJAX_STR(x) TBLJAX_STR2(x)

NB_MODULE(_core, m) {
  namespace nb = nanobind;
  using namespace tbljax::py;
  m.doc() = "tbljax native core (TBL format, decode, kernels). Use the tbljax package, not this.";

  g_corrupt_file_error = PyErr_NewExceptionWithDoc(
      "tbljax.CorruptFileError",
      "A TBL file's bytes break the format: truncated, damaged or not a TBL file.",
      PyExc_ValueError, nullptr);
  g_decode_error = PyErr_NewExceptionWithDoc("tbljax.DecodeError", "An image could not be decoded.",
                                             PyExc_ValueError, nullptr);
  m.attr("CorruptFileError") = nb::borrow(g_corrupt_file_error);
  m.attr("DecodeError") = nb::borrow(g_decode_error);

  m.def(
      "native_info",
      [] {
        nb::dict d;
        d["version"] = TBLJAX_VERSION;
        d["compiler"] = __VERSION__;
        d["nanobind"] = TBLJAX_STR(NB_VERSION_MAJOR) "." TBLJAX_STR(
            NB_VERSION_MINOR) "." TBLJAX_STR(NB_VERSION_PATCH);
        // The libraries' versions as linked and run (see linked_versions.h), and the headers'.
        const std::string jpeg = tbljax::LinkedLibjpegTurboVersion();
        d["libjpeg_turbo"] = jpeg.empty() ? "unknown" : jpeg;
        d["libjpeg_turbo_headers"] = TBLJAX_STR(LIBJPEG_TURBO_VERSION);
        d["libjpeg_library"] = tbljax::LinkedLibjpegPath();
        d["jpeg_lib_version"] = JPEG_LIB_VERSION;
        d["lz4"] = tbljax::LinkedLz4Version();
        d["lz4_headers"] = LZ4_VERSION_STRING;
        // "static": both are linked into this module (a wheel); "shared": the system's.
        d["native_deps"] = TBLJAX_STATIC_DEPS ? "static" : "shared";
        // One pool for the loader, the decoder and the XLA CPU handler: its size (what it has if
        // started, what it will start with otherwise).
        d["default_threads"] = tbljax::ThreadPool::DefaultThreadCount();
        const tbljax::ThreadPool* pool = tbljax::ThreadPool::DefaultIfStarted();
        d["threads"] = pool ? pool->num_threads() : tbljax::ThreadPool::DefaultThreadCount();
        d["pool_started"] = pool != nullptr;
        // One SIMD target for the serve kernel, the resize and the CRC.
        tbljax::SimdTarget simd;
        d["simd"] = tbljax::ActiveSimdTarget(&simd).ok() ? tbljax::SimdTargetName(simd)
                                                         : "invalid TBLJAX_SIMD";
        std::vector<std::string> targets;
        for (tbljax::SimdTarget t : tbljax::SupportedSimdTargets())
          targets.emplace_back(tbljax::SimdTargetName(t));
        d["simd_targets"] = targets;
        d["cpu_features"] = tbljax::CpuFeatureNames(tbljax::DetectedCpuFeatures());
#if TBLJAX_XLA_CPU
        d["xla_cpu"] = true;
        d["xla_ffi_api"] = XlaFfiApiVersion();
#else
        d["xla_cpu"] = false;
        d["xla_ffi_api"] = nb::none();
#endif
        d["jpeg_idct"] = tbljax::kJpegIdctName;
        d["resize_filter"] = tbljax::kResizeFilterName;
        return d;
      },
      "What this build of the core was compiled with and what it runs.");

  BindFormat(m);
  BindKernel(m);
  BindDecode(m);
  BindServe(m);
#if TBLJAX_XLA_CPU
  BindXla(m);
#endif
}
