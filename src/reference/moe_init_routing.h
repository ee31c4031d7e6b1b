// The reference backend of the forward routing: the definition of its semantics.
#pragma once

#include "params/moe_init_routing_problem.h"

namespace moe_routing::reference {

/// The plain reference of both forward operators: collect the routed pairs, std::stable_sort them
/// by expert id, then write every output with plain loops (docs/spec/moe_init_routing.md §2.4,
/// §3.2, §3.3). Inputs must already be validated. All allocation happens before the first output is
/// written.
void moe_init_routing(const detail::RoutingProblem& problem);

}  // namespace moe_routing::reference
