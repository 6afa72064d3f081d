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
// CPUID and XGETBV read directly, not __builtin_cpu_supports: that builtin reads a table that
// the compiler's runtime fills at start-up, and zig's (scripts/build-manylinux.sh) leaves it
// empty, so every CPU would look like a plain x86-64 there.
void Cpuid(unsigned leaf, unsigned sub, unsigned r[4]) {
  __asm__("cpuid" : "=a"(r[0]), "=b"(r[1]), "=c"(r[2]), "=d"(r[3]) : "a"(leaf), "c"(sub));
}
#endif

CpuFeatures Detect() {
  CpuFeatures f;
#if TBLJAX_SIMD_X86
  unsigned r[4];
  Cpuid(0, 0, r);
  const unsigned max_leaf = r[0];
  Cpuid(1, 0, r);
  const unsigned ecx1 = r[2];
  auto bit = [](unsigned reg, int n) { return ((reg >> n) & 1u) != 0; };
  // The OS saves the XMM and YMM registers (XCR0 bits 1, 2), and for AVX-512 also the opmask
  // and ZMM ones (bits 5-7): without that the wider instructions fault.
  unsigned long long xcr0 = 0;
  if (bit(ecx1, 27)) {  // OSXSAVE: XGETBV may be used
    unsigned lo, hi;
    __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    xcr0 = (static_cast<unsigned long long>(hi) << 32) | lo;
  }
  const bool os_avx = bit(ecx1, 28) && (xcr0 & 0x6) == 0x6;
  const bool os_avx512 = os_avx && (xcr0 & 0xe0) == 0xe0;
  unsigned ebx7 = 0, ecx7 = 0;
  if (max_leaf >= 7) {
    Cpuid(7, 0, r);
    ebx7 = r[1];
    ecx7 = r[2];
  }
  f.pclmul = bit(ecx1, 1);
  f.popcnt = bit(ecx1, 23);
  f.fma = os_avx && bit(ecx1, 12);
  f.f16c = os_avx && bit(ecx1, 29);
  f.bmi = bit(ebx7, 3);
  f.bmi2 = bit(ebx7, 8);
  f.avx2 = os_avx && bit(ebx7, 5);
  f.avx512f = os_avx512 && bit(ebx7, 16);
  f.avx512dq = os_avx512 && bit(ebx7, 17);
  f.avx512bw = os_avx512 && bit(ebx7, 30);
  f.avx512vl = os_avx512 && bit(ebx7, 31);
  f.avx512vbmi = os_avx512 && bit(ecx7, 1);
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
    {"avx512dq", &CpuFeatures::avx512dq}, {"avx512vbmi", &CpuFeatures::avx512vbmi},
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

namespace {
std::atomic<bool> g_vbmi_allowed{true};
}  // namespace

bool SimdVbmi() {
  return DetectedCpuFeatures().avx512vbmi && g_vbmi_allowed.load(std::memory_order_relaxed);
}

void SetSimdVbmi(bool allowed) { g_vbmi_allowed.store(allowed, std::memory_order_relaxed); }

}  // namespace tbljax
