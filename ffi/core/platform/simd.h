// The SIMD targets of the whole core: the CPU's features, detected once; the targets built
// from them; the one process-wide choice (TBLJAX_SIMD or SetSimdTarget) that every kernel
// follows. How code is compiled for a target and chosen at run time: simd_dispatch.h.
#pragma once
#include <string>
#include <vector>

#include "status.h"

// TBLJAX_SIMD_X86 is 1 where the x86 targets are compiled: x86-64 with GCC or Clang (function
// target attributes, __builtin_cpu_supports). TBLJAX_SIMD_GENERIC_ONLY builds only the portable
// code, as on other machines (a way to check that build on x86).
#if (defined(__x86_64__) || defined(_M_X64)) && (defined(__GNUC__) || defined(__clang__)) && \
    !defined(TBLJAX_SIMD_GENERIC_ONLY)
#define TBLJAX_SIMD_X86 1
#else
#define TBLJAX_SIMD_X86 0
#endif

// The features of each target: code compiled for a target may use any of them, and the target
// is offered only on a CPU (and OS) that has every one. AVX2 implies PCLMULQDQ (the CRC's
// carry-less multiply) on every x86 CPU made, so it is part of the avx2 target. One literal
// each (a target pragma does not concatenate strings); avx512 is avx2's list and four more.
// DetectedCpuFeatures() checks exactly these names.
#define TBLJAX_AVX2_FEATURES "avx2,fma,bmi,bmi2,f16c,popcnt,pclmul"
#define TBLJAX_AVX512_FEATURES \
  "avx2,fma,bmi,bmi2,f16c,popcnt,pclmul,avx512f,avx512bw,avx512vl,avx512dq"

namespace tbljax {

// What the CPU and OS offer (AVX state saved by the OS included), detected once per process.
struct CpuFeatures {
  bool avx2 = false, fma = false, bmi = false, bmi2 = false, f16c = false, popcnt = false,
       pclmul = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false;
  bool avx512vbmi = false;  // not part of a target: see SimdVbmi
};
const CpuFeatures& DetectedCpuFeatures();
// The names of the features present, in the spelling of the target strings above.
std::vector<std::string> CpuFeatureNames(const CpuFeatures& f);

// "scalar" is portable C++ for the baseline ISA (what the compiler makes of it, no intrinsics;
// the CRC uses its tables); "avx2" needs TBLJAX_AVX2_FEATURES, "avx512" TBLJAX_AVX512_FEATURES.
// The active target is the best the CPU supports, capped by the environment variable
// TBLJAX_SIMD (auto | scalar | avx2 | avx512), read at first use, or set by SetSimdTarget.
enum class SimdTarget : int { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };
inline constexpr SimdTarget kSimdTargets[] = {SimdTarget::kScalar, SimdTarget::kAvx2,
                                              SimdTarget::kAvx512};

const char* SimdTargetName(SimdTarget t);
// The targets this CPU can run, best last (always starts with scalar).
std::vector<SimdTarget> SupportedSimdTargets();
// The target that every kernel (simd_dispatch.h) uses now. Fails only when
// TBLJAX_SIMD holds an unknown name.
Status ActiveSimdTarget(SimdTarget* out);
// Sets the target by name: "auto" (the best supported), or one this CPU supports.
Status SetSimdTarget(const std::string& name);

// AVX-512 VBMI (byte permutes) is not in the avx512 target (CPUs before Ice Lake and Zen 4 lack
// it): the avx512 copy of a kernel may use it in functions marked TBLJAX_AVX512_VBMI
// (simd_dispatch.h), taken only where SimdVbmi() is true: the CPU has it and it is allowed.
// SetSimdVbmi(false) makes the avx512 copies run their code without it (for tests).
bool SimdVbmi();
void SetSimdVbmi(bool allowed);

}  // namespace tbljax
