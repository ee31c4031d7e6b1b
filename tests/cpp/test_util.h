// Helpers shared by the C++ tests: the test cases of tools/cases/ (moe_routing::cases, visible
// here as moe_routing::testing: typed buffers, owning tensors, the runners, the random
// generators), their comparisons as GoogleTest assertions, and scoped overrides of the
// streaming-store threshold and of the parallel loop.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include "cases/random.h"
#include "cases/runner.h"
#include "cases/tensor.h"
#include "core/cpu_tuning.h"
#include "core/memory_hints.h"
#include "moe_routing/moe_routing.hpp"

namespace moe_routing::testing {

using namespace cases;

/// A comparison of tools/cases/ ("" when equal, else the difference) as a GoogleTest assertion.
inline ::testing::AssertionResult as_assertion(const std::string& difference) {
  if (difference.empty()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << difference;
}

/// Compares bit patterns; on mismatch reports the first differing element and the count.
inline ::testing::AssertionResult bitwise_equal(const FloatBuffer& expected,
                                                const FloatBuffer& got) {
  return as_assertion(difference(expected, got));
}

/// Forces the non-temporal store threshold (core/memory_hints.h) for a scope, so that tests reach
/// the streaming paths with outputs of a few MiB whatever this machine's cache size is.
class StreamingThresholdOverride {
 public:
  explicit StreamingThresholdOverride(int64_t bytes) {
    detail::set_streaming_store_threshold_for_testing(bytes);
  }
  ~StreamingThresholdOverride() { detail::set_streaming_store_threshold_for_testing(0); }
  StreamingThresholdOverride(const StreamingThresholdOverride&) = delete;
  StreamingThresholdOverride& operator=(const StreamingThresholdOverride&) = delete;
};

/// Storage for `bytes` bytes starting `offset` bytes past a 64-byte boundary, poisoned, inside
/// poisoned margins that a write out of bounds changes (AddressSanitizer cannot see into them).
class OffsetStorage {
 public:
  OffsetStorage(size_t bytes, int offset) : bytes_(bytes), storage_(bytes + 128, kPoison) {
    const uintptr_t base = reinterpret_cast<uintptr_t>(storage_.data());
    data_ = storage_.data() + ((base + 63) / 64 * 64 - base) + size_t(offset);
  }
  uint8_t* data() { return data_; }
  /// Whether every byte outside the `bytes` at data() is still the poison.
  bool margins_untouched() const {
    const size_t begin = size_t(data_ - storage_.data()), end = begin + bytes_;
    for (size_t b = 0; b < storage_.size(); ++b)
      if ((b < begin || b >= end) && storage_[b] != kPoison) return false;
    return true;
  }

 private:
  static constexpr uint8_t kPoison = 0x7f;
  size_t bytes_;
  std::vector<uint8_t> storage_;
  uint8_t* data_ = nullptr;
};

/// Forces the CPU tuning (core/cpu_tuning.h) for a scope, so that tests take every tuning's
/// prefetch policy whatever CPU they run on.
class CpuTuningOverride {
 public:
  explicit CpuTuningOverride(detail::CpuTuning tuning) {
    detail::set_cpu_tuning_for_testing(&tuning);
  }
  ~CpuTuningOverride() { detail::set_cpu_tuning_for_testing(nullptr); }
  CpuTuningOverride(const CpuTuningOverride&) = delete;
  CpuTuningOverride& operator=(const CpuTuningOverride&) = delete;
};

/// Runs the kernels' parallel loops for a scope through a host loop that gives every job, however
/// small, as many pieces as it asks threads for and runs them one after the other on the calling
/// thread, last piece first: small test cases then take the multi-threaded splits (each piece a
/// contiguous share of the units) that the built-in pool keeps for jobs of 2 MiB per thread.
class EveryJobSplitIntoPieces {
 public:
  EveryJobSplitIntoPieces() { set_parallel_backend(&reverse_pieces, 1); }
  ~EveryJobSplitIntoPieces() { set_parallel_backend(nullptr); }
  EveryJobSplitIntoPieces(const EveryJobSplitIntoPieces&) = delete;
  EveryJobSplitIntoPieces& operator=(const EveryJobSplitIntoPieces&) = delete;

 private:
  static void reverse_pieces(int64_t num_tasks, int pieces, void (*task)(void*, int64_t, int64_t),
                             void* context) {
    for (int64_t piece = pieces - 1; piece >= 0; --piece)
      task(context, num_tasks * piece / pieces, num_tasks * (piece + 1) / pieces);
  }
};

/// Calls check(threads, what) for each thread count, first with the built-in pool, then with every
/// job split into that many pieces (EveryJobSplitIntoPieces); `what` names the run in messages
/// ("3 threads", "3 pieces").
template <class Check>
void for_each_split(std::initializer_list<int> thread_counts, const Check& check) {
  for (const bool split : {false, true}) {
    std::optional<EveryJobSplitIntoPieces> pieces;
    if (split) pieces.emplace();
    for (int threads : thread_counts)
      check(threads, std::to_string(threads) + (split ? " pieces" : " threads"));
  }
}

}  // namespace moe_routing::testing
