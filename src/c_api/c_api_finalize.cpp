// C ABI of the combine: moe_finalize_routing (aclnnMoeFinalizeRouting = V1,
// aclnnMoeFinalizeRoutingV2) and its backward (aclnnMoeFinalizeRoutingV2Grad): shape inference,
// phase one, phase two. Phase one runs the operator's validation (ops/moe_finalize_routing*/
// meta.h), the one the C++ entry point runs before reading data; phase two is the C++ entry point
// itself.
#include "c_api/c_api_internal.h"
#include "ops/moe_finalize_routing/meta.h"
#include "ops/moe_finalize_routing_grad/meta.h"

namespace moe_routing::c_api {
namespace {

constexpr const char* kOp = "moe_finalize_routing: ";
constexpr const char* kOpGrad = "moe_finalize_routing_grad: ";

/// The tensor arguments of the forward, in the C++ API's names. V1 requires x1, bias, scales and
/// expert_idx (NULL is the C ABI's "must not be NULL"); V2 takes NULL as "absent".
struct FinalizeTensors {
  const mrTensor *expanded_x, *expanded_row_idx, *x1, *x2, *bias, *scales, *expert_idx;
};

Status plan_finalize(const FinalizeTensors& t, FinalizeRoutingApi api, int64_t drop_pad_mode,
                     Executor::Finalize* call, MoeFinalizeRoutingPlan* plan) {
  MOE_ROUTING_RETURN_IF_ERROR(require_non_null(kOp, "expanded_x", t.expanded_x));
  MOE_ROUTING_RETURN_IF_ERROR(require_non_null(kOp, "expanded_row_idx", t.expanded_row_idx));
  if (api == FinalizeRoutingApi::v1) {
    MOE_ROUTING_RETURN_IF_ERROR(require_non_null(kOp, "x1", t.x1));
    MOE_ROUTING_RETURN_IF_ERROR(require_non_null(kOp, "bias", t.bias));
    MOE_ROUTING_RETURN_IF_ERROR(require_non_null(kOp, "scales", t.scales));
    MOE_ROUTING_RETURN_IF_ERROR(require_non_null(kOp, "expert_idx", t.expert_idx));
  }
  MoeFinalizeRoutingInputs& in = call->in;
  in.expanded_x = t.expanded_x->view;
  in.expanded_row_idx = t.expanded_row_idx->view;
  MOE_ROUTING_RETURN_IF_ERROR(optional_view(kOp, "x1", t.x1, &in.x1));
  MOE_ROUTING_RETURN_IF_ERROR(optional_view(kOp, "x2", t.x2, &in.x2));
  MOE_ROUTING_RETURN_IF_ERROR(optional_view(kOp, "bias", t.bias, &in.bias));
  MOE_ROUTING_RETURN_IF_ERROR(optional_view(kOp, "scales", t.scales, &in.scales));
  MOE_ROUTING_RETURN_IF_ERROR(optional_view(kOp, "expert_idx", t.expert_idx, &in.expert_idx));
  call->attrs.api = api;
  call->attrs.drop_pad_mode = drop_pad_mode;
  return infer_moe_finalize_routing(in, call->attrs, plan);
}

Status infer_finalize(const FinalizeTensors& t, FinalizeRoutingApi api, int64_t drop_pad_mode,
                      mrTensorDesc* out) {
  Executor::Finalize call;
  MoeFinalizeRoutingPlan plan;
  MOE_ROUTING_RETURN_IF_ERROR(plan_finalize(t, api, drop_pad_mode, &call, &plan));
  MOE_ROUTING_RETURN_IF_ERROR(require_non_null(kOp, "out", out));
  describe_output(plan.out, out);
  return Status::ok();
}

Status phase_one_finalize(const FinalizeTensors& t, FinalizeRoutingApi api, int64_t drop_pad_mode,
                          mrTensor* out, uint64_t* workspace_size, mrExecutor** executor) {
  MOE_ROUTING_RETURN_IF_ERROR(begin_phase_one(kOp, workspace_size, executor));
  auto planned =
      new_executor(api == FinalizeRoutingApi::v1 ? Executor::Operator::moe_finalize_routing
                                                 : Executor::Operator::moe_finalize_routing_v2);
  Executor::Finalize& call = planned->finalize;
  MoeFinalizeRoutingPlan plan;
  MOE_ROUTING_RETURN_IF_ERROR(plan_finalize(t, api, drop_pad_mode, &call, &plan));
  call.out = view_of(out);
  MOE_ROUTING_RETURN_IF_ERROR(require_produced_outputs(kOp, {{"out", out, plan.out}}));
  MOE_ROUTING_RETURN_IF_ERROR(detail::validate_moe_finalize_routing(call.in, call.attrs, call.out,
                                                                    planned->config(), &plan));
  const int threads =
      call.out.device == Device::cpu ? detail::cpu_threads(plan, planned->num_threads) : 0;
  // The forward needs no workspace.
  return finish_phase_one(kOp, std::move(planned), 0, threads, workspace_size, executor);
}

Status phase_two_finalize(Executor::Operator kind, void* workspace, uint64_t workspace_size,
                          const mrExecutor* handle, const std::unique_ptr<Executor>& owned,
                          mrStream stream) {
  MOE_ROUTING_RETURN_IF_ERROR(
      begin_phase_two(kOp, kind, handle, owned.get(), workspace, workspace_size));
  const Executor::Finalize& call = owned->finalize;
  return moe_finalize_routing(call.in, call.attrs, call.out,
                              owned->config(workspace, workspace_size, stream));
}

/// The view of the backward's grad_scales or grad_bias handle. NULL means "not wanted", as an
/// absent output in C++. A handle the inputs can fill (`spec` produced) is wanted, even one that
/// looks like the absent view (optional_view refuses it: one element without a buffer); one they
/// cannot (InferShape describes it as not produced, 0-d) may have null data and is ignored.
Status wanted_output_view(const char* name, const mrTensor* handle, const OutputSpec& spec,
                          TensorView* view) {
  if (spec.produced) return optional_view(kOpGrad, name, handle, view);
  *view = view_of(handle);
  return Status::ok();
}

/// The backward's arguments that are not tensors.
struct GradScalars {
  int64_t drop_pad_mode, active_num, expert_num, expert_capacity;
};

Status plan_grad(const mrTensor* grad_y, const mrTensor* expanded_row_idx,
                 const mrTensor* expanded_x, const mrTensor* scales, const mrTensor* expert_idx,
                 const mrTensor* bias, const GradScalars& s, Executor::FinalizeGrad* call,
                 MoeFinalizeRoutingGradPlan* plan) {
  MOE_ROUTING_RETURN_IF_ERROR(require_non_null(kOpGrad, "grad_y", grad_y));
  MOE_ROUTING_RETURN_IF_ERROR(require_non_null(kOpGrad, "expanded_row_idx", expanded_row_idx));
  MoeFinalizeRoutingGradInputs& in = call->in;
  in.grad_y = grad_y->view;
  in.expanded_row_idx = expanded_row_idx->view;
  MOE_ROUTING_RETURN_IF_ERROR(optional_view(kOpGrad, "expanded_x", expanded_x, &in.expanded_x));
  MOE_ROUTING_RETURN_IF_ERROR(optional_view(kOpGrad, "scales", scales, &in.scales));
  MOE_ROUTING_RETURN_IF_ERROR(optional_view(kOpGrad, "expert_idx", expert_idx, &in.expert_idx));
  MOE_ROUTING_RETURN_IF_ERROR(optional_view(kOpGrad, "bias", bias, &in.bias));
  call->attrs.drop_pad_mode = s.drop_pad_mode;
  call->attrs.active_num = s.active_num;
  call->attrs.expert_num = s.expert_num;
  call->attrs.expert_capacity = s.expert_capacity;
  return infer_moe_finalize_routing_grad(in, call->attrs, plan);
}

}  // namespace
}  // namespace moe_routing::c_api

using moe_routing::FinalizeRoutingApi;
using moe_routing::Status;
using namespace moe_routing::c_api;

extern "C" {

mrStatus mrMoeFinalizeRoutingInferShape(const mrTensor* expandedX, const mrTensor* x1,
                                        const mrTensor* x2Optional, const mrTensor* bias,
                                        const mrTensor* scales, const mrTensor* expandedRowIdx,
                                        const mrTensor* expandedExpertIdx,
                                        mrTensorDesc* out) noexcept {
  return guard(kOp, [&]() -> Status {
    return infer_finalize(
        {expandedX, expandedRowIdx, x1, x2Optional, bias, scales, expandedExpertIdx},
        FinalizeRoutingApi::v1, 0, out);
  });
}

mrStatus mrMoeFinalizeRoutingGetWorkspaceSize(
    const mrTensor* expandedX, const mrTensor* x1, const mrTensor* x2Optional, const mrTensor* bias,
    const mrTensor* scales, const mrTensor* expandedRowIdx, const mrTensor* expandedExpertIdx,
    mrTensor* out, uint64_t* workspaceSize, mrExecutor** executor) noexcept {
  reset_phase_one_outputs(workspaceSize, executor);
  return guard(kOp, [&]() -> Status {
    return phase_one_finalize(
        {expandedX, expandedRowIdx, x1, x2Optional, bias, scales, expandedExpertIdx},
        FinalizeRoutingApi::v1, 0, out, workspaceSize, executor);
  });
}

mrStatus mrMoeFinalizeRouting(void* workspace, uint64_t workspaceSize, mrExecutor* executor,
                              mrStream stream) noexcept {
  std::unique_ptr<Executor> owned = take_executor(executor);  // consumed, whatever happens
  return guard(kOp, [&]() -> Status {
    return phase_two_finalize(Executor::Operator::moe_finalize_routing, workspace, workspaceSize,
                              executor, owned, stream);
  });
}

mrStatus mrMoeFinalizeRoutingV2InferShape(const mrTensor* expandedX, const mrTensor* expandedRowIdx,
                                          const mrTensor* x1Optional, const mrTensor* x2Optional,
                                          const mrTensor* biasOptional,
                                          const mrTensor* scalesOptional,
                                          const mrTensor* expertIdxOptional, int64_t dropPadMode,
                                          mrTensorDesc* out) noexcept {
  return guard(kOp, [&]() -> Status {
    return infer_finalize({expandedX, expandedRowIdx, x1Optional, x2Optional, biasOptional,
                           scalesOptional, expertIdxOptional},
                          FinalizeRoutingApi::v2, dropPadMode, out);
  });
}

mrStatus mrMoeFinalizeRoutingV2GetWorkspaceSize(
    const mrTensor* expandedX, const mrTensor* expandedRowIdx, const mrTensor* x1Optional,
    const mrTensor* x2Optional, const mrTensor* biasOptional, const mrTensor* scalesOptional,
    const mrTensor* expertIdxOptional, int64_t dropPadMode, mrTensor* out, uint64_t* workspaceSize,
    mrExecutor** executor) noexcept {
  reset_phase_one_outputs(workspaceSize, executor);
  return guard(kOp, [&]() -> Status {
    return phase_one_finalize({expandedX, expandedRowIdx, x1Optional, x2Optional, biasOptional,
                               scalesOptional, expertIdxOptional},
                              FinalizeRoutingApi::v2, dropPadMode, out, workspaceSize, executor);
  });
}

mrStatus mrMoeFinalizeRoutingV2(void* workspace, uint64_t workspaceSize, mrExecutor* executor,
                                mrStream stream) noexcept {
  std::unique_ptr<Executor> owned = take_executor(executor);  // consumed, whatever happens
  return guard(kOp, [&]() -> Status {
    return phase_two_finalize(Executor::Operator::moe_finalize_routing_v2, workspace, workspaceSize,
                              executor, owned, stream);
  });
}

mrStatus mrMoeFinalizeRoutingV2GradInferShape(
    const mrTensor* gradY, const mrTensor* expandedRowIdx, const mrTensor* expandedXOptional,
    const mrTensor* scalesOptional, const mrTensor* expertIdxOptional, const mrTensor* biasOptional,
    int64_t dropPadMode, int64_t activeNum, int64_t expertNum, int64_t expertCapacity,
    mrTensorDesc* gradExpandedXOut, mrTensorDesc* gradScalesOut,
    mrTensorDesc* gradBiasOut) noexcept {
  return guard(kOpGrad, [&]() -> Status {
    Executor::FinalizeGrad call;
    moe_routing::MoeFinalizeRoutingGradPlan plan;
    MOE_ROUTING_RETURN_IF_ERROR(
        plan_grad(gradY, expandedRowIdx, expandedXOptional, scalesOptional, expertIdxOptional,
                  biasOptional, {dropPadMode, activeNum, expertNum, expertCapacity}, &call, &plan));
    MOE_ROUTING_RETURN_IF_ERROR(require_non_null(kOpGrad, "grad_expanded_x_out", gradExpandedXOut));
    MOE_ROUTING_RETURN_IF_ERROR(require_non_null(kOpGrad, "grad_scales_out", gradScalesOut));
    MOE_ROUTING_RETURN_IF_ERROR(require_non_null(kOpGrad, "grad_bias_out", gradBiasOut));
    describe_output(plan.grad_expanded_x, gradExpandedXOut);
    describe_output(plan.grad_scales, gradScalesOut);
    describe_output(plan.grad_bias, gradBiasOut);
    return Status::ok();
  });
}

mrStatus mrMoeFinalizeRoutingV2GradGetWorkspaceSize(
    const mrTensor* gradY, const mrTensor* expandedRowIdx, const mrTensor* expandedXOptional,
    const mrTensor* scalesOptional, const mrTensor* expertIdxOptional, const mrTensor* biasOptional,
    int64_t dropPadMode, int64_t activeNum, int64_t expertNum, int64_t expertCapacity,
    mrTensor* gradExpandedXOut, mrTensor* gradScalesOut, mrTensor* gradBiasOut,
    uint64_t* workspaceSize, mrExecutor** executor) noexcept {
  reset_phase_one_outputs(workspaceSize, executor);
  return guard(kOpGrad, [&]() -> Status {
    MOE_ROUTING_RETURN_IF_ERROR(begin_phase_one(kOpGrad, workspaceSize, executor));
    auto planned = new_executor(Executor::Operator::moe_finalize_routing_v2_grad);
    Executor::FinalizeGrad& call = planned->finalize_grad;
    moe_routing::MoeFinalizeRoutingGradPlan plan;
    MOE_ROUTING_RETURN_IF_ERROR(
        plan_grad(gradY, expandedRowIdx, expandedXOptional, scalesOptional, expertIdxOptional,
                  biasOptional, {dropPadMode, activeNum, expertNum, expertCapacity}, &call, &plan));
    call.out.grad_expanded_x = view_of(gradExpandedXOut);
    MOE_ROUTING_RETURN_IF_ERROR(
        wanted_output_view("grad_scales", gradScalesOut, plan.grad_scales, &call.out.grad_scales));
    MOE_ROUTING_RETURN_IF_ERROR(
        wanted_output_view("grad_bias", gradBiasOut, plan.grad_bias, &call.out.grad_bias));
    MOE_ROUTING_RETURN_IF_ERROR(require_produced_outputs(
        kOpGrad, {{"grad_expanded_x", gradExpandedXOut, plan.grad_expanded_x}}));
    MOE_ROUTING_RETURN_IF_ERROR(moe_routing::detail::validate_moe_finalize_routing_grad(
        call.in, call.attrs, call.out, planned->config(), &plan));
    // The CPU kernels' pair lists; the CUDA backend takes its own from its pool.
    const bool cpu = call.in.grad_y.device == moe_routing::Device::cpu;
    const uint64_t needed =
        cpu ? moe_routing::moe_finalize_routing_grad_workspace_size(plan, planned->num_threads) : 0;
    const int threads = cpu ? moe_routing::detail::cpu_threads(plan, planned->num_threads) : 0;
    return finish_phase_one(kOpGrad, std::move(planned), needed, threads, workspaceSize, executor);
  });
}

mrStatus mrMoeFinalizeRoutingV2Grad(void* workspace, uint64_t workspaceSize, mrExecutor* executor,
                                    mrStream stream) noexcept {
  std::unique_ptr<Executor> owned = take_executor(executor);  // consumed, whatever happens
  return guard(kOpGrad, [&]() -> Status {
    MOE_ROUTING_RETURN_IF_ERROR(begin_phase_two(kOpGrad,
                                                Executor::Operator::moe_finalize_routing_v2_grad,
                                                executor, owned.get(), workspace, workspaceSize));
    const Executor::FinalizeGrad& call = owned->finalize_grad;
    return moe_routing::moe_finalize_routing_grad(call.in, call.attrs, call.out,
                                                  owned->config(workspace, workspaceSize, stream));
  });
}

}  // extern "C"
