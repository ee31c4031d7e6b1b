// The one validation of each forward routing call (moe_init_routing_v2, moe_init_routing), used
// by the C++ entry points (dispatch.cpp) and by phase one of the C ABI alike, and the reduction of
// a plan to the problem the backends see.
#pragma once

#include "moe_routing/moe_init_routing.h"
#include "params/moe_init_routing_problem.h"

namespace moe_routing::detail {

/// The sizes and attributes of a planned call as every backend sees them, without data pointers
/// (enough to size the CPU kernels' workspace).
RoutingProblem routing_problem(const MoeInitRoutingV2Plan& plan);
RoutingProblem routing_problem(const MoeInitRoutingPlan& plan);

/// The CPU threads a call of `plan` runs on given `num_threads` (0: the library default): what
/// its work can use, no more. The C ABI's phase one starts them.
int cpu_threads(const MoeInitRoutingV2Plan& plan, int num_threads);
int cpu_threads(const MoeInitRoutingPlan& plan, int num_threads);

/// Everything decided before any data is read: shape inference (infer_moe_init_routing_v2), then
/// the outputs, the buffers, the device and the execution settings (ops/validation.h), and a
/// caller's workspace (config.workspace) large enough. Fills `plan` on success. The expert ids are
/// checked later, by whoever reads them.
Status validate_moe_init_routing_v2(const TensorView& x, const TensorView& expert_idx,
                                    const MoeInitRoutingV2Attrs& attrs,
                                    const TensorView& expanded_x,
                                    const TensorView& expanded_row_idx,
                                    const TensorView& expert_tokens_count_or_cumsum,
                                    const TensorView& expert_tokens_before_capacity,
                                    const ExecConfig& config, MoeInitRoutingV2Plan* plan);

/// The same for moe_init_routing (shape inference: infer_moe_init_routing).
Status validate_moe_init_routing(const TensorView& x, const TensorView& expert_idx,
                                 const TensorView& scale, const TensorView& offset,
                                 const TensorView& topk_weight, const MoeInitRoutingAttrs& attrs,
                                 const TensorView& expanded_x, const TensorView& expanded_row_idx,
                                 const TensorView& expert_tokens_count_or_cumsum,
                                 const TensorView& expanded_scale,
                                 const TensorView& expanded_topk_weight, const ExecConfig& config,
                                 MoeInitRoutingPlan* plan);

}  // namespace moe_routing::detail
