// moe_finalize_routing_grad entry point: validate, check the index values, hand the problem to a
// backend.
#include "cpu/cpu_backend.h"
#include "moe_routing/dtype.h"
#include "moe_routing/moe_finalize_routing.h"
#include "ops/guard.h"
#include "ops/moe_finalize_routing_grad/meta.h"
#include "params/finalize_routing_problem.h"
#include "reference/moe_finalize_routing_grad.h"
#if defined(MOE_ROUTING_HAVE_CUDA)
#include "cuda/cuda_backend.h"
#endif

namespace moe_routing {

uint64_t moe_finalize_routing_grad_workspace_size(const MoeFinalizeRoutingGradPlan& plan,
                                                  int num_threads) {
  static_cast<void>(num_threads);  // the pair lists do not depend on the thread count
  if (plan.hidden == 0) return 0;  // no columns: no lists (moe_finalize_routing_grad below)
  return cpu::finalize_grad_workspace_bytes(plan.num_rows * plan.top_k, plan.expanded_rows,
                                            plan.expert_num, plan.compute_grad_bias);
}

Status moe_finalize_routing_grad(const MoeFinalizeRoutingGradInputs& inputs,
                                 const MoeFinalizeRoutingGradAttrs& attrs,
                                 const MoeFinalizeRoutingGradOutputs& outputs,
                                 const ExecConfig& config) {
  // Exceptions (memory, threads) become statuses: the C++ API never throws.
  return detail::run_guarded("moe_finalize_routing_grad: ", [&]() -> Status {
    MoeFinalizeRoutingGradPlan plan;
    MOE_ROUTING_RETURN_IF_ERROR(
        detail::validate_moe_finalize_routing_grad(inputs, attrs, outputs, config, &plan));
    const detail::FinalizeRoutingGradProblem problem =
        detail::make_finalize_routing_grad_problem(plan, inputs, outputs);
#if defined(MOE_ROUTING_HAVE_CUDA)
    // The CUDA backend checks the indices on the device (they live there).
    if (inputs.grad_y.device == Device::cuda)
      return cuda::moe_finalize_routing_grad(problem, plan, config.stream);
#endif
    MOE_ROUTING_RETURN_IF_ERROR(check_moe_finalize_routing_grad_indices(problem.expanded_row_idx,
                                                                        problem.expert_idx, plan));
    // No columns: grad_expanded_x and grad_bias hold no element, and every pair's grad_scales is
    // +0 (a sum over no column). Done here for every backend, before any of them sizes its lists
    // by the rows: a drop-pad layout of expert_num * expert_capacity rows costs nothing then.
    if (plan.hidden == 0) {
      if (problem.grad_scales != nullptr)
        for (int64_t q = 0; q < problem.num_rows * problem.top_k; ++q)
          store_from_float(problem.grad_scales, problem.scales_dtype, q, 0.0f);
      return Status::ok();
    }
    // Backends take their memory and threads before writing, so a refusal leaves every output
    // untouched.
    if (config.backend == Backend::reference)
      reference::moe_finalize_routing_grad(problem);
    else
      cpu::moe_finalize_routing_grad(problem, config.num_threads, config.isa, config.workspace);
    return Status::ok();
  });
}

}  // namespace moe_routing
