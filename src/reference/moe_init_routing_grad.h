// The reference backend of moe_init_routing_grad: the definition of its semantics.
#pragma once

#include "params/moe_init_routing_grad_problem.h"

namespace moe_routing::reference {

/// The plain reference: one output element at a time, the K addends gathered, skipped and summed
/// exactly as docs/spec/moe_init_routing.md §1.6 (tree) / §1.7 (sequential) describe. Indices must
/// already be checked, and the problem must have an output element (its buffers are sized by
/// top_k).
void moe_init_routing_grad(const detail::GradProblem& problem);

}  // namespace moe_routing::reference
