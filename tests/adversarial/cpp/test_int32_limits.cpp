// Every product of sizes and attributes that ends up in an int32 is checked before anything runs
// (issue 17, item 1): the index dtype is int32, so a value that does not fit would wrap and be
// written as a wrong index without a word. Drop-pad slot numbers e*C + c (expanded_row_idx) need
// expert_num * expert_capacity to fit; the pair positions and destination rows need N*K to fit
// (the counts and cumulative counts of V2, int32 too, are at most N*K). Each limit is refused with
// the same message by the C++ API and by both C-ABI phases (the torch binding and the CLI call
// the C++ API), and accepted exactly at its bound. docs/reliability.md cites these tests.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "c_api_handles.h"
#include "moe_routing/moe_routing.hpp"
#include "routing_cases.h"

namespace moe_routing::testing {
namespace {

constexpr int64_t kInt32Max = 2147483647;

/// The case: 65537 experts of capacity 32768 give 2^31 + 32768 slots; every pair routed to
/// the last expert would take slot 2^31 (written as -2147483648 before the check).
struct OverflowingDropPad {
  static constexpr int64_t kRows = 32768, kExperts = 65537, kCapacity = 32768;
  Tensor x{DType::float32, {kRows, 0}};  // hidden 0: the outputs cost no memory
  Tensor expert_idx = Tensor::int32s({kRows, 1}, std::vector<int32_t>(kRows, kExperts - 1));
  Tensor expanded_x{DType::float32, {kExperts, kCapacity, 0}};
  Tensor expanded_row_idx{DType::int32, {kRows}};

  OverflowingDropPad() { expanded_row_idx.poison(); }
  bool untouched() const {
    for (uint8_t b : expanded_row_idx.bytes)
      if (b != 0x5A) return false;
    return true;
  }

  /// Expects call(config), a C++ entry point on this case's tensors, to refuse with `expected` on
  /// both host backends, writing nothing.
  template <class Call>
  void expect_refused(const Call& call, const std::string& expected) {
    for (Backend backend : {Backend::reference, Backend::cpu}) {
      ExecConfig config;
      config.backend = backend;
      const Status s = call(config);
      EXPECT_EQ(s.code(), StatusCode::invalid_argument);
      EXPECT_EQ(s.message(), expected);
      EXPECT_TRUE(untouched());
    }
  }

  /// C-ABI handles of the four tensors.
  struct Handles {
    TensorHandle x, idx, out, row_idx;
  };
  Handles handles() {
    return {tensor_handle(x.view().data, MR_FLOAT32, x.shape),
            tensor_handle(expert_idx.view().data, MR_INT32, expert_idx.shape),
            tensor_handle(expanded_x.view().data, MR_FLOAT32, expanded_x.shape),
            tensor_handle(expanded_row_idx.view().data, MR_INT32, expanded_row_idx.shape)};
  }
};

const std::string kSlotsMessage =
    "expert_num * expert_capacity must be at most 2147483647 (drop-pad slots e*C + c are int32 "
    "expanded_row_idx values), got 65537 * 32768 = 2147516416";

TEST(AdversarialInt32Limits, DropPadSlotsMustFitInt32V2) {
  OverflowingDropPad c;
  MoeInitRoutingV2Attrs attrs;
  attrs.drop_pad_mode = 1;
  attrs.expert_num = c.kExperts;
  attrs.expert_capacity = c.kCapacity;
  const std::string expected = "moe_init_routing_v2: " + kSlotsMessage;

  MoeInitRoutingV2Plan plan;
  Status s = infer_moe_init_routing_v2(c.x.view(), c.expert_idx.view(), attrs, &plan);
  EXPECT_EQ(s.code(), StatusCode::invalid_argument);
  EXPECT_EQ(s.message(), expected);
  c.expect_refused(
      [&](const ExecConfig& config) {
        return moe_init_routing_v2(c.x.view(), c.expert_idx.view(), attrs, c.expanded_x.view(),
                                   c.expanded_row_idx.view(), TensorView(), TensorView(), config);
      },
      expected);

  // The C ABI: shape inference and phase one alike.
  const OverflowingDropPad::Handles h = c.handles();
  mrTensorDesc descs[4];
  EXPECT_EQ(mrMoeInitRoutingV2InferShape(h.x.get(), h.idx.get(), 0, c.kCapacity, c.kExperts, 1, 0,
                                         false, &descs[0], &descs[1], &descs[2], &descs[3]),
            MR_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(mrGetLastErrorMessage(), expected);
  uint64_t workspace_size = 1;
  mrExecutor* executor = nullptr;
  EXPECT_EQ(mrMoeInitRoutingV2GetWorkspaceSize(h.x.get(), h.idx.get(), 0, c.kCapacity, c.kExperts,
                                               1, 0, false, h.out.get(), h.row_idx.get(), nullptr,
                                               nullptr, &workspace_size, &executor),
            MR_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(mrGetLastErrorMessage(), expected);
  EXPECT_EQ(executor, nullptr);
  EXPECT_EQ(workspace_size, 0u);
  EXPECT_TRUE(c.untouched());
}

TEST(AdversarialInt32Limits, DropPadSlotsMustFitInt32Routing) {
  OverflowingDropPad c;
  MoeInitRoutingAttrs attrs;
  attrs.drop_pad_mode = 1;
  attrs.expert_num = c.kExperts;
  attrs.expert_capacity = c.kCapacity;
  const std::string expected = "moe_init_routing: " + kSlotsMessage;

  MoeInitRoutingPlan plan;
  Status s = infer_moe_init_routing(c.x.view(), c.expert_idx.view(), TensorView(), TensorView(),
                                    TensorView(), attrs, &plan);
  EXPECT_EQ(s.code(), StatusCode::invalid_argument);
  EXPECT_EQ(s.message(), expected);
  c.expect_refused(
      [&](const ExecConfig& config) {
        return moe_init_routing(c.x.view(), c.expert_idx.view(), TensorView(), TensorView(),
                                TensorView(), attrs, c.expanded_x.view(), c.expanded_row_idx.view(),
                                TensorView(), TensorView(), TensorView(), config);
      },
      expected);

  const OverflowingDropPad::Handles h = c.handles();
  mrTensorDesc descs[5];
  EXPECT_EQ(mrMoeInitRoutingInferShape(h.x.get(), h.idx.get(), nullptr, nullptr, nullptr, -1,
                                       c.kCapacity, c.kExperts, 1, 0, false, -1, nullptr, 0, 0,
                                       &descs[0], &descs[1], &descs[2], &descs[3], &descs[4]),
            MR_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(mrGetLastErrorMessage(), expected);
  uint64_t workspace_size = 1;
  mrExecutor* executor = nullptr;
  EXPECT_EQ(mrMoeInitRoutingGetWorkspaceSize(h.x.get(), h.idx.get(), nullptr, nullptr, nullptr, -1,
                                             c.kCapacity, c.kExperts, 1, 0, false, -1, nullptr, 0,
                                             0, h.out.get(), h.row_idx.get(), nullptr, nullptr,
                                             nullptr, &workspace_size, &executor),
            MR_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(mrGetLastErrorMessage(), expected);
  EXPECT_EQ(executor, nullptr);
  EXPECT_TRUE(c.untouched());
}

/// Shape inference of a drop-pad call with no rows (capacity is then unbounded by N) and the
/// given expert count and capacity, for both forward operators.
std::vector<Status> infer_drop_pad(int64_t experts, int64_t capacity) {
  Tensor x(DType::float32, {0, 4});
  Tensor idx(DType::int32, {0, 2});
  MoeInitRoutingV2Attrs v2;
  v2.drop_pad_mode = 1;
  v2.expert_num = experts;
  v2.expert_capacity = capacity;
  MoeInitRoutingV2Plan v2_plan;
  MoeInitRoutingAttrs routing;
  routing.drop_pad_mode = 1;
  routing.expert_num = experts;
  routing.expert_capacity = capacity;
  MoeInitRoutingPlan routing_plan;
  return {infer_moe_init_routing_v2(x.view(), idx.view(), v2, &v2_plan),
          infer_moe_init_routing(x.view(), idx.view(), TensorView(), TensorView(), TensorView(),
                                 routing, &routing_plan)};
}

TEST(AdversarialInt32Limits, DropPadSlotsAreAcceptedUpToTheBound) {
  for (const Status& s : infer_drop_pad(1, kInt32Max)) EXPECT_TRUE(s.is_ok()) << s.message();
  for (const Status& s : infer_drop_pad(3, 715827882))  // 2147483646
    EXPECT_TRUE(s.is_ok()) << s.message();
  for (const Status& s : infer_drop_pad(2, int64_t(1) << 30)) {
    EXPECT_EQ(s.code(), StatusCode::invalid_argument);
    EXPECT_NE(s.message().find("got 2 * 1073741824 = 2147483648"), std::string::npos)
        << s.message();
  }
  // A product beyond int64 is refused by the same check, with the true product in the message.
  for (const Status& s : infer_drop_pad(kInt32Max, int64_t(1) << 40)) {
    EXPECT_EQ(s.code(), StatusCode::invalid_argument);
    EXPECT_NE(s.message().find("got 2147483647 * 1099511627776 = 2361183240335310979072"),
              std::string::npos)
        << s.message();
  }
}

// N*K (positions, destination rows, and the V2 counts, all int32) is checked by both forward
// operators; the backward's pairs are len(expanded_row_idx). Pinned here, at the bound.
TEST(AdversarialInt32Limits, PairCountMustFitInt32) {
  const int64_t rows = 65536, top_k = 32768;  // 2^31 pairs
  Tensor x(DType::float32, {rows, 0});
  TensorView idx(static_cast<const void*>(&rows), DType::int32, {rows, top_k});
  MoeInitRoutingV2Attrs v2;
  MoeInitRoutingV2Plan v2_plan;
  Status s = infer_moe_init_routing_v2(x.view(), idx, v2, &v2_plan);
  EXPECT_EQ(s.message(),
            "moe_init_routing_v2: expert_idx must have at most 2147483647 elements (N*K, int32 "
            "indices), got [65536, 32768]");
  MoeInitRoutingAttrs routing;
  routing.expert_num = 8;
  MoeInitRoutingPlan routing_plan;
  s = infer_moe_init_routing(x.view(), idx, TensorView(), TensorView(), TensorView(), routing,
                             &routing_plan);
  EXPECT_EQ(s.message(),
            "moe_init_routing: expert_idx must have at most 2147483647 elements (N*K, int32 "
            "indices), got [65536, 32768]");
  // One pair fewer fits.
  TensorView fits(static_cast<const void*>(&rows), DType::int32, {1, kInt32Max});
  Tensor one_row(DType::float32, {1, 0});
  s = infer_moe_init_routing_v2(one_row.view(), fits, v2, &v2_plan);
  EXPECT_TRUE(s.is_ok()) << s.message();

  MoeInitRoutingGradAttrs grad;
  grad.top_k = 1;
  MoeInitRoutingGradPlan grad_plan;
  TensorView g(static_cast<const void*>(&rows), DType::float32, {kInt32Max + 1, 0});
  TensorView row_idx(static_cast<const void*>(&rows), DType::int32, {kInt32Max + 1});
  s = infer_moe_init_routing_grad(g, row_idx, grad, &grad_plan);
  EXPECT_EQ(s.message(),
            "moe_init_routing_grad: len(expanded_row_idx) must be at most 2147483647 (int32 "
            "indices), got 2147483648");
}

// The combine's backward in drop-pad: grad_expanded_x is [expert_num, expert_capacity, H]. With
// E = 0 it is empty and E*C fits int32, yet a C*H beyond int64 was accepted: a shape no tensor
// can have (its strides overflow; the torch binding failed allocating it with PyTorch's "Stride
// calculation overflowed", and the CLI wrote an .npy NumPy cannot load). Refused by shape
// inference, so by the C++ API, both C-ABI phases, the CLI and the binding alike.
TEST(AdversarialInt32Limits, CombineGradDropPadSlotsOfOneExpertMustFitInt64) {
  Tensor grad_y(DType::float32, {2, 4});
  Tensor idx = Tensor::int32s({2}, {-1, -1});
  MoeFinalizeRoutingGradInputs in;
  in.grad_y = grad_y.view();
  in.expanded_row_idx = idx.view();
  MoeFinalizeRoutingGradAttrs attrs;
  attrs.drop_pad_mode = 1;
  attrs.expert_capacity = int64_t(1) << 61;
  const std::string expected =
      "moe_finalize_routing_grad: grad_expanded_x would have more than 2^63 - 1 bytes per expert "
      "(expert_capacity * H), got 2305843009213693952 * 4";
  MoeFinalizeRoutingGradPlan plan;
  Status s = infer_moe_finalize_routing_grad(in, attrs, &plan);
  EXPECT_EQ(s.code(), StatusCode::invalid_argument);
  EXPECT_EQ(s.message(), expected);
  const TensorHandle gy = tensor_handle(grad_y.view().data, MR_FLOAT32, grad_y.shape);
  const TensorHandle row_idx = tensor_handle(idx.view().data, MR_INT32, idx.shape);
  mrTensorDesc descs[3];
  EXPECT_EQ(mrMoeFinalizeRoutingV2GradInferShape(gy.get(), row_idx.get(), nullptr, nullptr, nullptr,
                                                 nullptr, 1, 0, 0, attrs.expert_capacity, &descs[0],
                                                 &descs[1], &descs[2]),
            MR_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(mrGetLastErrorMessage(), expected);
  // At the bound: C*H of exactly int64's bytes; and many experts of no slots are fine.
  attrs.expert_capacity = INT64_MAX / 4 / 4;
  s = infer_moe_finalize_routing_grad(in, attrs, &plan);
  EXPECT_TRUE(s.is_ok()) << s.message();
  attrs.expert_num = int64_t(1) << 62;
  attrs.expert_capacity = 0;
  s = infer_moe_finalize_routing_grad(in, attrs, &plan);
  EXPECT_TRUE(s.is_ok()) << s.message();
}

// The dispatch's outputs and the dispatch backward's grad_x, in bytes: shape inference checked
// their element counts against int64 but not their sizes in bytes, so a shape whose elements fit
// and whose bytes do not (2^62 float32 elements: 2^64 bytes) was reported by the C ABI's
// *InferShape and accepted by phase one's inference, while mrCreateTensor refuses every tensor
// of that shape ("the tensor's size in bytes must fit int64"): the caller was handed a shape no
// tensor can have and the error came from the wrong function. Reachable with empty inputs: the
// drop-pad dispatch of no token still writes [E, C, H], and the drop-pad backward from E*C = 0
// slots still writes grad_x [N, H]. Refused now by shape inference, as the combine and its
// backward refuse theirs, naming the output.
TEST(AdversarialInt32Limits, DispatchOutputsMustFitInt64Bytes) {
  const int64_t kHidden = int64_t(1) << 62;  // 2^62 float32 elements: 2^64 bytes
  const TensorHandle x = tensor_handle(nullptr, MR_FLOAT32, {0, kHidden});
  const TensorHandle ids = tensor_handle(nullptr, MR_INT32, {0, 1});
  mrTensorDesc descs[5];
  // moe_init_routing_v2, drop-pad, no token: expanded_x [1, 1, 2^62].
  EXPECT_EQ(mrMoeInitRoutingV2InferShape(x.get(), ids.get(), 0, 1, 1, 1, 0, false, &descs[0],
                                         &descs[1], &descs[2], &descs[3]),
            MR_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(
      std::string(mrGetLastErrorMessage()),
      "moe_init_routing_v2: expanded_x would have more than 2^63 - 1 bytes, got 3-D float32 [1, 1, "
      "4611686018427387904]");
  // moe_init_routing alike, and phase one with the same arguments.
  EXPECT_EQ(mrMoeInitRoutingInferShape(x.get(), ids.get(), nullptr, nullptr, nullptr, 0, 1, 1, 1, 0,
                                       false, -1, nullptr, 0, 0, &descs[0], &descs[1], &descs[2],
                                       &descs[3], &descs[4]),
            MR_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(
      std::string(mrGetLastErrorMessage()),
      "moe_init_routing: expanded_x would have more than 2^63 - 1 bytes, got 3-D float32 [1, 1, "
      "4611686018427387904]");
  uint64_t workspace_size = 1;
  mrExecutor* executor = nullptr;
  EXPECT_EQ(mrMoeInitRoutingGetWorkspaceSize(x.get(), ids.get(), nullptr, nullptr, nullptr, 0, 1, 1,
                                             1, 0, false, -1, nullptr, 0, 0, nullptr, nullptr,
                                             nullptr, nullptr, nullptr, &workspace_size, &executor),
            MR_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(
      std::string(mrGetLastErrorMessage()),
      "moe_init_routing: expanded_x would have more than 2^63 - 1 bytes, got 3-D float32 [1, 1, "
      "4611686018427387904]");
  EXPECT_EQ(executor, nullptr);
  // Dropless: 2^60 float32 columns, K = 2 (x is 2^62 bytes, expanded_x would be 2^63).
  const TensorHandle wide_x = tensor_handle(nullptr, MR_FLOAT32, {1, int64_t(1) << 60});
  const TensorHandle pair_ids = tensor_handle(nullptr, MR_INT32, {1, 2});
  EXPECT_EQ(mrMoeInitRoutingV2InferShape(wide_x.get(), pair_ids.get(), 0, 0, 0, 0, 0, false,
                                         &descs[0], &descs[1], &descs[2], &descs[3]),
            MR_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(
      std::string(mrGetLastErrorMessage()),
      "moe_init_routing_v2: expanded_x would have more than 2^63 - 1 bytes, got 2-D float32 [2, "
      "1152921504606846976]");
  // Quantised, the same shape is int8: 2^61 bytes fit.
  EXPECT_EQ(mrMoeInitRoutingInferShape(wide_x.get(), pair_ids.get(), nullptr, nullptr, nullptr, 0,
                                       0, 4, 0, 0, false, 1, nullptr, 0, 0, &descs[0], &descs[1],
                                       &descs[2], &descs[3], &descs[4]),
            MR_SUCCESS)
      << mrGetLastErrorMessage();
  EXPECT_EQ(descs[0].dtype, MR_INT8);
  // moe_init_routing_grad, drop-pad from no slot: grad_x [1, 2^62].
  const TensorHandle grad = tensor_handle(nullptr, MR_FLOAT32, {0, 5, kHidden});
  const TensorHandle row_idx = tensor_handle(nullptr, MR_INT32, {1});
  EXPECT_EQ(mrMoeInitRoutingV2GradInferShape(grad.get(), row_idx.get(), 1, 1, 0, &descs[0]),
            MR_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(
      std::string(mrGetLastErrorMessage()),
      "moe_init_routing_grad: grad_x would have more than 2^63 - 1 bytes, got 2-D float32 [1, "
      "4611686018427387904]");
  // At the bound: exactly int64's bytes in float16 ([1, 1, 2^62 - 1] is 2^63 - 2 bytes).
  const TensorHandle half_x = tensor_handle(nullptr, MR_FLOAT16, {0, kHidden - 1});
  EXPECT_EQ(mrMoeInitRoutingV2InferShape(half_x.get(), ids.get(), 0, 1, 1, 1, 0, false, &descs[0],
                                         &descs[1], &descs[2], &descs[3]),
            MR_SUCCESS)
      << mrGetLastErrorMessage();
  mrTensor* out = nullptr;
  EXPECT_EQ(
      mrCreateTensor(descs[0].shape, descs[0].ndim, descs[0].dtype, MR_DEVICE_CPU, nullptr, &out),
      MR_SUCCESS)
      << mrGetLastErrorMessage();
  mrDestroyTensor(out);
}

}  // namespace
}  // namespace moe_routing::testing
