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

#include "moe_routing/moe_init_routing_grad.h"
#include "moe_routing/status.h"
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

}  // namespace moe_routing::cuda
