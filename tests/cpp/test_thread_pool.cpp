// The thread pool under back-to-back jobs of different sizes: every piece runs exactly once per
// job. (A worker that lingered in one job's piece loop once took a piece of the next job, ran it
// twice and unbalanced the completion count.)
#include <gtest/gtest.h>

#include <atomic>
#include <vector>

#include "core/thread_pool.h"

namespace moe_routing {
namespace {

TEST(ThreadPool, BackToBackJobsRunEveryPieceOnce) {
  std::vector<std::atomic<int>> hits(64);
  for (int iteration = 0; iteration < 20000; ++iteration) {
    const int pieces = iteration % 3 == 0 ? 8 : (iteration % 3 == 1 ? 2 : 5);
    for (int p = 0; p < pieces; ++p) hits[p].store(0);
    detail::parallel_for(pieces, pieces, [&](int64_t begin, int64_t end) {
      for (int64_t p = begin; p < end; ++p) hits[p].fetch_add(1);
    });
    for (int p = 0; p < pieces; ++p) ASSERT_EQ(hits[p].load(), 1) << "iteration " << iteration << " piece " << p;
  }
}

TEST(ThreadPool, NestedCallsRunInline) {
  std::atomic<int64_t> total{0};
  detail::parallel_for(4, 4, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i)
      detail::parallel_for(10, 4, [&](int64_t b, int64_t e) { total += e - b; });
  });
  EXPECT_EQ(total.load(), 40);
}

}  // namespace
}  // namespace moe_routing
