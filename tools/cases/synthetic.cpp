#include "cases/synthetic.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "cases/random.h"

namespace moe_routing::cases {

std::vector<int32_t> random_expert_idx(int64_t num_tokens, int64_t top_k, int64_t expert_num,
                                       uint64_t seed) {
  std::vector<int32_t> expert_idx(size_t(num_tokens * top_k));
  // Integer weights round(2^20 / sqrt(e + 1)) + 1: sqrt and division are correctly rounded
  // everywhere, so a seed gives the same routing on every platform. Each token draws K times
  // without replacement: a drawn expert's weight drops to 0 for the rest of that token. The draw
  // r in [0, remaining total) picks the first expert whose running sum of remaining weights
  // exceeds r; a Fenwick tree over the weights finds it in O(log E) (a scan took O(E) per draw:
  // days for K = E = 2^24) and takes the K drawn weights out and back per token.
  const size_t count = size_t(expert_num);
  std::vector<uint64_t> weight(count);
  for (size_t e = 0; e < count; ++e)
    weight[e] = uint64_t(std::llround(1048576.0 / std::sqrt(double(e + 1)))) + 1;
  std::vector<uint64_t> tree(count + 1, 0);  // tree[i]: the weights of (i - lowbit(i), i]
  auto add = [&tree, count](size_t e, uint64_t delta) {  // delta modulo 2^64: removal too
    for (size_t i = e + 1; i <= count; i += i & (~i + 1)) tree[i] += delta;
  };
  uint64_t full_total = 0;
  for (size_t e = 0; e < count; ++e) {
    add(e, weight[e]);
    full_total += weight[e];
  }
  size_t top_bit = 1;
  while (top_bit * 2 <= count) top_bit *= 2;
  SplitMix64 rng(seed);
  for (int64_t i = 0; i < num_tokens; ++i) {
    int32_t* const token = expert_idx.data() + i * top_k;
    uint64_t total = full_total;
    for (int64_t t = 0; t < top_k; ++t) {
      uint64_t r = rng.below(total);
      // The largest prefix whose sum is <= r; the expert right after it is the one drawn.
      size_t position = 0;
      for (size_t step = top_bit; step > 0; step /= 2)
        if (position + step <= count && tree[position + step] <= r) {
          position += step;
          r -= tree[position];
        }
      token[t] = int32_t(position);
      total -= weight[position];
      add(position, ~weight[position] + 1);  // remaining weight 0 for the rest of the token
    }
    for (int64_t t = 0; t < top_k; ++t) add(size_t(token[t]), weight[size_t(token[t])]);
  }
  return expert_idx;
}

std::vector<RoutingScenario> routing_scenarios(int64_t num_tokens, int64_t top_k,
                                               int64_t expert_num) {
  const int64_t pairs = num_tokens * top_k;
  std::vector<RoutingScenario> scenarios(3);

  scenarios[0].scenario = GradScenario::dropless;
  scenarios[0].attrs.expert_num = expert_num;
  scenarios[0].attrs.expert_tokens_count_or_cumsum_flag = 2;  // count

  scenarios[1].scenario = GradScenario::active;
  scenarios[1].attrs.expert_num = expert_num;
  scenarios[1].attrs.active_num = std::max<int64_t>(1, pairs * 3 / 4);
  scenarios[1].attrs.expert_tokens_count_or_cumsum_flag = 1;  // cumsum

  scenarios[2].scenario = GradScenario::drop_pad;
  scenarios[2].attrs.expert_num = expert_num;
  scenarios[2].attrs.drop_pad_mode = 1;
  scenarios[2].attrs.expert_capacity = (pairs + expert_num - 1) / expert_num;  // ceil(N*K / E)
  scenarios[2].attrs.expert_tokens_before_capacity_flag = true;
  return scenarios;
}

GradProblem grad_problem(const RoutingScenario& forward, int64_t num_tokens, int64_t top_k,
                         int64_t hidden, std::vector<int32_t> expanded_row_idx) {
  const MoeInitRoutingV2Attrs& a = forward.attrs;
  const int64_t pairs = num_tokens * top_k;
  GradProblem problem;
  problem.scenario = forward.scenario;
  problem.attrs.top_k = top_k;
  problem.expanded_row_idx = std::move(expanded_row_idx);
  if (a.drop_pad_mode == 1) {
    problem.attrs.drop_pad_mode = 1;
    problem.expert_capacity = a.expert_capacity;
    problem.grad_shape = {a.expert_num, a.expert_capacity, hidden};
  } else if (a.active_num > 0) {
    problem.attrs.active_num = a.active_num;
    problem.grad_shape = {std::min(a.active_num, pairs), hidden};
  } else {
    problem.grad_shape = {pairs, hidden};
  }
  return problem;
}

std::vector<int32_t> forward_expanded_row_idx(const std::vector<int32_t>& expert_idx, int64_t top_k,
                                              const RoutingScenario& forward) {
  const int64_t num_tokens = top_k > 0 ? int64_t(expert_idx.size()) / top_k : 0;
  // Hidden size 0: the library routes without copying a row. The views still get a non-null
  // pointer, as a caller's empty tensors would have.
  float no_data = 0.0f;
  const TensorView x(&no_data, DType::float32, {num_tokens, 0});
  const TensorView ids(expert_idx.data(), DType::int32, {num_tokens, top_k});
  MoeInitRoutingV2Plan plan;
  throw_if_error(infer_moe_init_routing_v2(x, ids, forward.attrs, &plan));
  std::vector<int32_t> expanded_row_idx(size_t(plan.expanded_row_idx.numel()));
  std::vector<int32_t> counts(size_t(std::max<int64_t>(plan.expert_num, 1)));
  auto view = [&](const OutputSpec& spec, void* data) {
    if (!spec.produced) return TensorView();
    return TensorView(data != nullptr ? data : &no_data, spec.dtype, spec.ndim, spec.shape);
  };
  const OutputSpec& count_spec = plan.expert_tokens_count_or_cumsum;
  const OutputSpec& before_spec = plan.expert_tokens_before_capacity;
  throw_if_error(moe_init_routing_v2(x, ids, forward.attrs, view(plan.expanded_x, &no_data),
                                     view(plan.expanded_row_idx, expanded_row_idx.data()),
                                     view(count_spec, counts.data()),
                                     view(before_spec, counts.data())));
  return expanded_row_idx;
}

std::vector<GradProblem> grad_problems(const std::vector<int32_t>& expert_idx, int64_t num_tokens,
                                       int64_t top_k, int64_t expert_num, int64_t hidden) {
  std::vector<GradProblem> problems;
  for (const RoutingScenario& forward : routing_scenarios(num_tokens, top_k, expert_num))
    problems.push_back(grad_problem(forward, num_tokens, top_k, hidden,
                                    forward_expanded_row_idx(expert_idx, top_k, forward)));
  return problems;
}

}  // namespace moe_routing::cases
