// Helpers shared by the C++ tests: the test cases of tools/cases/ (moe_routing::cases, visible
// here as moe_routing::testing: typed buffers, owning tensors, the runners, the random
// generators), their comparisons as GoogleTest assertions, and a scoped override of the
// streaming-store threshold.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "cases/random.h"
#include "cases/runner.h"
#include "cases/tensor.h"
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

}  // namespace moe_routing::testing
