// A seeded synthetic MoE batch for `moe-routing demo`: random top-K routing, and the
// expanded_row_idx that CANN's forward (moe_init_routing_v2, spec §2.4) derives from it.
//
// forward_expanded_row_idx() stands in for the library's forward operator until that lands; it is
// the only place that knows the forward's sort, and the only function to replace then.
#pragma once

#include <cstdint>
#include <vector>

#include "moe_routing/moe_init_routing_grad.h"

namespace moe_routing::cli {

/// expert_idx [N, K] int32, row-major: K distinct experts in [0, E) per token, drawn without
/// replacement with a Zipf-like skew (expert e has weight 1/sqrt(e+1), so low ids are popular and
/// drop-pad drops pairs, as in real routers). Deterministic for a seed on every platform.
/// Requires 1 <= top_k <= expert_num.
std::vector<int32_t> random_expert_idx(int64_t num_tokens, int64_t top_k, int64_t expert_num,
                                       uint64_t seed);

/// expanded_row_idx [N*K] int32 as CANN's forward returns it (gather convention: indexed by the
/// flat pair p = i*K + t, holding a destination row). The pairs are sorted stably by
/// (expert, p); the d-th pair in that order has destination d (drop_pad_mode 0, a permutation of
/// [0, N*K) whatever active_num is), or slot e*C + rank for the rank-th pair of expert e, -1 when
/// rank >= expert_capacity (drop_pad_mode 1). Requires every id in [0, expert_num).
std::vector<int32_t> forward_expanded_row_idx(const std::vector<int32_t>& expert_idx, int64_t top_k,
                                              int64_t expert_num, int64_t drop_pad_mode,
                                              int64_t expert_capacity);

/// One backward problem derived from a routing: attributes, grad_expanded_x's shape, indices.
struct GradProblem {
  GradScenario scenario = GradScenario::dropless;
  MoeInitRoutingGradAttrs attrs;    // top_k, drop_pad_mode, active_num (order left at its default)
  std::vector<int64_t> grad_shape;  // [N*K, H] | [active_num, H] | [E, C, H]
  std::vector<int32_t> expanded_row_idx;
  int64_t expert_capacity = 0;  // C (drop-pad only)
};

/// The three scenarios for one routing: dropless; active with active_num = max(1, 3*N*K/4);
/// drop-pad with expert_capacity C = ceil(N*K / E).
std::vector<GradProblem> grad_problems(const std::vector<int32_t>& expert_idx, int64_t num_tokens,
                                       int64_t top_k, int64_t expert_num, int64_t hidden);

}  // namespace moe_routing::cli
