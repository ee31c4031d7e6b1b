// The worked examples of moe_finalize_routing and its grad
// (docs/spec/moe_finalize_routing.md §5) and hand-computed cases of every rule the docs state
// (docs/moe_finalize_routing.md): accumulation types, the first-term-assigned rule, the +0 steps,
// V1's narrowing, the special experts, and the grad's sums over pairs, on every runner.
#include <cmath>

#include "finalize_cases.h"

namespace moe_routing {
namespace {

using testing::FloatBuffer;
using testing::Runner;

TensorView f32(std::vector<float>& v, std::initializer_list<int64_t> shape) {
  return TensorView(v.data(), DType::float32, shape);
}
TensorView i32(std::vector<int32_t>& v, std::initializer_list<int64_t> shape) {
  return TensorView(v.data(), DType::int32, shape);
}

/// Runs the forward on every runner; returns the outputs' bit patterns (all runners must agree).
std::vector<uint32_t> forward_bits(const MoeFinalizeRoutingInputs& in,
                                   const MoeFinalizeRoutingAttrs& attrs, DType dtype, int64_t N,
                                   int64_t H) {
  std::vector<uint32_t> first;
  for (const Runner& runner : testing::all_runners()) {
    FloatBuffer out(dtype, N * H);
    out.poison();
    const Status s =
        moe_finalize_routing(in, attrs, TensorView(out.data(), dtype, {N, H}), runner.config());
    EXPECT_TRUE(s.is_ok()) << runner.name() << ": " << s.message();
    std::vector<uint32_t> bits;
    for (int64_t k = 0; k < out.count(); ++k) bits.push_back(out.bits(k));
    if (first.empty()) first = bits;
    EXPECT_EQ(bits, first) << runner.name();
  }
  return first;
}

uint32_t bits_of(DType dtype, float v) { return FloatBuffer::from_floats(dtype, {v}).bits(0); }

TEST(FinalizeExamples, Mode2WithX1AndScales) {
  // §5: N=2, K=2, H=1, row layout.
  std::vector<float> ex{1, 2, 3, 4}, scales{0.5f, 0.25f, 2, 1}, x1{10, 20};
  std::vector<int32_t> idx{1, 3, 0, 2};
  MoeFinalizeRoutingInputs in;
  in.expanded_x = f32(ex, {4, 1});
  in.expanded_row_idx = i32(idx, {4});
  in.scales = f32(scales, {2, 2});
  in.x1 = f32(x1, {2, 1});
  for (Numerics numerics : testing::kFinalizeNumerics) {
    MoeFinalizeRoutingAttrs attrs;
    attrs.drop_pad_mode = 2;
    attrs.numerics = numerics;
    EXPECT_EQ(forward_bits(in, attrs, DType::float32, 2, 1),
              (std::vector<uint32_t>{float_bits(12.0f), float_bits(25.0f)}));
    // The same pairs in the column layout of mode 0: idx[t*N + i].
    std::vector<int32_t> column{1, 0, 3, 2};
    MoeFinalizeRoutingInputs col = in;
    col.expanded_row_idx = i32(column, {4});
    attrs.drop_pad_mode = 0;
    EXPECT_EQ(forward_bits(col, attrs, DType::float32, 2, 1),
              (std::vector<uint32_t>{float_bits(12.0f), float_bits(25.0f)}));
  }
}

TEST(FinalizeExamples, Float16AccumulatesInFloat16UnderAtlasA2) {
  // §5: 2048 + 1 + 1 in fp16 stays 2048 (ties to even); in fp32 it is 2050.
  std::vector<float> values{2048, 1, 1}, ones{1, 1, 1};
  FloatBuffer ex = FloatBuffer::from_floats(DType::float16, values);
  FloatBuffer scales = FloatBuffer::from_floats(DType::float16, ones);
  std::vector<int32_t> idx{0, 1, 2};
  MoeFinalizeRoutingInputs in;
  in.expanded_x = TensorView(ex.data(), DType::float16, {3, 1});
  in.expanded_row_idx = i32(idx, {3});
  in.scales = TensorView(scales.data(), DType::float16, {1, 3});
  MoeFinalizeRoutingAttrs attrs;
  attrs.drop_pad_mode = 2;
  EXPECT_EQ(forward_bits(in, attrs, DType::float16, 1, 1),
            std::vector<uint32_t>{bits_of(DType::float16, 2048)});
  attrs.numerics = Numerics::ascend_950;
  EXPECT_EQ(forward_bits(in, attrs, DType::float16, 1, 1),
            std::vector<uint32_t>{bits_of(DType::float16, 2050)});
}

TEST(FinalizeExamples, FirstTermIsAssignedWithoutX1UnderAtlasA2Only) {
  // bfloat16, no x1, no bias: atlas_a2 assigns the first term (-0 stays -0); ascend_950 adds it
  // to +0 (+0). float16 under atlas_a2 adds a zero bias first (-0 + 0 = +0).
  for (DType dtype : {DType::bfloat16, DType::float16}) {
    FloatBuffer ex = FloatBuffer::from_floats(dtype, {-0.0f});
    std::vector<int32_t> idx{0};
    MoeFinalizeRoutingInputs in;
    in.expanded_x = TensorView(ex.data(), dtype, {1, 1});
    in.expanded_row_idx = i32(idx, {1});
    MoeFinalizeRoutingAttrs attrs;
    attrs.drop_pad_mode = 2;
    const uint32_t minus = bits_of(dtype, -0.0f), plus = 0;
    EXPECT_EQ(forward_bits(in, attrs, dtype, 1, 1)[0], dtype == DType::bfloat16 ? minus : plus)
        << dtype_name(dtype);
    attrs.numerics = Numerics::ascend_950;
    EXPECT_EQ(forward_bits(in, attrs, dtype, 1, 1)[0], plus) << dtype_name(dtype);
  }
}

TEST(FinalizeExamples, X1WithoutX2IsAddedToZeroUnderAtlasA2) {
  std::vector<float> ex{5}, x1{-0.0f};
  std::vector<int32_t> idx{-1};
  MoeFinalizeRoutingInputs in;
  in.expanded_x = f32(ex, {1, 1});
  in.expanded_row_idx = i32(idx, {1});
  in.x1 = f32(x1, {1, 1});
  MoeFinalizeRoutingAttrs attrs;
  attrs.drop_pad_mode = 2;
  EXPECT_EQ(forward_bits(in, attrs, DType::float32, 1, 1)[0], 0u);  // -0 + 0 = +0
  attrs.numerics = Numerics::ascend_950;
  EXPECT_EQ(forward_bits(in, attrs, DType::float32, 1, 1)[0], float_bits(-0.0f));
}

TEST(FinalizeExamples, V1NarrowsBfloat16WithTiesAwayFromZero) {
  // x1 = 1, one term 2^-8 (bias 0, scale 1): the float32 sum 1 + 2^-8 is a tie between bfloat16
  // neighbours 1 and 1 + 2^-7: V1 rounds away from zero, V2 to even.
  const float tie_part = std::ldexp(1.0f, -8);
  FloatBuffer ex = FloatBuffer::from_floats(DType::bfloat16, {tie_part, -tie_part});
  FloatBuffer x1 = FloatBuffer::from_floats(DType::bfloat16, {1, -1});
  FloatBuffer bias = FloatBuffer::from_floats(DType::bfloat16, {0});
  std::vector<float> scales{1, 1};
  std::vector<int32_t> idx{0, 1}, experts{0, 0};
  MoeFinalizeRoutingInputs in;
  in.expanded_x = TensorView(ex.data(), DType::bfloat16, {2, 1});
  in.expanded_row_idx = i32(idx, {2});
  in.x1 = TensorView(x1.data(), DType::bfloat16, {2, 1});
  in.bias = TensorView(bias.data(), DType::bfloat16, {1, 1});
  in.scales = f32(scales, {2, 1});
  in.expert_idx = i32(experts, {2, 1});
  MoeFinalizeRoutingAttrs attrs;
  attrs.api = FinalizeRoutingApi::v1;
  EXPECT_EQ(forward_bits(in, attrs, DType::bfloat16, 2, 1),
            (std::vector<uint32_t>{0x3f81u, 0xbf81u}));
  attrs.api = FinalizeRoutingApi::v2;
  EXPECT_EQ(forward_bits(in, attrs, DType::bfloat16, 2, 1),
            (std::vector<uint32_t>{0x3f80u, 0xbf80u}));
  attrs.api = FinalizeRoutingApi::v1;
  attrs.numerics = Numerics::ascend_950;  // the 950 arithmetic narrows to even
  EXPECT_EQ(forward_bits(in, attrs, DType::bfloat16, 2, 1),
            (std::vector<uint32_t>{0x3f80u, 0xbf80u}));
}

TEST(FinalizeExamples, SpecialExperts) {
  // Experts: 0 zero, 1 copy, 2 constant, 3 an ordinary expert. Token 0 routes to 0, 1, 2;
  // token 1 to 3, 2 and a dropped pair.
  std::vector<float> ex{7, 7, 100, 200, 9, 9}, x{3, 5, 1, -1}, x1{1, 1, 0, 0};
  std::vector<float> scales{1, 0.5f, 2, 1, 1, 1}, alpha1{2, 2}, alpha2{10, 10}, v{1, -1};
  std::vector<int32_t> idx{0, 1, 2, 3, 2, -1}, experts{0, 1, 2, 3, 2, 1};
  MoeFinalizeRoutingInputs in;
  in.expanded_x = f32(ex, {3, 2});  // R = 3 rows: index 3 is a pair cut by active_num
  in.expanded_row_idx = i32(idx, {6});
  in.x1 = f32(x1, {2, 2});
  in.scales = f32(scales, {2, 3});
  in.expert_idx = i32(experts, {2, 3});
  in.x = f32(x, {2, 2});
  in.alpha1 = f32(alpha1, {1, 2});
  in.alpha2 = f32(alpha2, {1, 2});
  in.v = f32(v, {1, 2});
  MoeFinalizeRoutingAttrs attrs;
  attrs.drop_pad_mode = 2;
  attrs.zero_expert_range = {0, 1};
  attrs.copy_expert_range = {1, 2};
  attrs.constant_expert_range = {2, 3};
  // Token 0: 1 + 0.5 * x0 + 2 * (2 * x0 + 10 * v) = [1 + 1.5 + 32, 1 + 2.5 + 0].
  // Token 1: expert 3 reads row 3 >= R = 3: cut by active_num (skipped); expert 2 constant:
  //          2 * x1 + 10 * v = [2 + 10, -2 - 10].
  for (Numerics numerics : testing::kFinalizeNumerics) {
    attrs.numerics = numerics;
    EXPECT_EQ(forward_bits(in, attrs, DType::float32, 2, 2),
              (std::vector<uint32_t>{float_bits(34.5f), float_bits(3.5f), float_bits(12.0f),
                                     float_bits(-12.0f)}));
  }
}

TEST(FinalizeExamples, ConstantExpertsRoundEachOperationToTheDtype) {
  // bfloat16: x * alpha1 = (1 + 2^-7)^2 = 1 + 2^-6 + 2^-14 rounds to 1 + 2^-6; with x1 = 2^-8 the
  // sum 1 + 2^-6 + 2^-8 is then a tie that goes to even (1 + 2^-6); unrounded it would round up.
  const float a = 1.0f + std::ldexp(1.0f, -7);
  FloatBuffer ex = FloatBuffer::from_floats(DType::bfloat16, {0});
  FloatBuffer x = FloatBuffer::from_floats(DType::bfloat16, {a});
  FloatBuffer x1 = FloatBuffer::from_floats(DType::bfloat16, {std::ldexp(1.0f, -8)});
  FloatBuffer alpha1 = FloatBuffer::from_floats(DType::bfloat16, {a});
  FloatBuffer zero = FloatBuffer::from_floats(DType::bfloat16, {0});
  std::vector<int32_t> idx{0}, experts{0};
  MoeFinalizeRoutingInputs in;
  in.expanded_x = TensorView(ex.data(), DType::bfloat16, {1, 1});
  in.expanded_row_idx = i32(idx, {1});
  in.x1 = TensorView(x1.data(), DType::bfloat16, {1, 1});
  in.expert_idx = i32(experts, {1, 1});
  in.x = TensorView(x.data(), DType::bfloat16, {1, 1});
  in.alpha1 = TensorView(alpha1.data(), DType::bfloat16, {1, 1});
  in.alpha2 = TensorView(zero.data(), DType::bfloat16, {1, 1});
  in.v = TensorView(zero.data(), DType::bfloat16, {1, 1});
  MoeFinalizeRoutingAttrs attrs;
  attrs.drop_pad_mode = 2;
  attrs.constant_expert_range = {0, 1};
  for (Numerics numerics : testing::kFinalizeNumerics) {
    attrs.numerics = numerics;
    EXPECT_EQ(forward_bits(in, attrs, DType::bfloat16, 1, 1), std::vector<uint32_t>{0x3f82u});
  }
}

TEST(FinalizeExamples, DropPadSkipsMinusOneAndNoTermGivesPlusZero) {
  std::vector<float> ex{1, 2, 3, 4};  // [E=2, C=2, H=1]
  std::vector<int32_t> idx{3, -1, -1, -1};
  MoeFinalizeRoutingInputs in;
  in.expanded_x = f32(ex, {2, 2, 1});
  in.expanded_row_idx = i32(idx, {4});
  for (Numerics numerics : testing::kFinalizeNumerics) {
    MoeFinalizeRoutingAttrs attrs;
    attrs.drop_pad_mode = 3;
    attrs.top_k = 2;
    attrs.numerics = numerics;
    EXPECT_EQ(forward_bits(in, attrs, DType::float32, 2, 1),
              (std::vector<uint32_t>{float_bits(4.0f), 0u}));
  }
}

// ---- the grad -----------------------------------------------------------------------------------

/// Runs the grad on every runner with every output the plan produces; every runner must agree;
/// returns the first one's result.
testing::GradResult grad_all(const MoeFinalizeRoutingGradInputs& in,
                             const MoeFinalizeRoutingGradAttrs& attrs) {
  MoeFinalizeRoutingGradPlan plan;
  EXPECT_TRUE(infer_moe_finalize_routing_grad(in, attrs, &plan).is_ok());
  auto buffer = [](const OutputSpec& spec) {
    FloatBuffer b(spec.dtype, spec.produced ? spec.numel() : 0);
    b.poison();
    return b;
  };
  auto view = [](FloatBuffer& b, const OutputSpec& spec) {
    return spec.produced ? TensorView(b.data(), spec.dtype, spec.ndim, spec.shape) : TensorView();
  };
  testing::GradResult first;
  bool have_first = false;
  for (const Runner& runner : testing::all_runners()) {
    testing::GradResult r{buffer(plan.grad_expanded_x), buffer(plan.grad_scales),
                          buffer(plan.grad_bias)};
    MoeFinalizeRoutingGradOutputs out;
    out.grad_expanded_x = view(r.grad_expanded_x, plan.grad_expanded_x);
    out.grad_scales = view(r.grad_scales, plan.grad_scales);
    out.grad_bias = view(r.grad_bias, plan.grad_bias);
    const Status s = moe_finalize_routing_grad(in, attrs, out, runner.config());
    EXPECT_TRUE(s.is_ok()) << runner.name() << ": " << s.message();
    if (!have_first) {
      first = r;
      have_first = true;
    }
    EXPECT_TRUE(testing::grad_results_equal(first, r)) << runner.name();
  }
  return first;
}

std::vector<float> floats(const FloatBuffer& b) {
  std::vector<float> v;
  for (int64_t k = 0; k < b.count(); ++k) v.push_back(b.at(k));
  return v;
}

TEST(FinalizeGradExamples, SpecExample) {
  // §5: gradY [[1, 2], [3, 4]], expandedX rows [[0,1],[2,3],[4,5],[6,7]], idx [1, 3, 0, 2].
  std::vector<float> gy{1, 2, 3, 4}, ex{0, 1, 2, 3, 4, 5, 6, 7}, scales{0.5f, 0.25f, 2, 1};
  std::vector<int32_t> idx{1, 3, 0, 2};
  MoeFinalizeRoutingGradInputs in;
  in.grad_y = f32(gy, {2, 2});
  in.expanded_row_idx = i32(idx, {4});
  in.expanded_x = f32(ex, {4, 2});
  in.scales = f32(scales, {2, 2});
  for (Numerics numerics : testing::kFinalizeNumerics) {
    MoeFinalizeRoutingGradAttrs attrs;
    attrs.numerics = numerics;
    const testing::GradResult r = grad_all(in, attrs);
    EXPECT_EQ(floats(r.grad_expanded_x), (std::vector<float>{6, 8, 0.5f, 1, 3, 4, 0.25f, 0.5f}));
    EXPECT_EQ(floats(r.grad_scales), (std::vector<float>{8, 20, 4, 32}));
  }
}

TEST(FinalizeGradExamples, RowsNamedTwiceSumInIncreasingPairOrder) {
  // Three pairs name row 0; row 1 is named by none. (1e8 + 1) - 1e8 = 0 in float32: the pairs are
  // summed in increasing pair index whatever the thread count (any other order gives 1).
  std::vector<float> gy{1e8f, 1, -1e8f};
  std::vector<int32_t> idx{0, 0, 0};
  MoeFinalizeRoutingGradInputs in;
  in.grad_y = f32(gy, {3, 1});
  in.expanded_row_idx = i32(idx, {3});
  MoeFinalizeRoutingGradAttrs attrs;
  attrs.active_num = 2;  // grad_expanded_x [2, 1]
  const testing::GradResult r = grad_all(in, attrs);
  EXPECT_EQ(floats(r.grad_expanded_x), (std::vector<float>{0, 0}));
  EXPECT_EQ(r.grad_expanded_x.bits(1), 0u);  // unreferenced: +0
}

TEST(FinalizeGradExamples, SinglePairKeepsTheSignOfZeroAndDroppedPairsGetZero) {
  std::vector<float> gy{-0.0f, 3}, ex{1, 1, 1}, scales{1, 2};
  std::vector<int32_t> idx{2, -1};  // pair 1 dropped
  MoeFinalizeRoutingGradInputs in;
  in.grad_y = f32(gy, {2, 1});
  in.expanded_row_idx = i32(idx, {2});
  in.expanded_x = f32(ex, {3, 1, 1});
  in.scales = f32(scales, {2, 1});
  MoeFinalizeRoutingGradAttrs attrs;
  attrs.drop_pad_mode = 1;
  attrs.expert_num = 3;
  attrs.expert_capacity = 1;
  const testing::GradResult r = grad_all(in, attrs);
  EXPECT_EQ(r.grad_expanded_x.bits(2), float_bits(-0.0f));
  EXPECT_EQ(r.grad_expanded_x.bits(0), 0u);
  EXPECT_EQ(floats(r.grad_scales)[1], 0.0f);  // dropped: 0, not bias * grad_y
}

TEST(FinalizeGradExamples, GradBiasSumsTheExpertsPairsInOrder) {
  // Experts [[0, 1], [0, 0]]: grad_bias[0] = 2*1 + 1*3 + 4*3, grad_bias[1] = 3*1;
  // grad_scales = (x + bias) * grad_y.
  std::vector<float> gy{1, 3}, ex{1, 1, 1, 1}, scales{2, 3, 1, 4}, bias{0.5f, 0.5f};
  std::vector<int32_t> idx{0, 1, 2, 3}, experts{0, 1, 0, 0};
  MoeFinalizeRoutingGradInputs in;
  in.grad_y = f32(gy, {2, 1});
  in.expanded_row_idx = i32(idx, {4});
  in.expanded_x = f32(ex, {4, 1});
  in.scales = f32(scales, {2, 2});
  in.expert_idx = i32(experts, {2, 2});
  in.bias = f32(bias, {2, 1});
  const testing::GradResult r = grad_all(in, {});
  EXPECT_EQ(floats(r.grad_bias), (std::vector<float>{17, 3}));
  EXPECT_EQ(floats(r.grad_scales), (std::vector<float>{1.5f, 1.5f, 4.5f, 4.5f}));
}

TEST(FinalizeGradExamples, GradScalesOrdersDifferAsDocumented) {
  // H = 65, products p0 = 1, p1 = 1e8, p2 = -1e8, p64 = -1, others 0. atlas_a2: one 512-lane tree,
  // (p0 + p1) rounds to 1e8 and cancels with p2, leaving p64: -1. ascend_950: the fold first adds
  // p64 to p0 (0), then 0 + 1e8 - 1e8 = 0.
  std::vector<float> gy(65, 1.0f), ex(65, 0.0f), scales{1};
  ex[0] = 1, ex[1] = 1e8f, ex[2] = -1e8f, ex[64] = -1;
  std::vector<int32_t> idx{0};
  MoeFinalizeRoutingGradInputs in;
  in.grad_y = f32(gy, {1, 65});
  in.expanded_row_idx = i32(idx, {1});
  in.expanded_x = f32(ex, {1, 65});
  in.scales = f32(scales, {1, 1});
  MoeFinalizeRoutingGradAttrs attrs;
  EXPECT_EQ(floats(grad_all(in, attrs).grad_scales)[0], -1.0f);
  attrs.numerics = Numerics::ascend_950;
  EXPECT_EQ(floats(grad_all(in, attrs).grad_scales)[0], 0.0f);
}

}  // namespace
}  // namespace moe_routing
