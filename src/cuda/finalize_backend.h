// The CUDA backend of moe_finalize_routing and its grad as the core dispatch sees it: plain C++ (no
// CUDA headers), compiled into the library only with MOE_ROUTING_CUDA. The launchers follow
// cuda_backend.h's conventions: they find the device of the pointers, check every index on the
// device and read the verdict back once (the error then names the first bad position and value in
// the CPU's words, and nothing is written), take scratch memory stream-ordered from the library's
// pool, and return once the work is queued. Results are bitwise identical to the CPU backend.
#pragma once

#include <cstdint>

#include "moe_routing/moe_finalize_routing.h"
#include "moe_routing/status.h"
#include "params/finalize_routing_problem.h"

namespace moe_routing::cuda {

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
