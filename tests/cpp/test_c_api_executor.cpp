// The C ABI's executors: lifecycle, the workspace, the setters between the phases (numerics,
// accumulation order, thread count), the per-thread last error and concurrent calls.
#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

#include "c_api_test_util.h"
#include "grad_cases.h"

namespace moe_routing::testing {
namespace {

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

}  // namespace
}  // namespace moe_routing::testing
