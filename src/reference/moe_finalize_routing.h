// The reference backend of moe_finalize_routing: the definition of its semantics.
#pragma once

#include "params/finalize_routing_problem.h"

namespace moe_routing::reference {

/// Plain loops, one output element at a time, written from docs/spec/moe_finalize_routing.md §3
/// and its Decisions; every other backend is compared with it bit for bit. Writes problem.out
/// [N, H]. Indices must already be checked.
void moe_finalize_routing(const detail::FinalizeRoutingProblem& problem);

}  // namespace moe_routing::reference
