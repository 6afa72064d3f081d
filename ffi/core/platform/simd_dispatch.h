// The one way the core compiles and chooses SIMD code, after Highway's foreach_target.h and
// HWY_DYNAMIC_DISPATCH: a kernel's per-target source (an .inc file) is compiled once per SIMD
// target by the driver at the end of this header, each copy in a namespace of its own and in a
// region whose target pragma lets the compiler use that target's ISA; a table of the copies'
// entry points is chosen from at run time by the active target (simd.h: TBLJAX_SIMD,
// SetSimdTarget), so every kernel follows the one choice and the tests reach every copy.
//
// A new kernel is one .inc and one registration:
//
//   // thing.inc -- no include guard: included once per target
//   namespace tbljax::thing_detail::TBLJAX_SIMD_NS {
//   void Run(const Job& job) {
//   #if TBLJAX_SIMD_LEVEL == 2   // avx512 (TBLJAX_AVX512_FEATURES)
//   #elif TBLJAX_SIMD_LEVEL == 1 // avx2 (TBLJAX_AVX2_FEATURES)
//   #else                        // scalar: portable C++, compiled outside any target region
//   #endif
//   }
//   }  // namespace tbljax::thing_detail::TBLJAX_SIMD_NS
//
//   // thing.cpp
//   #define TBLJAX_SIMD_INC "thing.inc"
//   #define TBLJAX_SIMD_TOP 1  // optional: no copy above avx2 (avx512 runs avx2's)
//   #include "simd_dispatch.h"
//   namespace tbljax::thing_detail {
//   TBLJAX_SIMD_EXPORT(Run);  // the table: Run of each target
//   }
//   ... TBLJAX_SIMD_DISPATCH(thing_detail::Run)(job);  // the active target's Run
//
// The rule for every .inc: plain code, its own helpers and intrinsics only. A std:: template
// (or any inline function defined outside the .inc) instantiated inside a target region may be
// emitted with that ISA and shared, via the linker, with callers on CPUs without it; what the
// copies need from outside comes as plain pointers and plain functions defined outside.
//
// The guarded part below is an ordinary header; the driver after it runs on every inclusion
// that defines TBLJAX_SIMD_INC.
#ifndef TBLJAX_PLATFORM_SIMD_DISPATCH_H_
#define TBLJAX_PLATFORM_SIMD_DISPATCH_H_

#include "simd.h"

#if TBLJAX_SIMD_X86
// A region compiled for a target: TBLJAX_PUSH_TARGET(TBLJAX_AVX2_FEATURES) ... TBLJAX_POP_TARGET.
// clang-format off
#define TBLJAX_PRAGMA_(x) _Pragma(#x)
#define TBLJAX_PRAGMA(x) TBLJAX_PRAGMA_(x)
#if defined(__clang__)
#define TBLJAX_PUSH_TARGET(features) \
  TBLJAX_PRAGMA(clang attribute push(__attribute__((target(features))), apply_to = function))
#define TBLJAX_POP_TARGET TBLJAX_PRAGMA(clang attribute pop)
#else
// GCC 12's AVX-512 headers trip -Wmaybe-uninitialized on _mm512_undefined_* (GCC PR105593).
#define TBLJAX_PUSH_TARGET(features)                                \
  TBLJAX_PRAGMA(GCC push_options)                                   \
  TBLJAX_PRAGMA(GCC target(features))                               \
  TBLJAX_PRAGMA(GCC diagnostic push)                                \
  TBLJAX_PRAGMA(GCC diagnostic ignored "-Wmaybe-uninitialized")
#define TBLJAX_POP_TARGET TBLJAX_PRAGMA(GCC diagnostic pop) TBLJAX_PRAGMA(GCC pop_options)
#endif
// clang-format on
// A function of an avx512 copy that may also use AVX-512 VBMI (taken only where SimdVbmi()):
// TBLJAX_AVX512_VBMI before it, inside #if TBLJAX_SIMD_LEVEL == 2. Its own target attribute adds
// to the region's (GCC 12; zig 0.17's clang, which builds the wheels: checked).
#define TBLJAX_AVX512_VBMI __attribute__((target("avx512vbmi")))
#include <immintrin.h>
#endif  // TBLJAX_SIMD_X86

namespace tbljax {

inline constexpr int kNumSimdTargets =
    static_cast<int>(sizeof(kSimdTargets) / sizeof(kSimdTargets[0]));

// The entry of a table (TBLJAX_SIMD_EXPORT) for target t.
template <typename Fn>
Fn SimdChoose(Fn const (&table)[kNumSimdTargets], SimdTarget t) {
  return table[static_cast<int>(t)];
}

// The entry for the active target; scalar's where TBLJAX_SIMD holds an unknown name (the
// serve kernel, which cannot run then, reports it).
template <typename Fn>
Fn SimdChoose(Fn const (&table)[kNumSimdTargets]) {
  SimdTarget t = SimdTarget::kScalar;
  if (!ActiveSimdTarget(&t).ok()) t = SimdTarget::kScalar;
  return table[static_cast<int>(t)];
}

}  // namespace tbljax

// The table of `name` over the targets, by SimdTarget; written in the namespace that holds the
// driver's per-target namespaces (simd_scalar, simd_avx2, simd_avx512), after the driver ran.
// A target not compiled (above TBLJAX_SIMD_TOP, or not x86) takes the best one below it.
#define TBLJAX_SIMD_TABLE(name) name##_simd_table
#define TBLJAX_SIMD_EXPORT(name)                                                                \
  constexpr decltype(&simd_scalar::name) TBLJAX_SIMD_TABLE(name)[::tbljax::kNumSimdTargets] = { \
      &simd_scalar::name, TBLJAX_SIMD_AVX2_ENTRY_(name), TBLJAX_SIMD_AVX512_ENTRY_(name)}
// `name` of the active target, and of target t; `name` may be qualified (thing_detail::Run).
#define TBLJAX_SIMD_DISPATCH(name) ::tbljax::SimdChoose(TBLJAX_SIMD_TABLE(name))
#define TBLJAX_SIMD_DISPATCH_FOR(t, name) ::tbljax::SimdChoose(TBLJAX_SIMD_TABLE(name), t)

#endif  // TBLJAX_PLATFORM_SIMD_DISPATCH_H_

// ---- the driver: TBLJAX_SIMD_INC once per target, levels 0 (scalar), 1 (avx2), 2 (avx512)
// up to TBLJAX_SIMD_TOP (default 2). TBLJAX_SIMD_NS names the copy's namespace and
// TBLJAX_SIMD_LEVEL its target, as SimdTarget's value. ----
#ifdef TBLJAX_SIMD_INC
#ifndef TBLJAX_SIMD_TOP
#define TBLJAX_SIMD_TOP 2
#endif
#undef TBLJAX_SIMD_AVX2_ENTRY_
#undef TBLJAX_SIMD_AVX512_ENTRY_

#define TBLJAX_SIMD_NS simd_scalar
#define TBLJAX_SIMD_LEVEL 0
#include TBLJAX_SIMD_INC
#undef TBLJAX_SIMD_NS
#undef TBLJAX_SIMD_LEVEL

#if TBLJAX_SIMD_X86 && TBLJAX_SIMD_TOP >= 1
TBLJAX_PUSH_TARGET(TBLJAX_AVX2_FEATURES)
#define TBLJAX_SIMD_NS simd_avx2
#define TBLJAX_SIMD_LEVEL 1
#include TBLJAX_SIMD_INC
#undef TBLJAX_SIMD_NS
#undef TBLJAX_SIMD_LEVEL
TBLJAX_POP_TARGET
#define TBLJAX_SIMD_AVX2_ENTRY_(name) &simd_avx2::name
#else
#define TBLJAX_SIMD_AVX2_ENTRY_(name) &simd_scalar::name
#endif

#if TBLJAX_SIMD_X86 && TBLJAX_SIMD_TOP >= 2
TBLJAX_PUSH_TARGET(TBLJAX_AVX512_FEATURES)
#define TBLJAX_SIMD_NS simd_avx512
#define TBLJAX_SIMD_LEVEL 2
#include TBLJAX_SIMD_INC
#undef TBLJAX_SIMD_NS
#undef TBLJAX_SIMD_LEVEL
TBLJAX_POP_TARGET
#define TBLJAX_SIMD_AVX512_ENTRY_(name) &simd_avx512::name
#else
#define TBLJAX_SIMD_AVX512_ENTRY_(name) TBLJAX_SIMD_AVX2_ENTRY_(name)
#endif

#undef TBLJAX_SIMD_INC
#undef TBLJAX_SIMD_TOP
#endif  // TBLJAX_SIMD_INC
