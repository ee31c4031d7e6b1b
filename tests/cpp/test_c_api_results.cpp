// The C ABI's results for all three operators, bitwise equal to the C++ API on random cases;
// shape inference describes every output.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "c_api_test_util.h"
#include "grad_cases.h"

namespace moe_routing::testing {
namespace {

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
  std::vector<GradShape> sizes(std::begin(kEmptyGradShapes), std::end(kEmptyGradShapes));
  sizes.insert(sizes.end(), std::begin(kGradShapes), std::end(kGradShapes));
  for (GradScenario scenario :
       {GradScenario::dropless, GradScenario::active, GradScenario::drop_pad})
    for (DType dtype : {DType::float32, DType::float16, DType::bfloat16})
      for (const auto& size : sizes)
        for (AccumulationOrder order : {AccumulationOrder::tree, AccumulationOrder::sequential}) {
          GradCase c = make_grad_case(rng, scenario, dtype, size.num_rows, size.top_k, size.hidden);
          c.attrs.order = order;
          SCOPED_TRACE(std::string(grad_scenario_name(scenario)) + " " + dtype_name(dtype) + " " +
                       accumulation_order_name(order) + " N=" + std::to_string(size.num_rows) +
                       " K=" + std::to_string(size.top_k) + " H=" + std::to_string(size.hidden));
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
    c.x = random_tensor(rng, dtype, {n, h});
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
    c.x = random_tensor(rng, dtype, {n, h});
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
    if (a.quant_mode == -1 && rng.integer(0, 1)) c.scale = random_tensor(rng, f32, {n});
    if (a.quant_mode == 0) {
      c.scale = random_tensor(rng, f32, {1});
      if (rng.integer(0, 1)) c.offset = random_tensor(rng, f32, {1});
    }
    if (a.quant_mode == 1 && rng.integer(0, 1))
      c.scale = random_tensor(rng, f32, {rng.integer(0, 1) ? range : 1, h});
    if (rng.integer(0, 1)) c.topk_weight = random_tensor(rng, f32, {n, k});
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
