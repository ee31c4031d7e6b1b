// Helpers of the C-ABI tests (test_c_api_*.cpp): owning C tensor handles, argument bundles that
// run one operator through the C++ API and through both phases of the C ABI alike (GradCall,
// V2Call, RoutingCall: the spec's examples G1, F1, F3), and the outcome of a C call.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "c_api/c_api_internal.h"
#include "moe_routing/moe_routing.h"
#include "routing_cases.h"

namespace moe_routing::testing {

using c_api::live_executors;
using c_api::live_tensors;

struct TensorDeleter {
  void operator()(mrTensor* t) const { EXPECT_EQ(mrDestroyTensor(t), MR_SUCCESS); }
};
using Handle = std::unique_ptr<mrTensor, TensorDeleter>;

inline Handle make_handle(void* data, DType dtype, const std::vector<int64_t>& shape,
                          Device device = Device::cpu) {
  mrTensor* t = nullptr;
  const mrStatus s =
      mrCreateTensor(shape.data(), shape.size(), mrDataType(dtype), mrDevice(device), data, &t);
  EXPECT_EQ(s, MR_SUCCESS) << mrGetLastErrorMessage();
  return Handle(t);
}

/// A handle for a Tensor of routing_cases.h; an absent tensor gives NULL.
inline Handle make_handle(Tensor& t) {
  if (!t.present) return Handle();
  return make_handle(t.view().data, t.dtype, t.shape);
}

/// A Tensor allocated (poisoned, as run_forward / run_v2 do) from a description; absent when the
/// description says "not produced".
inline Tensor from_desc(const mrTensorDesc& desc) {
  if (!desc.produced) return Tensor();
  Tensor t(DType(desc.dtype), std::vector<int64_t>(desc.shape, desc.shape + desc.ndim));
  t.poison();
  return t;
}

/// One tensor argument of an error case: shape, dtype, device, and whether it is passed at all
/// or passed without a buffer. The buffer (poisoned) is sized from the shape.
struct Arg {
  bool given = false;
  DType dtype = DType::float32;
  std::vector<int64_t> shape;
  Device device = Device::cpu;
  bool null_data = false;
  std::vector<uint8_t> bytes;

  Arg() = default;
  Arg(DType dtype_, std::vector<int64_t> shape_)
      : given(true), dtype(dtype_), shape(std::move(shape_)) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    bytes.assign(size_t(n) * dtype_size(dtype) + 8, 0x5A);
  }
  void* data() { return null_data ? nullptr : bytes.data(); }
  TensorView view() {
    if (!given) return TensorView();
    return TensorView(data(), dtype, int(shape.size()), shape.data(), device);
  }
  Handle handle() { return given ? make_handle(data(), dtype, shape, device) : Handle(); }
  bool untouched() const {
    for (uint8_t b : bytes)
      if (b != 0x5A) return false;
    return true;
  }
};

/// The outcome of a C call: status, message ("" on success: the last error message belongs to
/// a failure only), and phase one's workspace size.
struct Outcome {
  mrStatus status = MR_SUCCESS;
  std::string message;
  uint64_t workspace_size = 0;
};

inline Outcome outcome_of(mrStatus status, uint64_t workspace_size = 0) {
  Outcome o;
  o.status = status;
  o.workspace_size = workspace_size;
  if (status != MR_SUCCESS) o.message = mrGetLastErrorMessage();
  return o;
}

using PhaseTwo = mrStatus (*)(void*, uint64_t, mrExecutor*, mrStream);

/// Phase one of `call`, then, if it succeeded, `phase_two` with a workspace of the reported size.
template <class Call>
Outcome both_phases(Call& call, PhaseTwo phase_two) {
  mrExecutor* executor = nullptr;
  const Outcome o = call.phase_one(&executor);
  if (o.status != MR_SUCCESS) return o;
  std::vector<unsigned char> workspace(size_t(o.workspace_size));
  return outcome_of(phase_two(workspace.data(), o.workspace_size, executor, nullptr));
}

// ------------------------------------------------------------------------------------------
// The three operators as argument bundles that run through the C++ API and the C ABI alike.
// ------------------------------------------------------------------------------------------

/// Spec G1: dropless, top_k 3, float32.
struct GradCall {
  Arg grad_expanded_x{DType::float32, {6, 2}};
  Arg expanded_row_idx{DType::int32, {6}};
  Arg grad_x{DType::float32, {2, 2}};
  int64_t top_k = 3, drop_pad_mode = 0, active_num = 0;

  GradCall() {
    const float g[12] = {-1, 0.5f, 0.5f, 0.5f, 0x1p-30f, 0.25f, 0.125f, 2, 1, 3, 0.25f, -1};
    std::memcpy(grad_expanded_x.bytes.data(), g, sizeof g);
    set_indices({4, 0, 2, 1, 5, 3});
  }
  void set_indices(const std::vector<int32_t>& values) {
    std::memcpy(expanded_row_idx.bytes.data(), values.data(), values.size() * sizeof(int32_t));
  }
  Status cpp() {
    MoeInitRoutingGradAttrs attrs;
    attrs.top_k = top_k;
    attrs.drop_pad_mode = drop_pad_mode;
    attrs.active_num = active_num;
    return moe_init_routing_grad(grad_expanded_x.view(), expanded_row_idx.view(), attrs,
                                 grad_x.view());
  }
  /// Phase one; the executor is returned to the caller (NULL on failure).
  Outcome phase_one(mrExecutor** executor) {
    Handle g = grad_expanded_x.handle(), idx = expanded_row_idx.handle(), out = grad_x.handle();
    uint64_t workspace_size = 77;  // must be reset to 0
    const mrStatus status = mrMoeInitRoutingV2GradGetWorkspaceSize(
        g.get(), idx.get(), top_k, drop_pad_mode, active_num, out.get(), &workspace_size, executor);
    return outcome_of(status, workspace_size);
  }
  /// Both phases.
  Outcome c() { return both_phases(*this, &mrMoeInitRoutingV2Grad); }
  bool outputs_untouched() const { return grad_x.untouched(); }
};

/// Spec F1 with counts: dropless, N 3, K 2, E 3, flag 2 (count).
struct V2Call {
  Arg x{DType::float32, {3, 2}};
  Arg expert_idx{DType::int32, {3, 2}};
  Arg expanded_x{DType::float32, {6, 2}};
  Arg expanded_row_idx{DType::int32, {6}};
  Arg counts{DType::int32, {3}};
  Arg before_capacity;
  int64_t active_num = 0, expert_capacity = 0, expert_num = 3, drop_pad_mode = 0, count_flag = 2;
  bool before_capacity_flag = false;

  V2Call() {
    const float values[6] = {1, 1.5f, 2, 2.5f, 3, 3.5f};
    std::memcpy(x.bytes.data(), values, sizeof values);
    set_ids({1, 0, 2, 1, 0, 2});
  }
  void set_ids(const std::vector<int32_t>& ids) {
    std::memcpy(expert_idx.bytes.data(), ids.data(), ids.size() * sizeof(int32_t));
  }
  Status cpp() {
    MoeInitRoutingV2Attrs attrs;
    attrs.active_num = active_num;
    attrs.expert_capacity = expert_capacity;
    attrs.expert_num = expert_num;
    attrs.drop_pad_mode = drop_pad_mode;
    attrs.expert_tokens_count_or_cumsum_flag = count_flag;
    attrs.expert_tokens_before_capacity_flag = before_capacity_flag;
    return moe_init_routing_v2(x.view(), expert_idx.view(), attrs, expanded_x.view(),
                               expanded_row_idx.view(), counts.view(), before_capacity.view());
  }
  Outcome phase_one(mrExecutor** executor) {
    Handle hx = x.handle(), hidx = expert_idx.handle(), ex = expanded_x.handle(),
           eri = expanded_row_idx.handle(), cnt = counts.handle(), bc = before_capacity.handle();
    uint64_t workspace_size = 77;  // must be reset to 0
    const mrStatus status = mrMoeInitRoutingV2GetWorkspaceSize(
        hx.get(), hidx.get(), active_num, expert_capacity, expert_num, drop_pad_mode, count_flag,
        before_capacity_flag, ex.get(), eri.get(), cnt.get(), bc.get(), &workspace_size, executor);
    return outcome_of(status, workspace_size);
  }
  Outcome c() { return both_phases(*this, &mrMoeInitRoutingV2); }
  bool outputs_untouched() const {
    return expanded_x.untouched() && expanded_row_idx.untouched() && counts.untouched() &&
           before_capacity.untouched();
  }
};

/// Spec F3: range [1, 3) of E 4, topk_weight, count (type 1).
struct RoutingCall {
  Arg x{DType::float32, {3, 2}};
  Arg expert_idx{DType::int32, {3, 2}};
  Arg scale, offset;
  Arg topk_weight{DType::float32, {3, 2}};
  Arg expanded_x{DType::float32, {6, 2}};
  Arg expanded_row_idx{DType::int32, {6}};
  Arg counts{DType::int64, {2}};
  Arg expanded_scale;
  Arg expanded_topk_weight{DType::float32, {6, 1}};
  int64_t active_num = -1, expert_capacity = -1, expert_num = 4, drop_pad_mode = 0;
  int64_t expert_tokens_num_type = 1;
  bool expert_tokens_num_flag = true;
  int64_t quant_mode = -1;
  std::vector<int64_t> range{1, 3};
  bool range_null = false;
  int64_t row_idx_type = 0;

  RoutingCall() {
    const float values[6] = {1, 2, 3, 4, 5, 6};
    std::memcpy(x.bytes.data(), values, sizeof values);
    const float weights[6] = {0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f};
    std::memcpy(topk_weight.bytes.data(), weights, sizeof weights);
    const int32_t ids[6] = {1, 3, 0, 2, 2, 1};
    std::memcpy(expert_idx.bytes.data(), ids, sizeof ids);
  }
  MoeInitRoutingAttrs attrs() const {
    MoeInitRoutingAttrs a;
    a.active_num = active_num;
    a.expert_capacity = expert_capacity;
    a.expert_num = expert_num;
    a.drop_pad_mode = drop_pad_mode;
    a.expert_tokens_num_type = expert_tokens_num_type;
    a.expert_tokens_num_flag = expert_tokens_num_flag;
    a.quant_mode = quant_mode;
    a.has_active_expert_range = !range.empty();
    if (range.size() == 2) a.active_expert_range = {range[0], range[1]};
    a.row_idx_type = row_idx_type;
    return a;
  }
  Status cpp() {
    return moe_init_routing(x.view(), expert_idx.view(), scale.view(), offset.view(),
                            topk_weight.view(), attrs(), expanded_x.view(), expanded_row_idx.view(),
                            counts.view(), expanded_scale.view(), expanded_topk_weight.view());
  }
  Outcome phase_one(mrExecutor** executor) {
    Handle hx = x.handle(), hidx = expert_idx.handle(), hs = scale.handle(), ho = offset.handle(),
           hw = topk_weight.handle(), ex = expanded_x.handle(), eri = expanded_row_idx.handle(),
           cnt = counts.handle(), es = expanded_scale.handle(), ew = expanded_topk_weight.handle();
    uint64_t workspace_size = 77;  // must be reset to 0
    const mrStatus status = mrMoeInitRoutingGetWorkspaceSize(
        hx.get(), hidx.get(), hs.get(), ho.get(), hw.get(), active_num, expert_capacity, expert_num,
        drop_pad_mode, expert_tokens_num_type, expert_tokens_num_flag, quant_mode,
        range_null ? nullptr : range.data(), range.size(), row_idx_type, ex.get(), eri.get(),
        cnt.get(), es.get(), ew.get(), &workspace_size, executor);
    return outcome_of(status, workspace_size);
  }
  Outcome c() { return both_phases(*this, &mrMoeInitRouting); }
  bool outputs_untouched() const {
    return expanded_x.untouched() && expanded_row_idx.untouched() && counts.untouched() &&
           expanded_scale.untouched() && expanded_topk_weight.untouched();
  }
};

}  // namespace moe_routing::testing
