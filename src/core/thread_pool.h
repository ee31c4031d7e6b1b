// A small persistent thread pool for the CPU kernels.
//
// Determinism does not depend on it: every kernel makes each output element a function of its own
// inputs in a fixed order, so how tasks are split among threads never changes a bit.
#pragma once

#include <cstdint>
#include <functional>

namespace moe_routing::detail {

/// The thread count a call runs with: `requested` if > 0, else the library default.
int resolve_num_threads(int requested);

/// Work smaller than this per thread is not worth waking a thread for (a wake-up costs about as
/// much as moving this many bytes).
constexpr int64_t kMinBytesPerThread = int64_t(256) << 10;

/// The threads worth using for a job that moves `bytes`: at most `threads`, at least 1.
inline int threads_for_bytes(int threads, int64_t bytes) {
  const int64_t useful = bytes / kMinBytesPerThread;
  if (useful < 1) return 1;
  return useful < threads ? int(useful) : threads;
}

/// Calls fn(begin, end) on contiguous pieces covering [0, num_tasks), using up to `num_threads`
/// threads (the caller's included). Returns when every piece is done. When the pool is busy with
/// another call (concurrent or nested use) the work runs inline on the calling thread.
void parallel_for(int64_t num_tasks, int num_threads,
                  const std::function<void(int64_t, int64_t)>& fn);

}  // namespace moe_routing::detail
