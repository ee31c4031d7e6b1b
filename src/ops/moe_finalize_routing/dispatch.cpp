// moe_finalize_routing entry point: infer (every check that needs no data), check the index data,
// then hand the problem to a backend.
#include "core/tensor_checks.h"
#include "cpu/finalize_kernel.h"
#include "moe_routing/moe_finalize_routing.h"
#include "params/finalize_routing_problem.h"
#include "reference/moe_finalize_routing.h"
#if defined(MOE_ROUTING_HAVE_CUDA)
#include "cuda/finalize_backend.h"
#endif

namespace moe_routing {

Status moe_finalize_routing(const MoeFinalizeRoutingInputs& inputs,
                            const MoeFinalizeRoutingAttrs& attrs, const TensorView& out,
                            const ExecConfig& config) {
  constexpr const char* kOp = "moe_finalize_routing: ";
  MoeFinalizeRoutingPlan plan;
  MOE_ROUTING_RETURN_IF_ERROR(infer_moe_finalize_routing(inputs, attrs, &out, &plan));
  MOE_ROUTING_RETURN_IF_ERROR(detail::check_execution(kOp, inputs.expanded_x.device, config));
  const detail::FinalizeRoutingProblem problem =
      detail::make_finalize_routing_problem(plan, inputs, out.data);
#if defined(MOE_ROUTING_HAVE_CUDA)
  if (inputs.expanded_x.device == Device::cuda)
    return cuda::moe_finalize_routing(problem, plan, config.stream);
#endif
  MOE_ROUTING_RETURN_IF_ERROR(
      check_moe_finalize_routing_indices(problem.expanded_row_idx, problem.expert_idx, plan));
  if (plan.num_rows == 0 || plan.hidden == 0) return Status::ok();  // nothing to write
  if (config.backend == Backend::reference) {
    reference::moe_finalize_routing(problem);
    return Status::ok();
  }
  cpu::moe_finalize_routing(problem, config.isa == CpuIsa::automatic ? best_cpu_isa() : config.isa,
                            config.num_threads);
  return Status::ok();
}

}  // namespace moe_routing
