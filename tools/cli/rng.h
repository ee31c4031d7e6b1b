// SplitMix64: a tiny, fast, seedable generator whose output is the same on every platform and
// standard library (std:: distributions are not), for the demo's synthetic data.
#pragma once

#include <cstdint>

namespace moe_routing::cli {

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

}  // namespace moe_routing::cli
