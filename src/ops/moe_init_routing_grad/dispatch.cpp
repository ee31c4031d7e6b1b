// moe_init_routing_grad entry point: infer and check, then hand the plan to a backend.
#include "core/memory_hints.h"
#include "core/thread_pool.h"
#include "cpu/grad_kernel.h"
#include "moe_routing/moe_init_routing_grad.h"
#include "ops/moe_init_routing_grad/reference.h"
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
Status run_cuda(const TensorView& grad_expanded_x, const TensorView& expanded_row_idx,
                const TensorView& grad_x, const MoeInitRoutingGradPlan& plan,
                const ExecConfig& config) {
#if defined(MOE_ROUTING_HAVE_CUDA)
  if (config.backend != Backend::automatic)
    return not_supported(kOp,
                         "backend must be automatic for cuda tensors (reference and cpu run "
                         "on host memory), got ",
                         config.backend == Backend::cpu ? "cpu" : "reference");
  return cuda::moe_init_routing_grad(grad_expanded_x.data,
                                     expanded_row_idx.data_as<const int32_t>(), grad_x.data, plan,
                                     config.stream);
#else
  static_cast<void>(expanded_row_idx), static_cast<void>(grad_x), static_cast<void>(plan),
      static_cast<void>(config);
  return not_supported(kOp, "device must be cpu in this build, got ",
                       device_name(grad_expanded_x.device));
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
  if (grad_expanded_x.device == Device::cuda)
    return run_cuda(grad_expanded_x, expanded_row_idx, grad_x, plan, config);
  if (grad_expanded_x.device != Device::cpu)
    return not_supported(kOp, "device must be cpu in this build, got ",
                         device_name(grad_expanded_x.device));
  if (config.isa != CpuIsa::automatic && !cpu_isa_available(config.isa))
    return not_supported(kOp, "isa ", cpu_isa_name(config.isa),
                         " is not available on this CPU or build, got a request for it");
  const int32_t* indices = expanded_row_idx.data_as<const int32_t>();
  MOE_ROUTING_RETURN_IF_ERROR(check_moe_init_routing_grad_indices(indices, plan));
  if (plan.num_rows == 0 || plan.hidden == 0) return Status::ok();  // nothing to write

  if (config.backend == Backend::reference) {
    reference::moe_init_routing_grad(grad_expanded_x.data, indices, grad_x.data, plan);
    return Status::ok();
  }
  cpu::GradKernelArgs args{grad_expanded_x.data, indices, grad_x.data, plan, 0, 0, false};
  args.stream_output = int64_t(grad_x.nbytes()) >= detail::streaming_store_threshold();
  const int64_t bytes =
      plan.num_rows * plan.top_k * (plan.hidden * int64_t(dtype_size(plan.dtype)) + 4);
  const int threads =
      detail::threads_for_bytes(detail::resolve_num_threads(config.num_threads), bytes);
  args.tile_width = cpu::grad_unit_width(plan, threads);
  args.tiles_per_row = (plan.hidden + args.tile_width - 1) / args.tile_width;
  const CpuIsa isa = config.isa == CpuIsa::automatic ? best_cpu_isa() : config.isa;
  auto kernel = &cpu::grad_kernel_baseline;
#if defined(MOE_ROUTING_HAVE_AVX2)
  if (isa == CpuIsa::avx2) kernel = &cpu::grad_kernel_avx2;
#endif
  detail::parallel_for(plan.num_rows * args.tiles_per_row, threads,
                       [&](int64_t begin, int64_t end) { kernel(args, begin, end); });
  return Status::ok();
}

}  // namespace moe_routing
