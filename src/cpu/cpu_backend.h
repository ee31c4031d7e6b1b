// The CPU backend as the operator entry points see it: one function per operator taking the
// operator's problem struct (src/params/). The backend owns everything about how the work runs:
// the thread count for the size of the job, the instruction set, the tiling and the parallel
// loops. Results are bitwise identical to the reference backend for every thread count and ISA.
#pragma once

#include <cstdint>

#include "moe_routing/tensor.h"
#include "params/finalize_routing_problem.h"
#include "params/moe_init_routing_grad_problem.h"
#include "params/moe_init_routing_problem.h"

namespace moe_routing::cpu {

/// Whether an operator without code of its own for the resolved ISA runs its AVX2 kernels there:
/// at avx2 and at avx512, where only the combine's kernels are AVX-512 code.
inline bool runs_avx2_code(CpuIsa isa) { return isa == CpuIsa::avx2 || isa == CpuIsa::avx512; }

/// The forward routing (both moe_init_routing_v2 and moe_init_routing):
///  1. keys: expert id - range start for routed pairs (parallel over positions);
///  2. a stable counting sort of the positions (cpu/routing_sort.h);
///  3. expanded_row_idx and the rows (memcpy per row, or quantisation), parallel over
///     destination rows / slots, each written by exactly one thread;
///  4. the counts, from the runs of equal ids in the sorted order, straight into the output.
/// Scratch: 2 * N*K 32-bit integers (3 * N*K when ids beyond 2^16 may need the radix passes)
/// plus about threads * min(range, 2^16) 64-bit integers, nothing per expert or per drop-pad
/// slot (issue 17, item 7), all in one `workspace` of workspace_bytes(problem, num_threads)
/// bytes (any alignment). Rows that hold nothing (RoutingProblem::writes_rows) are not visited.
/// With a null workspace the kernel
/// allocates it before the first output is written (std::bad_alloc leaves the outputs
/// untouched); scratch up to a few MiB is kept per calling thread for the next call. With a
/// workspace, the kernel allocates nothing.
/// `num_threads`: the most threads to use (0 = the library default); small jobs use fewer
/// (moe_init_routing_threads), and those are started (detail::reserve_threads: it throws
/// ThreadStartError) before anything is written.
/// `isa`: automatic or an ISA that cpu_isa_available() reports (the caller checked it).
void moe_init_routing(const detail::RoutingProblem& problem, int num_threads, CpuIsa isa,
                      void* workspace);

/// The threads moe_init_routing runs `problem` on, given `num_threads` (0 = the library
/// default): fewer for work too small to share (kernels never use more than that).
int moe_init_routing_threads(const detail::RoutingProblem& problem, int num_threads);

/// The workspace size moe_init_routing needs for `problem` with `num_threads` (as there): an
/// upper bound from the sizes and attributes only (never the data), so it can be asked before the
/// data exists.
uint64_t workspace_bytes(const detail::RoutingProblem& problem, int num_threads);

/// moe_init_routing_grad: units of (output row, column tile) in parallel, each output element's
/// addends summed in the plan's order (cpu/grad_kernel_impl.h). Allocates nothing but the
/// threads it reserves first. The problem has at least one output element (the entry point
/// returns before otherwise). Arguments as for moe_init_routing.
void moe_init_routing_grad(const detail::GradProblem& problem, int num_threads, CpuIsa isa);

/// The threads moe_init_routing_grad runs a call of `plan` on (as moe_init_routing_threads).
int moe_init_routing_grad_threads(const MoeInitRoutingGradPlan& plan, int num_threads);

/// moe_finalize_routing: units of (output row, column tile) in parallel, each output element's
/// terms taken in increasing k in the problem's arithmetic (cpu/finalize_kernel_impl.h).
/// Allocates nothing. The problem has at least one output element. Arguments as for
/// moe_init_routing.
void moe_finalize_routing(const detail::FinalizeRoutingProblem& problem, int num_threads,
                          CpuIsa isa);

/// The threads moe_finalize_routing runs a call of `plan` on (as moe_init_routing_threads).
int moe_finalize_routing_threads(const MoeFinalizeRoutingPlan& plan, int num_threads);

/// The most threads moe_finalize_routing_grad runs a call of `plan` on (as
/// moe_init_routing_threads; grad_scales and grad_bias counted as if requested).
int moe_finalize_routing_grad_threads(const MoeFinalizeRoutingGradPlan& plan, int num_threads);

/// Bytes of scratch moe_finalize_routing_grad needs: the non-dropped pairs listed by row of
/// grad_expanded_x, the order its rows are visited in and, with grad_bias, the pairs listed by
/// expert (independent of the thread count).
uint64_t finalize_grad_workspace_bytes(int64_t pairs, int64_t expanded_rows, int64_t experts,
                                       bool grad_bias);

/// moe_finalize_routing_grad: the pair lists (a counting sort, so each row's and each expert's
/// pairs are in increasing pair index), then rows of grad_expanded_x with the grad_scales of
/// their pairs (visited token-major: build_visit_order in finalize_kernel.cpp), then
/// (expert, column tile) units of grad_bias, in parallel. The lists live in `workspace`
/// (finalize_grad_workspace_bytes, any alignment); with a null workspace the backend allocates them
/// before the first output is written (std::bad_alloc leaves the outputs untouched). Indices must
/// be checked. Arguments as for moe_init_routing.
void moe_finalize_routing_grad(detail::FinalizeRoutingGradProblem problem, int num_threads,
                               CpuIsa isa, void* workspace);

}  // namespace moe_routing::cpu
