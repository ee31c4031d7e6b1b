// Deterministic random numbers for the test cases, the benchmarks, the demo and the fuzzer: the
// same values on every platform and standard library (std::mt19937_64 is specified bit for bit,
// SplitMix64 is written out; std:: distributions differ between libraries, so none is used).
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "moe_routing/dtype.h"

namespace moe_routing::cases {

/// The generator of the random test cases (tests, tools/gpu_check.cpp): std::mt19937_64 with
/// distributions of its own.
class Random {
 public:
  explicit Random(uint64_t seed) : engine_(seed) {}
  uint64_t next() { return engine_(); }
  /// Uniform integer in [lo, hi].
  int64_t integer(int64_t lo, int64_t hi) { return lo + int64_t(next() % uint64_t(hi - lo + 1)); }
  /// Uniform float in [-1, 1) with 24 random bits, times 2^scale_exponent.
  float uniform(int scale_exponent = 0) {
    float u = float(int64_t(next() >> 40) - (int64_t(1) << 23)) / float(1 << 23);
    return std::ldexp(u, scale_exponent);
  }

 private:
  std::mt19937_64 engine_;
};

/// SplitMix64: a tiny, fast, seedable generator for bulk data (the demo's and the benchmarks'
/// tensors, the synthetic routing, the fuzzer's buffers).
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  /// Uniform integer in [0, n), n > 0 (multiply-shift; bias below 2^-40 for the sizes used here).
  uint64_t below(uint64_t n) { return uint64_t((unsigned __int128)next() * n >> 64); }

 private:
  uint64_t state_;
};

/// Fills `count` elements of a floating `dtype` at `data` with gradient-like values (uniform in
/// +-2^-e, e in 0..7), on several threads. Chunk c of 2^20 elements always gets the generator
/// seeded with (seed, c), so the data never depends on the thread count.
void fill_random(void* data, DType dtype, int64_t count, uint64_t seed);

/// Signed zeros, NaN, +-Inf, subnormals of every type (float32's, float16's, bfloat16's), and
/// values whose sums and products overflow float16, bfloat16 and float32.
inline std::vector<float> special_floats() {
  const float inf = std::numeric_limits<float>::infinity();
  return {0.0f,
          -0.0f,
          inf,
          -inf,
          std::nanf(""),
          -std::nanf(""),
          std::numeric_limits<float>::denorm_min(),
          -std::ldexp(1.0f, -130),
          std::ldexp(1.0f, -24),
          -std::ldexp(1.0f, -133),
          65504.0f,
          60000.0f,
          -65504.0f,
          -60000.0f,
          3.38e38f,
          3.4e38f,
          -3.4e38f,
          1.0f,
          -1.0f};
}

}  // namespace moe_routing::cases
