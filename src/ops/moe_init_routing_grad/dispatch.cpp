// moe_init_routing_grad entry point: validate, check the index values, hand the problem to a
// backend.
#include "cpu/cpu_backend.h"
#include "moe_routing/moe_init_routing_grad.h"
#include "ops/guard.h"
#include "ops/moe_init_routing_grad/meta.h"
#include "params/moe_init_routing_grad_problem.h"
#include "reference/moe_init_routing_grad.h"
#if defined(MOE_ROUTING_HAVE_CUDA)
#include "cuda/cuda_backend.h"
#endif

namespace moe_routing {

Status moe_init_routing_grad(const TensorView& grad_expanded_x, const TensorView& expanded_row_idx,
                             const MoeInitRoutingGradAttrs& attrs, const TensorView& grad_x,
                             const ExecConfig& config) {
  // Exceptions (memory, threads) become statuses: the C++ API never throws.
  return detail::run_guarded("moe_init_routing_grad: ", [&]() -> Status {
    detail::GradProblem problem;
    MOE_ROUTING_RETURN_IF_ERROR(detail::validate_moe_init_routing_grad(
        grad_expanded_x, expanded_row_idx, attrs, grad_x, config, &problem.plan));
    problem.grad_expanded_x = grad_expanded_x.data;
    problem.expanded_row_idx = expanded_row_idx.data_as<const int32_t>();
    problem.grad_x = grad_x.data;
#if defined(MOE_ROUTING_HAVE_CUDA)
    // The CUDA backend checks the indices on the device (they live there).
    if (grad_expanded_x.device == Device::cuda)
      return cuda::moe_init_routing_grad(problem, config.stream);
#endif
    MOE_ROUTING_RETURN_IF_ERROR(
        check_moe_init_routing_grad_indices(problem.expanded_row_idx, problem.plan));
    // Nothing to write: no backend runs (top_k, unbounded by any buffer then, sizes nothing).
    if (problem.plan.num_rows == 0 || problem.plan.hidden == 0) return Status::ok();
    if (config.backend == Backend::reference)
      reference::moe_init_routing_grad(problem);
    else
      cpu::moe_init_routing_grad(problem, config.num_threads, config.isa);
    return Status::ok();
  });
}

}  // namespace moe_routing
