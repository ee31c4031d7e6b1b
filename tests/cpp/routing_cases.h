// The forward operators' cases (tools/cases/routing_cases.h) for the GoogleTest suites: their
// byte-exact comparisons as assertions.
#pragma once

#include "cases/routing_cases.h"
#include "test_util.h"

namespace moe_routing::testing {

/// Byte-exact comparison with a report of the first difference.
inline ::testing::AssertionResult same_tensor(const Tensor& expected, const Tensor& got) {
  return as_assertion(difference(expected, got));
}

/// Same status code and every output byte for byte.
inline ::testing::AssertionResult same_result(const ForwardResult& a, const ForwardResult& b) {
  return as_assertion(difference(a, b));
}
inline ::testing::AssertionResult same_result(const V2Result& a, const V2Result& b) {
  return as_assertion(difference(a, b));
}

}  // namespace moe_routing::testing
