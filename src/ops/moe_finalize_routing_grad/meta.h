// The one validation of a moe_finalize_routing_grad call, used by the C++ entry point
// (dispatch.cpp) and by phase one of the C ABI alike.
#pragma once

#include "moe_routing/moe_finalize_routing.h"

namespace moe_routing::detail {

/// The CPU threads a call of `plan` runs on given `num_threads` (0: the library default): what
/// its work can use, no more. The C ABI's phase one starts them.
int cpu_threads(const MoeFinalizeRoutingGradPlan& plan, int num_threads);

/// Everything decided before any data is read: shape inference (infer_moe_finalize_routing_grad),
/// which of grad_scales / grad_bias the caller wants (present outputs) and whether the inputs
/// give them, then the outputs, the buffers, their overlap, the device and the execution settings
/// (ops/validation.h), and a caller's workspace (config.workspace) large enough. Fills `plan`
/// (compute_grad_* included) on success. The index values are checked later, by whoever reads
/// them.
Status validate_moe_finalize_routing_grad(const MoeFinalizeRoutingGradInputs& inputs,
                                          const MoeFinalizeRoutingGradAttrs& attrs,
                                          const MoeFinalizeRoutingGradOutputs& outputs,
                                          const ExecConfig& config,
                                          MoeFinalizeRoutingGradPlan* plan);

}  // namespace moe_routing::detail
