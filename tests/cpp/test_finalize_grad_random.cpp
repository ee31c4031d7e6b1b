// moe_finalize_routing_grad: random cases against the reference, bit for bit, on every ISA at
// several thread counts (with and without a caller workspace): every dtype x drop_pad_mode x
// numerics x optional input/output combination, rows named several times, the grad_scales orders
// at the H where their shapes change, streamed outputs, special values, empty inputs.
#include <cmath>
#include <limits>

#include "finalize_cases.h"

namespace moe_routing {
namespace {

using testing::FinalizeGradCase;
using testing::GradOptions;
using testing::GradResult;

std::string describe_case(const FinalizeGradCase& c) {
  const GradOptions& o = c.options;
  std::ostringstream out;
  out << dtype_name(c.dtype) << (o.mixed_scales ? "+f32 scales" : "") << " mode "
      << c.attrs.drop_pad_mode << ' ' << numerics_name(c.attrs.numerics) << " N=" << c.N
      << " K=" << c.K << " H=" << c.H << " rows=" << c.rows << (o.scales ? " scales" : "")
      << (o.expanded_x ? " expanded_x" : "") << (o.bias ? " bias" : "")
      << (o.grad_scales ? " grad_scales" : "") << (o.grad_bias ? " grad_bias" : "")
      << (o.duplicates ? " duplicates" : "");
  return out.str();
}

void expect_all_runners_match(FinalizeGradCase& c) {
  const auto runners = testing::all_runners();
  const GradResult expected = testing::run_finalize_grad_case(c, runners[0]);
  for (size_t r = 1; r < runners.size(); ++r)
    EXPECT_TRUE(
        testing::grad_results_equal(expected, testing::run_finalize_grad_case(c, runners[r])))
        << runners[r].name() << ' ' << describe_case(c);
}

/// Every dtype x drop_pad_mode x numerics x optional input/output combination, in random sizes
/// (rows named several times, dropped and active-cut pairs).
void expect_every_option_matches(testing::Random& rng) {
  for (const testing::DtypeVariant& d : testing::kFinalizeDtypes)
    for (int64_t mode = 0; mode < 2; ++mode)
      for (Numerics numerics : testing::kFinalizeNumerics)
        for (int scales = 0; scales < 2; ++scales)
          for (int bias = 0; bias < 2; ++bias)
            for (int outputs = 0; outputs < 3; ++outputs) {
              if (d.mixed_scales && !scales) continue;
              GradOptions o;
              o.scales = scales, o.bias = bias, o.mixed_scales = d.mixed_scales;
              o.expanded_x = outputs != 2;
              o.grad_scales = outputs == 0;
              o.grad_bias = outputs != 1;
              o.duplicates = rng.integer(0, 3) == 0;
              const int64_t n = rng.integer(1, 8);
              const int64_t k = scales ? rng.integer(1, 9) : rng.integer(1, 3);
              const int64_t h = rng.integer(0, 1) ? 16 * rng.integer(1, 4) : rng.integer(1, 70);
              FinalizeGradCase c =
                  testing::make_finalize_grad_case(rng, d.dtype, mode, numerics, o, n, k, h);
              expect_all_runners_match(c);
            }
}

TEST(FinalizeGradRandom, EveryDtypeModeNumericsAndOptionMatchesTheReference) {
  testing::Random rng(314159);
  expect_every_option_matches(rng);
}

TEST(FinalizeGradRandom, EveryOptionStreamedAndPrefetchedMatchesTheReference) {
  // Outputs beyond the streaming threshold (here: all) are streamed, and grad_y's rows requested
  // ahead: the paths of training sizes, for every option.
  testing::StreamingThresholdOverride small(1);
  testing::Random rng(271828);
  expect_every_option_matches(rng);
}

TEST(FinalizeGradRandom, ZenFourPageRequestsMatchTheReference) {
  // On AMD Zen 4 each step of the row loop also requests the pages of the rows two runs ahead
  // (a tuning changes no bit): every option, streamed and prefetched, split among threads, and
  // rows of 2048 and 7168 columns (one to eight pages each, by dtype) in runs well past that
  // distance.
  testing::StreamingThresholdOverride small(1);
  testing::CpuTuningOverride zen4(detail::CpuTuning::amd_zen4);
  testing::EveryJobSplitIntoPieces pieces;
  testing::Random rng(40961);
  expect_every_option_matches(rng);
  for (int64_t h : {2048, 7168})
    for (const testing::DtypeVariant& d : testing::kFinalizeDtypes)
      for (int64_t mode = 0; mode < 2; ++mode) {
        GradOptions o;
        o.bias = mode == 0, o.mixed_scales = d.mixed_scales;
        FinalizeGradCase c =
            testing::make_finalize_grad_case(rng, d.dtype, mode, Numerics::atlas_a2, o, 16, 8, h);
        expect_all_runners_match(c);
      }
}

TEST(FinalizeGradRandom, EveryOptionSplitAcrossThreadsMatchesTheReference) {
  // The rows are visited in an order of their own (the rows of one pair in pair order, the empty
  // and shared rows spread among them) and split into contiguous shares of it: every option, its
  // empty rows (mode 1's unfilled slots) and shared rows included, split into 2, 3 and 8 pieces.
  testing::EveryJobSplitIntoPieces pieces;
  testing::Random rng(161803);
  expect_every_option_matches(rng);
}

TEST(FinalizeGradRandom, GradScalesOrdersAtTheirShapeChanges) {
  // atlas_a2: one group (H <= 512), several, a ragged last group, more than one chunk (12264
  // float32 products with bias, 19616 16-bit without). ascend_950: one tree (H <= 64), the fold,
  // 64 block sums, halvings (H >= 8192: 2 and 4 leaves per final lane).
  testing::Random rng(2718);
  for (int64_t h : {1, 63, 64, 65, 100, 511, 512, 513, 4099, 7168, 8192, 12300, 16484, 19700})
    for (const testing::DtypeVariant& d : testing::kFinalizeDtypes)
      for (Numerics numerics : testing::kFinalizeNumerics) {
        if (d.dtype == DType::float16 && h > 8192) continue;  // the same shapes as bfloat16
        GradOptions o;
        o.bias = h % 2 == 0, o.mixed_scales = d.mixed_scales, o.drop_fraction = 0.0;
        FinalizeGradCase c =
            testing::make_finalize_grad_case(rng, d.dtype, 0, numerics, o, 2, 2, h);
        expect_all_runners_match(c);
      }
}

TEST(FinalizeGradRandom, OnePairRowsAtVectorAndGroupBoundariesMatchTheReference) {
  // A row named by one pair takes the one-pass path (its columns and its pair's atlas_a2 sum
  // together) where its stores may stream from its start; streamed rows that start off the
  // boundary take the general path (cached head). H around the vectors (16 columns), the column
  // steps (64) and the 512-column groups, ragged last groups included.
  testing::Random rng(512);
  testing::for_each_column_boundary(
      {15, 16, 17, 63, 64, 65, 496, 511, 512, 513, 528, 1040},
      [&](int64_t h, const testing::DtypeVariant& d, Numerics numerics, bool) {
        GradOptions o;
        o.bias = h % 2 == 0, o.mixed_scales = d.mixed_scales, o.drop_fraction = 0.1;
        FinalizeGradCase c =
            testing::make_finalize_grad_case(rng, d.dtype, 0, numerics, o, 5, 2, h);
        expect_all_runners_match(c);
      });
}

TEST(FinalizeGradRandom, LongPairListsMatchTheReference) {
  // Experts with hundreds of pairs and rows named by dozens (more than one pass of
  // kFinalizeTermsPerPass pairs), over more than one column tile of kFinalizeAccColumns.
  testing::Random rng(1234);
  for (const testing::DtypeVariant& d : testing::kFinalizeDtypes) {
    GradOptions o;
    o.bias = true, o.grad_bias = true, o.mixed_scales = d.mixed_scales, o.drop_fraction = 0.05;
    FinalizeGradCase c =
        testing::make_finalize_grad_case(rng, d.dtype, 0, Numerics::atlas_a2, o, 60, 4, 1100);
    for (int32_t& r : c.idx)
      if (r >= 0 && rng.integer(0, 1) == 0) r = int32_t(rng.integer(0, 2));  // rows 0-2 crowded
    expect_all_runners_match(c);
  }
}

TEST(FinalizeGradRandom, StreamedOutputsMatchTheReference) {
  testing::StreamingThresholdOverride small(1);
  testing::Random rng(8);
  for (const testing::DtypeVariant& d : testing::kFinalizeDtypes) {
    GradOptions o;
    o.bias = true, o.grad_bias = true, o.mixed_scales = d.mixed_scales, o.duplicates = true;
    FinalizeGradCase c =
        testing::make_finalize_grad_case(rng, d.dtype, 0, Numerics::atlas_a2, o, 40, 4, 300);
    expect_all_runners_match(c);
  }
}

TEST(FinalizeGradRandom, SpecialValuesPropagateIdentically) {
  testing::Random rng(77);
  for (const testing::DtypeVariant& d : testing::kFinalizeDtypes)
    for (Numerics numerics : testing::kFinalizeNumerics)
      for (int64_t mode : {0, 1}) {
        GradOptions o;
        o.bias = true, o.grad_bias = true, o.mixed_scales = d.mixed_scales, o.duplicates = true;
        FinalizeGradCase c =
            testing::make_finalize_grad_case(rng, d.dtype, mode, numerics, o, 12, 3, 90);
        testing::fill_special(rng, {&c.grad_y, &c.expanded_x, &c.scales, &c.bias});
        expect_all_runners_match(c);
      }
}

TEST(FinalizeGradRandom, RunsOfOnePairRowsAcrossGroupsAndSplitsMatchTheReference) {
  // atlas_a2's rows named by one pair are taken up to four at a time, their columns interleaved
  // group by group (512 columns): runs cut by empty and shared rows (drop-pad's unfilled slots,
  // duplicates), by a thread's share of the visit order, and by rows that start off a streaming
  // boundary, at widths of several groups and a ragged last one, streamed and prefetched.
  testing::StreamingThresholdOverride small(1);
  testing::EveryJobSplitIntoPieces pieces;
  testing::Random rng(5051);
  for (int64_t h : {1100, 2065})
    for (const testing::DtypeVariant& d : testing::kFinalizeDtypes)
      for (int64_t mode = 0; mode < 2; ++mode)
        for (int duplicates = 0; duplicates < 2; ++duplicates) {
          GradOptions o;
          o.bias = duplicates == 1, o.mixed_scales = d.mixed_scales;
          o.duplicates = duplicates == 1, o.drop_fraction = 0.2;
          FinalizeGradCase c =
              testing::make_finalize_grad_case(rng, d.dtype, mode, Numerics::atlas_a2, o, 9, 8, h);
          expect_all_runners_match(c);
        }
}

TEST(FinalizeGradRandom, ThreadCountsAndRepeatedRunsGiveTheSameBits) {
  testing::Random rng(4);
  GradOptions o;
  o.bias = true, o.grad_bias = true, o.mixed_scales = true, o.duplicates = true;
  FinalizeGradCase c = testing::make_finalize_grad_case(rng, DType::bfloat16, 0,
                                                        Numerics::ascend_950, o, 200, 8, 200);
  const GradResult first = testing::run_finalize_grad_case(c, {Backend::cpu, best_cpu_isa(), 1});
  // With the built-in pool (which gives a job this small one thread), then split into pieces.
  testing::for_each_split({2, 4, 7, 16}, [&](int threads, const std::string& what) {
    for (int repeat = 0; repeat < 2; ++repeat)
      EXPECT_TRUE(testing::grad_results_equal(
          first, testing::run_finalize_grad_case(c, {Backend::cpu, best_cpu_isa(), threads})))
          << what << ", run " << repeat;
  });
}

TEST(FinalizeGradRandom, EmptyInputsGiveCorrectlyShapedResults) {
  float dummy = 0.0f;
  std::vector<int32_t> idx{0, 1, -1, -1};
  std::vector<float> scales{1, 2, 3, 4}, grad_scales(4, 7.0f), gex(4, 7.0f);
  for (Numerics numerics : testing::kFinalizeNumerics) {
    MoeFinalizeRoutingGradAttrs attrs;
    attrs.numerics = numerics;
    // N = 0.
    MoeFinalizeRoutingGradInputs in;
    in.grad_y = TensorView(&dummy, DType::float32, {0, 5});
    in.expanded_row_idx = TensorView(idx.data(), DType::int32, {0});
    MoeFinalizeRoutingGradOutputs out;
    out.grad_expanded_x = TensorView(gex.data(), DType::float32, {0, 5});
    EXPECT_TRUE(moe_finalize_routing_grad(in, attrs, out).is_ok());
    // H = 0: grad_scales (every pair sums nothing) is +0.
    in.grad_y = TensorView(&dummy, DType::float32, {2, 0});
    in.expanded_row_idx = TensorView(idx.data(), DType::int32, {4});
    in.scales = TensorView(scales.data(), DType::float32, {2, 2});
    in.expanded_x = TensorView(&dummy, DType::float32, {4, 0});
    out.grad_expanded_x = TensorView(gex.data(), DType::float32, {4, 0});
    out.grad_scales = TensorView(grad_scales.data(), DType::float32, {2, 2});
    for (const testing::Runner& runner : testing::all_runners()) {
      std::fill(grad_scales.begin(), grad_scales.end(), 7.0f);
      ASSERT_TRUE(moe_finalize_routing_grad(in, attrs, out, runner.config()).is_ok())
          << runner.name();
      for (float v : grad_scales) EXPECT_EQ(float_bits(v), 0u) << runner.name();
    }
    // E*C = 0 in drop-pad: every pair dropped.
    std::vector<float> gy{1, 2, 3, 4};
    std::vector<int32_t> dropped{-1, -1, -1, -1};
    attrs.drop_pad_mode = 1;
    attrs.expert_num = 0;
    attrs.expert_capacity = 3;
    in.grad_y = TensorView(gy.data(), DType::float32, {2, 2});
    in.expanded_row_idx = TensorView(dropped.data(), DType::int32, {4});
    in.expanded_x = TensorView(&dummy, DType::float32, {0, 3, 2});
    out.grad_expanded_x = TensorView(gex.data(), DType::float32, {0, 3, 2});
    std::fill(grad_scales.begin(), grad_scales.end(), 7.0f);
    ASSERT_TRUE(moe_finalize_routing_grad(in, attrs, out).is_ok());
    for (float v : grad_scales) EXPECT_EQ(float_bits(v), 0u);
  }
}

}  // namespace
}  // namespace moe_routing
