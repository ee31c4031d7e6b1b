// The reference implementations of moe_finalize_routing and its grad: plain loops, one output
// element at a time, written from finalize_routing_spec §3-§4 and the Decisions of
// docs/moe_finalize_routing.md. Every other backend is compared with them bit for bit.
#pragma once

#include "params/finalize_routing_problem.h"

namespace moe_routing::reference {

/// Writes problem.out [N, H]. Indices must already be checked.
void moe_finalize_routing(const detail::FinalizeRoutingProblem& problem);

/// Writes grad_expanded_x and, where the problem has them, grad_scales and grad_bias. Indices must
/// already be checked. Ignores the problem's pair lists (it builds its own).
void moe_finalize_routing_grad(const detail::FinalizeRoutingGradProblem& problem);

}  // namespace moe_routing::reference
