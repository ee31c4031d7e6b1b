// The combine's random cases (tools/cases/finalize_cases.h) for the GoogleTest suites: their runs
// with the status asserted, their comparison as an assertion, and the error tables' runner.
#pragma once

#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "cases/finalize_cases.h"
#include "test_util.h"

namespace moe_routing::testing {

/// One row of an error table: a change to a valid call, and what the call must then return.
template <class Fixture>
struct ErrorCase {
  const char* name;
  std::function<void(Fixture&)> change;
  StatusCode code;
  const char* message;
};

/// Runs every case on every runner: `call(fixture, runner)` (on a fresh, changed fixture) must
/// return the case's category and a message containing its text, and `unwritten(fixture)` must
/// hold afterwards. Cases named "cuda tensors" are skipped in builds with the CUDA backend.
template <class Fixture, class Call, class Unwritten>
void expect_error_table(const std::vector<ErrorCase<Fixture>>& cases, Call call,
                        Unwritten unwritten) {
  for (const ErrorCase<Fixture>& c : cases) {
    SCOPED_TRACE(c.name);
    if (std::string(c.name) == "cuda tensors" && device_supported(Device::cuda)) continue;
    for (const Runner& runner : all_runners()) {
      Fixture f;
      c.change(f);
      const Status s = call(f, runner);
      EXPECT_EQ(s.code(), c.code) << runner.name() << ": " << s.message();
      EXPECT_NE(s.message().find(c.message), std::string::npos)
          << runner.name() << ": message was: " << s.message();
      EXPECT_TRUE(unwritten(f)) << runner.name() << ": an output was written on error";
    }
  }
}

/// Runs a forward case on one runner into a poisoned output; the status must be ok.
inline FloatBuffer run_finalize_case(FinalizeCase& c, const Runner& runner) {
  FloatBuffer out;
  const Status s = run_finalize(c, runner, &out);
  EXPECT_TRUE(s.is_ok()) << runner.name() << ": " << s.message();
  return out;
}

/// Runs a grad case on one runner into poisoned outputs (with the runner's caller workspace:
/// exactly the reported size, misaligned on purpose); the status must be ok.
inline GradResult run_finalize_grad_case(FinalizeGradCase& c, const Runner& runner) {
  GradResult r;
  const Status s = run_finalize_grad(c, runner, &r);
  EXPECT_TRUE(s.is_ok()) << runner.name() << ": " << s.message();
  return r;
}

inline ::testing::AssertionResult grad_results_equal(const GradResult& a, const GradResult& b) {
  return as_assertion(difference(a, b));
}

/// The CPU kernels' column-loop boundaries: `fn(h, dtype_variant, numerics, streamed)` for every
/// hidden size of `widths`, dtype and numerics, first with the outputs written through the
/// cache, then with every output streamed (which also turns on the prefetches ahead). Rows of an
/// odd length start at every alignment, so streamed rows also begin with their cached head.
template <class Fn>
void for_each_column_boundary(std::initializer_list<int64_t> widths, Fn fn) {
  for (bool streamed : {false, true}) {
    std::unique_ptr<StreamingThresholdOverride> small;
    if (streamed) small = std::make_unique<StreamingThresholdOverride>(1);
    for (int64_t h : widths)
      for (const DtypeVariant& d : kFinalizeDtypes)
        for (Numerics numerics : kFinalizeNumerics) fn(h, d, numerics, streamed);
  }
}

}  // namespace moe_routing::testing
