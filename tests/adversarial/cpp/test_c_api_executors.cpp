// Executors used after phase two consumed them (issue 17, item 3): phase two run twice,
// mrDestroyExecutor after phase two or twice, a setter on a consumed executor, a stale handle
// after a new executor was made, two threads running phase two on one executor, a pointer no
// phase one made. Each once freed or read freed memory (heap-use-after-free under
// AddressSanitizer, a double free or SIGSEGV in Release); each is now MR_ERROR_INVALID_ARGUMENT
// with the same message, nothing is written, and every executor is freed exactly once.
// docs/reliability.md and docs/c_api.md cite these tests.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "c_api/c_api_internal.h"
#include "c_api_handles.h"

namespace moe_routing::testing {
namespace {

const std::string kNotLive =
    "executor must be live (made by a phase one, and neither run by a phase two nor destroyed "
    "since), got one that is not (already run, destroyed, or never made)";

/// A backward call (top_k 1, dropless) whose phase one makes executors on request.
struct GradCall {
  std::vector<float> g = {1, 2, 3, 4};
  std::vector<int32_t> idx = {1, 0};
  std::vector<float> grad_x = std::vector<float>(4, -1.0f);
  TensorHandle g_handle = tensor_handle(g.data(), MR_FLOAT32, {2, 2});
  TensorHandle idx_handle = tensor_handle(idx.data(), MR_INT32, {2});
  TensorHandle out_handle = tensor_handle(grad_x.data(), MR_FLOAT32, {2, 2});

  mrExecutor* phase_one() {
    uint64_t workspace_size = 0;
    mrExecutor* executor = nullptr;
    EXPECT_EQ(mrMoeInitRoutingV2GradGetWorkspaceSize(g_handle.get(), idx_handle.get(), 1, 0, 0,
                                                     out_handle.get(), &workspace_size, &executor),
              MR_SUCCESS)
        << mrGetLastErrorMessage();
    EXPECT_EQ(workspace_size, 0u);
    return executor;
  }
  static mrStatus phase_two(mrExecutor* executor) {
    return mrMoeInitRoutingV2Grad(nullptr, 0, executor, nullptr);
  }
  std::vector<float> expected() const { return {3, 4, 1, 2}; }
};

/// Expects `status` to be the dead-executor error of `function`.
void expect_not_live(mrStatus status, const std::string& function) {
  EXPECT_EQ(status, MR_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(mrGetLastErrorMessage(), function + kNotLive);
}

TEST(AdversarialExecutor, PhaseTwoTwiceIsAnError) {
  GradCall call;
  mrExecutor* executor = call.phase_one();
  ASSERT_EQ(GradCall::phase_two(executor), MR_SUCCESS) << mrGetLastErrorMessage();
  EXPECT_EQ(call.grad_x, call.expected());
  EXPECT_EQ(c_api::live_executors(), 0);
  call.grad_x.assign(4, -1.0f);
  expect_not_live(GradCall::phase_two(executor), "moe_init_routing_grad: ");
  EXPECT_EQ(call.grad_x, std::vector<float>(4, -1.0f)) << "a refused phase two wrote grad_x";
  EXPECT_EQ(c_api::live_executors(), 0);
}

// A phase two that fails consumes its executor too; the forward operators alike.
TEST(AdversarialExecutor, PhaseTwoAfterAFailedPhaseTwoIsAnError) {
  std::vector<float> x = {1, 2, 3, 4};
  std::vector<int32_t> ids = {1, 0};
  std::vector<float> expanded_x(4, -1.0f);
  std::vector<int32_t> row_idx(2, -7);
  TensorHandle x_handle = tensor_handle(x.data(), MR_FLOAT32, {2, 2});
  TensorHandle ids_handle = tensor_handle(ids.data(), MR_INT32, {2, 1});
  TensorHandle out = tensor_handle(expanded_x.data(), MR_FLOAT32, {2, 2});
  TensorHandle row_idx_handle = tensor_handle(row_idx.data(), MR_INT32, {2});
  uint64_t workspace_size = 0;
  mrExecutor* executor = nullptr;
  ASSERT_EQ(mrMoeInitRoutingV2GetWorkspaceSize(x_handle.get(), ids_handle.get(), 0, 0, 0, 0, 0,
                                               false, out.get(), row_idx_handle.get(), nullptr,
                                               nullptr, &workspace_size, &executor),
            MR_SUCCESS)
      << mrGetLastErrorMessage();
  ASSERT_GT(workspace_size, 0u);
  EXPECT_EQ(mrMoeInitRoutingV2(nullptr, 0, executor, nullptr), MR_ERROR_INVALID_ARGUMENT);
  std::vector<unsigned char> workspace(static_cast<size_t>(workspace_size));
  expect_not_live(mrMoeInitRoutingV2(workspace.data(), workspace_size, executor, nullptr),
                  "moe_init_routing_v2: ");
  expect_not_live(mrMoeInitRouting(workspace.data(), workspace_size, executor, nullptr),
                  "moe_init_routing: ");
  EXPECT_EQ(expanded_x, std::vector<float>(4, -1.0f));
  EXPECT_EQ(row_idx, std::vector<int32_t>(2, -7));
  EXPECT_EQ(c_api::live_executors(), 0);
}

TEST(AdversarialExecutor, DestroyingAConsumedOrDestroyedExecutorIsAnError) {
  GradCall call;
  mrExecutor* executor = call.phase_one();
  ASSERT_EQ(GradCall::phase_two(executor), MR_SUCCESS);
  expect_not_live(mrDestroyExecutor(executor), "mrDestroyExecutor: ");

  executor = call.phase_one();
  EXPECT_EQ(mrDestroyExecutor(executor), MR_SUCCESS);
  EXPECT_EQ(c_api::live_executors(), 0);
  expect_not_live(mrDestroyExecutor(executor), "mrDestroyExecutor: ");
  expect_not_live(GradCall::phase_two(executor), "moe_init_routing_grad: ");
  EXPECT_EQ(mrDestroyExecutor(nullptr), MR_SUCCESS);  // NULL stays a no-op
  EXPECT_EQ(c_api::live_executors(), 0);
}

TEST(AdversarialExecutor, SettersRefuseAConsumedExecutor) {
  GradCall call;
  mrExecutor* executor = call.phase_one();
  ASSERT_EQ(GradCall::phase_two(executor), MR_SUCCESS);
  expect_not_live(mrSetNumerics(executor, MR_NUMERICS_ASCEND_950), "mrSetNumerics: ");
  expect_not_live(mrSetAccumulationOrder(executor, MR_ACCUMULATION_SEQUENTIAL),
                  "mrSetAccumulationOrder: ");
}

// The allocator hands a freed block to the next allocation of its size, so an executor's address
// comes back at once; its handle must not: a stale handle never reaches the newer executor.
TEST(AdversarialExecutor, AStaleHandleNeverReachesANewerExecutor) {
  GradCall call;
  mrExecutor* first = call.phase_one();
  ASSERT_EQ(GradCall::phase_two(first), MR_SUCCESS);
  for (int round = 0; round < 100; ++round) {
    mrExecutor* next = call.phase_one();
    ASSERT_NE(next, first);
    expect_not_live(GradCall::phase_two(first), "moe_init_routing_grad: ");
    EXPECT_EQ(c_api::live_executors(), 1);
    call.grad_x.assign(4, -1.0f);
    ASSERT_EQ(GradCall::phase_two(next), MR_SUCCESS) << mrGetLastErrorMessage();
    EXPECT_EQ(call.grad_x, call.expected());
    first = next;
  }
}

// Two threads racing to run one executor: exactly one runs it, the other is told it is gone.
TEST(AdversarialExecutor, ConcurrentPhaseTwosRunTheExecutorOnce) {
  GradCall call;
  for (int round = 0; round < 200; ++round) {
    mrExecutor* executor = call.phase_one();
    std::atomic<int> ready{0};
    mrStatus statuses[2];
    std::string messages[2];
    auto racer = [&](int i) {
      ++ready;
      while (ready.load() < 2) {
      }
      statuses[i] = GradCall::phase_two(executor);
      if (statuses[i] != MR_SUCCESS) messages[i] = mrGetLastErrorMessage();
    };
    std::thread a(racer, 0), b(racer, 1);
    a.join();
    b.join();
    const int winner = statuses[0] == MR_SUCCESS ? 0 : 1;
    ASSERT_EQ(statuses[winner], MR_SUCCESS) << messages[winner];
    ASSERT_EQ(statuses[1 - winner], MR_ERROR_INVALID_ARGUMENT);
    ASSERT_EQ(messages[1 - winner], "moe_init_routing_grad: " + kNotLive);
    ASSERT_EQ(c_api::live_executors(), 0);
  }
  EXPECT_EQ(call.grad_x, call.expected());
}

// An address no phase one returned (here a local variable's) is not an executor.
TEST(AdversarialExecutor, APointerNoPhaseOneMadeIsRefused) {
  uint64_t not_an_executor[64] = {};
  mrExecutor* bogus = reinterpret_cast<mrExecutor*>(not_an_executor);
  expect_not_live(GradCall::phase_two(bogus), "moe_init_routing_grad: ");
  expect_not_live(mrSetNumerics(bogus, MR_NUMERICS_ATLAS_A2), "mrSetNumerics: ");
  expect_not_live(mrDestroyExecutor(bogus), "mrDestroyExecutor: ");
  for (uint64_t word : not_an_executor) EXPECT_EQ(word, 0u);
}

}  // namespace
}  // namespace moe_routing::testing
