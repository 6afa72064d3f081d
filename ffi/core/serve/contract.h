// What every path that makes a batch agrees on -- the host kernel, the XLA CPU and CUDA
// handlers and, through the bindings, Python: the names of the layouts and output dtypes, the
// normalization contract with its exact tables, and the checks of a request's arguments, each
// with the one message users see. Pure functions, no state, no SIMD: the CUDA module links
// this part of the core alone (CMake target tbljax_contract).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

#include "status.h"

namespace tbljax {

// ---------------------------------------------------------------------------------------
// Output dtypes and layouts: each name is spelled here once
// ---------------------------------------------------------------------------------------

enum class OutDType : int { kUint8 = 0, kFloat32 = 1, kBfloat16 = 2 };
inline constexpr OutDType kOutDTypes[] = {OutDType::kUint8, OutDType::kFloat32,
                                          OutDType::kBfloat16};
// "uint8", "float32", "bfloat16" ("?" for a value that is not an OutDType).
const char* OutDTypeName(OutDType t);
// Bytes per element: 1, 4, 2; 0 for a value that is not an OutDType.
int OutDTypeBytes(OutDType t);
// By name; `arg` names the argument in the error ("out_dtype='x' is not one of: ...").
Status ParseOutDType(std::string_view name, OutDType* out, const char* arg = "out_dtype");
std::string OutDTypeNames();  // "uint8, float32, bfloat16", for messages

enum class Layout : int { kNHWC = 0, kNCHW = 1 };
inline constexpr Layout kLayouts[] = {Layout::kNHWC, Layout::kNCHW};
const char* LayoutName(Layout l);  // "NHWC", "NCHW"
Status ParseLayout(std::string_view name, Layout* out, const char* arg = "layout");

// The XLA custom-call targets of the gather (the CPU handlers in _core and the CUDA ones in
// _ffi_cuda register under these names; Python reads them as _core.GATHER_TARGET and
// _core.GATHER_PACKED_TARGET): records of one size in an (N, H, W, 3) array, and records of
// different sizes packed at page starts. The *_ops targets take the per-image ops
// (kernel.h's OpsRequest) and NaFlex rows (GatherRequest::patch, out_sizes) as further
// operands; only the CPU handlers register them.
inline constexpr const char* kGatherTarget = "tbljax_gather_normalize";
inline constexpr const char* kGatherPackedTarget = "tbljax_gather_normalize_packed";
inline constexpr const char* kGatherOpsTarget = "tbljax_gather_normalize_ops";
inline constexpr const char* kGatherPackedOpsTarget = "tbljax_gather_normalize_packed_ops";

// ---------------------------------------------------------------------------------------
// Normalization contract (DESIGN.md §3)
// ---------------------------------------------------------------------------------------
// For pixel x of channel c the output is the float32 / bfloat16 nearest (ties to even) to
// (x/255 - mean[c]) / std[c] evaluated in float64; bfloat16 is rounded from the float64
// directly, never through float32 (which would round twice). Every mean must be finite and
// every std finite and > 0 (a negative std would mirror the value range; no recipe wants it,
// and the Python front end has always refused it).

// mean[c] finite, std[c] finite and > 0, or InvalidArgument naming the first that is not.
Status CheckNormalization(const double mean[3], const double std[3]);
// (x/255 - mean) / std in float64, exactly as the contract spells it.
double NormalizeValue(int x, double mean, double std);
// The bfloat16 (bit pattern) nearest to d, ties to even. Exact for every finite double.
uint16_t DoubleToBfloat16(double d);
// The float32 values / bfloat16 bit patterns for the 3 x 256 inputs: table[c * 256 + x].
// The parameters must pass CheckNormalization.
void NormalizeTableF32(const double mean[3], const double std[3], float table[3 * 256]);
void NormalizeTableBf16(const double mean[3], const double std[3], uint16_t table[3 * 256]);

// ---------------------------------------------------------------------------------------
// The checks of concrete arguments (host kernel, XLA CPU handler, Python)
// ---------------------------------------------------------------------------------------

// Every indices[b] in [0, num_records), or OutOfRange naming the first position and value.
Status CheckIndices(const int64_t* indices, int64_t batch, int64_t num_records);
// box = crops[b] = (y0, x0, h, w) a non-empty box inside a height x width record whose resize
// to (out_h, out_w) stays within the exact int32 arithmetic of kernel.h (not checked when
// out_h or out_w is 0), or InvalidArgument naming it.
Status CheckCropBox(int64_t b, const int32_t* box, int64_t height, int64_t width, int64_t out_h,
                    int64_t out_w);
// CheckCropBox for every box of a batch of records of one size.
Status CheckCrops(const int32_t* crops, int64_t batch, int64_t height, int64_t width,
                  int64_t out_h = 0, int64_t out_w = 0);
// Without crop boxes the output is the records' size: (out_h, out_w) == (height, width).
Status CheckOutputSize(bool has_crops, int64_t out_h, int64_t out_w, int64_t height, int64_t width);

// A double as Python's repr() writes it ("0.0", "-2.5", "1e-05", "nan"), so that a message
// built here reads the same as one built in Python.
std::string FormatDouble(double v);

}  // namespace tbljax
