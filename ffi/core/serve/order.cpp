#include "order.h"

namespace tbljax {
namespace {

inline uint32_t Mix32(uint32_t x) {  // lowbias32, as order.mix32
  x ^= x >> 16;
  x *= 0x7FEB352Du;
  x ^= x >> 15;
  x *= 0x846CA68Bu;
  return x ^ (x >> 16);
}

inline uint64_t Feistel(uint64_t x, int a, int b, const uint32_t keys[kShuffleRounds]) {
  uint32_t left = static_cast<uint32_t>(x >> b);
  uint32_t right = static_cast<uint32_t>(x & ((uint64_t{1} << b) - 1));
  int wl = a, wr = b;
  for (int r = 0; r < kShuffleRounds; ++r) {
    // The halves are at most 31 bits (n <= 2^62), so the mask never needs a 32-bit shift.
    const uint32_t f = Mix32(right ^ keys[r]) & static_cast<uint32_t>((uint64_t{1} << wl) - 1);
    const uint32_t t = left ^ f;
    left = right;
    right = t;
    const int w = wl;
    wl = wr;
    wr = w;
  }
  return (static_cast<uint64_t>(left) << b) | right;
}

}  // namespace

void FeistelPermute(const int64_t* pos, int64_t count, int64_t n,
                    const uint32_t keys[kShuffleRounds], int a, int b, int64_t* out) {
  for (int64_t i = 0; i < count; ++i) {
    uint64_t y = Feistel(static_cast<uint64_t>(pos[i]), a, b, keys);
    while (y >= static_cast<uint64_t>(n)) y = Feistel(y, a, b, keys);  // < 2 passes on average
    out[i] = static_cast<int64_t>(y);
  }
}

}  // namespace tbljax
