// The demo's synthetic routing (tools/cli/synthetic.h): the forward's expanded_row_idx on the
// spec's worked examples (§2.6), properties of the random routing, and that every derived
// backward problem is valid for the library.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "moe_routing/moe_routing.hpp"
#include "synthetic.h"

namespace moe_routing::cli {
namespace {

using Indices = std::vector<int32_t>;

TEST(CliSynthetic, ForwardMatchesTheSpecExamples) {
  // G1's forward: expert_idx [[2,0,1],[0,2,1]], E=3.
  EXPECT_EQ(forward_expanded_row_idx({2, 0, 1, 0, 2, 1}, 3, 3, 0, 0), (Indices{4, 0, 2, 1, 5, 3}));
  // F1: expert_idx [[1,0],[2,1],[0,2]], E=3 (active_num does not change expanded_row_idx).
  EXPECT_EQ(forward_expanded_row_idx({1, 0, 2, 1, 0, 2}, 2, 3, 0, 0), (Indices{2, 0, 4, 3, 1, 5}));
  // F2: drop-pad, expert_idx [[0,1],[0,2],[0,1],[1,0]], E=3, C=2.
  EXPECT_EQ(forward_expanded_row_idx({0, 1, 0, 2, 0, 1, 1, 0}, 2, 3, 1, 2),
            (Indices{0, 2, 1, 4, -1, 3, -1, -1}));
  // The seed's example expanded_row_idx 4 1 5 3 0 2 is what expert_idx [[3,1],[3,2],[0,1]] gives.
  EXPECT_EQ(forward_expanded_row_idx({3, 1, 3, 2, 0, 1}, 2, 4, 0, 0), (Indices{4, 1, 5, 3, 0, 2}));
}

TEST(CliSynthetic, RandomRoutingIsDistinctInRangeSkewedAndSeeded) {
  const int64_t n = 2000, k = 8, e = 64;
  const Indices a = random_expert_idx(n, k, e, 7);
  ASSERT_EQ(a.size(), size_t(n * k));
  std::vector<int64_t> count(e, 0);
  for (int64_t i = 0; i < n; ++i) {
    std::set<int32_t> experts(a.begin() + i * k, a.begin() + (i + 1) * k);
    EXPECT_EQ(experts.size(), size_t(k)) << "token " << i << " repeats an expert";
    for (int32_t x : experts) {
      ASSERT_GE(x, 0);
      ASSERT_LT(x, e);
      ++count[x];
    }
  }
  // Weight 1/sqrt(e+1): expert 0 is picked clearly more often than expert 63, and every expert
  // gets some tokens.
  EXPECT_GT(count[0], 2 * count[63]);
  EXPECT_GT(*std::min_element(count.begin(), count.end()), 0);
  EXPECT_EQ(random_expert_idx(n, k, e, 7), a);
  EXPECT_NE(random_expert_idx(n, k, e, 8), a);
  // K = E: every token takes every expert.
  const Indices all = random_expert_idx(3, 5, 5, 1);
  for (int64_t i = 0; i < 3; ++i)
    EXPECT_EQ(std::set<int32_t>(all.begin() + i * 5, all.begin() + i * 5 + 5).size(), 5u);
}

TEST(CliSynthetic, ProblemsHaveCannsShapesAndAreValid) {
  const int64_t n = 301, k = 3, e = 10, h = 5;
  const Indices expert_idx = random_expert_idx(n, k, e, 3);
  const std::vector<GradProblem> problems = grad_problems(expert_idx, n, k, e, h);
  ASSERT_EQ(problems.size(), 3u);
  const int64_t pairs = n * k, capacity = (pairs + e - 1) / e;  // 91

  EXPECT_EQ(problems[0].scenario, GradScenario::dropless);
  EXPECT_EQ(problems[0].grad_shape, (std::vector<int64_t>{pairs, h}));
  Indices sorted = problems[0].expanded_row_idx;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t d = 0; d < pairs; ++d) ASSERT_EQ(sorted[d], d) << "not a permutation";

  EXPECT_EQ(problems[1].scenario, GradScenario::active);
  EXPECT_EQ(problems[1].attrs.active_num, pairs * 3 / 4);
  EXPECT_EQ(problems[1].grad_shape, (std::vector<int64_t>{pairs * 3 / 4, h}));
  EXPECT_EQ(problems[1].expanded_row_idx, problems[0].expanded_row_idx);

  EXPECT_EQ(problems[2].scenario, GradScenario::drop_pad);
  EXPECT_EQ(problems[2].attrs.drop_pad_mode, 1);
  EXPECT_EQ(problems[2].expert_capacity, capacity);
  EXPECT_EQ(problems[2].grad_shape, (std::vector<int64_t>{e, capacity, h}));
  // Each slot e*C + c is used once, by a pair routed to expert e; the skew makes some drops.
  std::set<int32_t> slots;
  int64_t dropped = 0;
  for (int64_t p = 0; p < pairs; ++p) {
    const int32_t slot = problems[2].expanded_row_idx[p];
    if (slot == -1) {
      ++dropped;
      continue;
    }
    EXPECT_EQ(slot / capacity, expert_idx[p]) << "pair " << p;
    EXPECT_TRUE(slots.insert(slot).second) << "slot " << slot << " used twice";
  }
  EXPECT_GT(dropped, 0);

  for (const GradProblem& problem : problems) {
    std::vector<float> grad(size_t(problem.grad_shape[0] * problem.grad_shape[1] *
                                   (problem.grad_shape.size() == 3 ? problem.grad_shape[2] : 1)),
                            1.0f);
    std::vector<float> out(size_t(n * h), -1.0f);
    Indices idx = problem.expanded_row_idx;
    ExecConfig reference;
    reference.backend = Backend::reference;
    Status s =
        moe_init_routing_grad(TensorView(grad.data(), DType::float32,
                                         int(problem.grad_shape.size()), problem.grad_shape.data()),
                              TensorView(idx.data(), DType::int32, {pairs}), problem.attrs,
                              TensorView(out.data(), DType::float32, {n, h}), reference);
    ASSERT_TRUE(s.is_ok()) << grad_scenario_name(problem.scenario) << ": " << s.message();
    // All-ones gradients: each output is the number of pairs of the token that were kept.
    for (int64_t i = 0; i < n; ++i) {
      int kept = 0;
      for (int64_t t = 0; t < k; ++t) {
        const int32_t r = idx[i * k + t];
        kept += r != -1 && (problem.attrs.active_num == 0 || r < problem.attrs.active_num);
      }
      ASSERT_EQ(out[i * h], float(kept)) << grad_scenario_name(problem.scenario) << " token " << i;
    }
  }
}

}  // namespace
}  // namespace moe_routing::cli
