// Shared by the nanobind binding files: turning a core Status into a Python exception.
#pragma once
#include <Python.h>
#include <nanobind/nanobind.h>

#include "status.h"

namespace tbljax::py {

namespace nb = nanobind;

// Exception types created in module.cpp (both subclass ValueError).
extern PyObject* g_corrupt_file_error;
extern PyObject* g_decode_error;

// Raises the Python exception for a failed Status. Call with the GIL held.
[[noreturn]] void Raise(const Status& s);
inline void Check(const Status& s) {
  if (!s.ok()) Raise(s);
}

void BindFormat(nb::module_& m);
void BindKernel(nb::module_& m);
void BindDecode(nb::module_& m);
#if TBLJAX_XLA_CPU
// bind_xla.cpp, compiled only where XLA's FFI headers were found.
void BindXla(nb::module_& m);
const char* XlaFfiApiVersion();  // "MAJOR.MINOR" of the headers the handlers were built with
#endif

}  // namespace tbljax::py
