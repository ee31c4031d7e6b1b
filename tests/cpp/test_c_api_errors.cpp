// The C ABI's errors for all three operators: every status code reachable, the messages (phase
// one reports exactly what the C++ entry point reports for the same mistake), index values in
// phase two, NULL pointers named, the exception barrier, nothing written on error.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "c_api_test_util.h"

namespace moe_routing::testing {
namespace {

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

// A handle is present even when its tensor looks like the C++ API's absent view (0-d, data NULL):
// that is one element without a buffer, refused, never taken for an absent optional input (the
// dispatch computed without the scale, offset or topk_weight given instead, or said 'got none'
// for a given scale). A produced output's such handle fails the output's shape check, as in the
// C++ API; one for an output the inputs cannot give (not produced) is ignored.
TEST(CApiErrors, AHandleLikeTheAbsentViewIsNotAbsent) {
  const std::string rule =
      " data must not be null for a non-empty tensor, got null for a 0-d tensor (one element; an "
      "absent argument is a NULL handle)";
  Arg absent_like(DType::float32, {});
  absent_like.null_data = true;
  // The configurations in which each optional input of moe_init_routing is used.
  const auto per_token = [](RoutingCall&) {};
  const auto static_quant = [](RoutingCall& c) {
    c.quant_mode = 0;
    c.scale = Arg(DType::float32, {1});
    c.expanded_x = Arg(DType::int8, {6, 2});
  };
  const auto dynamic_quant = [](RoutingCall& c) {
    c.quant_mode = 1;
    c.expanded_x = Arg(DType::int8, {6, 2});
    c.expanded_scale = Arg(DType::float32, {6});
  };
  const auto no_weight_output = [](RoutingCall& c) { c.expanded_topk_weight = Arg(); };
  struct Case {
    const char* what;
    const char* name;
    Arg RoutingCall::*input;
    std::function<void(RoutingCall&)> configure;
  };
  const Case cases[] = {
      {"per-token scale", "scale", &RoutingCall::scale, per_token},
      {"static scale", "scale", &RoutingCall::scale, static_quant},
      {"smooth scale", "scale", &RoutingCall::scale, dynamic_quant},
      {"offset", "offset", &RoutingCall::offset, static_quant},
      {"topk_weight", "topk_weight", &RoutingCall::topk_weight, no_weight_output},
  };
  for (const Case& row : cases) {
    SCOPED_TRACE(row.what);
    RoutingCall call;
    row.configure(call);
    call.*row.input = absent_like;
    mrExecutor* executor = reinterpret_cast<mrExecutor*>(&call);  // must be reset to NULL
    const Outcome o = call.phase_one(&executor);
    EXPECT_EQ(o.status, MR_ERROR_INVALID_ARGUMENT);
    EXPECT_EQ(o.message, std::string("moe_init_routing: ") + row.name + rule);
    EXPECT_EQ(o.workspace_size, 0u);
    EXPECT_EQ(executor, nullptr);
    if (o.status == MR_SUCCESS) {
      EXPECT_EQ(mrDestroyExecutor(executor), MR_SUCCESS);
    }
    EXPECT_TRUE(call.outputs_untouched());
    // Shape inference runs the same planning.
    Handle hx = call.x.handle(), hidx = call.expert_idx.handle(), hs = call.scale.handle(),
           ho = call.offset.handle(), hw = call.topk_weight.handle();
    mrTensorDesc d[5];
    EXPECT_EQ(mrMoeInitRoutingInferShape(hx.get(), hidx.get(), hs.get(), ho.get(), hw.get(),
                                         call.active_num, call.expert_capacity, call.expert_num,
                                         call.drop_pad_mode, call.expert_tokens_num_type,
                                         call.expert_tokens_num_flag, call.quant_mode,
                                         call.range.data(), call.range.size(), call.row_idx_type,
                                         &d[0], &d[1], &d[2], &d[3], &d[4]),
              MR_ERROR_INVALID_ARGUMENT);
    EXPECT_EQ(std::string(mrGetLastErrorMessage()),
              std::string("moe_init_routing: ") + row.name + rule);
  }

  // Outputs: a produced one is checked for its shape, exactly as the C++ API checks the same view.
  expect_phase_one_matches_cpp<RoutingCall>({
      {"expanded_topk_weight", [&](RoutingCall& c) { c.expanded_topk_weight = absent_like; },
       MR_ERROR_INVALID_ARGUMENT,
       "moe_init_routing: expanded_topk_weight must be 2-D float32 [6, 1], got "},
      {"counts", [&](RoutingCall& c) { c.counts = absent_like; }, MR_ERROR_INVALID_ARGUMENT,
       "moe_init_routing: expert_tokens_count_or_cumsum must be 1-D int64 [2], got "},
  });
  expect_phase_one_matches_cpp<V2Call>({
      {"counts", [&](V2Call& c) { c.counts = absent_like; }, MR_ERROR_INVALID_ARGUMENT,
       "moe_init_routing_v2: expert_tokens_count_or_cumsum must be 1-D int32 [3], got "},
      {"expanded_x", [&](V2Call& c) { c.expanded_x = absent_like; }, MR_ERROR_INVALID_ARGUMENT,
       "moe_init_routing_v2: expanded_x must be 2-D float32 [6, 2], got "},
  });
  expect_phase_one_matches_cpp<GradCall>({
      {"grad_x", [&](GradCall& c) { c.grad_x = absent_like; }, MR_ERROR_INVALID_ARGUMENT,
       "moe_init_routing_grad: grad_x must be 2-D float32 [2, 2], got "},
  });
  // One not produced (InferShape: produced false) may be such a handle, and is ignored.
  RoutingCall routing;
  routing.expanded_scale = absent_like;
  Outcome o = routing.c();
  EXPECT_EQ(o.status, MR_SUCCESS) << o.message;
  V2Call v2;
  v2.before_capacity = absent_like;
  o = v2.c();
  EXPECT_EQ(o.status, MR_SUCCESS) << o.message;
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
  EXPECT_EQ(o.message, "moe_init_routing_grad: expanded_row_idx[5] must be in [0, 6), got 99");
  EXPECT_TRUE(call.outputs_untouched());
  EXPECT_EQ(live_executors(), 0);  // consumed although it failed
  EXPECT_STREQ(mrGetStatusName(o.status), "index out of range");
}

TEST(CApiErrors, V2ExpertIdOutOfRange) {
  V2Call call;
  call.set_ids({1, 0, 2, 3, 0, 2});  // 3 >= expert_num, which the counts use
  const Outcome o = call.c();
  EXPECT_EQ(o.status, MR_ERROR_INDEX_OUT_OF_RANGE);
  EXPECT_EQ(o.message,
            "moe_init_routing_v2: expert_idx[1][1] must be in [0, 3) (expert_num), got 3");
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

}  // namespace
}  // namespace moe_routing::testing
