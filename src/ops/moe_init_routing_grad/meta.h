// The one validation of a moe_init_routing_grad call, used by the C++ entry point (dispatch.cpp)
// and by phase one of the C ABI alike.
#pragma once

#include "moe_routing/moe_init_routing_grad.h"

namespace moe_routing::detail {

/// grad_x as the plan describes it: [N, H] of the plan's dtype, always produced.
OutputSpec grad_x_spec(const MoeInitRoutingGradPlan& plan);

/// The CPU threads a call of `plan` runs on given `num_threads` (0: the library default): what
/// its work can use, no more. The C ABI's phase one starts them.
int cpu_threads(const MoeInitRoutingGradPlan& plan, int num_threads);

/// Everything decided before any data is read: shape inference (infer_moe_init_routing_grad),
/// then grad_x, the buffers, the device and the execution settings (ops/validation.h). Fills
/// `plan` on success. The index values are checked later, by whoever reads them.
Status validate_moe_init_routing_grad(const TensorView& grad_expanded_x,
                                      const TensorView& expanded_row_idx,
                                      const MoeInitRoutingGradAttrs& attrs,
                                      const TensorView& grad_x, const ExecConfig& config,
                                      MoeInitRoutingGradPlan* plan);

}  // namespace moe_routing::detail
