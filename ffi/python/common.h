// Shared by the nanobind binding files: turning a core Status into a Python exception, the
// kernel's batch arguments, and the thread pools a call may ask for.
#pragma once
#include <Python.h>
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <array>
#include <optional>
#include <string>
#include <vector>

#include "kernel.h"
#include "status.h"
#include "thread_pool.h"

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

// The kernel's array arguments, as every entry that serves a batch takes them.
using IndexArray = nb::ndarray<const int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using CropArray = nb::ndarray<const int32_t, nb::shape<-1, 4>, nb::c_contig, nb::device::cpu>;
using SizeArray = nb::ndarray<const int32_t, nb::shape<-1, 2>, nb::c_contig, nb::device::cpu>;
// uint8 or bool (both one byte, nonzero = flip); checked by ParseGatherRequest.
using FlipArray = nb::ndarray<nb::ro, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
// Any dtype: checked against out_dtype (bfloat16 arrives as a uint16 view).
using OutArray = nb::ndarray<nb::ndim<4>, nb::c_contig, nb::device::cpu>;
using ByteArray = nb::ndarray<const uint8_t, nb::c_contig, nb::device::cpu>;
using I64Array = nb::ndarray<const int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using I32Array = nb::ndarray<const int32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using U8Array = nb::ndarray<const uint8_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

// Shards of records stored as bytes (RAW records of different sizes, JPEG records): shards[k]
// a C-contiguous uint8 array holding counts[k] records. Appends them to `raw` (their bytes)
// and `keep` (the arrays, kept alive by the source); returns the total record count.
int64_t ByteShards(const nb::sequence& shards, const I64Array& counts, std::vector<RawShard>* raw,
                   std::vector<nb::object>* keep);

// A GatherRequest from the arguments of _core.gather (bind_kernel.cpp): layout and dtype
// parsed, out's dtype checked against out_dtype, crop and flip rows counted. The arrays must
// outlive the request.
GatherRequest ParseGatherRequest(const IndexArray& indices, const OutArray& out,
                                 const std::string& layout, const std::string& out_dtype,
                                 const std::array<double, 3>& mean,
                                 const std::array<double, 3>& std,
                                 const std::optional<CropArray>& crop,
                                 const std::optional<FlipArray>& flip);

// NaFlex rows (GatherRequest::patch): patch > 0 with a (batch, 2) size per sample, or neither.
void SetPatches(GatherRequest* r, int64_t patch, const std::optional<SizeArray>& sizes);

// The per-image ops of a batch (kernel.h's OpsRequest) from the tuple tbljax.kernels builds:
// (codes (B, K) uint8, args (B, K) int32, matrices (B, K, 6) float64, fill (K, 3) uint8,
// nearest (K,) uint8, erase_boxes (B, E, 4) int32, erase_keys (B,) uint32, erase_mode int,
// normal_table (4096,) float32), shapes checked against `batch`. The tuple must outlive it.
OpsRequest ParseOps(const nb::tuple& ops, int64_t batch);

void BindFormat(nb::module_& m);
void BindKernel(nb::module_& m);
void BindDecode(nb::module_& m);
void BindServe(nb::module_& m);

// threads 0: the shared default pool; 1..kMaxThreads: a persistent pool of that size, made
// once per size and kept (bind_decode.cpp), so a call never spawns threads.
constexpr int kMaxThreads = 1024;
ThreadPool& PoolFor(int threads);
// Raises ValueError unless threads is 0 or 1..kMaxThreads; call with the GIL held, before
// releasing it for PoolFor (a typo must not start a million threads).
void CheckThreads(int threads);
#if TBLJAX_XLA_CPU
// bind_xla.cpp, compiled only where XLA's FFI headers were found.
void BindXla(nb::module_& m);
const char* XlaFfiApiVersion();  // "MAJOR.MINOR" of the headers the handlers were built with
#endif

}  // namespace tbljax::py
