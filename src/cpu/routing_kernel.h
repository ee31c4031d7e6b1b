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
/// Scratch: 2 * N*K 32-bit integers (3 * N*K when ids beyond 2^16 may need the radix passes)
/// plus about threads * min(range, 2^16) + E + range 64-bit integers, all in one `workspace` of
/// workspace_bytes(problem, num_threads) bytes (any alignment). With a null workspace the kernel
/// allocates it before the first output is written (std::bad_alloc leaves the outputs
/// untouched); scratch up to a few MiB is kept per calling thread for the next call. With a
/// workspace, the kernel allocates nothing.
/// `isa`: avx2 or baseline (resolved; avx2 only where the CPU has it) - the row copies' stores.
void moe_init_routing(const detail::RoutingProblem& problem, int num_threads, CpuIsa isa,
                      void* workspace);

/// The workspace size moe_init_routing needs for `problem` with `num_threads` threads: an upper
/// bound from the sizes and attributes only (never the data), so it can be asked before the data
/// exists.
uint64_t workspace_bytes(const detail::RoutingProblem& problem, int num_threads);

}  // namespace moe_routing::cpu
