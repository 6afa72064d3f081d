// The SIMD targets (see simd.h): one detection, one override, one choice for the core.
#include "simd.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "names.h"

namespace tbljax {
namespace {

#if TBLJAX_SIMD_X86
// Clang before 16 has no "f16c" for __builtin_cpu_supports (the core would not compile with
// it); CPUID leaf 1, ECX bit 29 says the same thing everywhere.
bool CpuHasF16c() {
#if defined(__clang__) && __clang_major__ < 16
  unsigned a, b, c, d;
  __asm__("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(1), "c"(0));
  return (c >> 29) & 1;
#else
  return __builtin_cpu_supports("f16c");
#endif
}
#endif

CpuFeatures Detect() {
  CpuFeatures f;
#if TBLJAX_SIMD_X86
  // __builtin_cpu_supports also checks that the OS saves the wider registers (XGETBV).
  __builtin_cpu_init();
  f.avx2 = __builtin_cpu_supports("avx2");
  f.fma = __builtin_cpu_supports("fma");
  f.bmi = __builtin_cpu_supports("bmi");
  f.bmi2 = __builtin_cpu_supports("bmi2");
  f.f16c = CpuHasF16c();
  f.popcnt = __builtin_cpu_supports("popcnt");
  f.pclmul = __builtin_cpu_supports("pclmul");
  f.avx512f = __builtin_cpu_supports("avx512f");
  f.avx512bw = __builtin_cpu_supports("avx512bw");
  f.avx512vl = __builtin_cpu_supports("avx512vl");
  f.avx512dq = __builtin_cpu_supports("avx512dq");
#endif
  return f;
}

// Each feature under the name the target strings (simd.h) use.
struct NamedFeature {
  const char* name;
  bool CpuFeatures::*flag;
};
constexpr NamedFeature kFeatures[] = {
    {"avx2", &CpuFeatures::avx2},         {"fma", &CpuFeatures::fma},
    {"bmi", &CpuFeatures::bmi},           {"bmi2", &CpuFeatures::bmi2},
    {"f16c", &CpuFeatures::f16c},         {"popcnt", &CpuFeatures::popcnt},
    {"pclmul", &CpuFeatures::pclmul},     {"avx512f", &CpuFeatures::avx512f},
    {"avx512bw", &CpuFeatures::avx512bw}, {"avx512vl", &CpuFeatures::avx512vl},
    {"avx512dq", &CpuFeatures::avx512dq},
};

// Whether f has every feature of a target string ("avx2,fma,..."): the string the code is
// compiled with is the one checked, so the two cannot disagree. A name not in kFeatures means
// the target is never offered (and the tests, which expect avx2 here, fail).
bool HasAll(const CpuFeatures& f, const char* list) {
  const std::string s(list);
  for (size_t begin = 0; begin <= s.size();) {
    size_t end = s.find(',', begin);
    if (end == std::string::npos) end = s.size();
    const std::string name = s.substr(begin, end - begin);
    bool known = false;
    for (const NamedFeature& n : kFeatures) {
      if (name == n.name) {
        if (!(f.*n.flag)) return false;
        known = true;
      }
    }
    if (!known) return false;
    begin = end + 1;
  }
  return true;
}

SimdTarget BestSupported() {
  static const SimdTarget best = [] {
#if TBLJAX_SIMD_X86
    const CpuFeatures& f = DetectedCpuFeatures();
    if (HasAll(f, TBLJAX_AVX512_FEATURES)) return SimdTarget::kAvx512;
    if (HasAll(f, TBLJAX_AVX2_FEATURES)) return SimdTarget::kAvx2;
#endif
    return SimdTarget::kScalar;
  }();
  return best;
}

bool ParseTarget(const std::string& name, bool* is_auto, SimdTarget* t) {
  *is_auto = false;
  if (name == "auto" || name.empty()) {
    *is_auto = true;
    return true;
  }
  return FindByName(name, kSimdTargets, SimdTargetName, t);
}

// "auto, scalar, avx2, avx512": what TBLJAX_SIMD and SetSimdTarget take.
std::string TargetChoices() { return "auto, " + JoinNames(kSimdTargets, SimdTargetName); }

std::mutex g_target_mu;
bool g_target_set = false;  // guarded by g_target_mu
std::atomic<int> g_target{-1};

}  // namespace

const CpuFeatures& DetectedCpuFeatures() {
  static const CpuFeatures features = Detect();
  return features;
}

std::vector<std::string> CpuFeatureNames(const CpuFeatures& f) {
  std::vector<std::string> v;
  for (const NamedFeature& n : kFeatures)
    if (f.*n.flag) v.emplace_back(n.name);
  return v;
}

const char* SimdTargetName(SimdTarget t) {
  switch (t) {
    case SimdTarget::kScalar: return "scalar";
    case SimdTarget::kAvx2: return "avx2";
    case SimdTarget::kAvx512: return "avx512";
  }
  return "?";
}

std::vector<SimdTarget> SupportedSimdTargets() {
  std::vector<SimdTarget> v;
  for (int t = 0; t <= static_cast<int>(BestSupported()); ++t)
    v.push_back(static_cast<SimdTarget>(t));
  return v;
}

Status ActiveSimdTarget(SimdTarget* out) {
  const int cached = g_target.load(std::memory_order_acquire);
  if (cached >= 0) {
    *out = static_cast<SimdTarget>(cached);
    return Status::Ok();
  }
  std::lock_guard<std::mutex> lock(g_target_mu);
  if (!g_target_set) {
    // TBLJAX_SIMD caps the target (Highway-style): asking for more than the CPU has gives the
    // best it has; an unknown name is an error rather than a silent default.
    const char* env = std::getenv("TBLJAX_SIMD");
    const std::string name = env ? env : "auto";
    bool is_auto;
    SimdTarget want = SimdTarget::kScalar;
    if (!ParseTarget(name, &is_auto, &want))
      return InvalidArgument("TBLJAX_SIMD='" + name + "' is not one of: " + TargetChoices());
    const SimdTarget best = BestSupported();
    const SimdTarget t = is_auto || want > best ? best : want;
    g_target.store(static_cast<int>(t), std::memory_order_release);
    g_target_set = true;
  }
  *out = static_cast<SimdTarget>(g_target.load(std::memory_order_acquire));
  return Status::Ok();
}

Status SetSimdTarget(const std::string& name) {
  bool is_auto;
  SimdTarget want = SimdTarget::kScalar;
  if (!ParseTarget(name, &is_auto, &want))
    return InvalidArgument("SIMD target '" + name + "' is not one of: " + TargetChoices());
  const SimdTarget best = BestSupported();
  if (!is_auto && want > best)
    return InvalidArgument(std::string("SIMD target '") + name +
                           "' is not supported by this CPU (best: " + SimdTargetName(best) + ")");
  std::lock_guard<std::mutex> lock(g_target_mu);
  g_target.store(static_cast<int>(is_auto ? best : want), std::memory_order_release);
  g_target_set = true;
  return Status::Ok();
}

}  // namespace tbljax
