// moe_finalize_routing entry point: validate, check the index values, hand the problem to a
// backend.
#include "cpu/cpu_backend.h"
#include "moe_routing/moe_finalize_routing.h"
#include "ops/guard.h"
#include "ops/moe_finalize_routing/meta.h"
#include "params/finalize_routing_problem.h"
#include "reference/moe_finalize_routing.h"
#if defined(MOE_ROUTING_HAVE_CUDA)
#include "cuda/cuda_backend.h"
#endif

namespace moe_routing {

Status moe_finalize_routing(const MoeFinalizeRoutingInputs& inputs,
                            const MoeFinalizeRoutingAttrs& attrs, const TensorView& out,
                            const ExecConfig& config) {
  // Exceptions (memory, threads) become statuses: the C++ API never throws.
  return detail::run_guarded("moe_finalize_routing: ", [&]() -> Status {
    MoeFinalizeRoutingPlan plan;
    MOE_ROUTING_RETURN_IF_ERROR(
        detail::validate_moe_finalize_routing(inputs, attrs, out, config, &plan));
    const detail::FinalizeRoutingProblem problem =
        detail::make_finalize_routing_problem(plan, inputs, out.data);
#if defined(MOE_ROUTING_HAVE_CUDA)
    // The CUDA backend checks the indices on the device (they live there).
    if (inputs.expanded_x.device == Device::cuda)
      return cuda::moe_finalize_routing(problem, plan, config.stream);
#endif
    MOE_ROUTING_RETURN_IF_ERROR(
        check_moe_finalize_routing_indices(problem.expanded_row_idx, problem.expert_idx, plan));
    if (plan.num_rows == 0 || plan.hidden == 0) return Status::ok();  // nothing to write
    if (config.backend == Backend::reference)
      reference::moe_finalize_routing(problem);
    else
      cpu::moe_finalize_routing(problem, config.num_threads, config.isa);
    return Status::ok();
  });
}

}  // namespace moe_routing
