// The C ABI (include/moe_routing/moe_routing.h) for all three operators: results bitwise equal to
// the C++ API, every status code reachable, the messages (phase one reports exactly what the C++
// entry point reports for the same mistake), nothing written on error, the executor lifecycle,
// the last-error store and thread safety.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "c_api/c_api_internal.h"
#include "grad_cases.h"
#include "moe_routing/moe_routing.h"
#include "routing_cases.h"

namespace moe_routing::testing {
namespace {

using c_api::live_executors;
using c_api::live_tensors;

struct TensorDeleter {
  void operator()(mrTensor* t) const { EXPECT_EQ(mrDestroyTensor(t), MR_SUCCESS); }
};
using Handle = std::unique_ptr<mrTensor, TensorDeleter>;

Handle make_handle(void* data, DType dtype, const std::vector<int64_t>& shape,
                   Device device = Device::cpu) {
  mrTensor* t = nullptr;
  const mrStatus s =
      mrCreateTensor(shape.data(), shape.size(), mrDataType(dtype), mrDevice(device), data, &t);
  EXPECT_EQ(s, MR_SUCCESS) << mrGetLastErrorMessage();
  return Handle(t);
}

/// A handle for a Tensor of routing_cases.h; an absent tensor gives NULL.
Handle make_handle(Tensor& t) {
  if (!t.present) return Handle();
  return make_handle(t.view().data, t.dtype, t.shape);
}

/// A Tensor allocated (poisoned, as run_forward / run_v2 do) from a description; absent when the
/// description says "not produced".
Tensor from_desc(const mrTensorDesc& desc) {
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

Outcome outcome_of(mrStatus status, uint64_t workspace_size = 0) {
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

// ------------------------------------------------------------------------------------------
// Phase one reports what the C++ entry point reports, and writes nothing.
// ------------------------------------------------------------------------------------------

template <class Call>
struct ErrorRow {
  const char* name;
  std::function<void(Call&)> mutate;
  mrStatus status;
  const char* message;  // a substring of the expected message
};

/// Runs each row through the C++ API and the C ABI: same category, same text; the C ABI fails
/// in phase one (no executor, workspace size 0) and no output is written by either.
template <class Call>
void expect_phase_one_matches_cpp(const std::vector<ErrorRow<Call>>& rows) {
  for (const auto& row : rows) {
    SCOPED_TRACE(row.name);
    Call cpp_call;
    row.mutate(cpp_call);
    const Status expected = cpp_call.cpp();
    EXPECT_EQ(int(expected.code()), row.status) << expected.message();
    EXPECT_TRUE(cpp_call.outputs_untouched());

    Call c_call;
    row.mutate(c_call);
    mrExecutor* executor = reinterpret_cast<mrExecutor*>(&c_call);  // must be reset to NULL
    const Outcome got = c_call.phase_one(&executor);
    EXPECT_EQ(got.status, row.status);
    EXPECT_EQ(got.message, expected.message());
    EXPECT_NE(got.message.find(row.message), std::string::npos) << got.message;
    EXPECT_EQ(executor, nullptr);
    EXPECT_EQ(got.workspace_size, 0u);
    EXPECT_TRUE(c_call.outputs_untouched());
  }
  EXPECT_EQ(live_executors(), 0);
}

TEST(CApiErrors, GradPhaseOneMatchesCpp) {
  using Row = ErrorRow<GradCall>;
  expect_phase_one_matches_cpp<GradCall>({
      Row{"drop_pad_mode", [](GradCall& c) { c.drop_pad_mode = 2; }, MR_ERROR_INVALID_ARGUMENT,
          "moe_init_routing_grad: drop_pad_mode must be 0 (dropless/active) or 1 (drop-pad), got "
          "2"},
      Row{"top_k", [](GradCall& c) { c.top_k = 0; }, MR_ERROR_INVALID_ARGUMENT,
          "top_k must be > 0, got 0"},
      Row{"top_k min", [](GradCall& c) { c.top_k = INT64_MIN; }, MR_ERROR_INVALID_ARGUMENT,
          "top_k must be > 0, got -9223372036854775808"},
      Row{"active_num", [](GradCall& c) { c.active_num = -1; }, MR_ERROR_INVALID_ARGUMENT,
          "active_num must be >= 0, got -1"},
      Row{"3-D in mode 0",
          [](GradCall& c) {
            c.grad_expanded_x = Arg(DType::float32, {6, 1, 2});
          },
          MR_ERROR_INVALID_ARGUMENT, "grad_expanded_x must be 2-D [rows, H] when drop_pad_mode=0"},
      Row{"dtype",
          [](GradCall& c) {
            c.grad_expanded_x = Arg(DType::int32, {6, 2});
          },
          MR_ERROR_INVALID_ARGUMENT,
          "grad_expanded_x must be float16, bfloat16 or float32, got int32"},
      Row{"index dtype", [](GradCall& c) { c.expanded_row_idx = Arg(DType::int64, {6}); },
          MR_ERROR_INVALID_ARGUMENT, "expanded_row_idx must be 1-D int32, got 1-D int64 [6]"},
      Row{"divisible", [](GradCall& c) { c.top_k = 4; }, MR_ERROR_INVALID_ARGUMENT,
          "len(expanded_row_idx) must be divisible by top_k (4), got 6"},
      Row{"dropless rows",
          [](GradCall& c) {
            c.grad_expanded_x = Arg(DType::float32, {5, 2});
          },
          MR_ERROR_INVALID_ARGUMENT,
          "grad_expanded_x.size(0) must equal len(expanded_row_idx) (6)"},
      Row{"active rows", [](GradCall& c) { c.active_num = 3; }, MR_ERROR_INVALID_ARGUMENT,
          "grad_expanded_x.size(0) must equal active_num (3) in the active scenario, got 6"},
      Row{"out shape",
          [](GradCall& c) {
            c.grad_x = Arg(DType::float32, {2, 3});
          },
          MR_ERROR_INVALID_ARGUMENT, "grad_x must be 2-D float32 [2, 2], got 2-D float32 [2, 3]"},
      Row{"out dtype",
          [](GradCall& c) {
            c.grad_x = Arg(DType::float16, {2, 2});
          },
          MR_ERROR_INVALID_ARGUMENT, "got 2-D float16 [2, 2]"},
      Row{"out device", [](GradCall& c) { c.grad_x.device = Device::cuda; },
          MR_ERROR_INVALID_ARGUMENT,
          "grad_x must be on the device of grad_expanded_x (cpu), got cuda"},
      Row{"input without data", [](GradCall& c) { c.grad_expanded_x.null_data = true; },
          MR_ERROR_INVALID_ARGUMENT,
          "grad_expanded_x data must not be null for a non-empty tensor"},
  });
}

TEST(CApiErrors, V2PhaseOneMatchesCpp) {
  using Row = ErrorRow<V2Call>;
  expect_phase_one_matches_cpp<V2Call>({
      Row{"drop_pad_mode", [](V2Call& c) { c.drop_pad_mode = -1; }, MR_ERROR_INVALID_ARGUMENT,
          "moe_init_routing_v2: drop_pad_mode must be 0 (dropless) or 1 (drop-pad), got -1"},
      Row{"active_num", [](V2Call& c) { c.active_num = INT64_MIN; }, MR_ERROR_INVALID_ARGUMENT,
          "active_num must be >= 0, got -9223372036854775808"},
      Row{"expert_num", [](V2Call& c) { c.expert_num = INT64_MAX; }, MR_ERROR_INVALID_ARGUMENT,
          "expert_num must be at most 2147483647"},
      Row{"flag", [](V2Call& c) { c.count_flag = 3; }, MR_ERROR_INVALID_ARGUMENT,
          "expert_tokens_count_or_cumsum_flag must be 0 (none), 1 (cumsum) or 2 (count), got 3"},
      Row{"capacity", [](V2Call& c) { c.drop_pad_mode = 1; }, MR_ERROR_INVALID_ARGUMENT,
          "expert_capacity must be >= 1 when drop_pad_mode=1, got 0"},
      Row{"x rank",
          [](V2Call& c) {
            c.x = Arg(DType::float32, {3, 2, 1});
          },
          MR_ERROR_INVALID_ARGUMENT, "x must be 2-D [N, H], got 3-D float32 [3, 2, 1]"},
      Row{"ids dtype",
          [](V2Call& c) {
            c.expert_idx = Arg(DType::int64, {3, 2});
          },
          MR_ERROR_INVALID_ARGUMENT, "expert_idx must be int32, got int64"},
      Row{"rows",
          [](V2Call& c) {
            c.expert_idx = Arg(DType::int32, {4, 2});
          },
          MR_ERROR_INVALID_ARGUMENT, "expert_idx.size(0) must equal x.size(0) (3), got 4"},
      Row{"x dtype",
          [](V2Call& c) {
            c.x = Arg(DType::int8, {3, 2});
          },
          MR_ERROR_INVALID_ARGUMENT, "x must be float16, bfloat16 or float32, got int8"},
      Row{"expanded_x",
          [](V2Call& c) {
            c.expanded_x = Arg(DType::float32, {5, 2});
          },
          MR_ERROR_INVALID_ARGUMENT,
          "expanded_x must be 2-D float32 [6, 2], got 2-D float32 [5, 2]"},
      Row{"counts dtype", [](V2Call& c) { c.counts = Arg(DType::int64, {3}); },
          MR_ERROR_INVALID_ARGUMENT, "expert_tokens_count_or_cumsum must be 1-D int32 [3]"},
      Row{"not produced, wrong shape",
          [](V2Call& c) { c.before_capacity = Arg(DType::int32, {9}); }, MR_ERROR_INVALID_ARGUMENT,
          "expert_tokens_before_capacity must be 1-D int32 [3] or have null data (it is not "
          "produced here), got 1-D int32 [9]"},
      Row{"output without data", [](V2Call& c) { c.expanded_row_idx.null_data = true; },
          MR_ERROR_INVALID_ARGUMENT, "expanded_row_idx data must not be null for a non-empty"},
      Row{"output on cuda", [](V2Call& c) { c.counts.device = Device::cuda; },
          MR_ERROR_INVALID_ARGUMENT, "must be on the device of x (cpu), got cuda"},
      Row{"x without data", [](V2Call& c) { c.x.null_data = true; }, MR_ERROR_INVALID_ARGUMENT,
          "x data must not be null for a non-empty tensor, got null"},
  });
}

TEST(CApiErrors, RoutingPhaseOneMatchesCpp) {
  using Row = ErrorRow<RoutingCall>;
  expect_phase_one_matches_cpp<RoutingCall>({
      Row{"quant_mode unknown", [](RoutingCall& c) { c.quant_mode = 10; },
          MR_ERROR_INVALID_ARGUMENT,
          "moe_init_routing: quant_mode must be -1 (none), 0 (static int8), 1 (dynamic int8)"},
      Row{"quant_mode unsupported", [](RoutingCall& c) { c.quant_mode = 5; },
          MR_ERROR_NOT_SUPPORTED, "CANN's MX/FP8/HiF8/INT4 modes are not implemented, got 5"},
      Row{"expert_num", [](RoutingCall& c) { c.expert_num = 0; }, MR_ERROR_INVALID_ARGUMENT,
          "expert_num must be >= 1, got 0"},
      Row{"range",
          [](RoutingCall& c) {
            c.range = {3, 3};
          },
          MR_ERROR_INVALID_ARGUMENT,
          "active_expert_range must be [start, end) with 0 <= start < end <= expert_num (4), got "
          "[3, 3]"},
      Row{"range extreme",
          [](RoutingCall& c) {
            c.range = {INT64_MIN, INT64_MAX};
          },
          MR_ERROR_INVALID_ARGUMENT, "got [-9223372036854775808, 9223372036854775807]"},
      Row{"type", [](RoutingCall& c) { c.expert_tokens_num_type = 3; }, MR_ERROR_INVALID_ARGUMENT,
          "expert_tokens_num_type must be 0 (cumsum), 1 (count) or 2 (key_value), got 3"},
      Row{"row_idx_type", [](RoutingCall& c) { c.row_idx_type = 2; }, MR_ERROR_INVALID_ARGUMENT,
          "row_idx_type must be 0 (gather) or 1 (scatter), got 2"},
      Row{"active_num", [](RoutingCall& c) { c.active_num = -2; }, MR_ERROR_INVALID_ARGUMENT,
          "active_num must be -1 or 0 (keep every routed pair) or > 0, got -2"},
      Row{"scale shape", [](RoutingCall& c) { c.scale = Arg(DType::float32, {2}); },
          MR_ERROR_INVALID_ARGUMENT, "scale must be 1-D float32 [N] = [3]"},
      Row{"offset", [](RoutingCall& c) { c.offset = Arg(DType::float32, {1}); },
          MR_ERROR_INVALID_ARGUMENT, "offset must be none unless quant_mode=0"},
      Row{"topk_weight",
          [](RoutingCall& c) {
            c.topk_weight = Arg(DType::float32, {3, 1});
          },
          MR_ERROR_INVALID_ARGUMENT, "topk_weight must be 2-D float32 [N, K] = [3, 2]"},
      Row{"counts shape", [](RoutingCall& c) { c.counts = Arg(DType::int64, {4}); },
          MR_ERROR_INVALID_ARGUMENT, "expert_tokens_count_or_cumsum must be 1-D int64 [2]"},
      Row{"weight output",
          [](RoutingCall& c) { c.expanded_topk_weight = Arg(DType::float32, {6}); },
          MR_ERROR_INVALID_ARGUMENT, "expanded_topk_weight must be 2-D float32 [6, 1]"},
      Row{"scale without data",
          [](RoutingCall& c) {
            c.scale = Arg(DType::float32, {3});
            c.scale.null_data = true;
            c.expanded_scale = Arg(DType::float32, {6});
          },
          MR_ERROR_INVALID_ARGUMENT, "scale data must not be null for a non-empty tensor"},
  });
}

// Phase one validates with the C++ entry point's own function, so cuda tensors fare exactly as in
// the C++ API, and the test follows the build it is in: without the CUDA backend phase one
// refuses them (not supported); with it phase one accepts them (no workspace: the CUDA backend
// has its own pool) and phase two runs them as the C++ API does. Here their buffers are host
// memory, so both fail alike there (no GPU: a runtime error; a GPU: not device memory), writing
// nothing.
template <class Call>
void expect_cuda_tensors_fare_as_in_cpp(Call& cpp_call, Call& c_call, const std::string& op) {
  const Status expected = cpp_call.cpp();
  EXPECT_FALSE(expected.is_ok());
  mrExecutor* executor = nullptr;
  const Outcome one = c_call.phase_one(&executor);
  if (!device_supported(Device::cuda)) {
    EXPECT_EQ(expected.code(), StatusCode::not_supported);
    EXPECT_EQ(expected.message(), op + "device must be cpu in this build, got cuda");
    EXPECT_EQ(one.status, MR_ERROR_NOT_SUPPORTED);
    EXPECT_EQ(one.message, expected.message());
    EXPECT_EQ(executor, nullptr);
  } else {
    ASSERT_EQ(one.status, MR_SUCCESS) << one.message;
    EXPECT_EQ(one.workspace_size, 0u);
    EXPECT_EQ(mrDestroyExecutor(executor), MR_SUCCESS);
    const Outcome both = c_call.c();
    EXPECT_EQ(both.status, mrStatus(expected.code()));
    EXPECT_EQ(both.message, expected.message());
  }
  EXPECT_TRUE(cpp_call.outputs_untouched());
  EXPECT_TRUE(c_call.outputs_untouched());
}

TEST(CApiErrors, CudaTensorsFareAsInTheCppApi) {
  auto on_cuda = [](std::initializer_list<Arg*> args) {
    for (Arg* a : args) a->device = Device::cuda;
  };
  GradCall grad, grad_c;
  for (GradCall* c : {&grad, &grad_c})
    on_cuda({&c->grad_expanded_x, &c->expanded_row_idx, &c->grad_x});
  expect_cuda_tensors_fare_as_in_cpp(grad, grad_c, "moe_init_routing_grad: ");
  V2Call v2, v2_c;
  for (V2Call* c : {&v2, &v2_c})
    on_cuda({&c->x, &c->expert_idx, &c->expanded_x, &c->expanded_row_idx, &c->counts});
  expect_cuda_tensors_fare_as_in_cpp(v2, v2_c, "moe_init_routing_v2: ");
  RoutingCall routing, routing_c;
  for (RoutingCall* c : {&routing, &routing_c})
    on_cuda({&c->x, &c->expert_idx, &c->topk_weight, &c->expanded_x, &c->expanded_row_idx,
             &c->counts, &c->expanded_topk_weight});
  expect_cuda_tensors_fare_as_in_cpp(routing, routing_c, "moe_init_routing: ");
  EXPECT_EQ(live_executors(), 0);
}

TEST(CApiErrors, ActiveExpertRangeArray) {
  RoutingCall too_long;
  too_long.range = {0, 2, 4};
  mrExecutor* executor = nullptr;
  Outcome o = too_long.phase_one(&executor);
  EXPECT_EQ(o.status, MR_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(o.message,
            "moe_init_routing: active_expert_range must hold 2 values [start, end) (or "
            "none: length 0), got length 3");
  RoutingCall null_range;
  null_range.range_null = true;
  o = null_range.phase_one(&executor);
  EXPECT_EQ(o.status, MR_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(o.message, "moe_init_routing: active_expert_range must not be NULL, got NULL");
  // Length 0: the full range [0, expert_num); counts then cover the 4 experts.
  RoutingCall full;
  full.range.clear();
  full.counts = Arg(DType::int64, {4});
  o = full.c();
  EXPECT_EQ(o.status, MR_SUCCESS) << o.message;
  const int64_t* counts = reinterpret_cast<const int64_t*>(full.counts.bytes.data());
  EXPECT_EQ(std::vector<int64_t>(counts, counts + 4), (std::vector<int64_t>{1, 2, 2, 1}));
  EXPECT_EQ(live_executors(), 0);
}

// ------------------------------------------------------------------------------------------
// Phase two: index values, nothing written on error.
// ------------------------------------------------------------------------------------------

TEST(CApiErrors, GradIndexOutOfRange) {
  GradCall call;
  call.set_indices({4, 0, 2, 1, 5, 99});
  const Outcome o = call.c();
  EXPECT_EQ(o.status, MR_ERROR_INDEX_OUT_OF_RANGE);
  EXPECT_EQ(o.message, "moe_init_routing_grad: expanded_row_idx[5] = 99 is outside [0, 6)");
  EXPECT_TRUE(call.outputs_untouched());
  EXPECT_EQ(live_executors(), 0);  // consumed although it failed
  EXPECT_STREQ(mrGetStatusName(o.status), "index out of range");
}

TEST(CApiErrors, V2ExpertIdOutOfRange) {
  V2Call call;
  call.set_ids({1, 0, 2, 3, 0, 2});  // 3 >= expert_num, which the counts use
  const Outcome o = call.c();
  EXPECT_EQ(o.status, MR_ERROR_INDEX_OUT_OF_RANGE);
  EXPECT_EQ(o.message, "moe_init_routing_v2: expert_idx[1][1] = 3 is outside [0, 3) (expert_num)");
  EXPECT_TRUE(call.outputs_untouched());
  EXPECT_EQ(live_executors(), 0);
}

TEST(CApiErrors, RoutingIdsOutsideTheRangeAreNotAnError) {
  RoutingCall call;
  call.range = {0, 4};
  call.counts = Arg(DType::int64, {4});
  const int32_t ids[6] = {-1, 3, 0, 2, 7, INT32_MIN};
  std::memcpy(call.expert_idx.bytes.data(), ids, sizeof ids);
  const Outcome o = call.c();
  EXPECT_EQ(o.status, MR_SUCCESS) << o.message;
  const int32_t* row_idx = reinterpret_cast<const int32_t*>(call.expanded_row_idx.bytes.data());
  EXPECT_EQ(std::vector<int32_t>(row_idx, row_idx + 6),
            (std::vector<int32_t>{-1, 2, 0, 1, -1, -1}));
}

// ------------------------------------------------------------------------------------------
// NULL pointers: each one named.
// ------------------------------------------------------------------------------------------

TEST(CApiErrors, NullPointersAreNamed) {
  GradCall grad;
  Handle g = grad.grad_expanded_x.handle(), idx = grad.expanded_row_idx.handle(),
         out = grad.grad_x.handle();
  V2Call v2;
  Handle x2 = v2.x.handle(), ids2 = v2.expert_idx.handle(), ex2 = v2.expanded_x.handle(),
         eri2 = v2.expanded_row_idx.handle(), cnt2 = v2.counts.handle();
  RoutingCall r;
  Handle x4 = r.x.handle(), ids4 = r.expert_idx.handle(), ex4 = r.expanded_x.handle(),
         eri4 = r.expanded_row_idx.handle(), cnt4 = r.counts.handle(), w4 = r.topk_weight.handle(),
         ew4 = r.expanded_topk_weight.handle();
  const int64_t range[2] = {1, 3};
  uint64_t ws = 0;
  mrExecutor* ex = nullptr;
  mrTensorDesc d;
  const int64_t shape[1] = {2};
  mrTensor* t = nullptr;

  struct Row {
    std::function<mrStatus()> call;
    const char* message;
  };
  const Row rows[] = {
      {[&] { return mrCreateTensor(nullptr, 1, MR_FLOAT32, MR_DEVICE_CPU, nullptr, &t); },
       "mrCreateTensor: shape must not be NULL when ndim > 0, got NULL with ndim 1"},
      {[&] { return mrCreateTensor(shape, 1, MR_FLOAT32, MR_DEVICE_CPU, nullptr, nullptr); },
       "mrCreateTensor: tensor must not be NULL, got NULL"},
      {[&] { return mrMoeInitRoutingV2GradInferShape(nullptr, idx.get(), 3, 0, 0, &d); },
       "moe_init_routing_grad: grad_expanded_x must not be NULL, got NULL"},
      {[&] { return mrMoeInitRoutingV2GradInferShape(g.get(), nullptr, 3, 0, 0, &d); },
       "moe_init_routing_grad: expanded_row_idx must not be NULL, got NULL"},
      {[&] { return mrMoeInitRoutingV2GradInferShape(g.get(), idx.get(), 3, 0, 0, nullptr); },
       "moe_init_routing_grad: out must not be NULL, got NULL"},
      {[&] {
         return mrMoeInitRoutingV2GradGetWorkspaceSize(g.get(), idx.get(), 3, 0, 0, nullptr, &ws,
                                                       &ex);
       },
       "moe_init_routing_grad: grad_x must not be NULL, got NULL"},
      {[&] {
         return mrMoeInitRoutingV2GradGetWorkspaceSize(g.get(), idx.get(), 3, 0, 0, out.get(),
                                                       nullptr, &ex);
       },
       "moe_init_routing_grad: workspace_size must not be NULL, got NULL"},
      {[&] {
         return mrMoeInitRoutingV2GradGetWorkspaceSize(g.get(), idx.get(), 3, 0, 0, out.get(), &ws,
                                                       nullptr);
       },
       "moe_init_routing_grad: executor must not be NULL, got NULL"},
      {[&] { return mrMoeInitRoutingV2Grad(nullptr, 0, nullptr, nullptr); },
       "moe_init_routing_grad: executor must not be NULL, got NULL"},
      {[&] {
         return mrMoeInitRoutingV2InferShape(nullptr, ids2.get(), 0, 0, 3, 0, 2, false, &d, &d, &d,
                                             &d);
       },
       "moe_init_routing_v2: x must not be NULL, got NULL"},
      {[&] {
         return mrMoeInitRoutingV2InferShape(x2.get(), ids2.get(), 0, 0, 3, 0, 2, false, &d, &d, &d,
                                             nullptr);
       },
       "moe_init_routing_v2: expert_tokens_before_capacity_out must not be NULL, got NULL"},
      {[&] {
         return mrMoeInitRoutingV2GetWorkspaceSize(x2.get(), nullptr, 0, 0, 3, 0, 2, false,
                                                   ex2.get(), eri2.get(), cnt2.get(), nullptr, &ws,
                                                   &ex);
       },
       "moe_init_routing_v2: expert_idx must not be NULL, got NULL"},
      {[&] {
         return mrMoeInitRoutingV2GetWorkspaceSize(x2.get(), ids2.get(), 0, 0, 3, 0, 2, false,
                                                   nullptr, eri2.get(), cnt2.get(), nullptr, &ws,
                                                   &ex);
       },
       "moe_init_routing_v2: expanded_x must not be NULL, got NULL"},
      {[&] {  // produced (flag 2), so required
         return mrMoeInitRoutingV2GetWorkspaceSize(x2.get(), ids2.get(), 0, 0, 3, 0, 2, false,
                                                   ex2.get(), eri2.get(), nullptr, nullptr, &ws,
                                                   &ex);
       },
       "moe_init_routing_v2: expert_tokens_count_or_cumsum must not be NULL, got NULL"},
      {[&] { return mrMoeInitRoutingV2(nullptr, 0, nullptr, nullptr); },
       "moe_init_routing_v2: executor must not be NULL, got NULL"},
      {[&] {
         return mrMoeInitRoutingInferShape(x4.get(), nullptr, nullptr, nullptr, nullptr, -1, -1, 4,
                                           0, 1, true, -1, range, 2, 0, &d, &d, &d, &d, &d);
       },
       "moe_init_routing: expert_idx must not be NULL, got NULL"},
      {[&] {
         return mrMoeInitRoutingInferShape(x4.get(), ids4.get(), nullptr, nullptr, nullptr, -1, -1,
                                           4, 0, 1, true, -1, range, 2, 0, &d, &d, &d, nullptr, &d);
       },
       "moe_init_routing: expanded_scale_out must not be NULL, got NULL"},
      {[&] {
         return mrMoeInitRoutingGetWorkspaceSize(x4.get(), ids4.get(), nullptr, nullptr, w4.get(),
                                                 -1, -1, 4, 0, 1, true, -1, range, 2, 0, ex4.get(),
                                                 nullptr, cnt4.get(), nullptr, ew4.get(), &ws, &ex);
       },
       "moe_init_routing: expanded_row_idx must not be NULL, got NULL"},
      {[&] {  // produced because topk_weight is given
         return mrMoeInitRoutingGetWorkspaceSize(
             x4.get(), ids4.get(), nullptr, nullptr, w4.get(), -1, -1, 4, 0, 1, true, -1, range, 2,
             0, ex4.get(), eri4.get(), cnt4.get(), nullptr, nullptr, &ws, &ex);
       },
       "moe_init_routing: expanded_topk_weight must not be NULL, got NULL"},
      {[&] {
         return mrMoeInitRoutingGetWorkspaceSize(
             x4.get(), ids4.get(), nullptr, nullptr, w4.get(), -1, -1, 4, 0, 1, true, -1, range, 2,
             0, ex4.get(), eri4.get(), cnt4.get(), nullptr, ew4.get(), nullptr, &ex);
       },
       "moe_init_routing: workspace_size must not be NULL, got NULL"},
      {[&] { return mrMoeInitRouting(nullptr, 0, nullptr, nullptr); },
       "moe_init_routing: executor must not be NULL, got NULL"},
      {[&] { return mrSetAccumulationOrder(nullptr, MR_ACCUMULATION_TREE); },
       "mrSetAccumulationOrder: executor must not be NULL, got NULL"},
      {[&] { return mrSetNumerics(nullptr, MR_NUMERICS_ATLAS_A2); },
       "mrSetNumerics: executor must not be NULL, got NULL"},
  };
  for (const Row& row : rows) {
    SCOPED_TRACE(row.message);
    ex = nullptr;
    EXPECT_EQ(row.call(), MR_ERROR_INVALID_ARGUMENT);
    EXPECT_STREQ(mrGetLastErrorMessage(), row.message);
    EXPECT_EQ(ex, nullptr);
    EXPECT_EQ(t, nullptr);
  }
  EXPECT_TRUE(grad.outputs_untouched() && v2.outputs_untouched() && r.outputs_untouched());
  EXPECT_EQ(live_executors(), 0);
}

TEST(CApiErrors, CreateTensorChecks) {
  const int64_t shape[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
  const int64_t negative[2] = {2, -3};
  const int64_t huge[2] = {INT64_MAX / 4, 2};
  const int64_t empty_huge[3] = {INT64_MAX, 0, INT64_MAX};
  float buffer[1] = {0};
  mrTensor* t = nullptr;
  struct Row {
    const int64_t* shape;
    uint64_t ndim;
    mrDataType dtype;
    mrDevice device;
    const char* message;
  };
  const Row rows[] = {
      {shape, 9, MR_FLOAT32, MR_DEVICE_CPU, "mrCreateTensor: ndim must be at most 8, got 9"},
      {shape, UINT64_MAX, MR_FLOAT32, MR_DEVICE_CPU,
       "ndim must be at most 8, got 18446744073709551615"},
      {negative, 2, MR_FLOAT32, MR_DEVICE_CPU,
       "mrCreateTensor: shape[1] must be >= 0, got [2, -3]"},
      {shape, 1, 6, MR_DEVICE_CPU,
       "dtype must be one of MR_FLOAT32 (0), MR_FLOAT16 (1), "
       "MR_BFLOAT16 (2), MR_INT8 (3), MR_INT32 (4), MR_INT64 (5), got 6"},
      {shape, 1, INT32_MIN, MR_DEVICE_CPU, "got -2147483648"},
      {shape, 1, MR_FLOAT32, 2, "device must be MR_DEVICE_CPU (0) or MR_DEVICE_CUDA (1), got 2"},
      {huge, 2, MR_FLOAT32, MR_DEVICE_CPU,
       "the tensor's size in bytes must fit int64, got 2-D float32 [2305843009213693951, 2]"},
  };
  for (const Row& row : rows) {
    SCOPED_TRACE(row.message);
    t = reinterpret_cast<mrTensor*>(buffer);
    EXPECT_EQ(mrCreateTensor(row.shape, row.ndim, row.dtype, row.device, buffer, &t),
              MR_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(mrGetLastErrorMessage()).find(row.message), std::string::npos)
        << mrGetLastErrorMessage();
    EXPECT_EQ(t, nullptr);
  }
  // Valid edge cases: 0-d without a shape, empty with huge extents, NULL data, a CUDA tensor.
  EXPECT_EQ(mrCreateTensor(nullptr, 0, MR_INT64, MR_DEVICE_CPU, nullptr, &t), MR_SUCCESS);
  EXPECT_EQ(live_tensors(), 1);
  EXPECT_EQ(mrDestroyTensor(t), MR_SUCCESS);
  EXPECT_EQ(mrCreateTensor(empty_huge, 3, MR_BFLOAT16, MR_DEVICE_CUDA, nullptr, &t), MR_SUCCESS);
  EXPECT_EQ(mrDestroyTensor(t), MR_SUCCESS);
  EXPECT_EQ(live_tensors(), 0);
}

// ------------------------------------------------------------------------------------------
// MR_ERROR_INTERNAL and MR_ERROR_RUNTIME: the exception barrier.
// ------------------------------------------------------------------------------------------

TEST(CApiErrors, ExceptionsBecomeStatuses) {
  using c_api::InjectedFailure;
  GradCall call;
  {
    Handle g = call.grad_expanded_x.handle(), idx = call.expanded_row_idx.handle(),
           out = call.grad_x.handle();
    uint64_t ws = 5;
    mrExecutor* executor = reinterpret_cast<mrExecutor*>(&call);
    c_api::inject_failure_in_next_call(InjectedFailure::logic_error);
    EXPECT_EQ(mrMoeInitRoutingV2GradGetWorkspaceSize(g.get(), idx.get(), 3, 0, 0, out.get(), &ws,
                                                     &executor),
              MR_ERROR_INTERNAL);
    EXPECT_STREQ(mrGetLastErrorMessage(),
                 "moe_init_routing_grad: internal error: an unexpected C++ exception reached the "
                 "C ABI (please report this as a bug)");
    EXPECT_EQ(executor, nullptr);
    EXPECT_EQ(ws, 0u);
    EXPECT_STREQ(mrGetStatusName(MR_ERROR_INTERNAL), "internal error");
    EXPECT_EQ(live_executors(), 0);
  }

  c_api::inject_failure_in_next_call(InjectedFailure::bad_alloc);
  mrTensor* t = reinterpret_cast<mrTensor*>(&call);
  EXPECT_EQ(mrCreateTensor(nullptr, 0, MR_FLOAT32, MR_DEVICE_CPU, nullptr, &t), MR_ERROR_RUNTIME);
  EXPECT_STREQ(mrGetLastErrorMessage(),
               "mrCreateTensor: memory must be allocatable, got an allocation failure");
  EXPECT_EQ(t, nullptr);
  EXPECT_STREQ(mrGetStatusName(MR_ERROR_RUNTIME), "runtime error");

  // In phase two the executor is still consumed and nothing is written.
  mrExecutor* executor = nullptr;
  Outcome o = call.phase_one(&executor);
  ASSERT_EQ(o.status, MR_SUCCESS) << o.message;
  EXPECT_EQ(live_executors(), 1);
  c_api::inject_failure_in_next_call(InjectedFailure::bad_alloc);
  EXPECT_EQ(mrMoeInitRoutingV2Grad(nullptr, 0, executor, nullptr), MR_ERROR_RUNTIME);
  EXPECT_EQ(live_executors(), 0);
  EXPECT_TRUE(call.outputs_untouched());
  // The injection is one-shot: the next call works.
  o = call.c();
  EXPECT_EQ(o.status, MR_SUCCESS) << o.message;
  EXPECT_EQ(live_tensors(), 0);
}

TEST(CApiErrors, StatusNames) {
  EXPECT_STREQ(mrGetStatusName(MR_SUCCESS), "ok");
  EXPECT_STREQ(mrGetStatusName(MR_ERROR_INVALID_ARGUMENT), "invalid argument");
  EXPECT_STREQ(mrGetStatusName(MR_ERROR_NOT_SUPPORTED), "not supported");
  EXPECT_STREQ(mrGetStatusName(-1), "unknown status");
  EXPECT_STREQ(mrGetStatusName(6), "unknown status");
}

// ------------------------------------------------------------------------------------------
// Executors and the last error.
// ------------------------------------------------------------------------------------------

TEST(CApiExecutor, LifecycleAndWorkspace) {
  GradCall call;
  mrExecutor* executor = nullptr;
  // Phase one, then destroyed without running: nothing written, nothing leaked.
  ASSERT_EQ(call.phase_one(&executor).status, MR_SUCCESS);
  EXPECT_EQ(live_executors(), 1);
  EXPECT_EQ(mrDestroyExecutor(executor), MR_SUCCESS);
  EXPECT_EQ(live_executors(), 0);
  EXPECT_TRUE(call.outputs_untouched());

  // A NULL workspace with a non-zero size is refused (and the executor consumed).
  ASSERT_EQ(call.phase_one(&executor).status, MR_SUCCESS);
  EXPECT_EQ(mrMoeInitRoutingV2Grad(nullptr, 16, executor, nullptr), MR_ERROR_INVALID_ARGUMENT);
  EXPECT_STREQ(mrGetLastErrorMessage(),
               "moe_init_routing_grad: workspace must not be NULL when "
               "workspace_size > 0, got NULL with workspace_size 16");
  EXPECT_EQ(live_executors(), 0);
  EXPECT_TRUE(call.outputs_untouched());

  // A workspace larger than needed, and a stream, are accepted; the handles may be destroyed
  // between the phases (the executor keeps the buffers, not the handles).
  ASSERT_EQ(call.phase_one(&executor).status, MR_SUCCESS);
  EXPECT_EQ(live_tensors(), 0);
  std::vector<uint8_t> workspace(64);
  int stream_object = 0;
  EXPECT_EQ(mrMoeInitRoutingV2Grad(workspace.data(), workspace.size(), executor, &stream_object),
            MR_SUCCESS);
  EXPECT_EQ(live_executors(), 0);
  const float* grad_x = reinterpret_cast<const float*>(call.grad_x.bytes.data());
  EXPECT_EQ(std::vector<float>(grad_x, grad_x + 4),
            (std::vector<float>{0.0f, 3.75f, 0.875f, 1.5f}));
}

/// The forward operators report a workspace in phase one and require it in phase two: too
/// small (NULL with 0 included) is refused with nothing written, and the executor is consumed;
/// the exact size at an unaligned address works and gives the C++ API's results.
template <class Call, class PhaseTwoFn>
void expect_forward_workspace_required(PhaseTwoFn phase_two, const char* op) {
  Call call;
  mrExecutor* executor = nullptr;
  Outcome o = call.phase_one(&executor);
  ASSERT_EQ(o.status, MR_SUCCESS) << o.message;
  const uint64_t ws = o.workspace_size;
  EXPECT_GT(ws, 0u) << op;
  EXPECT_EQ(phase_two(nullptr, 0, executor, nullptr), MR_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(std::string(mrGetLastErrorMessage()),
            std::string(op) + "workspace_size must be at least " + std::to_string(ws) +
                " (the size phase one reported), got 0");
  EXPECT_EQ(live_executors(), 0);
  EXPECT_TRUE(call.outputs_untouched()) << op;

  std::vector<unsigned char> workspace(size_t(ws) + 1);
  ASSERT_EQ(call.phase_one(&executor).status, MR_SUCCESS);
  EXPECT_EQ(phase_two(workspace.data() + 1, ws - 1, executor, nullptr), MR_ERROR_INVALID_ARGUMENT);
  EXPECT_TRUE(call.outputs_untouched()) << op;

  ASSERT_EQ(call.phase_one(&executor).status, MR_SUCCESS);
  EXPECT_EQ(phase_two(workspace.data() + 1, ws, executor, nullptr), MR_SUCCESS)
      << mrGetLastErrorMessage();
  Call expected;
  ASSERT_TRUE(expected.cpp().is_ok());
  EXPECT_EQ(call.expanded_x.bytes, expected.expanded_x.bytes) << op;
  EXPECT_EQ(call.expanded_row_idx.bytes, expected.expanded_row_idx.bytes) << op;
  EXPECT_EQ(call.counts.bytes, expected.counts.bytes) << op;
  EXPECT_EQ(live_executors(), 0);
}

TEST(CApiExecutor, ForwardWorkspaceIsReportedAndRequired) {
  expect_forward_workspace_required<V2Call>(&mrMoeInitRoutingV2, "moe_init_routing_v2: ");
  expect_forward_workspace_required<RoutingCall>(&mrMoeInitRouting, "moe_init_routing: ");
}

// The workspace size is fixed in phase one with the thread count of then: changing the default
// before phase two does not invalidate it.
TEST(CApiExecutor, WorkspaceSurvivesAThreadCountChange) {
  V2Call call;
  // Large enough that the kernels would use every thread.
  call.x = Arg(DType::float32, {4096, 64});
  call.expert_idx = Arg(DType::int32, {4096, 2});
  std::vector<int32_t> ids(4096 * 2);
  for (size_t p = 0; p < ids.size(); ++p) ids[p] = int32_t(p % 3);
  call.set_ids(ids);
  call.expanded_x = Arg(DType::float32, {8192, 64});
  call.expanded_row_idx = Arg(DType::int32, {8192});
  ASSERT_EQ(mrSetNumThreads(1), MR_SUCCESS);
  mrExecutor* executor = nullptr;
  const Outcome o = call.phase_one(&executor);
  ASSERT_EQ(o.status, MR_SUCCESS) << o.message;
  ASSERT_EQ(mrSetNumThreads(8), MR_SUCCESS);
  std::vector<unsigned char> workspace(size_t(o.workspace_size));
  EXPECT_EQ(mrMoeInitRoutingV2(workspace.data(), o.workspace_size, executor, nullptr), MR_SUCCESS)
      << mrGetLastErrorMessage();
  ASSERT_EQ(mrSetNumThreads(0), MR_SUCCESS);
  const int32_t* counts = reinterpret_cast<const int32_t*>(call.counts.bytes.data());
  EXPECT_EQ(std::vector<int32_t>(counts, counts + 3), (std::vector<int32_t>{2731, 2731, 2730}));
}

TEST(CApiExecutor, WrongOperatorIsRefusedAndConsumed) {
  GradCall grad;
  V2Call v2;
  RoutingCall routing;
  mrExecutor* grad_executor = nullptr;
  mrExecutor* v2_executor = nullptr;
  mrExecutor* routing_executor = nullptr;
  ASSERT_EQ(grad.phase_one(&grad_executor).status, MR_SUCCESS);
  ASSERT_EQ(v2.phase_one(&v2_executor).status, MR_SUCCESS);
  ASSERT_EQ(routing.phase_one(&routing_executor).status, MR_SUCCESS);
  EXPECT_EQ(live_executors(), 3);

  // The order setter refuses executors of other operators and leaves them unchanged; the
  // numerics are the library's one switch, which every executor takes.
  EXPECT_EQ(mrSetAccumulationOrder(v2_executor, MR_ACCUMULATION_SEQUENTIAL),
            MR_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(mrGetLastErrorMessage()).find("the order only applies to the backward"),
            std::string::npos);
  for (mrExecutor* executor : {grad_executor, v2_executor, routing_executor})
    EXPECT_EQ(mrSetNumerics(executor, MR_NUMERICS_ASCEND_950), MR_SUCCESS);

  EXPECT_EQ(mrMoeInitRoutingV2(nullptr, 0, grad_executor, nullptr), MR_ERROR_INVALID_ARGUMENT);
  EXPECT_STREQ(mrGetLastErrorMessage(),
               "moe_init_routing_v2: executor must come from mrMoeInitRoutingV2GetWorkspaceSize, "
               "got one from mrMoeInitRoutingV2GradGetWorkspaceSize");
  EXPECT_EQ(mrMoeInitRouting(nullptr, 0, v2_executor, nullptr), MR_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(mrMoeInitRoutingV2Grad(nullptr, 0, routing_executor, nullptr),
            MR_ERROR_INVALID_ARGUMENT);
  EXPECT_STREQ(mrGetLastErrorMessage(),
               "moe_init_routing_grad: executor must come from "
               "mrMoeInitRoutingV2GradGetWorkspaceSize, got one from "
               "mrMoeInitRoutingGetWorkspaceSize");
  EXPECT_EQ(live_executors(), 0);
  EXPECT_TRUE(grad.outputs_untouched() && v2.outputs_untouched() && routing.outputs_untouched());
}

TEST(CApiExecutor, AccumulationOrderSetter) {
  // Spec G1 row 0, column 0: tree gives 0, sequential 2^-30.
  for (const auto& [order, expected] :
       {std::pair<mrAccumulationOrder, float>{MR_ACCUMULATION_TREE, 0.0f},
        std::pair<mrAccumulationOrder, float>{MR_ACCUMULATION_SEQUENTIAL, 0x1p-30f}}) {
    GradCall call;
    mrExecutor* executor = nullptr;
    ASSERT_EQ(call.phase_one(&executor).status, MR_SUCCESS);
    EXPECT_EQ(mrSetAccumulationOrder(executor, order), MR_SUCCESS);
    // An unknown order is refused and leaves the chosen one.
    EXPECT_EQ(mrSetAccumulationOrder(executor, 2), MR_ERROR_INVALID_ARGUMENT);
    EXPECT_STREQ(mrGetLastErrorMessage(),
                 "mrSetAccumulationOrder: order must be "
                 "MR_ACCUMULATION_TREE (0) or MR_ACCUMULATION_SEQUENTIAL "
                 "(1), got 2");
    ASSERT_EQ(mrMoeInitRoutingV2Grad(nullptr, 0, executor, nullptr), MR_SUCCESS);
    float got;
    std::memcpy(&got, call.grad_x.bytes.data(), sizeof got);
    EXPECT_EQ(float_bits(got), float_bits(expected));
  }
}

TEST(CApiExecutor, NumericsChooseTheBackwardOrderUnlessAnOrderIsSet) {
  // Spec G1 row 0, column 0: tree (atlas_a2) gives 0, sequential (ascend_950) 2^-30.
  struct Case {
    const char* name;
    std::vector<mrNumerics> numerics;  // mrSetNumerics calls, in order
    bool set_order;                    // then mrSetAccumulationOrder(order)
    mrAccumulationOrder order;
    float expected;
  };
  const Case cases[] = {
      {"default", {}, false, 0, 0.0f},
      {"ascend_950", {MR_NUMERICS_ASCEND_950}, false, 0, 0x1p-30f},
      {"back to atlas_a2", {MR_NUMERICS_ASCEND_950, MR_NUMERICS_ATLAS_A2}, false, 0, 0.0f},
      {"ascend_950, tree override", {MR_NUMERICS_ASCEND_950}, true, MR_ACCUMULATION_TREE, 0.0f},
      {"atlas_a2, sequential override",
       {MR_NUMERICS_ATLAS_A2},
       true,
       MR_ACCUMULATION_SEQUENTIAL,
       0x1p-30f},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    GradCall call;
    mrExecutor* executor = nullptr;
    ASSERT_EQ(call.phase_one(&executor).status, MR_SUCCESS);
    for (mrNumerics numerics : c.numerics) EXPECT_EQ(mrSetNumerics(executor, numerics), MR_SUCCESS);
    if (c.set_order) {
      EXPECT_EQ(mrSetAccumulationOrder(executor, c.order), MR_SUCCESS);
    }
    // An unknown value is refused and leaves the executor as it was.
    EXPECT_EQ(mrSetNumerics(executor, 2), MR_ERROR_INVALID_ARGUMENT);
    EXPECT_STREQ(mrGetLastErrorMessage(),
                 "mrSetNumerics: numerics must be MR_NUMERICS_ATLAS_A2 (0) or "
                 "MR_NUMERICS_ASCEND_950 (1), got 2");
    ASSERT_EQ(mrMoeInitRoutingV2Grad(nullptr, 0, executor, nullptr), MR_SUCCESS);
    float got;
    std::memcpy(&got, call.grad_x.bytes.data(), sizeof got);
    EXPECT_EQ(float_bits(got), float_bits(c.expected));
  }
}

TEST(CApiExecutor, NumericsSetter) {
  // Spec §3.3: x = 3.824000835418701, scale 1.7, offset 0: float32 path 6.5008 -> 7, float16
  // path 6.5 -> 6 (half to even).
  for (const auto& [numerics, expected] :
       {std::pair<mrNumerics, int8_t>{MR_NUMERICS_ATLAS_A2, 7},
        std::pair<mrNumerics, int8_t>{MR_NUMERICS_ASCEND_950, 6}}) {
    RoutingCall call;
    call.x = Arg(DType::float32, {1, 1});
    const float x = 3.824000835418701f, scale = 1.7f;
    std::memcpy(call.x.bytes.data(), &x, sizeof x);
    call.expert_idx = Arg(DType::int32, {1, 1});
    std::memset(call.expert_idx.bytes.data(), 0, 4);
    call.topk_weight = Arg();
    call.scale = Arg(DType::float32, {1});
    std::memcpy(call.scale.bytes.data(), &scale, sizeof scale);
    call.quant_mode = 0;
    call.expert_num = 1;
    call.range.clear();
    call.expanded_x = Arg(DType::int8, {1, 1});
    call.expanded_row_idx = Arg(DType::int32, {1});
    call.counts = Arg(DType::int64, {1});
    call.expanded_topk_weight = Arg();
    mrExecutor* executor = nullptr;
    const Outcome o = call.phase_one(&executor);
    ASSERT_EQ(o.status, MR_SUCCESS) << o.message;
    EXPECT_EQ(mrSetNumerics(executor, numerics), MR_SUCCESS);
    EXPECT_EQ(mrSetNumerics(executor, -7), MR_ERROR_INVALID_ARGUMENT);
    std::vector<unsigned char> workspace(size_t(o.workspace_size));
    ASSERT_EQ(mrMoeInitRouting(workspace.data(), o.workspace_size, executor, nullptr), MR_SUCCESS)
        << mrGetLastErrorMessage();
    EXPECT_EQ(int8_t(call.expanded_x.bytes[0]), expected);
  }
}

TEST(CApiExecutor, LastErrorIsPerThreadAndKeptBySuccess) {
  GradCall bad;
  bad.top_k = -5;
  EXPECT_EQ(bad.c().status, MR_ERROR_INVALID_ARGUMENT);
  const std::string main_message = mrGetLastErrorMessage();
  EXPECT_EQ(main_message, "moe_init_routing_grad: top_k must be > 0, got -5");
  std::string other_before, other_after;
  std::thread other([&] {
    other_before = mrGetLastErrorMessage();
    EXPECT_EQ(mrSetNumThreads(-1), MR_ERROR_INVALID_ARGUMENT);
    other_after = mrGetLastErrorMessage();
  });
  other.join();
  EXPECT_EQ(other_before, "");
  EXPECT_EQ(other_after,
            "mrSetNumThreads: num_threads must be >= 0 (0 restores the default), got -1");
  EXPECT_EQ(mrGetLastErrorMessage(), main_message);
  // Successful calls (cleaning up, another operator) keep it; the next failure replaces it.
  GradCall good;
  EXPECT_EQ(good.c().status, MR_SUCCESS);
  EXPECT_EQ(mrDestroyTensor(nullptr), MR_SUCCESS);
  EXPECT_EQ(mrGetLastErrorMessage(), main_message);
  EXPECT_EQ(mrSetNumThreads(-2), MR_ERROR_INVALID_ARGUMENT);
  EXPECT_STREQ(mrGetLastErrorMessage(),
               "mrSetNumThreads: num_threads must be >= 0 (0 restores the default), got -2");
}

TEST(CApiExecutor, NumThreads) {
  EXPECT_EQ(mrSetNumThreads(3), MR_SUCCESS);
  EXPECT_EQ(mrGetNumThreads(), 3);
  EXPECT_EQ(get_num_threads(), 3);
  EXPECT_EQ(mrSetNumThreads(0), MR_SUCCESS);
  EXPECT_GE(mrGetNumThreads(), 1);
}

TEST(CApiExecutor, ConcurrentCallsOnSeparateExecutors) {
  Random rng(91);
  GradCase c = make_grad_case(rng, GradScenario::dropless, DType::bfloat16, 65, 5, 37);
  const FloatBuffer expected = run_grad_case(c, Runner{Backend::reference, CpuIsa::automatic, 1});
  std::vector<FloatBuffer> results(4, FloatBuffer(c.dtype, c.num_rows * c.hidden));
  std::vector<mrStatus> statuses(4, MR_ERROR_INTERNAL);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < results.size(); ++i)
    threads.emplace_back([&, i] {
      for (int repeat = 0; repeat < 20; ++repeat) {
        Handle g = make_handle(c.grad.data(), c.dtype, c.grad_shape);
        Handle idx = make_handle(c.expanded_row_idx.data(), DType::int32, {c.num_rows * c.top_k});
        Handle out = make_handle(results[i].data(), c.dtype, {c.num_rows, c.hidden});
        uint64_t ws = 0;
        mrExecutor* executor = nullptr;
        statuses[i] = mrMoeInitRoutingV2GradGetWorkspaceSize(g.get(), idx.get(), c.top_k, 0, 0,
                                                             out.get(), &ws, &executor);
        if (statuses[i] == MR_SUCCESS)
          statuses[i] = mrMoeInitRoutingV2Grad(nullptr, ws, executor, nullptr);
        if (statuses[i] != MR_SUCCESS) break;
      }
    });
  for (std::thread& t : threads) t.join();
  for (size_t i = 0; i < results.size(); ++i) {
    EXPECT_EQ(statuses[i], MR_SUCCESS);
    EXPECT_TRUE(bitwise_equal(expected, results[i]));
  }
  EXPECT_EQ(live_executors(), 0);
}

// ------------------------------------------------------------------------------------------
// Results: bitwise equal to the C++ API.
// ------------------------------------------------------------------------------------------

/// A poisoned output buffer (FloatBuffer::poison would pass memset a null pointer when empty).
FloatBuffer poisoned_output(DType dtype, int64_t count) {
  FloatBuffer out(dtype, count);
  if (count > 0) out.poison();
  return out;
}

/// The backward through the C++ API (CPU kernels, default configuration), output poisoned.
FloatBuffer run_cpp_grad(GradCase& c) {
  FloatBuffer out = poisoned_output(c.dtype, c.num_rows * c.hidden);
  const Status s = moe_init_routing_grad(c.grad_view(), c.idx_view(), c.attrs,
                                         TensorView(out.data(), c.dtype, {c.num_rows, c.hidden}));
  EXPECT_TRUE(s.is_ok()) << s.message();
  return out;
}

/// The backward through the C ABI, outputs allocated from InferShape.
FloatBuffer run_c_grad(GradCase& c, mrAccumulationOrder order) {
  Handle g = make_handle(c.grad.data(), c.dtype, c.grad_shape);
  Handle idx = make_handle(c.expanded_row_idx.data(), DType::int32, {c.num_rows * c.top_k});
  mrTensorDesc desc;
  EXPECT_EQ(mrMoeInitRoutingV2GradInferShape(g.get(), idx.get(), c.attrs.top_k,
                                             c.attrs.drop_pad_mode, c.attrs.active_num, &desc),
            MR_SUCCESS)
      << mrGetLastErrorMessage();
  EXPECT_TRUE(desc.produced);
  EXPECT_EQ(desc.dtype, mrDataType(c.dtype));
  EXPECT_EQ(desc.ndim, 2u);
  EXPECT_EQ(desc.shape[0], c.num_rows);
  EXPECT_EQ(desc.shape[1], c.hidden);
  FloatBuffer out = poisoned_output(c.dtype, desc.shape[0] * desc.shape[1]);
  Handle o = make_handle(out.data(), c.dtype, {desc.shape[0], desc.shape[1]});
  uint64_t ws = 1;
  mrExecutor* executor = nullptr;
  EXPECT_EQ(mrMoeInitRoutingV2GradGetWorkspaceSize(g.get(), idx.get(), c.attrs.top_k,
                                                   c.attrs.drop_pad_mode, c.attrs.active_num,
                                                   o.get(), &ws, &executor),
            MR_SUCCESS)
      << mrGetLastErrorMessage();
  EXPECT_EQ(ws, 0u);
  EXPECT_EQ(mrSetAccumulationOrder(executor, order), MR_SUCCESS);
  EXPECT_EQ(mrMoeInitRoutingV2Grad(nullptr, ws, executor, nullptr), MR_SUCCESS)
      << mrGetLastErrorMessage();
  return out;
}

TEST(CApiResults, GradEqualsCpp) {
  Random rng(7);
  const int64_t sizes[][3] = {{0, 2, 5},   {1, 1, 1},   {7, 3, 33},
                              {33, 8, 17}, {5, 128, 3}, {13, 5, 0}};
  for (GradScenario scenario :
       {GradScenario::dropless, GradScenario::active, GradScenario::drop_pad})
    for (DType dtype : {DType::float32, DType::float16, DType::bfloat16})
      for (const auto& size : sizes)
        for (AccumulationOrder order : {AccumulationOrder::tree, AccumulationOrder::sequential}) {
          GradCase c = make_grad_case(rng, scenario, dtype, size[0], size[1], size[2]);
          c.attrs.order = order;
          SCOPED_TRACE(std::string(grad_scenario_name(scenario)) + " " + dtype_name(dtype) + " " +
                       accumulation_order_name(order) + " N=" + std::to_string(size[0]) +
                       " K=" + std::to_string(size[1]) + " H=" + std::to_string(size[2]));
          const FloatBuffer expected = run_cpp_grad(c);
          const FloatBuffer got = run_c_grad(c, mrAccumulationOrder(order));
          EXPECT_TRUE(bitwise_equal(expected, got));
        }
  EXPECT_EQ(live_executors(), 0);
  EXPECT_EQ(live_tensors(), 0);
}

/// A C status as a Status (the last error message belongs only to a failure).
Status status_of(mrStatus s) {
  return s == MR_SUCCESS ? Status::ok() : Status(StatusCode(s), mrGetLastErrorMessage());
}

/// moe_init_routing_v2 through the C ABI, outputs allocated from InferShape (NULL when not
/// produced). The result has the layout run_v2 gives, for same_result.
V2Result run_c_v2(V2Case& c) {
  V2Result r;
  Handle x = make_handle(c.x), ids = make_handle(c.expert_idx);
  const MoeInitRoutingV2Attrs& a = c.attrs;
  mrTensorDesc descs[4];
  const mrStatus inferred = mrMoeInitRoutingV2InferShape(
      x.get(), ids.get(), a.active_num, a.expert_capacity, a.expert_num, a.drop_pad_mode,
      a.expert_tokens_count_or_cumsum_flag, a.expert_tokens_before_capacity_flag, &descs[0],
      &descs[1], &descs[2], &descs[3]);
  r.status = status_of(inferred);
  if (inferred != MR_SUCCESS) return r;
  Tensor* outputs[] = {&r.expanded_x, &r.expanded_row_idx, &r.counts, &r.before_capacity};
  for (int i = 0; i < 4; ++i) *outputs[i] = from_desc(descs[i]);
  Handle ex = make_handle(r.expanded_x), eri = make_handle(r.expanded_row_idx),
         cnt = make_handle(r.counts), bc = make_handle(r.before_capacity);
  uint64_t ws = 1;
  mrExecutor* executor = nullptr;
  mrStatus s = mrMoeInitRoutingV2GetWorkspaceSize(
      x.get(), ids.get(), a.active_num, a.expert_capacity, a.expert_num, a.drop_pad_mode,
      a.expert_tokens_count_or_cumsum_flag, a.expert_tokens_before_capacity_flag, ex.get(),
      eri.get(), cnt.get(), bc.get(), &ws, &executor);
  std::vector<unsigned char> workspace(size_t(s == MR_SUCCESS ? ws : 0));
  if (s == MR_SUCCESS) s = mrMoeInitRoutingV2(workspace.data(), ws, executor, nullptr);
  r.status = status_of(s);
  return r;
}

std::vector<int32_t> random_ids(Random& rng, int64_t count, int64_t lo, int64_t hi) {
  std::vector<int32_t> ids(static_cast<size_t>(count));
  for (int32_t& id : ids) id = int32_t(rng.integer(lo, hi));
  return ids;
}

/// A floating tensor of the given shape with values spread over binades 2^-6 .. 2^6.
Tensor random_floats(Random& rng, DType dtype, std::vector<int64_t> shape) {
  int64_t count = 1;
  for (int64_t d : shape) count *= d;
  std::vector<float> values(static_cast<size_t>(count));
  for (float& v : values) v = rng.uniform(int(rng.integer(-6, 6)));
  return Tensor::floats(dtype, std::move(shape), values);
}

TEST(CApiResults, V2EqualsCpp) {
  Random rng(11);
  const Runner cpu{Backend::automatic, CpuIsa::automatic, 0};
  int compared = 0;
  for (int iteration = 0; iteration < 60; ++iteration) {
    V2Case c;
    const int64_t n = rng.integer(0, 40), k = rng.integer(1, 6), h = rng.integer(0, 19);
    const int64_t e = rng.integer(1, 9);
    const DType dtype =
        std::vector<DType>{DType::float32, DType::float16, DType::bfloat16}[iteration % 3];
    c.x = random_floats(rng, dtype, {n, h});
    c.expert_idx = Tensor::int32s({n, k}, random_ids(rng, n * k, 0, e - 1));
    c.attrs.expert_num = e;
    c.attrs.drop_pad_mode = iteration % 4 == 3 ? 1 : 0;
    c.attrs.active_num = iteration % 5 == 1 ? rng.integer(1, 2 * n * k + 1) : 0;
    c.attrs.expert_capacity =
        c.attrs.drop_pad_mode == 1 ? rng.integer(1, std::max<int64_t>(1, n)) : 0;
    c.attrs.expert_tokens_count_or_cumsum_flag = rng.integer(0, 2);
    c.attrs.expert_tokens_before_capacity_flag = rng.integer(0, 1) == 1;
    SCOPED_TRACE("iteration " + std::to_string(iteration));
    const V2Result expected = run_v2(c, cpu);
    const V2Result got = run_c_v2(c);
    EXPECT_TRUE(same_result(expected, got));
    EXPECT_EQ(got.status.message(), expected.status.message());
    compared += expected.status.is_ok();
  }
  EXPECT_GT(compared, 40);  // most configurations are valid, so results were compared
  EXPECT_EQ(live_executors(), 0);
}

/// moe_init_routing through the C ABI, like run_forward.
ForwardResult run_c_forward(ForwardCase& c) {
  ForwardResult r;
  Handle x = make_handle(c.x), ids = make_handle(c.expert_idx), scale = make_handle(c.scale),
         offset = make_handle(c.offset), weight = make_handle(c.topk_weight);
  const MoeInitRoutingAttrs& a = c.attrs;
  const int64_t range[2] = {a.active_expert_range.start, a.active_expert_range.end};
  const uint64_t range_length = a.has_active_expert_range ? 2 : 0;
  mrTensorDesc descs[5];
  const mrStatus inferred = mrMoeInitRoutingInferShape(
      x.get(), ids.get(), scale.get(), offset.get(), weight.get(), a.active_num, a.expert_capacity,
      a.expert_num, a.drop_pad_mode, a.expert_tokens_num_type, a.expert_tokens_num_flag,
      a.quant_mode, range_length ? range : nullptr, range_length, a.row_idx_type, &descs[0],
      &descs[1], &descs[2], &descs[3], &descs[4]);
  r.status = status_of(inferred);
  if (inferred != MR_SUCCESS) return r;
  Tensor* outputs[] = {&r.expanded_x, &r.expanded_row_idx, &r.counts, &r.expanded_scale,
                       &r.expanded_topk_weight};
  for (int i = 0; i < 5; ++i) *outputs[i] = from_desc(descs[i]);
  Handle ex = make_handle(r.expanded_x), eri = make_handle(r.expanded_row_idx),
         cnt = make_handle(r.counts), es = make_handle(r.expanded_scale),
         ew = make_handle(r.expanded_topk_weight);
  uint64_t ws = 1;
  mrExecutor* executor = nullptr;
  mrStatus s = mrMoeInitRoutingGetWorkspaceSize(
      x.get(), ids.get(), scale.get(), offset.get(), weight.get(), a.active_num, a.expert_capacity,
      a.expert_num, a.drop_pad_mode, a.expert_tokens_num_type, a.expert_tokens_num_flag,
      a.quant_mode, range_length ? range : nullptr, range_length, a.row_idx_type, ex.get(),
      eri.get(), cnt.get(), es.get(), ew.get(), &ws, &executor);
  if (s == MR_SUCCESS) s = mrSetNumerics(executor, mrNumerics(a.numerics));
  std::vector<unsigned char> workspace(size_t(s == MR_SUCCESS ? ws : 0));
  if (s == MR_SUCCESS)
    s = mrMoeInitRouting(workspace.data(), ws, executor, nullptr);
  else
    mrDestroyExecutor(executor);
  r.status = status_of(s);
  return r;
}

TEST(CApiResults, RoutingEqualsCpp) {
  Random rng(23);
  const Runner cpu{Backend::automatic, CpuIsa::automatic, 0};
  int compared = 0;
  for (int iteration = 0; iteration < 120; ++iteration) {
    ForwardCase c;
    const int64_t n = rng.integer(0, 30), k = rng.integer(1, 5), h = rng.integer(1, 21);
    const int64_t e = rng.integer(1, 8);
    const DType dtype =
        std::vector<DType>{DType::float32, DType::float16, DType::bfloat16}[iteration % 3];
    c.x = random_floats(rng, dtype, {n, h});
    c.expert_idx = Tensor::int32s({n, k}, random_ids(rng, n * k, -1, e + 1));
    MoeInitRoutingAttrs& a = c.attrs;
    a.expert_num = e;
    a.quant_mode = rng.integer(-1, 1);
    a.numerics = rng.integer(0, 1) ? Numerics::ascend_950 : Numerics::atlas_a2;
    a.drop_pad_mode = a.quant_mode == -1 && iteration % 4 == 0 ? 1 : 0;
    a.expert_capacity = a.drop_pad_mode ? rng.integer(1, std::max<int64_t>(1, n)) : -1;
    a.row_idx_type = a.drop_pad_mode ? 0 : rng.integer(0, 1);
    a.expert_tokens_num_type = rng.integer(0, 2);
    a.expert_tokens_num_flag = rng.integer(0, 3) != 0;
    a.active_num = rng.integer(0, 2) == 0 ? rng.integer(1, n * k + 2) : -1;
    if (!a.drop_pad_mode && rng.integer(0, 1)) {
      a.has_active_expert_range = true;
      a.active_expert_range.start = rng.integer(0, e - 1);
      a.active_expert_range.end = rng.integer(a.active_expert_range.start + 1, e);
    }
    const int64_t range =
        a.has_active_expert_range ? a.active_expert_range.end - a.active_expert_range.start : e;
    const DType f32 = DType::float32;
    if (a.quant_mode == -1 && rng.integer(0, 1)) c.scale = random_floats(rng, f32, {n});
    if (a.quant_mode == 0) {
      c.scale = random_floats(rng, f32, {1});
      if (rng.integer(0, 1)) c.offset = random_floats(rng, f32, {1});
    }
    if (a.quant_mode == 1 && rng.integer(0, 1))
      c.scale = random_floats(rng, f32, {rng.integer(0, 1) ? range : 1, h});
    if (rng.integer(0, 1)) c.topk_weight = random_floats(rng, f32, {n, k});
    SCOPED_TRACE("iteration " + std::to_string(iteration));
    const ForwardResult expected = run_forward(c, cpu);
    const ForwardResult got = run_c_forward(c);
    EXPECT_TRUE(same_result(expected, got));
    EXPECT_EQ(got.status.message(), expected.status.message());
    compared += expected.status.is_ok();
  }
  EXPECT_GT(compared, 80);
  EXPECT_EQ(live_executors(), 0);
}

TEST(CApiResults, NotProducedOutputsMayBeGivenAndAreZeroed) {
  V2Call call;  // dropless: expert_tokens_before_capacity is not produced
  call.before_capacity = Arg(DType::int32, {3});
  const Outcome o = call.c();
  ASSERT_EQ(o.status, MR_SUCCESS) << o.message;
  const int32_t* before = reinterpret_cast<const int32_t*>(call.before_capacity.bytes.data());
  EXPECT_EQ(std::vector<int32_t>(before, before + 3), (std::vector<int32_t>{0, 0, 0}));
  const int32_t* counts = reinterpret_cast<const int32_t*>(call.counts.bytes.data());
  EXPECT_EQ(std::vector<int32_t>(counts, counts + 3), (std::vector<int32_t>{2, 2, 2}));
  const int32_t* row_idx = reinterpret_cast<const int32_t*>(call.expanded_row_idx.bytes.data());
  EXPECT_EQ(std::vector<int32_t>(row_idx, row_idx + 6), (std::vector<int32_t>{2, 0, 4, 3, 1, 5}));
  // A not-produced output with a NULL buffer is ignored, whatever its shape.
  V2Call ignored;
  ignored.before_capacity = Arg(DType::int64, {9, 9});
  ignored.before_capacity.null_data = true;
  EXPECT_EQ(ignored.c().status, MR_SUCCESS) << mrGetLastErrorMessage();
}

// Fuzzer regressions (fuzz/regressions/): with no tokens, x [0, H] is valid for any H, and no
// size computed from H may overflow or allocate.
TEST(CApiResults, EmptyXWithAnyHidden) {
  for (int64_t hidden : {INT64_MAX, INT64_MAX / 3, int64_t(1) << 40}) {
    SCOPED_TRACE("H=" + std::to_string(hidden));
    for (int64_t quant_mode : {-1, 1}) {
      RoutingCall call;
      call.x = Arg(DType::float32, {0, hidden});
      call.expert_idx = Arg(DType::int32, {0, 2});
      call.topk_weight = Arg();
      call.quant_mode = quant_mode;
      call.expanded_x = Arg(quant_mode == -1 ? DType::float32 : DType::int8, {0, hidden});
      call.expanded_row_idx = Arg(DType::int32, {0});
      call.expanded_scale = quant_mode == 1 ? Arg(DType::float32, {0}) : Arg();
      call.expanded_topk_weight = Arg();
      const Outcome o = call.c();
      EXPECT_EQ(o.status, MR_SUCCESS) << o.message;
      const int64_t* counts = reinterpret_cast<const int64_t*>(call.counts.bytes.data());
      EXPECT_EQ(counts[0], 0);
      EXPECT_EQ(counts[1], 0);
      // The reference backend as well (it once allocated an H-float scratch row).
      ExecConfig reference;
      reference.backend = Backend::reference;
      call.counts = Arg(DType::int64, {2});
      const Status s =
          moe_init_routing(call.x.view(), call.expert_idx.view(), call.scale.view(),
                           call.offset.view(), call.topk_weight.view(), call.attrs(),
                           call.expanded_x.view(), call.expanded_row_idx.view(), call.counts.view(),
                           call.expanded_scale.view(), call.expanded_topk_weight.view(), reference);
      EXPECT_TRUE(s.is_ok()) << s.message();
    }
    V2Call v2;
    v2.x = Arg(DType::bfloat16, {0, hidden});
    v2.expert_idx = Arg(DType::int32, {0, 3});
    v2.expanded_x = Arg(DType::bfloat16, {0, hidden});
    v2.expanded_row_idx = Arg(DType::int32, {0});
    const Outcome o = v2.c();
    EXPECT_EQ(o.status, MR_SUCCESS) << o.message;
  }
}

TEST(CApiResults, InferShapeDescribesEveryOutput) {
  RoutingCall call;  // F3: N 3, K 2, range [1, 3), count, topk_weight
  Handle x = call.x.handle(), ids = call.expert_idx.handle(), w = call.topk_weight.handle();
  mrTensorDesc d[5];
  std::memset(d, 0x77, sizeof d);
  ASSERT_EQ(mrMoeInitRoutingInferShape(x.get(), ids.get(), nullptr, nullptr, w.get(), -1, -1, 4, 0,
                                       1, true, -1, call.range.data(), 2, 0, &d[0], &d[1], &d[2],
                                       &d[3], &d[4]),
            MR_SUCCESS);
  EXPECT_TRUE(d[0].produced && d[0].ndim == 2 && d[0].shape[0] == 6 && d[0].shape[1] == 2 &&
              d[0].dtype == MR_FLOAT32);
  EXPECT_TRUE(d[1].produced && d[1].ndim == 1 && d[1].shape[0] == 6 && d[1].dtype == MR_INT32);
  EXPECT_TRUE(d[2].produced && d[2].ndim == 1 && d[2].shape[0] == 2 && d[2].dtype == MR_INT64);
  EXPECT_FALSE(d[3].produced);
  EXPECT_TRUE(d[4].produced && d[4].ndim == 2 && d[4].shape[0] == 6 && d[4].shape[1] == 1);
  for (const mrTensorDesc& desc : d)
    for (uint64_t i = desc.ndim; i < MR_MAX_DIMS; ++i) EXPECT_EQ(desc.shape[i], 0);
  // Shape inference needs no data; on failure the descriptions are left alone.
  Handle no_data = make_handle(nullptr, DType::float32, {3, 2});
  ASSERT_EQ(
      mrMoeInitRoutingInferShape(no_data.get(), ids.get(), nullptr, nullptr, nullptr, -1, -1, 4, 0,
                                 1, true, -1, nullptr, 0, 0, &d[0], &d[1], &d[2], &d[3], &d[4]),
      MR_SUCCESS);
  EXPECT_EQ(d[2].shape[0], 4);
  mrTensorDesc untouched;
  std::memset(&untouched, 0x33, sizeof untouched);
  mrTensorDesc copy = untouched;
  EXPECT_EQ(
      mrMoeInitRoutingInferShape(no_data.get(), ids.get(), nullptr, nullptr, nullptr, 5, -1, 4, 0,
                                 1, true, 13, nullptr, 0, 0, &copy, &copy, &copy, &copy, &copy),
      MR_ERROR_NOT_SUPPORTED);
  EXPECT_EQ(std::memcmp(&copy, &untouched, sizeof copy), 0);
}

}  // namespace
}  // namespace moe_routing::testing
