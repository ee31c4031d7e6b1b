// Random cases against the reference, bit for bit: every dtype x scenario x K x order on every
// ISA at several thread counts; special values; repeat runs; empty inputs.
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "grad_cases.h"

namespace moe_routing {
namespace {

using testing::FloatBuffer;
using testing::GradCase;

const DType kDtypes[] = {DType::float32, DType::float16, DType::bfloat16};
const GradScenario kScenarios[] = {GradScenario::dropless, GradScenario::active,
                                   GradScenario::drop_pad};
const AccumulationOrder kOrders[] = {AccumulationOrder::tree, AccumulationOrder::sequential};
const int64_t kTopKs[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 127, 128, 130};

TEST(GradRandom, EveryDtypeScenarioAndTopKMatchesTheReference) {
  testing::Random rng(20261130);
  const auto runners = testing::all_runners();
  for (DType dtype : kDtypes)
    for (GradScenario scenario : kScenarios)
      for (int64_t k : kTopKs)
        for (AccumulationOrder order : kOrders) {
          const int64_t n = rng.integer(1, 9), h = 8 * rng.integer(1, 6) + rng.integer(1, 7);
          GradCase c = testing::make_grad_case(rng, scenario, dtype, n, k, h);
          c.attrs.order = order;
          SCOPED_TRACE(::testing::Message()
                       << dtype_name(dtype) << ' ' << grad_scenario_name(scenario) << " K=" << k
                       << ' ' << accumulation_order_name(order) << " N=" << n << " H=" << h);
          FloatBuffer expected = testing::run_grad_case(c, runners[0]);
          for (size_t r = 1; r < runners.size(); ++r)
            EXPECT_TRUE(testing::bitwise_equal(expected, testing::run_grad_case(c, runners[r])))
                << runners[r].name();
        }
}

TEST(GradRandom, WideRowsCrossColumnTiles) {
  // H larger than a tile (1024 columns for small K, 64 for K >= 128), with a ragged tail.
  testing::Random rng(7);
  const auto runners = testing::all_runners();
  for (int64_t k : {1, 3, 8, 130})
    for (DType dtype : kDtypes)
      for (AccumulationOrder order : kOrders) {
        GradCase c = testing::make_grad_case(rng, GradScenario::dropless, dtype, 3, k, 2053);
        c.attrs.order = order;
        FloatBuffer expected = testing::run_grad_case(c, runners[0]);
        for (size_t r = 1; r < runners.size(); ++r)
          EXPECT_TRUE(testing::bitwise_equal(expected, testing::run_grad_case(c, runners[r])))
              << runners[r].name() << " K=" << k << ' ' << dtype_name(dtype);
      }
}

TEST(GradRandom, WidthsWithoutAScalarTailMatchTheReference) {
  // Real hidden sizes are multiples of the vector width (16 columns): every column then goes
  // through the vector loops, and for bfloat16 through the even/odd lanes of the AVX2 kernel.
  testing::Random rng(16);
  const auto runners = testing::all_runners();
  for (int64_t h : {16, 32, 64, 7168})
    for (DType dtype : kDtypes)
      for (GradScenario scenario : kScenarios)
        for (int64_t k : {2, 8, 33})
          for (AccumulationOrder order : kOrders) {
            GradCase c = testing::make_grad_case(rng, scenario, dtype, h > 64 ? 3 : 5, k, h);
            c.attrs.order = order;
            FloatBuffer expected = testing::run_grad_case(c, runners[0]);
            for (size_t r = 1; r < runners.size(); ++r)
              EXPECT_TRUE(testing::bitwise_equal(expected, testing::run_grad_case(c, runners[r])))
                  << runners[r].name() << ' ' << dtype_name(dtype) << ' '
                  << grad_scenario_name(scenario) << " K=" << k << " H=" << h << ' '
                  << accumulation_order_name(order);
          }
}

TEST(GradRandom, SpecialValuesPropagateIdentically) {
  const std::vector<float> specials = testing::special_floats();
  testing::Random rng(99);
  const auto runners = testing::all_runners();
  for (DType dtype : kDtypes)
    for (AccumulationOrder order : kOrders)
      for (int64_t k :
           {2, 3, 4, 5, 6, 8, 33, 130}) {  // 2/4/6/8 with drops: neutral rows; 33+: bins
        // H = 19: one vector and a tail; H = 50: the cache-line loop of 16-bit types as well.
        GradCase c = testing::make_grad_case(rng, GradScenario::dropless, dtype, 16, k,
                                             k % 2 ? 19 : 50, 0.2);
        c.attrs.order = order;
        for (int64_t e = 0; e < c.grad.count(); ++e)
          store_from_float(c.grad.data(), dtype, e,
                           specials[size_t(rng.integer(0, int64_t(specials.size()) - 1))]);
        FloatBuffer expected = testing::run_grad_case(c, runners[0]);
        for (size_t r = 1; r < runners.size(); ++r)
          EXPECT_TRUE(testing::bitwise_equal(expected, testing::run_grad_case(c, runners[r])))
              << runners[r].name() << ' ' << dtype_name(dtype) << " K=" << k;
      }
}

TEST(GradRandom, NanInputGivesNanOutput) {
  std::vector<float> grad{std::nanf(""), 1.0f};
  std::vector<int32_t> idx{0, 1};
  for (const testing::Runner& runner : testing::all_runners()) {
    std::vector<float> out{0.0f};
    Status s = moe_init_routing_grad(
        TensorView(grad.data(), DType::float32, {2, 1}), TensorView(idx.data(), DType::int32, {2}),
        {2, 0, 0}, TensorView(out.data(), DType::float32, {1, 1}), runner.config());
    ASSERT_TRUE(s.is_ok()) << s.message();
    EXPECT_EQ(float_bits(out[0]), kCanonicalNanFloat32) << runner.name();
  }
}

TEST(GradRandom, RepeatedRunsAndThreadCountsGiveTheSameBits) {
  testing::Random rng(3);
  GradCase c = testing::make_grad_case(rng, GradScenario::dropless, DType::bfloat16, 257, 8, 300);
  const testing::Runner one{Backend::cpu, best_cpu_isa(), 1};
  FloatBuffer first = testing::run_grad_case(c, one);
  // With the built-in pool (which gives a job this small one thread), then split into pieces.
  testing::for_each_split({1, 2, 4, 7, 16}, [&](int threads, const std::string& what) {
    for (int repeat = 0; repeat < 3; ++repeat)
      EXPECT_TRUE(testing::bitwise_equal(
          first, testing::run_grad_case(c, {Backend::cpu, best_cpu_isa(), threads})))
          << what << ", run " << repeat;
  });
  // The library-wide default thread count is honoured too.
  ASSERT_TRUE(set_num_threads(2).is_ok());
  EXPECT_EQ(get_num_threads(), 2);
  EXPECT_TRUE(testing::bitwise_equal(
      first, testing::run_grad_case(c, {Backend::automatic, CpuIsa::automatic, 0})));
  ASSERT_TRUE(set_num_threads(0).is_ok());
  EXPECT_GE(get_num_threads(), 1);
}

TEST(GradRandom, AllSkippedRowsArePositiveZero) {
  std::vector<float> grad(4 * 3, -1.0f);
  std::vector<int32_t> idx{-1, -1, -1, 0, -1, -1};  // row 0 all dropped, row 1 one addend
  for (AccumulationOrder order : kOrders)
    for (const testing::Runner& runner : testing::all_runners()) {
      std::vector<float> out(2 * 3, 7.0f);
      MoeInitRoutingGradAttrs attrs{3, 1, 0, order};
      Status s =
          moe_init_routing_grad(TensorView(grad.data(), DType::float32, {2, 2, 3}),
                                TensorView(idx.data(), DType::int32, {6}), attrs,
                                TensorView(out.data(), DType::float32, {2, 3}), runner.config());
      ASSERT_TRUE(s.is_ok()) << s.message();
      for (int j = 0; j < 3; ++j) {
        EXPECT_EQ(float_bits(out[j]), 0u) << runner.name();
        EXPECT_EQ(out[3 + j], -1.0f) << runner.name();
      }
    }
}

TEST(GradRandom, EmptyInputsGiveCorrectlyShapedResults) {
  std::vector<float> out(4, 7.0f);
  std::vector<int32_t> idx{-1, -1, -1, -1};
  float dummy = 0.0f;
  // N = 0: grad_x is [0, H].
  Status s = moe_init_routing_grad(TensorView(&dummy, DType::float32, {0, 5}),
                                   TensorView(idx.data(), DType::int32, {0}), {2, 0, 0},
                                   TensorView(out.data(), DType::float32, {0, 5}));
  EXPECT_TRUE(s.is_ok()) << s.message();
  // H = 0: grad_x is [N, 0].
  std::vector<int32_t> perm{1, 0, 3, 2};
  s = moe_init_routing_grad(TensorView(&dummy, DType::float32, {4, 0}),
                            TensorView(perm.data(), DType::int32, {4}), {2, 0, 0},
                            TensorView(out.data(), DType::float32, {2, 0}));
  EXPECT_TRUE(s.is_ok()) << s.message();
  // E*C = 0 in drop-pad: every pair dropped, grad_x all +0.
  s = moe_init_routing_grad(TensorView(&dummy, DType::float32, {0, 3, 2}),
                            TensorView(idx.data(), DType::int32, {4}), {2, 1, 0},
                            TensorView(out.data(), DType::float32, {2, 2}));
  EXPECT_TRUE(s.is_ok()) << s.message();
  for (float v : out) EXPECT_EQ(float_bits(v), 0u);
  MoeInitRoutingGradPlan plan;
  ASSERT_TRUE(infer_moe_init_routing_grad(TensorView(&dummy, DType::float16, {0, 3, 2}),
                                          TensorView(idx.data(), DType::int32, {4}), {2, 1, 0},
                                          &plan)
                  .is_ok());
  EXPECT_EQ(plan.grad_x_shape[0], 2);
  EXPECT_EQ(plan.grad_x_shape[1], 2);
  EXPECT_EQ(plan.source_rows, 0);
}

// No output row (N = 0, here with a top_k no buffer could hold): every backend returns at once, the
// reference too, without sizing a buffer by top_k (the fuzzer found the reference throwing).
TEST(GradRandom, NoOutputRowsWithAHugeTopKOnEveryBackend) {
  float dummy = 0.0f;
  int32_t no_index = 0;
  const int64_t huge = std::numeric_limits<int64_t>::max() / 2;
  for (const testing::Runner& runner : testing::all_runners()) {
    const Status s = moe_init_routing_grad(
        TensorView(&dummy, DType::float32, {0, 3}), TensorView(&no_index, DType::int32, {0}),
        {huge, 0, 0}, TensorView(&dummy, DType::float32, {0, 3}), runner.config());
    EXPECT_TRUE(s.is_ok()) << runner.name() << ": " << s.message();
  }
}

TEST(GradRandom, ActiveNumAboveNKAcceptsTheForwardsRowCount) {
  // The V2 forward keeps min(active_num, N*K) rows; the backward accepts that count too.
  std::vector<float> grad{1, 2, 3, 4};
  std::vector<int32_t> idx{3, 0, 1, 2};
  std::vector<float> out(2);
  Status s = moe_init_routing_grad(TensorView(grad.data(), DType::float32, {4, 1}),
                                   TensorView(idx.data(), DType::int32, {4}), {2, 0, 10},
                                   TensorView(out.data(), DType::float32, {2, 1}));
  ASSERT_TRUE(s.is_ok()) << s.message();
  EXPECT_EQ(out[0], 5.0f);
  EXPECT_EQ(out[1], 5.0f);
}

}  // namespace
}  // namespace moe_routing

namespace moe_routing {
namespace {

TEST(GradRandom, LargeOutputsTakeTheStreamingStorePathBitExactly) {
  // grad_x of >= the threshold (forced to 8 MiB here) is written with non-temporal stores; an odd
  // H also makes every other row unaligned, so both store paths run in one call.
  const testing::StreamingThresholdOverride threshold(int64_t(8) << 20);
  testing::Random rng(41);
  for (DType dtype : {DType::bfloat16, DType::float16, DType::float32}) {
    const int64_t h = dtype == DType::float32 ? 1029 : 2053;
    testing::GradCase c = testing::make_grad_case(rng, GradScenario::dropless, dtype, 2048, 2, h);
    ASSERT_GE(int64_t(c.num_rows * h * dtype_size(dtype)), int64_t(8) << 20);
    testing::FloatBuffer expected =
        testing::run_grad_case(c, {Backend::reference, CpuIsa::automatic, 1});
    for (int threads : {1, 2})
      EXPECT_TRUE(testing::bitwise_equal(
          expected, testing::run_grad_case(c, {Backend::cpu, best_cpu_isa(), threads})))
          << dtype_name(dtype) << ' ' << threads << " threads";
  }
}

TEST(GradRandom, StreamedRowsWithAbsentAddendsAndEitherOrderAreBitExact) {
  // K = 8 in every scenario (absent addends read from neutral rows, chunk by chunk) and both
  // orders, on every ISA, with an aligned H (all rows stream) and an odd one (every other row
  // takes the cached path). The threshold is forced down to 1 MiB to keep the inputs small.
  const testing::StreamingThresholdOverride threshold(int64_t(1) << 20);
  testing::Random rng(43);
  for (int64_t h : {2048, 2053})
    for (GradScenario scenario :
         {GradScenario::dropless, GradScenario::active, GradScenario::drop_pad})
      for (AccumulationOrder order : {AccumulationOrder::tree, AccumulationOrder::sequential}) {
        testing::GradCase c = testing::make_grad_case(rng, scenario, DType::bfloat16, 256, 8, h);
        c.attrs.order = order;
        ASSERT_GE(int64_t(c.num_rows * h * 2), int64_t(1) << 20);
        testing::FloatBuffer expected =
            testing::run_grad_case(c, {Backend::reference, CpuIsa::automatic, 1});
        for (CpuIsa isa : kCpuIsas) {
          if (!cpu_isa_available(isa)) continue;
          EXPECT_TRUE(
              testing::bitwise_equal(expected, testing::run_grad_case(c, {Backend::cpu, isa, 2})))
              << cpu_isa_name(isa) << ' ' << grad_scenario_name(scenario) << " H=" << h << ' '
              << accumulation_order_name(order);
        }
      }
}

TEST(GradRandom, StreamedOutputsAtEveryOffsetMatchTheReference) {
  // grad_x starting at every element offset within 64 bytes of a boundary (a C caller's malloc
  // gives 16), streaming forced: rows whose start is on a 32-byte boundary stream, the others go
  // through the cache. The bits are the reference's on every ISA and thread count, and no byte
  // outside grad_x changes.
  const testing::StreamingThresholdOverride threshold(1);
  testing::Random rng(47);
  for (DType dtype : kDtypes)
    for (int64_t h : {1, 7, 15, 16, 17, 33, 64, 100, 1029})
      for (GradScenario scenario : {GradScenario::dropless, GradScenario::active}) {
        testing::GradCase c = testing::make_grad_case(rng, scenario, dtype, 9, 8, h);
        const testing::FloatBuffer expected =
            testing::run_grad_case(c, {Backend::reference, CpuIsa::automatic, 1});
        for (int offset = 0; offset < 64; offset += int(dtype_size(dtype)))
          for (CpuIsa isa : kCpuIsas) {
            if (!cpu_isa_available(isa)) continue;
            for (int threads : {1, 2}) {
              testing::OffsetStorage storage(expected.bytes.size(), offset);
              const testing::Runner runner{Backend::cpu, isa, threads};
              const Status s = moe_init_routing_grad(
                  c.grad_view(), c.idx_view(), c.attrs,
                  TensorView(storage.data(), dtype, {c.num_rows, h}), runner.config());
              ASSERT_TRUE(s.is_ok()) << s.message();
              const std::string where = std::string(dtype_name(dtype)) + " H=" + std::to_string(h) +
                                        " offset " + std::to_string(offset) + ' ' + runner.name();
              EXPECT_EQ(0,
                        std::memcmp(storage.data(), expected.bytes.data(), expected.bytes.size()))
                  << where;
              EXPECT_TRUE(storage.margins_untouched()) << where << ": a write outside grad_x";
            }
          }
      }
}

}  // namespace
}  // namespace moe_routing
