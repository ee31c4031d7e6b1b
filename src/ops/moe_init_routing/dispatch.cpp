// moe_init_routing_v2 and moe_init_routing entry points: validate (meta.h), reduce the call to a
// RoutingProblem and hand it to a backend.
#include <cstring>
#include <new>

#include "cpu/cpu_backend.h"
#include "moe_routing/moe_init_routing.h"
#include "ops/guard.h"
#include "ops/moe_init_routing/meta.h"
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

/// Runs the problem on the configured backend. Backends allocate everything and start their
/// threads before writing, so a failure of either (run_guarded) leaves every output untouched.
/// On a CUDA device, `reject_unrouted` (the V2 API) has the kernels check the expert ids the CPU
/// path checked before building the problem.
Status run(const char* op, const RoutingProblem& problem, const ExecConfig& config, Device device,
           bool reject_unrouted) {
#if defined(MOE_ROUTING_HAVE_CUDA)
  if (device == Device::cuda)
    return cuda::moe_init_routing(op, problem, reject_unrouted, config.stream);
#endif
  static_cast<void>(op), static_cast<void>(device), static_cast<void>(reject_unrouted);
  if (config.backend == Backend::reference)
    reference::moe_init_routing(problem);
  else
    cpu::moe_init_routing(problem, config.num_threads, config.isa, config.workspace);
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
  return cpu::workspace_bytes(detail::routing_problem(plan), num_threads);
}

uint64_t moe_init_routing_workspace_size(const MoeInitRoutingPlan& plan, int num_threads) {
  return cpu::workspace_bytes(detail::routing_problem(plan), num_threads);
}

Status moe_init_routing_v2(const TensorView& x, const TensorView& expert_idx,
                           const MoeInitRoutingV2Attrs& attrs, const TensorView& expanded_x,
                           const TensorView& expanded_row_idx,
                           const TensorView& expert_tokens_count_or_cumsum,
                           const TensorView& expert_tokens_before_capacity,
                           const ExecConfig& config) {
  // Exceptions (memory, threads) become statuses: the C++ API never throws.
  return detail::run_guarded(kOpV2, [&]() -> Status {
    const char* op = kOpV2;
    MoeInitRoutingV2Plan plan;
    MOE_ROUTING_RETURN_IF_ERROR(detail::validate_moe_init_routing_v2(
        x, expert_idx, attrs, expanded_x, expanded_row_idx, expert_tokens_count_or_cumsum,
        expert_tokens_before_capacity, config, &plan));
    const int32_t* ids = expert_idx.data_as<const int32_t>();
    if (x.device == Device::cpu)  // CUDA: the kernels check the ids (device memory)
      MOE_ROUTING_RETURN_IF_ERROR(check_moe_init_routing_v2_expert_idx(ids, plan));

    RoutingProblem problem = detail::routing_problem(plan);
    problem.x = x.data;
    problem.expert_idx = ids;
    problem.expanded_x = expanded_x.data;
    problem.expanded_row_idx = expanded_row_idx.data_as<int32_t>();
    if (plan.expert_tokens_count_or_cumsum.produced)
      problem.counts = expert_tokens_count_or_cumsum.data;
    else if (plan.expert_tokens_before_capacity.produced)
      problem.counts = expert_tokens_before_capacity.data;
    MOE_ROUTING_RETURN_IF_ERROR(run(op, problem, config, x.device, true));
    MOE_ROUTING_RETURN_IF_ERROR(zero_if_not_produced(op, expert_tokens_count_or_cumsum,
                                                     plan.expert_tokens_count_or_cumsum, config));
    MOE_ROUTING_RETURN_IF_ERROR(zero_if_not_produced(op, expert_tokens_before_capacity,
                                                     plan.expert_tokens_before_capacity, config));
    return Status::ok();
  });
}

Status moe_init_routing(const TensorView& x, const TensorView& expert_idx, const TensorView& scale,
                        const TensorView& offset, const TensorView& topk_weight,
                        const MoeInitRoutingAttrs& attrs, const TensorView& expanded_x,
                        const TensorView& expanded_row_idx,
                        const TensorView& expert_tokens_count_or_cumsum,
                        const TensorView& expanded_scale, const TensorView& expanded_topk_weight,
                        const ExecConfig& config) {
  return detail::run_guarded(kOp, [&]() -> Status {
    const char* op = kOp;
    MoeInitRoutingPlan plan;
    MOE_ROUTING_RETURN_IF_ERROR(detail::validate_moe_init_routing(
        x, expert_idx, scale, offset, topk_weight, attrs, expanded_x, expanded_row_idx,
        expert_tokens_count_or_cumsum, expanded_scale, expanded_topk_weight, config, &plan));

    RoutingProblem problem = detail::routing_problem(plan);
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
    MOE_ROUTING_RETURN_IF_ERROR(run(op, problem, config, x.device, false));
    MOE_ROUTING_RETURN_IF_ERROR(zero_if_not_produced(op, expert_tokens_count_or_cumsum,
                                                     plan.expert_tokens_count_or_cumsum, config));
    MOE_ROUTING_RETURN_IF_ERROR(
        zero_if_not_produced(op, expanded_scale, plan.expanded_scale, config));
    MOE_ROUTING_RETURN_IF_ERROR(
        zero_if_not_produced(op, expanded_topk_weight, plan.expanded_topk_weight, config));
    return Status::ok();
  });
}

}  // namespace moe_routing
