// The one validation of a moe_finalize_routing call, used by the C++ entry point (dispatch.cpp)
// and by phase one of the C ABI alike.
#pragma once

#include "moe_routing/moe_finalize_routing.h"

namespace moe_routing::detail {

/// The CPU threads a call of `plan` runs on given `num_threads` (0: the library default): what
/// its work can use, no more. The C ABI's phase one starts them.
int cpu_threads(const MoeFinalizeRoutingPlan& plan, int num_threads);

/// Everything decided before any data is read: shape inference (infer_moe_finalize_routing), then
/// out, the buffers, their overlap, the device and the execution settings (ops/validation.h).
/// Fills `plan` on success. The index values are checked later, by whoever reads them.
Status validate_moe_finalize_routing(const MoeFinalizeRoutingInputs& inputs,
                                     const MoeFinalizeRoutingAttrs& attrs, const TensorView& out,
                                     const ExecConfig& config, MoeFinalizeRoutingPlan* plan);

}  // namespace moe_routing::detail
