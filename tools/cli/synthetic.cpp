#include "synthetic.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "rng.h"

namespace moe_routing::cli {

std::vector<int32_t> random_expert_idx(int64_t num_tokens, int64_t top_k, int64_t expert_num,
                                       uint64_t seed) {
  std::vector<int32_t> expert_idx(size_t(num_tokens * top_k));
  // Integer weights round(2^20 / sqrt(e + 1)) + 1: sqrt and division are correctly rounded
  // everywhere, so a seed gives the same routing on every platform. Each token draws K times
  // without replacement: a drawn expert's weight drops to 0 for the rest of that token.
  std::vector<uint64_t> weight(static_cast<size_t>(expert_num));
  for (int64_t e = 0; e < expert_num; ++e)
    weight[size_t(e)] = uint64_t(std::llround(1048576.0 / std::sqrt(double(e + 1)))) + 1;
  std::vector<uint64_t> remaining(weight.size());
  SplitMix64 rng(seed);
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

std::vector<int32_t> forward_expanded_row_idx(const std::vector<int32_t>& expert_idx, int64_t top_k,
                                              int64_t expert_num, int64_t drop_pad_mode,
                                              int64_t expert_capacity) {
  (void)top_k;  // the flat order p = i*K + t is the vector's own order
  const int64_t pairs = int64_t(expert_idx.size());
  // Counting sort by expert: stable, so ties keep ascending p (spec §2.4 step 2).
  std::vector<int64_t> start(size_t(expert_num) + 1, 0);
  for (int32_t e : expert_idx) ++start[size_t(e) + 1];
  for (int64_t e = 0; e < expert_num; ++e) start[size_t(e + 1)] += start[size_t(e)];
  std::vector<int32_t> expanded_row_idx(static_cast<size_t>(pairs));
  std::vector<int64_t> next(start.begin(), start.end() - 1);  // next destination per expert
  for (int64_t p = 0; p < pairs; ++p) {
    const int32_t e = expert_idx[size_t(p)];
    const int64_t d = next[size_t(e)]++;
    if (drop_pad_mode == 0) {
      expanded_row_idx[size_t(p)] = int32_t(d);
    } else {
      const int64_t rank = d - start[size_t(e)];  // rank among expert e's pairs, ascending p
      expanded_row_idx[size_t(p)] =
          rank < expert_capacity ? int32_t(e * expert_capacity + rank) : -1;
    }
  }
  return expanded_row_idx;
}

std::vector<GradProblem> grad_problems(const std::vector<int32_t>& expert_idx, int64_t num_tokens,
                                       int64_t top_k, int64_t expert_num, int64_t hidden) {
  const int64_t pairs = num_tokens * top_k;
  std::vector<GradProblem> problems;
  std::vector<int32_t> gather = forward_expanded_row_idx(expert_idx, top_k, expert_num, 0, 0);

  auto add = [&](GradScenario scenario, std::vector<int64_t> grad_shape,
                 std::vector<int32_t> expanded_row_idx) -> GradProblem& {
    GradProblem problem;
    problem.scenario = scenario;
    problem.attrs.top_k = top_k;
    problem.grad_shape = std::move(grad_shape);
    problem.expanded_row_idx = std::move(expanded_row_idx);
    problems.push_back(std::move(problem));
    return problems.back();
  };
  add(GradScenario::dropless, {pairs, hidden}, gather);

  const int64_t active_num = std::max<int64_t>(1, pairs * 3 / 4);
  add(GradScenario::active, {active_num, hidden}, gather).attrs.active_num = active_num;

  const int64_t capacity = (pairs + expert_num - 1) / expert_num;  // ceil(1.0 * N*K / E)
  GradProblem& drop_pad = add(GradScenario::drop_pad, {expert_num, capacity, hidden},
                              forward_expanded_row_idx(expert_idx, top_k, expert_num, 1, capacity));
  drop_pad.attrs.drop_pad_mode = 1;
  drop_pad.expert_capacity = capacity;
  return problems;
}

}  // namespace moe_routing::cli
