// moe_init_routing_v2 and moe_init_routing entry points: infer, check the outputs and the data,
// reduce the call to a RoutingProblem and hand it to a backend.
#include <algorithm>
#include <cstring>
#include <limits>
#include <new>

#include "cpu/cpu_backend.h"
#include "moe_routing/moe_init_routing.h"
#include "params/moe_init_routing_problem.h"
#include "reference/moe_init_routing.h"
#if defined(MOE_ROUTING_HAVE_CUDA)
#include "cuda/cuda_backend.h"
#endif

namespace moe_routing {
namespace {

using detail::CountFormat;
using detail::RoutingProblem;

constexpr const char* kOpV2 = "moe_init_routing_v2: ";
constexpr const char* kOp = "moe_init_routing: ";

/// A produced output must match its spec exactly; a not-produced one may be absent (data null).
Status check_output(const char* op, const char* name, const TensorView& t, const OutputSpec& spec,
                    Device device) {
  if (!spec.produced && t.data == nullptr) return Status::ok();
  bool same = t.ndim == spec.ndim && t.dtype == spec.dtype;
  for (int d = 0; same && d < spec.ndim; ++d) same = t.shape[d] == spec.shape[d];
  if (!same)
    return invalid_argument(
        op, name, " must be ", spec.ndim, "-D ", dtype_name(spec.dtype), ' ', shape_string(spec),
        spec.produced ? "" : " or have null data (it is not produced here)", ", got ", describe(t));
  if (t.device != device)
    return invalid_argument(op, name, " must be on the device of x (", device_name(device),
                            "), got ", device_name(t.device));
  if (t.data == nullptr && spec.numel() > 0)
    return invalid_argument(op, name, " data must not be null for a non-empty tensor, got null");
  return Status::ok();
}

Status check_data(const char* op, const char* name, const TensorView& t) {
  if (t.data == nullptr && t.ndim > 0 && t.numel() > 0)
    return invalid_argument(op, name, " data must not be null for a non-empty tensor, got null");
  return Status::ok();
}

Status check_backend(const char* op, const TensorView& x, const ExecConfig& config) {
#if defined(MOE_ROUTING_HAVE_CUDA)
  if (x.device == Device::cuda) {
    if (config.backend != Backend::automatic)
      return not_supported(op,
                           "backend must be automatic for cuda tensors (reference and cpu run "
                           "on host memory), got ",
                           config.backend == Backend::cpu ? "cpu" : "reference");
    return Status::ok();
  }
#endif
  if (x.device != Device::cpu)
    return not_supported(op, "device must be cpu in this build, got ", device_name(x.device));
  if (config.isa != CpuIsa::automatic && !cpu_isa_available(config.isa))
    return not_supported(op, "isa ", cpu_isa_name(config.isa),
                         " is not available on this CPU or build, got a request for it");
  return Status::ok();
}

/// The sizes and attributes of a call (no data pointers): enough to size its workspace.
RoutingProblem problem_from_plan(const MoeInitRoutingV2Plan& plan) {
  RoutingProblem problem;
  problem.num_rows = plan.num_rows;
  problem.top_k = plan.top_k;
  problem.hidden = plan.hidden;
  problem.x_dtype = plan.dtype;
  // Every id is checked to be in [0, expert_id_limit), so every pair is routed.
  problem.range_start = 0;
  problem.range_end = plan.expert_id_limit;
  problem.drop_pad = plan.drop_pad;
  problem.expert_num = plan.expert_num;
  problem.expert_capacity = plan.expert_capacity;
  problem.row_limit = plan.expanded_rows;
  problem.expanded_rows = plan.expanded_rows;
  problem.count_dtype = DType::int32;
  if (plan.expert_tokens_count_or_cumsum.produced)
    problem.count_format = plan.count_flag == 1 ? CountFormat::cumsum : CountFormat::count;
  else if (plan.expert_tokens_before_capacity.produced)
    problem.count_format = CountFormat::count;
  return problem;
}

RoutingProblem problem_from_plan(const MoeInitRoutingPlan& plan) {
  RoutingProblem problem;
  problem.num_rows = plan.num_rows;
  problem.top_k = plan.top_k;
  problem.hidden = plan.hidden;
  problem.x_dtype = plan.x_dtype;
  problem.range_start = plan.range_start;
  problem.range_end = plan.range_end;
  problem.drop_pad = plan.drop_pad;
  problem.expert_num = plan.expert_num;
  problem.expert_capacity = plan.expert_capacity;
  problem.row_limit = plan.row_limit;
  problem.expanded_rows = plan.expanded_x.shape[0] * (plan.drop_pad ? plan.expanded_x.shape[1] : 1);
  problem.row_idx_type = plan.row_idx_type;
  problem.quant_mode = plan.quant_mode;
  problem.numerics = plan.numerics;
  problem.scale_rows = plan.scale_rows;
  problem.count_dtype = DType::int64;
  if (plan.expert_tokens_num_flag) {
    const CountFormat formats[] = {CountFormat::cumsum, CountFormat::count, CountFormat::key_value};
    problem.count_format = formats[plan.expert_tokens_num_type];
  }
  return problem;
}

/// A caller's workspace (config.workspace) must hold what the CPU kernels need. `size_function`
/// names the function that reports the size.
Status check_workspace(const char* op, const char* size_function, const RoutingProblem& problem,
                       const ExecConfig& config, Device device) {
  if (config.workspace == nullptr || device != Device::cpu || config.backend == Backend::reference)
    return Status::ok();
  const uint64_t needed = cpu::workspace_bytes(problem, config.num_threads);
  if (config.workspace_bytes < needed)
    return invalid_argument(op, "workspace_bytes must be at least ", needed,
                            " for this call with num_threads ", config.num_threads, " (",
                            size_function, " with the same num_threads gives it), got ",
                            config.workspace_bytes);
  return Status::ok();
}

/// Runs the problem on the configured backend. Backends allocate everything before writing, so
/// an allocation failure leaves every output untouched. On a CUDA device, `reject_unrouted` (the
/// V2 API) has the kernels check the expert ids the CPU path checked before building the problem.
Status run(const char* op, const RoutingProblem& problem, const ExecConfig& config, Device device,
           bool reject_unrouted) {
#if defined(MOE_ROUTING_HAVE_CUDA)
  if (device == Device::cuda)
    return cuda::moe_init_routing(op, problem, reject_unrouted, config.stream);
#endif
  static_cast<void>(device), static_cast<void>(reject_unrouted);
  try {
    if (config.backend == Backend::reference)
      reference::moe_init_routing(problem);
    else
      cpu::moe_init_routing(problem, config.num_threads, config.isa, config.workspace);
  } catch (const std::bad_alloc&) {
    return runtime_error(op,
                         "memory for the sort must be allocatable (about 12 bytes per pair), "
                         "got an allocation failure for ",
                         problem.pairs(), " pairs");
  }
  return Status::ok();
}

/// A not-produced output passed with data is filled with zeros (never left uninitialised).
Status zero_if_not_produced(const char* op, const TensorView& t, const OutputSpec& spec,
                            const ExecConfig& config) {
  if (spec.produced || t.data == nullptr) return Status::ok();
#if defined(MOE_ROUTING_HAVE_CUDA)
  if (t.device == Device::cuda)
    return cuda::zero_device_memory(op, t.data, t.nbytes(), config.stream);
#endif
  static_cast<void>(op), static_cast<void>(config);
  std::memset(t.data, 0, t.nbytes());
  return Status::ok();
}

}  // namespace

uint64_t moe_init_routing_v2_workspace_size(const MoeInitRoutingV2Plan& plan, int num_threads) {
  return cpu::workspace_bytes(problem_from_plan(plan), num_threads);
}

uint64_t moe_init_routing_workspace_size(const MoeInitRoutingPlan& plan, int num_threads) {
  return cpu::workspace_bytes(problem_from_plan(plan), num_threads);
}

Status moe_init_routing_v2(const TensorView& x, const TensorView& expert_idx,
                           const MoeInitRoutingV2Attrs& attrs, const TensorView& expanded_x,
                           const TensorView& expanded_row_idx,
                           const TensorView& expert_tokens_count_or_cumsum,
                           const TensorView& expert_tokens_before_capacity,
                           const ExecConfig& config) {
  const char* op = kOpV2;
  MoeInitRoutingV2Plan plan;
  MOE_ROUTING_RETURN_IF_ERROR(infer_moe_init_routing_v2(x, expert_idx, attrs, &plan));
  MOE_ROUTING_RETURN_IF_ERROR(
      check_output(op, "expanded_x", expanded_x, plan.expanded_x, x.device));
  MOE_ROUTING_RETURN_IF_ERROR(
      check_output(op, "expanded_row_idx", expanded_row_idx, plan.expanded_row_idx, x.device));
  MOE_ROUTING_RETURN_IF_ERROR(check_output(op, "expert_tokens_count_or_cumsum",
                                           expert_tokens_count_or_cumsum,
                                           plan.expert_tokens_count_or_cumsum, x.device));
  MOE_ROUTING_RETURN_IF_ERROR(check_output(op, "expert_tokens_before_capacity",
                                           expert_tokens_before_capacity,
                                           plan.expert_tokens_before_capacity, x.device));
  MOE_ROUTING_RETURN_IF_ERROR(check_data(op, "x", x));
  MOE_ROUTING_RETURN_IF_ERROR(check_data(op, "expert_idx", expert_idx));
  MOE_ROUTING_RETURN_IF_ERROR(check_backend(op, x, config));
  const int32_t* ids = expert_idx.data_as<const int32_t>();
  if (x.device == Device::cpu)  // CUDA: the kernels check the ids (device memory)
    MOE_ROUTING_RETURN_IF_ERROR(check_moe_init_routing_v2_expert_idx(ids, plan));

  RoutingProblem problem = problem_from_plan(plan);
  problem.x = x.data;
  problem.expert_idx = ids;
  problem.expanded_x = expanded_x.data;
  problem.expanded_row_idx = expanded_row_idx.data_as<int32_t>();
  if (plan.expert_tokens_count_or_cumsum.produced)
    problem.counts = expert_tokens_count_or_cumsum.data;
  else if (plan.expert_tokens_before_capacity.produced)
    problem.counts = expert_tokens_before_capacity.data;
  MOE_ROUTING_RETURN_IF_ERROR(
      check_workspace(op, "moe_init_routing_v2_workspace_size", problem, config, x.device));
  MOE_ROUTING_RETURN_IF_ERROR(run(op, problem, config, x.device, true));
  MOE_ROUTING_RETURN_IF_ERROR(zero_if_not_produced(op, expert_tokens_count_or_cumsum,
                                                   plan.expert_tokens_count_or_cumsum, config));
  MOE_ROUTING_RETURN_IF_ERROR(zero_if_not_produced(op, expert_tokens_before_capacity,
                                                   plan.expert_tokens_before_capacity, config));
  return Status::ok();
}

Status moe_init_routing(const TensorView& x, const TensorView& expert_idx, const TensorView& scale,
                        const TensorView& offset, const TensorView& topk_weight,
                        const MoeInitRoutingAttrs& attrs, const TensorView& expanded_x,
                        const TensorView& expanded_row_idx,
                        const TensorView& expert_tokens_count_or_cumsum,
                        const TensorView& expanded_scale, const TensorView& expanded_topk_weight,
                        const ExecConfig& config) {
  const char* op = kOp;
  MoeInitRoutingPlan plan;
  MOE_ROUTING_RETURN_IF_ERROR(
      infer_moe_init_routing(x, expert_idx, scale, offset, topk_weight, attrs, &plan));
  MOE_ROUTING_RETURN_IF_ERROR(
      check_output(op, "expanded_x", expanded_x, plan.expanded_x, x.device));
  MOE_ROUTING_RETURN_IF_ERROR(
      check_output(op, "expanded_row_idx", expanded_row_idx, plan.expanded_row_idx, x.device));
  MOE_ROUTING_RETURN_IF_ERROR(check_output(op, "expert_tokens_count_or_cumsum",
                                           expert_tokens_count_or_cumsum,
                                           plan.expert_tokens_count_or_cumsum, x.device));
  MOE_ROUTING_RETURN_IF_ERROR(
      check_output(op, "expanded_scale", expanded_scale, plan.expanded_scale, x.device));
  MOE_ROUTING_RETURN_IF_ERROR(check_output(op, "expanded_topk_weight", expanded_topk_weight,
                                           plan.expanded_topk_weight, x.device));
  MOE_ROUTING_RETURN_IF_ERROR(check_data(op, "x", x));
  MOE_ROUTING_RETURN_IF_ERROR(check_data(op, "expert_idx", expert_idx));
  MOE_ROUTING_RETURN_IF_ERROR(check_data(op, "scale", scale));
  MOE_ROUTING_RETURN_IF_ERROR(check_data(op, "offset", offset));
  MOE_ROUTING_RETURN_IF_ERROR(check_data(op, "topk_weight", topk_weight));
  MOE_ROUTING_RETURN_IF_ERROR(check_backend(op, x, config));

  RoutingProblem problem = problem_from_plan(plan);
  problem.x = x.data;
  problem.expert_idx = expert_idx.data_as<const int32_t>();
  if (plan.has_scale) problem.scale = scale.data_as<const float>();
  if (plan.has_offset) problem.offset = offset.data_as<const float>();
  if (plan.has_topk_weight) problem.topk_weight = topk_weight.data_as<const float>();
  problem.expanded_x = expanded_x.data;
  problem.expanded_row_idx = expanded_row_idx.data_as<int32_t>();
  if (plan.expanded_scale.produced) problem.expanded_scale = expanded_scale.data_as<float>();
  if (plan.expanded_topk_weight.produced)
    problem.expanded_topk_weight = expanded_topk_weight.data_as<float>();
  if (plan.expert_tokens_num_flag) problem.counts = expert_tokens_count_or_cumsum.data;
  MOE_ROUTING_RETURN_IF_ERROR(
      check_workspace(op, "moe_init_routing_workspace_size", problem, config, x.device));
  MOE_ROUTING_RETURN_IF_ERROR(run(op, problem, config, x.device, false));
  MOE_ROUTING_RETURN_IF_ERROR(zero_if_not_produced(op, expert_tokens_count_or_cumsum,
                                                   plan.expert_tokens_count_or_cumsum, config));
  MOE_ROUTING_RETURN_IF_ERROR(
      zero_if_not_produced(op, expanded_scale, plan.expanded_scale, config));
  MOE_ROUTING_RETURN_IF_ERROR(
      zero_if_not_produced(op, expanded_topk_weight, plan.expanded_topk_weight, config));
  return Status::ok();
}

}  // namespace moe_routing
