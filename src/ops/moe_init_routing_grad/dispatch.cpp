// moe_init_routing_grad entry point: infer and check, then hand the problem to a backend.
#include "cpu/cpu_backend.h"
#include "moe_routing/moe_init_routing_grad.h"
#include "params/moe_init_routing_grad_problem.h"
#include "reference/moe_init_routing_grad.h"
#if defined(MOE_ROUTING_HAVE_CUDA)
#include "cuda/cuda_backend.h"
#endif

namespace moe_routing {
namespace {

constexpr const char* kOp = "moe_init_routing_grad: ";

Status check_output(const TensorView& grad_x, const MoeInitRoutingGradPlan& plan,
                    const TensorView& grad_expanded_x) {
  const bool shape_ok = grad_x.ndim == 2 && grad_x.shape[0] == plan.grad_x_shape[0] &&
                        grad_x.shape[1] == plan.grad_x_shape[1];
  if (!shape_ok || grad_x.dtype != plan.dtype)
    return invalid_argument(kOp, "grad_x must be 2-D ", dtype_name(plan.dtype), " [",
                            plan.grad_x_shape[0], ", ", plan.grad_x_shape[1], "], got ",
                            describe(grad_x));
  if (grad_x.device != grad_expanded_x.device)
    return invalid_argument(kOp, "grad_x must be on the device of grad_expanded_x (",
                            device_name(grad_expanded_x.device), "), got ",
                            device_name(grad_x.device));
  return Status::ok();
}

Status check_data(const char* name, const TensorView& t) {
  if (t.data == nullptr && t.numel() > 0)
    return invalid_argument(kOp, name, " data must not be null for a non-empty tensor, got null");
  return Status::ok();
}

/// Tensors on a CUDA device: the CUDA kernels, in builds that have them (MOE_ROUTING_CUDA).
Status run_cuda(const detail::GradProblem& problem, const ExecConfig& config) {
#if defined(MOE_ROUTING_HAVE_CUDA)
  if (config.backend != Backend::automatic)
    return not_supported(kOp,
                         "backend must be automatic for cuda tensors (reference and cpu run "
                         "on host memory), got ",
                         config.backend == Backend::cpu ? "cpu" : "reference");
  return cuda::moe_init_routing_grad(problem, config.stream);
#else
  static_cast<void>(problem), static_cast<void>(config);
  return not_supported(kOp, "device must be cpu in this build, got cuda");
#endif
}

}  // namespace

Status moe_init_routing_grad(const TensorView& grad_expanded_x, const TensorView& expanded_row_idx,
                             const MoeInitRoutingGradAttrs& attrs, const TensorView& grad_x,
                             const ExecConfig& config) {
  MoeInitRoutingGradPlan plan;
  MOE_ROUTING_RETURN_IF_ERROR(
      infer_moe_init_routing_grad(grad_expanded_x, expanded_row_idx, attrs, &plan));
  MOE_ROUTING_RETURN_IF_ERROR(check_output(grad_x, plan, grad_expanded_x));
  MOE_ROUTING_RETURN_IF_ERROR(check_data("grad_expanded_x", grad_expanded_x));
  MOE_ROUTING_RETURN_IF_ERROR(check_data("expanded_row_idx", expanded_row_idx));
  MOE_ROUTING_RETURN_IF_ERROR(check_data("grad_x", grad_x));
  detail::GradProblem problem;
  problem.grad_expanded_x = grad_expanded_x.data;
  problem.expanded_row_idx = expanded_row_idx.data_as<const int32_t>();
  problem.grad_x = grad_x.data;
  problem.plan = plan;
  if (grad_expanded_x.device == Device::cuda) return run_cuda(problem, config);
  if (grad_expanded_x.device != Device::cpu)
    return not_supported(kOp, "device must be cpu in this build, got ",
                         device_name(grad_expanded_x.device));
  if (config.isa != CpuIsa::automatic && !cpu_isa_available(config.isa))
    return not_supported(kOp, "isa ", cpu_isa_name(config.isa),
                         " is not available on this CPU or build, got a request for it");
  MOE_ROUTING_RETURN_IF_ERROR(check_moe_init_routing_grad_indices(problem.expanded_row_idx, plan));
  if (config.backend == Backend::reference)
    reference::moe_init_routing_grad(problem);
  else
    cpu::moe_init_routing_grad(problem, config.num_threads, config.isa);
  return Status::ok();
}

}  // namespace moe_routing
