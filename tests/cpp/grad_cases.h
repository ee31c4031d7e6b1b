// The backward's random cases (tools/cases/grad_cases.h) for the GoogleTest suites.
#pragma once

#include "cases/grad_cases.h"
#include "test_util.h"

namespace moe_routing::testing {

/// Runs a case on one runner, with a poisoned output; the status must be ok.
inline FloatBuffer run_grad_case(GradCase& c, const Runner& runner) {
  FloatBuffer out;
  const Status s = run_grad(c, runner, &out);
  EXPECT_TRUE(s.is_ok()) << s.message();
  return out;
}

}  // namespace moe_routing::testing
