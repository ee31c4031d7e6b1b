// The spec's forward examples (F1, F2, G1's forward, F3, Q1, Q2 and the static-quant numerics
// example of §3.3), exactly, through every backend (reference, each CPU ISA, several thread
// counts).
#include <algorithm>
#include <cmath>
#include <limits>

#include "params/quantize.h"
#include "routing_cases.h"

namespace moe_routing {
namespace {

using testing::ForwardCase;
using testing::ForwardResult;
using testing::Tensor;
using testing::V2Case;
using testing::V2Result;

const DType kFloatDtypes[] = {DType::float32, DType::float16, DType::bfloat16};

std::vector<int32_t> ints(const Tensor& t) { return t.values<int32_t>(); }
std::vector<int64_t> longs(const Tensor& t) { return t.values<int64_t>(); }
std::vector<int8_t> bytes(const Tensor& t) { return t.values<int8_t>(); }

// --- F1: dropless with active_num truncation and ties (V2) -----------------------------------

V2Case f1_case(DType dtype, int64_t active_num, int64_t flag) {
  V2Case c;
  c.x = Tensor::floats(dtype, {3, 2}, {1, 1.5f, 2, 2.5f, 3, 3.5f});
  c.expert_idx = Tensor::int32s({3, 2}, {1, 0, 2, 1, 0, 2});
  c.attrs.active_num = active_num;
  c.attrs.expert_num = 3;
  c.attrs.expert_tokens_count_or_cumsum_flag = flag;
  return c;
}

TEST(RoutingExamples, F1ActiveNumThreeWithCumsum) {
  for (DType dtype : kFloatDtypes)
    for (const testing::Runner& runner : testing::all_runners()) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + " on " + runner.name());
      V2Case c = f1_case(dtype, 3, 1);
      V2Result r = testing::run_v2(c, runner);
      ASSERT_TRUE(r.status.is_ok()) << r.status.message();
      EXPECT_EQ(r.expanded_x.shape, (std::vector<int64_t>{3, 2}));
      EXPECT_EQ(r.expanded_x.float_values(), (std::vector<float>{1, 1.5f, 3, 3.5f, 1, 1.5f}));
      EXPECT_EQ(ints(r.expanded_row_idx), (std::vector<int32_t>{2, 0, 4, 3, 1, 5}));
      EXPECT_EQ(ints(r.counts), (std::vector<int32_t>{2, 4, 6}));
      EXPECT_FALSE(r.before_capacity.present);
    }
}

TEST(RoutingExamples, F1DroplessWithCount) {
  for (const testing::Runner& runner : testing::all_runners()) {
    V2Case c = f1_case(DType::float32, 0, 2);
    V2Result r = testing::run_v2(c, runner);
    ASSERT_TRUE(r.status.is_ok()) << r.status.message();
    EXPECT_EQ(r.expanded_x.float_values(),
              (std::vector<float>{1, 1.5f, 3, 3.5f, 1, 1.5f, 2, 2.5f, 2, 2.5f, 3, 3.5f}))
        << runner.name();
    EXPECT_EQ(ints(r.expanded_row_idx), (std::vector<int32_t>{2, 0, 4, 3, 1, 5})) << runner.name();
    EXPECT_EQ(ints(r.counts), (std::vector<int32_t>{2, 2, 2})) << runner.name();
  }
}

TEST(RoutingExamples, F1ThroughTheTorchApiKeepsTheShapeAndZeroesTheTail) {
  // moe_init_routing: expanded_x is [N*K, H]; active_num = 3 keeps 3 rows, the rest are zero.
  for (const testing::Runner& runner : testing::all_runners()) {
    ForwardCase c;
    c.x = Tensor::floats(DType::float32, {3, 2}, {1, 1.5f, 2, 2.5f, 3, 3.5f});
    c.expert_idx = Tensor::int32s({3, 2}, {1, 0, 2, 1, 0, 2});
    c.attrs.active_num = 3;
    c.attrs.expert_num = 3;
    c.attrs.expert_tokens_num_flag = true;
    ForwardResult r = testing::run_forward(c, runner);
    ASSERT_TRUE(r.status.is_ok()) << r.status.message();
    EXPECT_EQ(r.expanded_x.float_values(),
              (std::vector<float>{1, 1.5f, 3, 3.5f, 1, 1.5f, 0, 0, 0, 0, 0, 0}))
        << runner.name();
    EXPECT_EQ(ints(r.expanded_row_idx), (std::vector<int32_t>{2, 0, 4, 3, 1, 5})) << runner.name();
    EXPECT_EQ(longs(r.counts), (std::vector<int64_t>{2, 4, 6})) << runner.name();
  }
}

// --- F2: drop-pad ----------------------------------------------------------------------------

TEST(RoutingExamples, F2DropPad) {
  for (DType dtype : kFloatDtypes)
    for (const testing::Runner& runner : testing::all_runners()) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + " on " + runner.name());
      V2Case c;
      c.x = Tensor::floats(dtype, {4, 1}, {10, 20, 30, 40});
      c.expert_idx = Tensor::int32s({4, 2}, {0, 1, 0, 2, 0, 1, 1, 0});
      c.attrs.drop_pad_mode = 1;
      c.attrs.expert_num = 3;
      c.attrs.expert_capacity = 2;
      c.attrs.expert_tokens_before_capacity_flag = true;
      c.attrs.expert_tokens_count_or_cumsum_flag = 1;  // ignored in drop-pad mode
      V2Result r = testing::run_v2(c, runner);
      ASSERT_TRUE(r.status.is_ok()) << r.status.message();
      EXPECT_EQ(r.expanded_x.shape, (std::vector<int64_t>{3, 2, 1}));
      EXPECT_EQ(r.expanded_x.float_values(), (std::vector<float>{10, 20, 10, 30, 20, 0}));
      EXPECT_EQ(ints(r.expanded_row_idx), (std::vector<int32_t>{0, 2, 1, 4, -1, 3, -1, -1}));
      EXPECT_EQ(ints(r.before_capacity), (std::vector<int32_t>{4, 3, 1}));
      EXPECT_FALSE(r.plan.expert_tokens_count_or_cumsum.produced);
    }
}

TEST(RoutingExamples, F2DropPadThroughTheTorchApi) {
  // Same routing; counts are pre-drop over the range; topk weights and the per-token scale follow
  // the slot layout with 0 in empty slots.
  for (const testing::Runner& runner : testing::all_runners()) {
    ForwardCase c;
    c.x = Tensor::floats(DType::float32, {4, 1}, {10, 20, 30, 40});
    c.expert_idx = Tensor::int32s({4, 2}, {0, 1, 0, 2, 0, 1, 1, 0});
    c.scale = Tensor::floats(DType::float32, {4}, {0.5f, 1.5f, 2.5f, 3.5f});
    c.topk_weight = Tensor::floats(DType::float32, {4, 2}, {1, 2, 3, 4, 5, 6, 7, 8});
    c.attrs.drop_pad_mode = 1;
    c.attrs.expert_num = 3;
    c.attrs.expert_capacity = 2;
    c.attrs.expert_tokens_num_flag = true;
    c.attrs.expert_tokens_num_type = 1;
    ForwardResult r = testing::run_forward(c, runner);
    ASSERT_TRUE(r.status.is_ok()) << r.status.message();
    EXPECT_EQ(r.expanded_x.float_values(), (std::vector<float>{10, 20, 10, 30, 20, 0}))
        << runner.name();
    EXPECT_EQ(ints(r.expanded_row_idx), (std::vector<int32_t>{0, 2, 1, 4, -1, 3, -1, -1}))
        << runner.name();
    EXPECT_EQ(longs(r.counts), (std::vector<int64_t>{4, 3, 1})) << runner.name();
    // Slots: p0 (token 0), p2 (token 1), p1 (token 0), p5 (token 2), p3 (token 1), empty.
    EXPECT_EQ(r.expanded_topk_weight.values<float>(), (std::vector<float>{1, 3, 2, 6, 4, 0}))
        << runner.name();
    EXPECT_EQ(r.expanded_topk_weight.shape, (std::vector<int64_t>{6, 1}));
    EXPECT_EQ(r.expanded_scale.values<float>(),
              (std::vector<float>{0.5f, 1.5f, 0.5f, 2.5f, 1.5f, 0}))
        << runner.name();
  }
}

// --- G1's forward ----------------------------------------------------------------------------

TEST(RoutingExamples, G1Forward) {
  for (const testing::Runner& runner : testing::all_runners()) {
    V2Case c;
    c.x = Tensor::floats(DType::float32, {2, 1}, {7, 9});
    c.expert_idx = Tensor::int32s({2, 3}, {2, 0, 1, 0, 2, 1});
    c.attrs.expert_num = 3;
    V2Result r = testing::run_v2(c, runner);
    ASSERT_TRUE(r.status.is_ok()) << r.status.message();
    // sorted positions [1, 3, 2, 5, 0, 4] -> tokens [0, 1, 0, 1, 0, 1]
    EXPECT_EQ(ints(r.expanded_row_idx), (std::vector<int32_t>{4, 0, 2, 1, 5, 3})) << runner.name();
    EXPECT_EQ(r.expanded_x.float_values(), (std::vector<float>{7, 9, 7, 9, 7, 9})) << runner.name();
  }
}

// --- F3: active_expert_range, both row_idx_types, three count types -------------------------

ForwardCase f3_case(int64_t row_idx_type, int64_t count_type) {
  ForwardCase c;
  c.x = Tensor::floats(DType::float32, {3, 2}, {1, 2, 3, 4, 5, 6});
  c.expert_idx = Tensor::int32s({3, 2}, {1, 3, 0, 2, 2, 1});
  c.topk_weight = Tensor::floats(DType::float32, {3, 2}, {0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f});
  c.attrs.expert_num = 4;
  c.attrs.has_active_expert_range = true;
  c.attrs.active_expert_range = {1, 3};
  c.attrs.row_idx_type = row_idx_type;
  c.attrs.expert_tokens_num_type = count_type;
  c.attrs.expert_tokens_num_flag = true;
  return c;
}

TEST(RoutingExamples, F3BothRowIdxTypesAndEveryCountType) {
  const std::vector<std::vector<int64_t>> expected_counts = {
      {2, 4}, {2, 2}, {1, 2, 2, 2, 0, 0, 0, 0}};
  const std::vector<std::vector<int64_t>> expected_count_shapes = {{2}, {2}, {4, 2}};
  const std::vector<std::vector<int32_t>> expected_row_idx = {{0, -1, -1, 2, 3, 1},
                                                              {0, 5, 3, 4, 1, 2}};
  for (int64_t row_idx_type : {0, 1})
    for (int64_t count_type : {0, 1, 2})
      for (const testing::Runner& runner : testing::all_runners()) {
        SCOPED_TRACE(::testing::Message() << "row_idx_type " << row_idx_type << " count type "
                                          << count_type << " on " << runner.name());
        ForwardCase c = f3_case(row_idx_type, count_type);
        ForwardResult r = testing::run_forward(c, runner);
        ASSERT_TRUE(r.status.is_ok()) << r.status.message();
        EXPECT_EQ(ints(r.expanded_row_idx), expected_row_idx[size_t(row_idx_type)]);
        EXPECT_EQ(r.expanded_x.float_values(),
                  (std::vector<float>{1, 2, 5, 6, 3, 4, 5, 6, 0, 0, 0, 0}));
        EXPECT_EQ(longs(r.counts), expected_counts[size_t(count_type)]);
        EXPECT_EQ(r.counts.shape, expected_count_shapes[size_t(count_type)]);
        EXPECT_EQ(r.expanded_topk_weight.values<float>(),
                  (std::vector<float>{0.1f, 0.6f, 0.4f, 0.5f, 0, 0}));
        EXPECT_FALSE(r.plan.expanded_scale.produced);
      }
}

TEST(RoutingExamples, RowIdxType1TailFollowsTheGoldenOrder) {
  // Range [2, 4) of 6: not routed are ids 5, 4 (>= end, by (id, p)), then 0, 1, -1 (< start, by p).
  const std::vector<int32_t> ids{5, 0, 4, 2, -1, 4, 1, 3};
  for (const testing::Runner& runner : testing::all_runners()) {
    ForwardCase c;
    c.x = Tensor::floats(DType::float32, {8, 1}, {0, 1, 2, 3, 4, 5, 6, 7});
    c.expert_idx = Tensor::int32s({8, 1}, ids);
    c.attrs.expert_num = 6;
    c.attrs.has_active_expert_range = true;
    c.attrs.active_expert_range = {2, 4};
    c.attrs.row_idx_type = 1;
    ForwardResult r = testing::run_forward(c, runner);
    ASSERT_TRUE(r.status.is_ok()) << r.status.message();
    // routed: p3 (2), p7 (3); tail: p2 (4), p5 (4), p0 (5), then p1, p4, p6.
    EXPECT_EQ(ints(r.expanded_row_idx), (std::vector<int32_t>{3, 7, 2, 5, 0, 1, 4, 6}))
        << runner.name();
    EXPECT_EQ(r.expanded_x.float_values(), (std::vector<float>{3, 7, 0, 0, 0, 0, 0, 0}))
        << runner.name();
    // The flag is off: the count output is not produced.
    EXPECT_FALSE(r.plan.expert_tokens_count_or_cumsum.produced);
    EXPECT_EQ(r.plan.expert_tokens_count_or_cumsum.shape[0], 2);
  }
}

// --- Q1: dynamic int8 ------------------------------------------------------------------------

ForwardCase dynamic_case(std::vector<float> x, Numerics numerics) {
  ForwardCase c;
  const int64_t h = int64_t(x.size());
  c.x = Tensor::floats(DType::float32, {1, h}, x);
  c.expert_idx = Tensor::int32s({1, 1}, {0});
  c.attrs.expert_num = 1;
  c.attrs.quant_mode = 1;
  c.attrs.numerics = numerics;
  return c;
}

TEST(RoutingExamples, Q1DynamicInt8RoundsHalfAwayFromZero) {
  for (Numerics numerics : {Numerics::atlas_a2, Numerics::ascend_950})
    for (const testing::Runner& runner : testing::all_runners()) {
      SCOPED_TRACE(std::string(numerics_name(numerics)) + " on " + runner.name());
      ForwardCase a = dynamic_case({127.0f, 2.5f, -2.5f, 0.5f, -126.4f}, numerics);
      ForwardResult ra = testing::run_forward(a, runner);
      ASSERT_TRUE(ra.status.is_ok()) << ra.status.message();
      EXPECT_EQ(ra.expanded_x.dtype, DType::int8);
      EXPECT_EQ(bytes(ra.expanded_x), (std::vector<int8_t>{127, 3, -3, 1, -126}));
      EXPECT_EQ(ra.expanded_scale.values<float>(), (std::vector<float>{1.0f}));

      ForwardCase b = dynamic_case({1.0f, -0.5f, 0.25f, 0.0f}, numerics);
      ForwardResult rb = testing::run_forward(b, runner);
      ASSERT_TRUE(rb.status.is_ok()) << rb.status.message();
      EXPECT_EQ(bytes(rb.expanded_x), (std::vector<int8_t>{127, -64, 32, 0}));
      EXPECT_EQ(rb.expanded_scale.values<float>()[0], 0.007874015718698502f);
    }
}

TEST(RoutingExamples, Q1SmoothScaleUsesThePairsExpertRow) {
  for (Numerics numerics : {Numerics::atlas_a2, Numerics::ascend_950})
    for (const testing::Runner& runner : testing::all_runners()) {
      SCOPED_TRACE(std::string(numerics_name(numerics)) + " on " + runner.name());
      // The spec's example: range [1, 2), the pair goes to expert 1, scale row [2, 1, -4, 1].
      ForwardCase c = dynamic_case({1.0f, -0.5f, 0.25f, 0.0f}, numerics);
      c.expert_idx = Tensor::int32s({1, 1}, {1});
      c.attrs.expert_num = 2;
      c.attrs.has_active_expert_range = true;
      c.attrs.active_expert_range = {1, 2};
      c.scale = Tensor::floats(DType::float32, {1, 4}, {2, 1, -4, 1});
      ForwardResult r = testing::run_forward(c, runner);
      ASSERT_TRUE(r.status.is_ok()) << r.status.message();
      EXPECT_EQ(bytes(r.expanded_x), (std::vector<int8_t>{127, -32, -64, 0}));
      EXPECT_EQ(r.expanded_scale.values<float>()[0], 0.015748031437397003f);

      // Two tokens, range [0, 2) with one smooth row per expert: row = expert - start.
      ForwardCase two =
          dynamic_case({1.0f, -0.5f, 0.25f, 0.0f, 1.0f, -0.5f, 0.25f, 0.0f}, numerics);
      two.x = Tensor::floats(DType::float32, {2, 4},
                             {1.0f, -0.5f, 0.25f, 0.0f, 1.0f, -0.5f, 0.25f, 0.0f});
      two.expert_idx = Tensor::int32s({2, 1}, {1, 0});
      two.attrs.expert_num = 2;
      two.scale = Tensor::floats(DType::float32, {2, 4}, {1, 1, 1, 1, 2, 1, -4, 1});
      ForwardResult r2 = testing::run_forward(two, runner);
      ASSERT_TRUE(r2.status.is_ok()) << r2.status.message();
      // Sorted: token 1 (expert 0, row [1,1,1,1]) first, then token 0 (expert 1, row [2,1,-4,1]).
      EXPECT_EQ(bytes(r2.expanded_x), (std::vector<int8_t>{127, -64, 32, 0, 127, -32, -64, 0}));
    }
}

TEST(RoutingExamples, DynamicZeroAndNanRowsQuantiseToZero) {
  for (const testing::Runner& runner : testing::all_runners()) {
    ForwardCase zero = dynamic_case({0.0f, -0.0f, 0.0f}, Numerics::atlas_a2);
    ForwardResult rz = testing::run_forward(zero, runner);
    ASSERT_TRUE(rz.status.is_ok()) << rz.status.message();
    EXPECT_EQ(bytes(rz.expanded_x), (std::vector<int8_t>{0, 0, 0})) << runner.name();
    EXPECT_EQ(float_bits(rz.expanded_scale.values<float>()[0]), 0u) << runner.name();

    ForwardCase nan = dynamic_case({1.0f, std::nanf(""), -3.0f}, Numerics::ascend_950);
    ForwardResult rn = testing::run_forward(nan, runner);
    ASSERT_TRUE(rn.status.is_ok()) << rn.status.message();
    EXPECT_EQ(bytes(rn.expanded_x), (std::vector<int8_t>{0, 0, 0})) << runner.name();
    EXPECT_EQ(float_bits(rn.expanded_scale.values<float>()[0]), kCanonicalNanFloat32)
        << runner.name();
  }
}

TEST(RoutingExamples, DynamicScaleNumericsDifferInTheLastBit) {
  // Find an m where m / 127 and m * float32(1/127) differ, and check both numerics use theirs.
  float m = 0.0f;
  for (int i = 1; i < 10000 && m == 0.0f; ++i) {
    const float candidate = 1.0f + float(i) / 1024.0f;
    if (candidate / 127.0f != candidate * quantize::kReciprocal127) m = candidate;
  }
  ASSERT_NE(m, 0.0f);
  EXPECT_EQ(quantize::kReciprocal127, float(1.0 / 127.0));
  for (const testing::Runner& runner : testing::all_runners()) {
    ForwardCase a2 = dynamic_case({m, -1.0f}, Numerics::atlas_a2);
    ForwardCase a950 = dynamic_case({m, -1.0f}, Numerics::ascend_950);
    ForwardResult r2 = testing::run_forward(a2, runner), r950 = testing::run_forward(a950, runner);
    ASSERT_TRUE(r2.status.is_ok() && r950.status.is_ok());
    EXPECT_EQ(r2.expanded_scale.values<float>()[0], m / 127.0f) << runner.name();
    EXPECT_EQ(r950.expanded_scale.values<float>()[0], m * quantize::kReciprocal127)
        << runner.name();
    EXPECT_NE(r2.expanded_scale.values<float>()[0], r950.expanded_scale.values<float>()[0]);
  }
}

// --- Q2 and the static numerics -------------------------------------------------------------

ForwardCase static_case(DType dtype, std::vector<float> x, float scale, const float* offset,
                        Numerics numerics) {
  ForwardCase c;
  const int64_t h = int64_t(x.size());
  c.x = Tensor::floats(dtype, {1, h}, x);
  c.expert_idx = Tensor::int32s({1, 1}, {0});
  c.scale = Tensor::floats(DType::float32, {1}, {scale});
  if (offset != nullptr) c.offset = Tensor::floats(DType::float32, {1}, {*offset});
  c.attrs.expert_num = 1;
  c.attrs.quant_mode = 0;
  c.attrs.numerics = numerics;
  return c;
}

TEST(RoutingExamples, Q2StaticInt8RoundsHalfToEvenAndSaturates) {
  const float offset = 0.5f;
  for (Numerics numerics : {Numerics::atlas_a2, Numerics::ascend_950})
    for (const testing::Runner& runner : testing::all_runners()) {
      SCOPED_TRACE(std::string(numerics_name(numerics)) + " on " + runner.name());
      ForwardCase c = static_case(DType::float32, {1.0f, -0.75f, 0.25f, 100.0f, -1.25f}, 2.0f,
                                  &offset, numerics);
      ForwardResult r = testing::run_forward(c, runner);
      ASSERT_TRUE(r.status.is_ok()) << r.status.message();
      EXPECT_EQ(bytes(r.expanded_x), (std::vector<int8_t>{2, -1, 1, 127, -2}));
      EXPECT_FALSE(r.plan.expanded_scale.produced);
    }
}

TEST(RoutingExamples, StaticQuantNumericsDiffer) {
  // Spec §3.3: x = 3.824000835418701, scale 1.7, offset 0: fp32 path 6.5008 -> 7, fp16 path 6.5
  // -> 6.
  const float zero = 0.0f;
  for (const testing::Runner& runner : testing::all_runners())
    for (bool with_offset : {true, false}) {
      ForwardCase a2 = static_case(DType::float32, {3.824000835418701f}, 1.7f,
                                   with_offset ? &zero : nullptr, Numerics::atlas_a2);
      ForwardCase a950 = static_case(DType::float32, {3.824000835418701f}, 1.7f,
                                     with_offset ? &zero : nullptr, Numerics::ascend_950);
      ForwardResult r2 = testing::run_forward(a2, runner),
                    r950 = testing::run_forward(a950, runner);
      ASSERT_TRUE(r2.status.is_ok() && r950.status.is_ok());
      EXPECT_EQ(bytes(r2.expanded_x), (std::vector<int8_t>{7})) << runner.name();
      EXPECT_EQ(bytes(r950.expanded_x), (std::vector<int8_t>{6})) << runner.name();
    }
}

TEST(RoutingExamples, StaticQuantSpecialValues) {
  const float offset = 0.0f;
  const float inf = std::numeric_limits<float>::infinity();
  for (Numerics numerics : {Numerics::atlas_a2, Numerics::ascend_950})
    for (const testing::Runner& runner : testing::all_runners()) {
      ForwardCase c = static_case(DType::float32,
                                  {2.5f, 3.5f, -2.5f, -3.5f, 1000.0f, -1000.0f, std::nanf(""), inf,
                                   -inf, 127.4f, -128.4f, -0.5f},
                                  1.0f, &offset, numerics);
      ForwardResult r = testing::run_forward(c, runner);
      ASSERT_TRUE(r.status.is_ok()) << r.status.message();
      EXPECT_EQ(bytes(r.expanded_x),
                (std::vector<int8_t>{2, 4, -2, -4, 127, -128, 0, 127, -128, 127, -128, 0}))
          << numerics_name(numerics) << " on " << runner.name();
    }
}

TEST(RoutingExamples, RoundingHelpersAreExact) {
  // Values just below a half must not be pushed over it (no float "+ 0.5").
  const float below_half = std::nextafter(0.5f, 0.0f);
  EXPECT_EQ(quantize::int8_round_half_away(below_half), 0);
  EXPECT_EQ(quantize::int8_round_half_away(-below_half), 0);
  EXPECT_EQ(quantize::int8_round_half_away(0.5f), 1);
  EXPECT_EQ(quantize::int8_round_half_away(-63.5f), -64);
  EXPECT_EQ(quantize::int8_round_half_away(126.5f), 127);
  EXPECT_EQ(quantize::int8_round_half_away(127.49f), 127);
  EXPECT_EQ(quantize::int8_round_half_away(127.5f), 127);
  EXPECT_EQ(quantize::int8_round_half_away(-127.5f), -128);
  EXPECT_EQ(quantize::int8_round_half_away(-128.5f), -128);
  EXPECT_EQ(quantize::int8_round_half_away(std::numeric_limits<float>::infinity()), 127);
  EXPECT_EQ(quantize::int8_round_half_away(std::nanf("")), 0);
  EXPECT_EQ(quantize::int8_round_half_even(below_half), 0);
  EXPECT_EQ(quantize::int8_round_half_even(0.5f), 0);
  EXPECT_EQ(quantize::int8_round_half_even(1.5f), 2);
  EXPECT_EQ(quantize::int8_round_half_even(-1.5f), -2);
  EXPECT_EQ(quantize::int8_round_half_even(-2.5f), -2);
  EXPECT_EQ(quantize::int8_round_half_even(126.5f), 126);
  EXPECT_EQ(quantize::int8_round_half_even(-127.5f), -128);
  EXPECT_EQ(quantize::int8_round_half_even(3e9f), 127);
  EXPECT_EQ(quantize::int8_round_half_even(-std::numeric_limits<float>::infinity()), -128);
  EXPECT_EQ(quantize::int8_round_half_even(-std::nanf("")), 0);
  // Against double arithmetic: every half n + 0.5 in [-140, 140] and its float neighbours, and a
  // fine grid.
  for (int n = -140; n <= 140; ++n) {
    const float half = float(n) + 0.5f;
    for (float q : {std::nextafter(half, -1000.0f), half, std::nextafter(half, 1000.0f)}) {
      const double away = q < 0 ? -std::floor(-double(q) + 0.5) : std::floor(double(q) + 0.5);
      const double even = std::nearbyint(double(q));
      EXPECT_EQ(quantize::int8_round_half_away(q), int8_t(std::max(-128.0, std::min(127.0, away))))
          << q;
      EXPECT_EQ(quantize::int8_round_half_even(q), int8_t(std::max(-128.0, std::min(127.0, even))))
          << q;
    }
  }
  for (int i = -140 * 64; i <= 140 * 64; ++i) {
    const float q = float(i) / 64.0f;
    const double away = q < 0 ? -std::floor(-double(q) + 0.5) : std::floor(double(q) + 0.5);
    const double even = std::nearbyint(double(q));  // default rounding mode: ties to even
    EXPECT_EQ(quantize::int8_round_half_away(q), int8_t(std::max(-128.0, std::min(127.0, away))))
        << q;
    EXPECT_EQ(quantize::int8_round_half_even(q), int8_t(std::max(-128.0, std::min(127.0, even))))
        << q;
  }
}

}  // namespace
}  // namespace moe_routing
