// The worked examples G1-G5 and the seed's example, bit for bit, in both orders, through
// every backend (reference, each CPU ISA, several thread counts).
#include <cmath>

#include "grad_spec_examples.h"
#include "test_util.h"

namespace moe_routing {
namespace {

using testing::FloatBuffer;

struct Example {
  const char* name;
  DType dtype;
  std::vector<int64_t> grad_shape;
  std::vector<float> grad_values;
  std::vector<int32_t> expanded_row_idx;
  MoeInitRoutingGradAttrs attrs;
  std::vector<float> expected_tree;
  std::vector<float> expected_sequential;
};

FloatBuffer run(const Example& ex, AccumulationOrder order, const testing::Runner& runner) {
  FloatBuffer grad = FloatBuffer::from_floats(ex.dtype, ex.grad_values);
  TensorView g(grad.data(), ex.dtype, int(ex.grad_shape.size()), ex.grad_shape.data());
  std::vector<int32_t> idx = ex.expanded_row_idx;
  TensorView r(idx.data(), DType::int32, {int64_t(idx.size())});
  MoeInitRoutingGradAttrs attrs = ex.attrs;
  attrs.order = order;
  const int64_t n = int64_t(idx.size()) / attrs.top_k;
  const int64_t h = ex.grad_shape.back();
  FloatBuffer out(ex.dtype, n * h);
  out.poison();
  TensorView o(out.data(), ex.dtype, {n, h});
  Status s = moe_init_routing_grad(g, r, attrs, o, runner.config());
  EXPECT_TRUE(s.is_ok()) << s.message();
  return out;
}

std::vector<Example> examples() {
  std::vector<Example> list;
  // Seed: expanded_row_idx = 4 1 5 3 0 2, K = 2 -> grad_x[0] = g4+g1, [1] = g5+g3, [2] = g0+g2.
  list.push_back({"seed",
                  DType::float32,
                  {6, 1},
                  {1, 10, 100, 1000, 10000, 100000},
                  {4, 1, 5, 3, 0, 2},
                  {2, 0, 0},
                  {10010, 101000, 101},
                  {10010, 101000, 101}});
  for (const testing::GradSpecExample& g : testing::grad_spec_examples()) {
    MoeInitRoutingGradAttrs attrs;
    attrs.top_k = g.top_k;
    attrs.drop_pad_mode = g.drop_pad_mode;
    attrs.active_num = g.active_num;
    list.push_back({g.name, g.dtype, g.grad_shape, g.grad_values, g.expanded_row_idx, attrs,
                    g.expected_tree, g.expected_sequential});
  }
  return list;
}

TEST(GradExamples, BitExactInBothOrdersOnEveryBackend) {
  for (const Example& ex : examples()) {
    for (const testing::Runner& runner : testing::all_runners()) {
      SCOPED_TRACE(std::string(ex.name) + " on " + runner.name());
      FloatBuffer tree = run(ex, AccumulationOrder::tree, runner);
      FloatBuffer sequential = run(ex, AccumulationOrder::sequential, runner);
      EXPECT_TRUE(
          testing::bitwise_equal(FloatBuffer::from_floats(ex.dtype, ex.expected_tree), tree));
      EXPECT_TRUE(testing::bitwise_equal(FloatBuffer::from_floats(ex.dtype, ex.expected_sequential),
                                         sequential));
    }
  }
}

// The numerics choose the order (atlas_a2: tree, ascend_950: sequential) unless attrs.order names
// one, which then overrides them.
TEST(GradExamples, NumericsChooseTheOrderUnlessOneIsGiven) {
  struct Choice {
    Numerics numerics;
    AccumulationOrder order;
    bool sequential;
  };
  const Choice choices[] = {{Numerics::atlas_a2, AccumulationOrder::from_numerics, false},
                            {Numerics::ascend_950, AccumulationOrder::from_numerics, true},
                            {Numerics::ascend_950, AccumulationOrder::tree, false},
                            {Numerics::atlas_a2, AccumulationOrder::sequential, true}};
  EXPECT_EQ(MoeInitRoutingGradAttrs().numerics, Numerics::atlas_a2);
  EXPECT_EQ(MoeInitRoutingGradAttrs().order, AccumulationOrder::from_numerics);
  for (const Example& ex : examples())
    for (const Choice& choice : choices) {
      SCOPED_TRACE(std::string(ex.name) + " " + numerics_name(choice.numerics) + " " +
                   accumulation_order_name(choice.order));
      Example chosen = ex;
      chosen.attrs.numerics = choice.numerics;
      FloatBuffer grad = FloatBuffer::from_floats(ex.dtype, ex.grad_values);
      std::vector<int32_t> idx = ex.expanded_row_idx;
      const TensorView g(grad.data(), ex.dtype, int(ex.grad_shape.size()), ex.grad_shape.data());
      const TensorView r(idx.data(), DType::int32, {int64_t(idx.size())});
      MoeInitRoutingGradAttrs attrs = chosen.attrs;
      attrs.order = choice.order;
      MoeInitRoutingGradPlan plan;
      ASSERT_TRUE(infer_moe_init_routing_grad(g, r, attrs, &plan).is_ok());
      EXPECT_EQ(plan.order,
                choice.sequential ? AccumulationOrder::sequential : AccumulationOrder::tree);
      for (const testing::Runner& runner : testing::all_runners()) {
        const FloatBuffer got = run(chosen, choice.order, runner);
        const std::vector<float>& expected =
            choice.sequential ? ex.expected_sequential : ex.expected_tree;
        EXPECT_TRUE(testing::bitwise_equal(FloatBuffer::from_floats(ex.dtype, expected), got))
            << runner.name();
      }
    }
}

TEST(GradExamples, G4IsASubnormalOnlyInSequentialOrder) {
  // Guards the example itself: the two orders must really disagree.
  Example g4 = examples()[4];
  FloatBuffer seq = run(g4, AccumulationOrder::sequential, testing::all_runners()[0]);
  EXPECT_EQ(seq.bits(0), 0x0001u);
  FloatBuffer tree = run(g4, AccumulationOrder::tree, testing::all_runners()[0]);
  EXPECT_EQ(tree.bits(0), 0x0000u);
}

TEST(GradExamples, TreeShapeMatchesTheSpecTable) {
  const int64_t expected_bins[][2] = {{1, 1},  {2, 1},  {3, 1},    {4, 2},    {7, 2},    {8, 4},
                                      {15, 4}, {16, 8}, {127, 32}, {128, 64}, {1000, 64}};
  for (const auto& row : expected_bins)
    EXPECT_EQ(tree_shape(row[0]).bins, row[1]) << "K=" << row[0];
  EXPECT_EQ(tree_shape(128).levels, 6);
  EXPECT_EQ(tree_shape(16).levels, 3);
}

TEST(GradExamples, SignedZeroFollowsTheSeedRule) {
  // K=2, both addends -0.0: tree keeps -0.0 (seed present); sequential gives +0.0.
  Example ex{"negzero", DType::float32, {2, 1}, {-0.0f, -0.0f}, {0, 1}, {2, 0, 0}, {}, {}};
  for (const testing::Runner& runner : testing::all_runners()) {
    SCOPED_TRACE(runner.name());
    EXPECT_EQ(run(ex, AccumulationOrder::tree, runner).bits(0), 0x80000000u);
    EXPECT_EQ(run(ex, AccumulationOrder::sequential, runner).bits(0), 0x00000000u);
  }
  // K=3 with the seed (t=0) dropped in drop-pad mode: ((+0)+a2)+a1 = +0 for a1 = a2 = -0.
  Example dropped{"seedskip", DType::float32, {1, 2, 1}, {-0.0f, -0.0f},
                  {-1, 0, 1}, {3, 1, 0},      {},        {}};
  for (const testing::Runner& runner : testing::all_runners())
    EXPECT_EQ(run(dropped, AccumulationOrder::tree, runner).bits(0), 0x00000000u) << runner.name();
}

}  // namespace
}  // namespace moe_routing
