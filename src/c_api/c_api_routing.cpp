// C ABI of the forward routing operators: moe_init_routing_v2 (aclnnMoeInitRoutingV2) and
// moe_init_routing (the torch API / aclnnMoeInitRoutingV4 style). Phase one runs the operator's
// validation (ops/moe_init_routing/meta.h), the one the C++ entry point runs before reading data;
// phase two is the C++ entry point itself.
#include "c_api/c_api_internal.h"
#include "ops/moe_init_routing/meta.h"

namespace moe_routing::c_api {
namespace {

constexpr const char* kOpV2 = "moe_init_routing_v2: ";
constexpr const char* kOp = "moe_init_routing: ";

// ------------------------------------------------------------------------------------------
// moe_init_routing_v2
// ------------------------------------------------------------------------------------------

Status plan_v2(const mrTensor* x, const mrTensor* expert_idx, int64_t active_num,
               int64_t expert_capacity, int64_t expert_num, int64_t drop_pad_mode,
               int64_t count_flag, bool before_capacity_flag, Executor::RoutingV2* call,
               MoeInitRoutingV2Plan* plan) {
  MOE_ROUTING_RETURN_IF_ERROR(require_non_null(kOpV2, "x", x));
  MOE_ROUTING_RETURN_IF_ERROR(require_non_null(kOpV2, "expert_idx", expert_idx));
  call->x = x->view;
  call->expert_idx = expert_idx->view;
  call->attrs.active_num = active_num;
  call->attrs.expert_capacity = expert_capacity;
  call->attrs.expert_num = expert_num;
  call->attrs.drop_pad_mode = drop_pad_mode;
  call->attrs.expert_tokens_count_or_cumsum_flag = count_flag;
  call->attrs.expert_tokens_before_capacity_flag = before_capacity_flag;
  return infer_moe_init_routing_v2(call->x, call->expert_idx, call->attrs, plan);
}

// ------------------------------------------------------------------------------------------
// moe_init_routing
// ------------------------------------------------------------------------------------------

/// The arguments of mrMoeInitRouting's phase one and shape inference that are not tensors.
struct RoutingScalars {
  int64_t active_num, expert_capacity, expert_num, drop_pad_mode, expert_tokens_num_type;
  bool expert_tokens_num_flag;
  int64_t quant_mode;
  const int64_t* active_expert_range;
  uint64_t active_expert_range_length;
  int64_t row_idx_type;
};

Status plan_routing(const mrTensor* x, const mrTensor* expert_idx, const mrTensor* scale,
                    const mrTensor* offset, const mrTensor* topk_weight, const RoutingScalars& s,
                    Executor::Routing* call, MoeInitRoutingPlan* plan) {
  MOE_ROUTING_RETURN_IF_ERROR(require_non_null(kOp, "x", x));
  MOE_ROUTING_RETURN_IF_ERROR(require_non_null(kOp, "expert_idx", expert_idx));
  call->x = x->view;
  call->expert_idx = expert_idx->view;
  MOE_ROUTING_RETURN_IF_ERROR(optional_view(kOp, "scale", scale, &call->scale));
  MOE_ROUTING_RETURN_IF_ERROR(optional_view(kOp, "offset", offset, &call->offset));
  MOE_ROUTING_RETURN_IF_ERROR(optional_view(kOp, "topk_weight", topk_weight, &call->topk_weight));
  MoeInitRoutingAttrs& attrs = call->attrs;
  attrs.active_num = s.active_num;
  attrs.expert_capacity = s.expert_capacity;
  attrs.expert_num = s.expert_num;
  attrs.drop_pad_mode = s.drop_pad_mode;
  attrs.expert_tokens_num_type = s.expert_tokens_num_type;
  attrs.expert_tokens_num_flag = s.expert_tokens_num_flag;
  attrs.quant_mode = s.quant_mode;
  attrs.row_idx_type = s.row_idx_type;
  // aclnn passes the range as an int array: none (length 0) means [0, expert_num).
  if (s.active_expert_range_length != 0) {
    if (s.active_expert_range_length != 2)
      return invalid_argument(kOp,
                              "active_expert_range must hold 2 values [start, end) (or none: "
                              "length 0), got length ",
                              s.active_expert_range_length);
    MOE_ROUTING_RETURN_IF_ERROR(
        require_non_null(kOp, "active_expert_range", s.active_expert_range));
    attrs.has_active_expert_range = true;
    attrs.active_expert_range.start = s.active_expert_range[0];
    attrs.active_expert_range.end = s.active_expert_range[1];
  }
  return infer_moe_init_routing(call->x, call->expert_idx, call->scale, call->offset,
                                call->topk_weight, attrs, plan);
}

}  // namespace
}  // namespace moe_routing::c_api

using moe_routing::Status;
using namespace moe_routing::c_api;

extern "C" {

mrStatus mrMoeInitRoutingV2InferShape(const mrTensor* x, const mrTensor* expertIdx,
                                      int64_t activeNum, int64_t expertCapacity, int64_t expertNum,
                                      int64_t dropPadMode, int64_t expertTokensCountOrCumsumFlag,
                                      bool expertTokensBeforeCapacityFlag,
                                      mrTensorDesc* expandedXOut, mrTensorDesc* expandedRowIdxOut,
                                      mrTensorDesc* expertTokensCountOrCumsumOut,
                                      mrTensorDesc* expertTokensBeforeCapacityOut) noexcept {
  return guard(kOpV2, [&]() -> Status {
    Executor::RoutingV2 call;
    moe_routing::MoeInitRoutingV2Plan plan;
    MOE_ROUTING_RETURN_IF_ERROR(plan_v2(x, expertIdx, activeNum, expertCapacity, expertNum,
                                        dropPadMode, expertTokensCountOrCumsumFlag,
                                        expertTokensBeforeCapacityFlag, &call, &plan));
    MOE_ROUTING_RETURN_IF_ERROR(require_non_null(kOpV2, "expanded_x_out", expandedXOut));
    MOE_ROUTING_RETURN_IF_ERROR(require_non_null(kOpV2, "expanded_row_idx_out", expandedRowIdxOut));
    MOE_ROUTING_RETURN_IF_ERROR(
        require_non_null(kOpV2, "expert_tokens_count_or_cumsum_out", expertTokensCountOrCumsumOut));
    MOE_ROUTING_RETURN_IF_ERROR(require_non_null(kOpV2, "expert_tokens_before_capacity_out",
                                                 expertTokensBeforeCapacityOut));
    describe_output(plan.expanded_x, expandedXOut);
    describe_output(plan.expanded_row_idx, expandedRowIdxOut);
    describe_output(plan.expert_tokens_count_or_cumsum, expertTokensCountOrCumsumOut);
    describe_output(plan.expert_tokens_before_capacity, expertTokensBeforeCapacityOut);
    return Status::ok();
  });
}

mrStatus mrMoeInitRoutingV2GetWorkspaceSize(
    const mrTensor* x, const mrTensor* expertIdx, int64_t activeNum, int64_t expertCapacity,
    int64_t expertNum, int64_t dropPadMode, int64_t expertTokensCountOrCumsumFlag,
    bool expertTokensBeforeCapacityFlag, mrTensor* expandedXOut, mrTensor* expandedRowIdxOut,
    mrTensor* expertTokensCountOrCumsumOut, mrTensor* expertTokensBeforeCapacityOut,
    uint64_t* workspaceSize, mrExecutor** executor) noexcept {
  reset_phase_one_outputs(workspaceSize, executor);
  return guard(kOpV2, [&]() -> Status {
    MOE_ROUTING_RETURN_IF_ERROR(begin_phase_one(kOpV2, workspaceSize, executor));
    auto planned = new_executor(Executor::Operator::moe_init_routing_v2);
    Executor::RoutingV2& call = planned->v2;
    moe_routing::MoeInitRoutingV2Plan plan;
    MOE_ROUTING_RETURN_IF_ERROR(plan_v2(x, expertIdx, activeNum, expertCapacity, expertNum,
                                        dropPadMode, expertTokensCountOrCumsumFlag,
                                        expertTokensBeforeCapacityFlag, &call, &plan));
    // Outputs need no optional_view: no output of the dispatch is "not wanted" when absent, so
    // validation checks a produced one's shape (a 0-d handle fails it) and ignores one not
    // produced that has NULL data (the handle a caller builds from InferShape's description).
    call.expanded_x = view_of(expandedXOut);
    call.expanded_row_idx = view_of(expandedRowIdxOut);
    call.expert_tokens_count_or_cumsum = view_of(expertTokensCountOrCumsumOut);
    call.expert_tokens_before_capacity = view_of(expertTokensBeforeCapacityOut);
    MOE_ROUTING_RETURN_IF_ERROR(require_produced_outputs(
        kOpV2, {{"expanded_x", expandedXOut, plan.expanded_x},
                {"expanded_row_idx", expandedRowIdxOut, plan.expanded_row_idx},
                {"expert_tokens_count_or_cumsum", expertTokensCountOrCumsumOut,
                 plan.expert_tokens_count_or_cumsum},
                {"expert_tokens_before_capacity", expertTokensBeforeCapacityOut,
                 plan.expert_tokens_before_capacity}}));
    MOE_ROUTING_RETURN_IF_ERROR(moe_routing::detail::validate_moe_init_routing_v2(
        call.x, call.expert_idx, call.attrs, call.expanded_x, call.expanded_row_idx,
        call.expert_tokens_count_or_cumsum, call.expert_tokens_before_capacity, planned->config(),
        &plan));
    // The CPU kernels' scratch and threads; the CUDA backend takes its scratch from its pool.
    const bool cpu = call.x.device == moe_routing::Device::cpu;
    const uint64_t needed =
        cpu ? moe_routing::moe_init_routing_v2_workspace_size(plan, planned->num_threads) : 0;
    const int threads = cpu ? moe_routing::detail::cpu_threads(plan, planned->num_threads) : 0;
    return finish_phase_one(kOpV2, std::move(planned), needed, threads, workspaceSize, executor);
  });
}

mrStatus mrMoeInitRoutingV2(void* workspace, uint64_t workspaceSize, mrExecutor* executor,
                            mrStream stream) noexcept {
  std::unique_ptr<Executor> owned = take_executor(executor);  // consumed, whatever happens
  return guard(kOpV2, [&]() -> Status {
    MOE_ROUTING_RETURN_IF_ERROR(begin_phase_two(kOpV2, Executor::Operator::moe_init_routing_v2,
                                                executor, owned.get(), workspace, workspaceSize));
    const Executor::RoutingV2& call = owned->v2;
    return moe_routing::moe_init_routing_v2(
        call.x, call.expert_idx, call.attrs, call.expanded_x, call.expanded_row_idx,
        call.expert_tokens_count_or_cumsum, call.expert_tokens_before_capacity,
        owned->config(workspace, workspaceSize, stream));
  });
}

mrStatus mrMoeInitRoutingInferShape(
    const mrTensor* x, const mrTensor* expertIdx, const mrTensor* scaleOptional,
    const mrTensor* offsetOptional, const mrTensor* topkWeightOptional, int64_t activeNum,
    int64_t expertCapacity, int64_t expertNum, int64_t dropPadMode, int64_t expertTokensNumType,
    bool expertTokensNumFlag, int64_t quantMode, const int64_t* activeExpertRange,
    uint64_t activeExpertRangeLength, int64_t rowIdxType, mrTensorDesc* expandedXOut,
    mrTensorDesc* expandedRowIdxOut, mrTensorDesc* expertTokensCountOrCumsumOut,
    mrTensorDesc* expandedScaleOut, mrTensorDesc* expandedTopkWeightOut) noexcept {
  return guard(kOp, [&]() -> Status {
    const RoutingScalars scalars{activeNum,   expertCapacity,      expertNum,
                                 dropPadMode, expertTokensNumType, expertTokensNumFlag,
                                 quantMode,   activeExpertRange,   activeExpertRangeLength,
                                 rowIdxType};
    Executor::Routing call;
    moe_routing::MoeInitRoutingPlan plan;
    MOE_ROUTING_RETURN_IF_ERROR(plan_routing(x, expertIdx, scaleOptional, offsetOptional,
                                             topkWeightOptional, scalars, &call, &plan));
    const struct {
      const char* name;
      mrTensorDesc* desc;
      const moe_routing::OutputSpec& spec;
    } outputs[] = {
        {"expanded_x_out", expandedXOut, plan.expanded_x},
        {"expanded_row_idx_out", expandedRowIdxOut, plan.expanded_row_idx},
        {"expert_tokens_count_or_cumsum_out", expertTokensCountOrCumsumOut,
         plan.expert_tokens_count_or_cumsum},
        {"expanded_scale_out", expandedScaleOut, plan.expanded_scale},
        {"expanded_topk_weight_out", expandedTopkWeightOut, plan.expanded_topk_weight},
    };
    for (const auto& output : outputs)
      MOE_ROUTING_RETURN_IF_ERROR(require_non_null(kOp, output.name, output.desc));
    for (const auto& output : outputs) describe_output(output.spec, output.desc);
    return Status::ok();
  });
}

mrStatus mrMoeInitRoutingGetWorkspaceSize(
    const mrTensor* x, const mrTensor* expertIdx, const mrTensor* scaleOptional,
    const mrTensor* offsetOptional, const mrTensor* topkWeightOptional, int64_t activeNum,
    int64_t expertCapacity, int64_t expertNum, int64_t dropPadMode, int64_t expertTokensNumType,
    bool expertTokensNumFlag, int64_t quantMode, const int64_t* activeExpertRange,
    uint64_t activeExpertRangeLength, int64_t rowIdxType, mrTensor* expandedXOut,
    mrTensor* expandedRowIdxOut, mrTensor* expertTokensCountOrCumsumOut, mrTensor* expandedScaleOut,
    mrTensor* expandedTopkWeightOut, uint64_t* workspaceSize, mrExecutor** executor) noexcept {
  reset_phase_one_outputs(workspaceSize, executor);
  return guard(kOp, [&]() -> Status {
    MOE_ROUTING_RETURN_IF_ERROR(begin_phase_one(kOp, workspaceSize, executor));
    const RoutingScalars scalars{activeNum,   expertCapacity,      expertNum,
                                 dropPadMode, expertTokensNumType, expertTokensNumFlag,
                                 quantMode,   activeExpertRange,   activeExpertRangeLength,
                                 rowIdxType};
    auto planned = new_executor(Executor::Operator::moe_init_routing);
    Executor::Routing& call = planned->routing;
    moe_routing::MoeInitRoutingPlan plan;
    MOE_ROUTING_RETURN_IF_ERROR(plan_routing(x, expertIdx, scaleOptional, offsetOptional,
                                             topkWeightOptional, scalars, &call, &plan));
    call.expanded_x = view_of(expandedXOut);
    call.expanded_row_idx = view_of(expandedRowIdxOut);
    call.expert_tokens_count_or_cumsum = view_of(expertTokensCountOrCumsumOut);
    call.expanded_scale = view_of(expandedScaleOut);
    call.expanded_topk_weight = view_of(expandedTopkWeightOut);
    MOE_ROUTING_RETURN_IF_ERROR(require_produced_outputs(
        kOp, {{"expanded_x", expandedXOut, plan.expanded_x},
              {"expanded_row_idx", expandedRowIdxOut, plan.expanded_row_idx},
              {"expert_tokens_count_or_cumsum", expertTokensCountOrCumsumOut,
               plan.expert_tokens_count_or_cumsum},
              {"expanded_scale", expandedScaleOut, plan.expanded_scale},
              {"expanded_topk_weight", expandedTopkWeightOut, plan.expanded_topk_weight}}));
    MOE_ROUTING_RETURN_IF_ERROR(moe_routing::detail::validate_moe_init_routing(
        call.x, call.expert_idx, call.scale, call.offset, call.topk_weight, call.attrs,
        call.expanded_x, call.expanded_row_idx, call.expert_tokens_count_or_cumsum,
        call.expanded_scale, call.expanded_topk_weight, planned->config(), &plan));
    // The CPU kernels' scratch and threads; the CUDA backend takes its scratch from its pool.
    const bool cpu = call.x.device == moe_routing::Device::cpu;
    const uint64_t needed =
        cpu ? moe_routing::moe_init_routing_workspace_size(plan, planned->num_threads) : 0;
    const int threads = cpu ? moe_routing::detail::cpu_threads(plan, planned->num_threads) : 0;
    return finish_phase_one(kOp, std::move(planned), needed, threads, workspaceSize, executor);
  });
}

mrStatus mrMoeInitRouting(void* workspace, uint64_t workspaceSize, mrExecutor* executor,
                          mrStream stream) noexcept {
  std::unique_ptr<Executor> owned = take_executor(executor);  // consumed, whatever happens
  return guard(kOp, [&]() -> Status {
    MOE_ROUTING_RETURN_IF_ERROR(begin_phase_two(kOp, Executor::Operator::moe_init_routing, executor,
                                                owned.get(), workspace, workspaceSize));
    const Executor::Routing& call = owned->routing;
    return moe_routing::moe_init_routing(call.x, call.expert_idx, call.scale, call.offset,
                                         call.topk_weight, call.attrs, call.expanded_x,
                                         call.expanded_row_idx, call.expert_tokens_count_or_cumsum,
                                         call.expanded_scale, call.expanded_topk_weight,
                                         owned->config(workspace, workspaceSize, stream));
  });
}

}  // extern "C"
