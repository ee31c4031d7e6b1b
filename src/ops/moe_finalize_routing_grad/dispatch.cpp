// moe_finalize_routing_grad entry point: infer (every check that needs no data), check the index
// data, then hand the problem to a backend.
#include <memory>
#include <new>

#include "core/tensor_checks.h"
#include "core/thread_pool.h"
#include "cpu/finalize_kernel.h"
#include "moe_routing/moe_finalize_routing.h"
#include "params/finalize_routing_problem.h"
#include "reference/moe_finalize_routing.h"
#if defined(MOE_ROUTING_HAVE_CUDA)
#include "cuda/finalize_backend.h"
#endif

namespace moe_routing {

uint64_t moe_finalize_routing_grad_workspace_size(const MoeFinalizeRoutingGradPlan& plan,
                                                  int num_threads) {
  static_cast<void>(num_threads);  // the pair lists do not depend on the thread count
  return cpu::finalize_grad_workspace_bytes(plan.num_rows * plan.top_k, plan.expanded_rows,
                                            plan.expert_num, plan.compute_grad_bias);
}

Status moe_finalize_routing_grad(const MoeFinalizeRoutingGradInputs& inputs,
                                 const MoeFinalizeRoutingGradAttrs& attrs,
                                 const MoeFinalizeRoutingGradOutputs& outputs,
                                 const ExecConfig& config) {
  constexpr const char* kOp = "moe_finalize_routing_grad: ";
  MoeFinalizeRoutingGradPlan plan;
  MOE_ROUTING_RETURN_IF_ERROR(infer_moe_finalize_routing_grad(inputs, attrs, &outputs, &plan));
  MOE_ROUTING_RETURN_IF_ERROR(detail::check_execution(kOp, inputs.grad_y.device, config));
  const detail::FinalizeRoutingGradProblem problem =
      detail::make_finalize_routing_grad_problem(plan, inputs, outputs);
#if defined(MOE_ROUTING_HAVE_CUDA)
  if (inputs.grad_y.device == Device::cuda)
    return cuda::moe_finalize_routing_grad(problem, plan, config.stream);
#endif
  MOE_ROUTING_RETURN_IF_ERROR(
      check_moe_finalize_routing_grad_indices(problem.expanded_row_idx, problem.expert_idx, plan));
  if (config.backend == Backend::reference) {
    reference::moe_finalize_routing_grad(problem);
    return Status::ok();
  }
  const uint64_t needed = moe_finalize_routing_grad_workspace_size(plan, config.num_threads);
  void* workspace = config.workspace;
  std::unique_ptr<char[]> owned;
  if (workspace == nullptr || config.workspace_bytes < needed) {
    if (workspace != nullptr)
      return invalid_argument(kOp, "workspace_bytes must be at least ", needed,
                              " (moe_finalize_routing_grad_workspace_size), got ",
                              config.workspace_bytes);
    owned.reset(new (std::nothrow) char[needed]);
    if (!owned)
      return runtime_error(kOp, "a workspace of ", needed, " bytes must be allocatable, got none");
    workspace = owned.get();
  }
  cpu::moe_finalize_routing_grad(problem,
                                 config.isa == CpuIsa::automatic ? best_cpu_isa() : config.isa,
                                 config.num_threads, workspace);
  return Status::ok();
}

}  // namespace moe_routing
