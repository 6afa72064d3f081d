// The keyed Feistel shuffle of tbljax/order.py, for the loader's hot path. tbljax/order.py
// documents the construction and stays the reference (it also runs in jax.numpy); this is the
// same arithmetic on uint32 halves, bit for bit, so NumPy, JAX and C++ agree.
#pragma once
#include <cstdint>

namespace tbljax {

inline constexpr int kShuffleRounds = 8;

// out[i] = the sample index at position pos[i] of a permutation of [0, n): 8 Feistel rounds
// on k = a + b bits (2^k >= n > 2^(k-1), a = k - k/2, b = k/2) with round keys `keys`, then
// cycle walking until the value is below n. Positions must lie in [0, n); n in [2, 2^62].
void FeistelPermute(const int64_t* pos, int64_t count, int64_t n,
                    const uint32_t keys[kShuffleRounds], int a, int b, int64_t* out);

}  // namespace tbljax
