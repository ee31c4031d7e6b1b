// The demo's and the benchmarks' synthetic routing (tools/cases/synthetic.h): the scenarios, the
// library forward's expanded_row_idx on the spec's worked examples (§2.6), properties of the
// random routing, and that every derived backward problem is valid for the library.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <set>

#include "cases/random.h"
#include "cases/synthetic.h"
#include "moe_routing/moe_routing.hpp"

namespace moe_routing::cases {
namespace {

using Indices = std::vector<int32_t>;

RoutingScenario dropless(int64_t expert_num) {
  RoutingScenario s;
  s.attrs.expert_num = expert_num;
  return s;
}

TEST(CliSynthetic, ScenariosAreCannsThreeConfigurations) {
  const int64_t n = 301, k = 3, e = 10, pairs = n * k;
  const std::vector<RoutingScenario> s = routing_scenarios(n, k, e);
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(s[0].scenario, GradScenario::dropless);
  EXPECT_EQ(s[0].attrs.drop_pad_mode, 0);
  EXPECT_EQ(s[0].attrs.active_num, 0);
  EXPECT_EQ(s[0].attrs.expert_tokens_count_or_cumsum_flag, 2);
  EXPECT_EQ(s[1].scenario, GradScenario::active);
  EXPECT_EQ(s[1].attrs.active_num, pairs * 3 / 4);
  EXPECT_EQ(s[1].attrs.expert_tokens_count_or_cumsum_flag, 1);
  EXPECT_EQ(s[2].scenario, GradScenario::drop_pad);
  EXPECT_EQ(s[2].attrs.drop_pad_mode, 1);
  EXPECT_EQ(s[2].attrs.expert_capacity, (pairs + e - 1) / e);  // 91
  EXPECT_TRUE(s[2].attrs.expert_tokens_before_capacity_flag);
  for (const RoutingScenario& scenario : s) EXPECT_EQ(scenario.attrs.expert_num, e);
  // One pair: active_num never drops to 0 (which would mean "dropless").
  EXPECT_EQ(routing_scenarios(1, 1, 1)[1].attrs.active_num, 1);
  // Capacity stays within N (the library requires it) when K == E.
  EXPECT_EQ(routing_scenarios(7, 5, 5)[2].attrs.expert_capacity, 7);
}

TEST(CliSynthetic, ForwardMatchesTheSpecExamples) {
  // G1's forward: expert_idx [[2,0,1],[0,2,1]], E=3.
  EXPECT_EQ(forward_expanded_row_idx({2, 0, 1, 0, 2, 1}, 3, dropless(3)),
            (Indices{4, 0, 2, 1, 5, 3}));
  // F1: expert_idx [[1,0],[2,1],[0,2]], E=3; active_num does not change expanded_row_idx.
  EXPECT_EQ(forward_expanded_row_idx({1, 0, 2, 1, 0, 2}, 2, dropless(3)),
            (Indices{2, 0, 4, 3, 1, 5}));
  RoutingScenario active = dropless(3);
  active.attrs.active_num = 3;
  active.attrs.expert_tokens_count_or_cumsum_flag = 1;
  EXPECT_EQ(forward_expanded_row_idx({1, 0, 2, 1, 0, 2}, 2, active), (Indices{2, 0, 4, 3, 1, 5}));
  // F2: drop-pad, expert_idx [[0,1],[0,2],[0,1],[1,0]], E=3, C=2.
  RoutingScenario drop_pad = dropless(3);
  drop_pad.attrs.drop_pad_mode = 1;
  drop_pad.attrs.expert_capacity = 2;
  drop_pad.attrs.expert_tokens_before_capacity_flag = true;
  EXPECT_EQ(forward_expanded_row_idx({0, 1, 0, 2, 0, 1, 1, 0}, 2, drop_pad),
            (Indices{0, 2, 1, 4, -1, 3, -1, -1}));
  // The seed's example expanded_row_idx 4 1 5 3 0 2 is what expert_idx [[3,1],[3,2],[0,1]] gives.
  EXPECT_EQ(forward_expanded_row_idx({3, 1, 3, 2, 0, 1}, 2, dropless(4)),
            (Indices{4, 1, 5, 3, 0, 2}));
  // No pairs at all.
  EXPECT_EQ(forward_expanded_row_idx({}, 2, dropless(4)), Indices{});
}

TEST(CliSynthetic, ForwardReportsTheLibrarysErrors) {
  RoutingScenario counted = dropless(3);
  counted.attrs.expert_tokens_count_or_cumsum_flag = 2;
  try {
    forward_expanded_row_idx({0, 1, 3, 2}, 2, counted);
    FAIL() << "an id >= expert_num must be rejected";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), StatusCode::index_out_of_range);
    EXPECT_STREQ(error.what(),
                 "moe_init_routing_v2: expert_idx[1][0] must be in [0, 3) (expert_num), got 3");
  }
  RoutingScenario drop_pad = dropless(3);
  drop_pad.attrs.drop_pad_mode = 1;  // expert_capacity 0
  EXPECT_THROW(forward_expanded_row_idx({0, 1}, 2, drop_pad), Error);
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

/// random_expert_idx as it was first written (a linear scan per draw): the routing a seed gives
/// must not change.
Indices scanned_random_expert_idx(int64_t num_tokens, int64_t top_k, int64_t expert_num,
                                  uint64_t seed) {
  Indices expert_idx(size_t(num_tokens * top_k));
  std::vector<uint64_t> weight(static_cast<size_t>(expert_num));
  for (int64_t e = 0; e < expert_num; ++e)
    weight[size_t(e)] = uint64_t(std::llround(1048576.0 / std::sqrt(double(e + 1)))) + 1;
  std::vector<uint64_t> remaining(weight.size());
  cases::SplitMix64 rng(seed);
  for (int64_t i = 0; i < num_tokens; ++i) {
    remaining = weight;
    uint64_t total = 0;
    for (uint64_t w : remaining) total += w;
    for (int64_t t = 0; t < top_k; ++t) {
      uint64_t r = rng.below(total);
      int64_t e = 0;
      while (r >= remaining[size_t(e)]) r -= remaining[size_t(e++)];
      expert_idx[size_t(i * top_k + t)] = int32_t(e);
      total -= remaining[size_t(e)];
      remaining[size_t(e)] = 0;
    }
  }
  return expert_idx;
}

TEST(CliSynthetic, RandomRoutingIsTheLinearScansDrawForEverySeed) {
  for (const auto& [n, k, e] : std::vector<std::array<int64_t, 3>>{{1, 1, 1},
                                                                   {7, 1, 1},
                                                                   {5, 3, 3},
                                                                   {9, 4, 5},
                                                                   {33, 8, 64},
                                                                   {20, 2, 63},
                                                                   {11, 7, 65},
                                                                   {4, 100, 100},
                                                                   {3, 30, 1000},
                                                                   {50, 8, 256}})
    for (uint64_t seed : {0ull, 1ull, 1234ull, 0xfedcba9876543210ull})
      ASSERT_EQ(random_expert_idx(n, k, e, seed), scanned_random_expert_idx(n, k, e, seed))
          << n << " tokens, top " << k << " of " << e << ", seed " << seed;
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

  // Each problem's indices are what the library's reference forward returns with real rows.
  const std::vector<RoutingScenario> scenarios = routing_scenarios(n, k, e);
  std::vector<float> x(size_t(n * 2), 1.0f);
  for (size_t i = 0; i < scenarios.size(); ++i) {
    MoeInitRoutingV2Plan plan;
    const TensorView xv(x.data(), DType::float32, {n, 2});
    const TensorView ids(expert_idx.data(), DType::int32, {n, k});
    ASSERT_TRUE(infer_moe_init_routing_v2(xv, ids, scenarios[i].attrs, &plan).is_ok());
    std::vector<float> expanded_x(size_t(plan.expanded_x.numel()));
    Indices row_idx(static_cast<size_t>(pairs));
    std::vector<int32_t> counts(static_cast<size_t>(e));
    auto view = [](void* data, const OutputSpec& spec) {
      return spec.produced ? TensorView(data, spec.dtype, spec.ndim, spec.shape) : TensorView();
    };
    ExecConfig reference;
    reference.backend = Backend::reference;
    const Status s =
        moe_init_routing_v2(xv, ids, scenarios[i].attrs, view(expanded_x.data(), plan.expanded_x),
                            view(row_idx.data(), plan.expanded_row_idx),
                            view(counts.data(), plan.expert_tokens_count_or_cumsum),
                            view(counts.data(), plan.expert_tokens_before_capacity), reference);
    ASSERT_TRUE(s.is_ok()) << s.message();
    EXPECT_EQ(problems[i].expanded_row_idx, row_idx) << grad_scenario_name(problems[i].scenario);
    // grad_expanded_x has the forward's expanded_x shape, with the problem's hidden size.
    std::vector<int64_t> forward_shape(plan.expanded_x.shape,
                                       plan.expanded_x.shape + plan.expanded_x.ndim);
    forward_shape.back() = h;
    EXPECT_EQ(problems[i].grad_shape, forward_shape) << grad_scenario_name(problems[i].scenario);
  }

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
}  // namespace moe_routing::cases
