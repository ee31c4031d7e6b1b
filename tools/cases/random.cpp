#include "cases/random.h"

#include <algorithm>
#include <thread>
#include <vector>

namespace moe_routing::cases {

void fill_random(void* data, DType dtype, int64_t count, uint64_t seed) {
  constexpr int64_t kChunk = int64_t(1) << 20;
  const int64_t chunks = (count + kChunk - 1) / kChunk;
  const unsigned threads = std::max(1u, std::min(std::thread::hardware_concurrency(), 16u));
  auto worker = [&](unsigned w) {
    for (int64_t c = w; c < chunks; c += threads) {
      SplitMix64 rng(seed * 0x9e3779b97f4a7c15ull + uint64_t(c));
      const int64_t end = std::min(count, (c + 1) * kChunk);
      for (int64_t i = c * kChunk; i < end; ++i) {
        const uint64_t bits = rng.next();
        const float unit = float(int64_t(bits >> 40) - (int64_t(1) << 23)) * (1.0f / 8388608.0f);
        store_from_float(data, dtype, i, unit * (1.0f / float(1u << (bits & 7))));
      }
    }
  };
  std::vector<std::thread> pool;
  for (unsigned w = 1; w < threads; ++w) pool.emplace_back(worker, w);
  worker(0);
  for (std::thread& t : pool) t.join();
}

}  // namespace moe_routing::cases
