// CPU implementation of the forward routing (both moe_init_routing_v2 and moe_init_routing).
#pragma once

#include "ops/moe_init_routing/routing_problem.h"

namespace moe_routing::cpu {

/// Same results as reference::moe_init_routing, bit for bit, for every thread count:
///  1. keys: expert id - range start for routed pairs (parallel over positions);
///  2. a stable counting sort of the positions (cpu/routing_sort.h), with per-expert totals;
///  3. expanded_row_idx and the rows (memcpy per row, or quantisation), parallel over
///     destination rows / slots, each written by exactly one thread;
///  4. the counts, from the totals.
/// Extra memory: 2 * N*K 32-bit integers (3 * N*K when ids beyond 2^16 need the radix passes)
/// plus threads * min(range, 2^16) + E 64-bit integers.
/// All of it is allocated before the first output is written (std::bad_alloc leaves the outputs
/// untouched).
void moe_init_routing(const detail::RoutingProblem& problem, int num_threads);

}  // namespace moe_routing::cpu
