// The reference backend of moe_finalize_routing_grad: the definition of its semantics.
#pragma once

#include "params/finalize_routing_problem.h"

namespace moe_routing::reference {

/// Plain loops written from docs/spec/moe_finalize_routing.md §4 and its Decisions. Writes
/// grad_expanded_x and, where the problem has them, grad_scales and grad_bias. Indices must
/// already be checked. Ignores the problem's pair lists (it builds its own).
void moe_finalize_routing_grad(const detail::FinalizeRoutingGradProblem& problem);

}  // namespace moe_routing::reference
