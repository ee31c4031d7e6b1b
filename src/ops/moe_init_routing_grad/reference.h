#pragma once

#include <cstdint>

#include "moe_routing/moe_init_routing_grad.h"

namespace moe_routing::reference {

/// The plain reference: one output element at a time, the K addends gathered, skipped and summed
/// exactly as spec §1.6 (tree) / §1.7 (sequential) describe. Indices must already be checked.
void moe_init_routing_grad(const void* grad_expanded_x, const int32_t* expanded_row_idx,
                           void* grad_x, const MoeInitRoutingGradPlan& plan);

}  // namespace moe_routing::reference
