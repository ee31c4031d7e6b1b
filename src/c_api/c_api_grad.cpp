// C ABI of moe_init_routing_grad (aclnnMoeInitRoutingV2Grad): shape inference, phase one, phase
// two. Phase one runs the operator's validation (ops/moe_init_routing_grad/meta.h), the one the C++
// entry point runs before reading data; phase two is the C++ entry point itself.
#include "c_api/c_api_internal.h"
#include "ops/moe_init_routing_grad/meta.h"

namespace moe_routing::c_api {
namespace {

constexpr const char* kOp = "moe_init_routing_grad: ";

/// The NULL checks of the inputs and the core's shape inference.
Status plan_grad(const mrTensor* grad_expanded_x, const mrTensor* expanded_row_idx, int64_t top_k,
                 int64_t drop_pad_mode, int64_t active_num, Executor::Grad* call,
                 MoeInitRoutingGradPlan* plan) {
  MOE_ROUTING_RETURN_IF_ERROR(require_non_null(kOp, "grad_expanded_x", grad_expanded_x));
  MOE_ROUTING_RETURN_IF_ERROR(require_non_null(kOp, "expanded_row_idx", expanded_row_idx));
  call->grad_expanded_x = grad_expanded_x->view;
  call->expanded_row_idx = expanded_row_idx->view;
  call->attrs.top_k = top_k;
  call->attrs.drop_pad_mode = drop_pad_mode;
  call->attrs.active_num = active_num;
  return infer_moe_init_routing_grad(call->grad_expanded_x, call->expanded_row_idx, call->attrs,
                                     plan);
}

}  // namespace
}  // namespace moe_routing::c_api

using moe_routing::Status;
using namespace moe_routing::c_api;

extern "C" {

mrStatus mrMoeInitRoutingV2GradInferShape(const mrTensor* gradExpandedX,
                                          const mrTensor* expandedRowIdx, int64_t topK,
                                          int64_t dropPadMode, int64_t activeNum,
                                          mrTensorDesc* out) noexcept {
  return guard(kOp, [&]() -> Status {
    Executor::Grad call;
    moe_routing::MoeInitRoutingGradPlan plan;
    MOE_ROUTING_RETURN_IF_ERROR(
        plan_grad(gradExpandedX, expandedRowIdx, topK, dropPadMode, activeNum, &call, &plan));
    MOE_ROUTING_RETURN_IF_ERROR(require_non_null(kOp, "out", out));
    describe_output(moe_routing::detail::grad_x_spec(plan), out);
    return Status::ok();
  });
}

mrStatus mrMoeInitRoutingV2GradGetWorkspaceSize(const mrTensor* gradExpandedX,
                                                const mrTensor* expandedRowIdx, int64_t topK,
                                                int64_t dropPadMode, int64_t activeNum,
                                                mrTensor* out, uint64_t* workspaceSize,
                                                mrExecutor** executor) noexcept {
  reset_phase_one_outputs(workspaceSize, executor);
  return guard(kOp, [&]() -> Status {
    MOE_ROUTING_RETURN_IF_ERROR(begin_phase_one(kOp, workspaceSize, executor));
    auto planned = new_executor(Executor::Operator::moe_init_routing_grad);
    Executor::Grad& call = planned->grad;
    moe_routing::MoeInitRoutingGradPlan plan;
    MOE_ROUTING_RETURN_IF_ERROR(
        plan_grad(gradExpandedX, expandedRowIdx, topK, dropPadMode, activeNum, &call, &plan));
    call.grad_x = view_of(out);
    MOE_ROUTING_RETURN_IF_ERROR(
        require_produced_outputs(kOp, {{"grad_x", out, moe_routing::detail::grad_x_spec(plan)}}));
    MOE_ROUTING_RETURN_IF_ERROR(moe_routing::detail::validate_moe_init_routing_grad(
        call.grad_expanded_x, call.expanded_row_idx, call.attrs, call.grad_x, planned->config(),
        &plan));
    const int threads = call.grad_x.device == moe_routing::Device::cpu
                            ? moe_routing::detail::cpu_threads(plan, planned->num_threads)
                            : 0;
    // The backward needs no workspace.
    return finish_phase_one(kOp, std::move(planned), 0, threads, workspaceSize, executor);
  });
}

mrStatus mrMoeInitRoutingV2Grad(void* workspace, uint64_t workspaceSize, mrExecutor* executor,
                                mrStream stream) noexcept {
  std::unique_ptr<Executor> owned = take_executor(executor);  // consumed, whatever happens
  return guard(kOp, [&]() -> Status {
    MOE_ROUTING_RETURN_IF_ERROR(begin_phase_two(kOp, Executor::Operator::moe_init_routing_grad,
                                                executor, owned.get(), workspace, workspaceSize));
    const Executor::Grad& call = owned->grad;
    return moe_routing::moe_init_routing_grad(call.grad_expanded_x, call.expanded_row_idx,
                                              call.attrs, call.grad_x,
                                              owned->config(workspace, workspaceSize, stream));
  });
}

}  // extern "C"
