// A seeded synthetic MoE batch for `moe-routing demo`, `moe-routing bench` and the benchmarks of
// tools/gpu_check.cpp: random top-K routing, the three CANN scenarios (dropless, active,
// drop-pad) as moe_init_routing_v2 configurations, and the backward problems that the library's
// forward derives from them.
#pragma once

#include <cstdint>
#include <vector>

#include "moe_routing/moe_init_routing.h"
#include "moe_routing/moe_init_routing_grad.h"

namespace moe_routing::cases {

/// expert_idx [N, K] int32, row-major: K distinct experts in [0, E) per token, drawn without
/// replacement with a Zipf-like skew (expert e has weight 1/sqrt(e+1), so low ids are popular and
/// drop-pad drops pairs, as in real routers). Deterministic for a seed on every platform.
/// Requires 1 <= top_k <= expert_num.
std::vector<int32_t> random_expert_idx(int64_t num_tokens, int64_t top_k, int64_t expert_num,
                                       uint64_t seed);

/// One scenario as a moe_init_routing_v2 configuration.
struct RoutingScenario {
  GradScenario scenario = GradScenario::dropless;
  /// expert_num = E. dropless: active_num 0, per-expert counts (flag 2); active: active_num =
  /// max(1, 3*N*K/4), cumsum (flag 1); drop-pad: expert_capacity C = ceil(N*K / E) (<= N because
  /// K <= E), counts before capacity.
  MoeInitRoutingV2Attrs attrs;
};

/// The three scenarios for N tokens routed to top_k of expert_num experts (1 <= top_k <=
/// expert_num), in the order dropless, active, drop-pad.
std::vector<RoutingScenario> routing_scenarios(int64_t num_tokens, int64_t top_k,
                                               int64_t expert_num);

/// One backward problem derived from a routing: attributes, grad_expanded_x's shape, indices.
struct GradProblem {
  GradScenario scenario = GradScenario::dropless;
  MoeInitRoutingGradAttrs attrs;    // top_k, drop_pad_mode, active_num (order left at its default)
  std::vector<int64_t> grad_shape;  // [N*K, H] | [active_num, H] | [E, C, H]
  std::vector<int32_t> expanded_row_idx;
  int64_t expert_capacity = 0;  // C (drop-pad only)
};

/// The backward of one forward scenario: grad_expanded_x has the shape of the forward's
/// expanded_x with hidden size `hidden`, and `expanded_row_idx` is the forward's output.
GradProblem grad_problem(const RoutingScenario& forward, int64_t num_tokens, int64_t top_k,
                         int64_t hidden, std::vector<int32_t> expanded_row_idx);

/// expanded_row_idx [N*K] of moe_init_routing_v2 (the library's forward, default backend) for
/// expert_idx [N, K] and the scenario's attributes. Only the routing is computed: x has hidden
/// size 0, so no row is copied. Throws moe_routing::Error if the library rejects the input (ids
/// outside [0, expert_num), an invalid configuration).
std::vector<int32_t> forward_expanded_row_idx(const std::vector<int32_t>& expert_idx, int64_t top_k,
                                              const RoutingScenario& forward);

/// The three backward problems of routing_scenarios(), each with the expanded_row_idx the
/// library's forward produces for expert_idx. Throws moe_routing::Error as above.
std::vector<GradProblem> grad_problems(const std::vector<int32_t>& expert_idx, int64_t num_tokens,
                                       int64_t top_k, int64_t expert_num, int64_t hidden);

}  // namespace moe_routing::cases
