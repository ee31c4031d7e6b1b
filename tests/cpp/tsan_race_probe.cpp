// A deliberate data race, run only in the ThreadSanitizer tree (MOE_ROUTING_TSAN): the test
// tsan.detects_a_race passes only if ThreadSanitizer reports it. It proves that the TSan tree
// really instruments the library's thread pool, so that the silence of the other tests under TSan
// means something.
//
// Two pieces of one parallel_for job each add to a plain int. Each piece first waits (boundedly)
// until the other has started, so that they run on two threads and the two writes are unordered:
// the start handshake uses relaxed atomics, which order nothing. A job counts as concurrent only if
// the piece that started first saw the second start while it was still waiting: when the pool's
// worker sits a job out (it was starting up while the job was posted), the caller runs both pieces
// one after the other, and then the second piece also sees two starts, but nothing raced (counting
// that as concurrent made this test fail about one run in fifteen). Jobs are repeated until one
// ran its pieces concurrently.
#include <atomic>
#include <chrono>
#include <cstdio>

#include "core/thread_pool.h"

namespace {
int unguarded_total = 0;  // the race: written by both pieces without synchronisation
std::atomic<int> started{0};
std::atomic<bool> concurrent{false};
}  // namespace

int main() {
  moe_routing::detail::reserve_threads(2);
  for (int attempt = 0; attempt < 100 && !concurrent.load(); ++attempt) {
    started.store(0, std::memory_order_relaxed);
    moe_routing::detail::parallel_for(2, 2, [](int64_t begin, int64_t end) {
      const bool first = started.fetch_add(1, std::memory_order_relaxed) == 0;
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
      while (started.load(std::memory_order_relaxed) < 2 &&
             std::chrono::steady_clock::now() < deadline) {
      }
      if (first && started.load(std::memory_order_relaxed) == 2) concurrent.store(true);
      for (int64_t i = begin; i < end; ++i) unguarded_total += 1;
    });
  }
  if (!concurrent.load()) {
    std::printf("race probe: no job ran its two pieces on two threads\n");
    return 1;
  }
  std::printf("race probe finished, total %d\n", unguarded_total);
  return 0;
}
