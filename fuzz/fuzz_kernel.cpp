// libFuzzer harness for the serve kernel's argument validation and its crop/resize/flip paths:
// Gather over a small source with every request field taken from the input (indices, crop
// boxes, flips, dtype, layout, output shape, mean, std, alignment, SIMD target). Gather must either
// reject the request without touching `out`, or write exactly the output and nothing else.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernel.h"

using namespace tbljax;

namespace {

// Consumes the input front to back; past its end it yields zeros.
struct Reader {
  const uint8_t* p;
  size_t n;
  template <typename T>
  T Take() {
    T v{};
    const size_t k = n < sizeof(T) ? n : sizeof(T);
    std::memcpy(&v, p, k);
    p += k;
    n -= k;
    return v;
  }
};

void Expect(bool ok) {
  if (!ok) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Reader in{data, size};
  const uint8_t shape = in.Take<uint8_t>();
  // Sides up to 22 x 36 reach every vector path (AVX2 lanes need rows of 16+ bytes, AVX-512
  // blocks 16+ output pixels, the mirror 6+ pixels) and their tails.
  const int64_t H = 1 + (shape & 7) * 3, W = 1 + (shape >> 3 & 7) * 5, N = 1 + (shape >> 6);
  std::vector<uint8_t> pixels(static_cast<size_t>(N * H * W * 3));
  for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<uint8_t>(i * 37 + (i >> 5));
  // Two shards (the second may be empty) exercise the shard lookup.
  const uint8_t split_byte = in.Take<uint8_t>();
  const int64_t split = split_byte % (N + 1);
  RawSource src;
  Expect(RawSource::Create({{pixels.data(), split}, {pixels.data() + split * H * W * 3, N - split}},
                           H, W, &src)
             .ok());

  GatherRequest r;
  const uint8_t mode = in.Take<uint8_t>();
  // Every run sets its SIMD target (one of those this CPU has) from bit 7 and the shard byte,
  // so each target is fuzzed and a crash replays on the same one.
  static const std::vector<SimdTarget> targets = SupportedSimdTargets();
  const size_t t = ((mode >> 7) | (split_byte / (N + 1)) << 1) % targets.size();
  Expect(SetSimdTarget(SimdTargetName(targets[t])).ok());
  r.dtype = static_cast<OutDType>(mode & 3);  // 3 is not a dtype: must be rejected
  r.layout = (mode & 4) ? Layout::kNCHW : Layout::kNHWC;
  const bool use_crops = mode & 8, use_flips = mode & 16, misalign = mode & 32;
  r.batch = static_cast<int8_t>(in.Take<uint8_t>()) % 9;  // may be negative
  const int64_t batch = r.batch > 0 ? r.batch : 0;
  for (int d = 0; d < 4; ++d) r.out_shape[d] = static_cast<int8_t>(in.Take<uint8_t>()) % 24;
  if (mode & 64) {  // usually a consistent shape, so the fuzzer gets past validation
    const int64_t oh = 1 + in.Take<uint8_t>() % 24, ow = 1 + in.Take<uint8_t>() % 72;
    const bool nchw = r.layout == Layout::kNCHW;
    const int64_t s[4] = {r.batch, nchw ? 3 : oh, nchw ? oh : ow, nchw ? ow : 3};
    std::memcpy(r.out_shape, s, sizeof s);
  }
  std::vector<int64_t> indices(batch);
  for (auto& i : indices) {
    const int8_t v = static_cast<int8_t>(in.Take<uint8_t>());
    i = v == -128 ? in.Take<int64_t>() : v % (N + 2);  // mostly near the valid range
  }
  r.indices = batch ? indices.data() : nullptr;
  std::vector<int32_t> crops(batch * 4);
  for (auto& c : crops) {
    const int8_t v = static_cast<int8_t>(in.Take<uint8_t>());
    c = v == -128 ? in.Take<int32_t>() : v % 40;
  }
  if (use_crops) r.crops = crops.data();
  std::vector<uint8_t> flips(batch);
  for (auto& f : flips) f = in.Take<uint8_t>();
  if (use_flips) r.flips = flips.data();
  for (int c = 0; c < 3; ++c) {
    const uint8_t k = in.Take<uint8_t>();
    r.mean[c] = k < 200 ? (k - 100) / 50.0 : in.Take<double>();  // the tail: any double
    const uint8_t j = in.Take<uint8_t>();
    r.std[c] = j < 200 ? (j - 100) / 40.0 : in.Take<double>();
  }

  // The buffer the caller owns, with guard bytes around it; its size follows out_shape
  // whenever that is a shape (else a small dummy: Gather must not write to it).
  int64_t elems = 1;
  bool positive = true;
  for (int64_t d : r.out_shape) {
    positive = positive && d > 0;
    elems *= d > 0 ? d : 1;
  }
  const size_t elem_bytes = (mode & 3) == 1 ? 4 : (mode & 3) == 2 ? 2 : 1;
  const size_t bytes = positive ? static_cast<size_t>(elems) * elem_bytes : 8;
  constexpr size_t kGuard = 64;
  std::vector<uint8_t> buf(bytes + 2 * kGuard + 8, 0xA5);
  uint8_t* out = buf.data() + kGuard + (misalign ? 1 : 0);
  // The alignment the allocator gives is 16; the guard keeps it (64) unless misaligned.
  r.out = out;

  const Status s = Gather(src, r);
  if (!s.ok()) {
    Expect(!s.message().empty());
    for (uint8_t b : buf) Expect(b == 0xA5);  // rejected: nothing written at all
    return 0;
  }
  // Accepted: the request was consistent, and only the output region was written.
  Expect(positive || r.batch == 0);
  for (size_t i = 0; i < kGuard; ++i) Expect(buf[i] == 0xA5);
  for (size_t i = kGuard + (misalign ? 1 : 0) + (positive ? bytes : 0); i < buf.size(); ++i)
    Expect(buf[i] == 0xA5);
  if (r.dtype == OutDType::kFloat32 && batch) {
    // Normalized values of finite parameters are never NaN.
    for (int64_t i = 0; i < elems; ++i) {
      float v;
      std::memcpy(&v, out + 4 * i, 4);
      Expect(!std::isnan(v));
    }
  }
  return 0;
}
