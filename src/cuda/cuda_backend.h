// The CUDA backend as the core dispatch sees it: plain C++ (no CUDA headers), compiled into the
// library only when it is built with MOE_ROUTING_CUDA (compile definition MOE_ROUTING_HAVE_CUDA).
//
// Every launcher takes the same problem struct as the CPU kernels (src/params/), with device
// pointers, plus the stream (a cudaStream_t as void*; null = the default stream). Launchers
//  * find the CUDA device that owns the pointers (cudaPointerGetAttributes) and run there, and
//    reject host pointers and pointers on different devices (invalid argument);
//  * allocate their scratch memory stream-ordered from a pool owned by the library, before any
//    output is written;
//  * validate index data on the device, read the verdict back once, and launch the kernels that
//    write outputs only when it is clean: on error nothing is written;
//  * return when the work is queued on the stream (after the one read-back where there is one);
//  * report CUDA failures as StatusCode::runtime naming the call and CUDA's error string.
// Results are bitwise identical to the CPU backend (docs/cuda.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "moe_routing/moe_finalize_routing.h"
#include "moe_routing/moe_init_routing_grad.h"
#include "moe_routing/status.h"
#include "params/finalize_routing_problem.h"
#include "params/moe_init_routing_grad_problem.h"
#include "params/moe_init_routing_problem.h"

namespace moe_routing::cuda {

/// moe_init_routing_grad on the GPU; the problem's pointers are device memory, and its indices
/// are not yet checked: they are checked on the device first (the error names the first bad flat
/// position, exactly as check_moe_init_routing_grad_indices does), and grad_x is written only
/// when all are valid.
Status moe_init_routing_grad(const detail::GradProblem& problem, void* stream);

/// The forward routing on the GPU; every pointer of `problem` is device memory (or null where the
/// problem says "not written"). `op` prefixes error messages. With `reject_unrouted` (the V2 API)
/// an expert id outside [range_start, range_end) is an index_out_of_range error naming the first
/// such position, exactly as check_moe_init_routing_v2_expert_idx words it, and nothing is
/// written; without it (the torch API) such pairs are simply not routed.
Status moe_init_routing(const char* op, const detail::RoutingProblem& problem, bool reject_unrouted,
                        void* stream);

/// Sets `bytes` bytes of device memory to zero (stream-ordered).
Status zero_device_memory(const char* op, void* data, size_t bytes, void* stream);

// ---- messages shared with the CPU checks (tests compare them with the CPU's, word for word) ----

/// The index_out_of_range error of check_moe_init_routing_grad_indices for value `value` at flat
/// position `position`.
Status grad_index_error(const MoeInitRoutingGradPlan& plan, int64_t position, int64_t value);
/// The index_out_of_range error of check_moe_init_routing_v2_expert_idx for expert id `id` at flat
/// position `position` of expert_idx [N, top_k]; `limit` is the plan's expert_id_limit.
Status v2_expert_id_error(int64_t top_k, int64_t limit, int64_t position, int64_t id);

// ---- the combine (moe_finalize_routing and its grad) -----------------------------------------

/// moe_finalize_routing on the GPU; every pointer of `problem` is device memory (indices not yet
/// checked).
Status moe_finalize_routing(const detail::FinalizeRoutingProblem& problem,
                            const MoeFinalizeRoutingPlan& plan, void* stream);

/// moe_finalize_routing_grad on the GPU; the problem's pair lists are built on the device.
Status moe_finalize_routing_grad(detail::FinalizeRoutingGradProblem problem,
                                 const MoeFinalizeRoutingGradPlan& plan, void* stream);

// ---- host logic of the launchers (tested without a GPU in test_cuda_finalize_host.cpp) ---------

/// What the device-side index check found: the first bad position of expanded_row_idx and of
/// expert_idx (flat, row-major [N, K]; kNoBadIndex when none) and the values there.
struct IndexVerdict {
  static constexpr uint32_t kNoBadIndex = 0xffffffffu;
  uint32_t row_position = kNoBadIndex;
  int32_t row_value = 0;
  uint32_t expert_position = kNoBadIndex;
  int32_t expert_value = 0;
};

/// The Status the CPU checks give for the same data: the row index error first, then the expert
/// error (`op` is "moe_finalize_routing: " or "moe_finalize_routing_grad: ").
Status finalize_verdict_status(const char* op, const IndexVerdict& verdict, int64_t rows,
                               int64_t skip_to, int64_t top_k, int64_t experts);

/// Bits a radix sort needs for keys in [0, key_count) (at least 1).
int finalize_sort_key_bits(int64_t key_count);

}  // namespace moe_routing::cuda
