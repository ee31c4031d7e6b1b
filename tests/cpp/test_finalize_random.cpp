// moe_finalize_routing: random cases against the reference, bit for bit, on every ISA at several
// thread counts: every dtype x drop_pad_mode x numerics x optional-input combination, api v1,
// wide rows and many terms (column tiles, several passes), streamed outputs, special values,
// repeated runs, empty inputs.
#include <cmath>
#include <limits>

#include "cpu/finalize_kernel.h"
#include "finalize_cases.h"

namespace moe_routing {
namespace {

using testing::FinalizeCase;
using testing::FinalizeOptions;
using testing::FloatBuffer;

/// Runs a case on every runner and compares each with the reference.
void expect_all_runners_match(FinalizeCase& c, const std::string& what) {
  const auto runners = testing::all_runners();
  const FloatBuffer expected = testing::run_finalize_case(c, runners[0]);
  for (size_t r = 1; r < runners.size(); ++r)
    EXPECT_TRUE(testing::bitwise_equal(expected, testing::run_finalize_case(c, runners[r])))
        << runners[r].name() << ' ' << what;
}

std::string describe_case(const FinalizeCase& c) {
  const FinalizeOptions& o = c.options;
  std::ostringstream out;
  out << dtype_name(c.dtype) << (o.mixed_scales ? "+f32 scales" : "") << " mode "
      << c.attrs.drop_pad_mode << ' ' << numerics_name(c.attrs.numerics) << ' '
      << finalize_routing_api_name(c.attrs.api) << " N=" << c.N << " K=" << c.K << " H=" << c.H
      << (o.x1 ? " x1" : "") << (o.x2 ? " x2" : "") << (o.bias ? " bias" : "")
      << (o.scales ? " scales" : "") << (o.expert_idx ? " expert_idx" : "")
      << (o.special ? " special" : "") << (o.duplicates ? " duplicates" : "");
  return out.str();
}

TEST(FinalizeRandom, EveryDtypeModeNumericsAndOptionalInputMatchesTheReference) {
  testing::Random rng(20260601);
  int cases = 0;
  for (const testing::DtypeVariant& d : testing::kFinalizeDtypes)
    for (int64_t mode = 0; mode < 4; ++mode)
      for (Numerics numerics : testing::kFinalizeNumerics)
        for (int x12 = 0; x12 < 3; ++x12)
          for (int bias = 0; bias < 2; ++bias)
            for (int special = 0; special < 2; ++special)
              for (int scales = 0; scales < 2; ++scales) {
                if (d.mixed_scales && !scales) continue;
                FinalizeOptions o;
                o.x1 = x12 >= 1, o.x2 = x12 == 2, o.bias = bias, o.scales = scales;
                o.special = special, o.mixed_scales = d.mixed_scales;
                o.expert_idx = rng.integer(0, 1) == 1;
                o.duplicates = rng.integer(0, 3) == 0;
                const int64_t n = rng.integer(1, 7), k = rng.integer(1, 9);
                const int64_t h = rng.integer(0, 1) ? 16 * rng.integer(1, 3) : rng.integer(1, 40);
                FinalizeCase c =
                    testing::make_finalize_case(rng, d.dtype, mode, numerics, o, n, k, h);
                expect_all_runners_match(c, describe_case(c));
                ++cases;
              }
  EXPECT_EQ(cases, 4 * 4 * 2 * 3 * 2 * 2 * 2 - 4 * 2 * 3 * 2 * 2);
}

TEST(FinalizeRandom, ApiV1MatchesTheReference) {
  testing::Random rng(11);
  for (const testing::DtypeVariant& d : testing::kFinalizeDtypes)
    for (Numerics numerics : testing::kFinalizeNumerics)
      for (bool x2 : {false, true}) {
        FinalizeOptions o;
        o.x1 = true, o.x2 = x2, o.bias = true, o.scales = true, o.mixed_scales = d.mixed_scales;
        FinalizeCase c = testing::make_finalize_case(rng, d.dtype, 0, numerics, o, 6, 3, 37,
                                                     FinalizeRoutingApi::v1);
        expect_all_runners_match(c, describe_case(c));
      }
}

TEST(FinalizeRandom, WideRowsAndManyTermsMatchTheReference) {
  // H beyond one tile (rows are cut into tiles when there are few of them) and K beyond one pass
  // of kFinalizeTermsPerPass terms (running sums kept per tile between passes).
  testing::Random rng(7);
  for (const testing::DtypeVariant& d : testing::kFinalizeDtypes)
    for (Numerics numerics : testing::kFinalizeNumerics)
      for (int64_t k : {1, 8, 33, 70}) {
        FinalizeOptions o;
        o.x1 = k % 2 == 1, o.bias = k > 8, o.scales = true, o.mixed_scales = d.mixed_scales;
        o.special = k == 33;
        FinalizeCase c =
            testing::make_finalize_case(rng, d.dtype, k == 70 ? 3 : 2, numerics, o, 3, k, 2053);
        expect_all_runners_match(c, describe_case(c));
      }
}

TEST(FinalizeRandom, TrainingShapedRowsMatchTheReference) {
  // Hidden sizes of the target models: every column through the vector loops.
  testing::Random rng(16);
  for (int64_t h : {2048, 7168}) {
    FinalizeOptions o;
    o.scales = true, o.mixed_scales = true, o.x1 = h == 2048, o.drop_fraction = 0;
    FinalizeCase c =
        testing::make_finalize_case(rng, DType::bfloat16, 2, Numerics::atlas_a2, o, 5, 8, h);
    expect_all_runners_match(c, describe_case(c));
  }
}

TEST(FinalizeRandom, ColumnStepBoundariesMatchTheReference) {
  // The column loops: full steps of kColumnStepVectors vectors (64 columns with AVX2), then one
  // vector, then single columns; streamed, also the cached head before a row's first 32-byte
  // boundary and the prefetches ahead inside the rows.
  testing::Random rng(64);
  testing::for_each_column_boundary(
      {15, 16, 17, 63, 64, 65, 80, 127, 128, 129, 143, 200},
      [&](int64_t h, const testing::DtypeVariant& d, Numerics numerics, bool streamed) {
        FinalizeOptions o;
        o.scales = true, o.mixed_scales = d.mixed_scales, o.x1 = h % 2 == 1, o.bias = h % 3 == 0;
        FinalizeCase c = testing::make_finalize_case(rng, d.dtype, 2, numerics, o, 3, 3, h);
        expect_all_runners_match(c, describe_case(c) + (streamed ? " streamed" : ""));
      });
}

TEST(FinalizeRandom, PrefetchDistanceFollowsTheCpuTuning) {
  using detail::CpuTuning;
  // Zen 4 is AMD's family 19h with AVX-512; Zen 3 (no AVX-512), Zen 5 (family 1Ah) and Intel are
  // not.
  EXPECT_EQ(detail::cpu_tuning_for(true, 0x19, true), CpuTuning::amd_zen4);
  EXPECT_EQ(detail::cpu_tuning_for(true, 0x19, false), CpuTuning::standard);
  EXPECT_EQ(detail::cpu_tuning_for(true, 0x1a, true), CpuTuning::standard);
  EXPECT_EQ(detail::cpu_tuning_for(false, 6, true), CpuTuning::standard);
  {
    const testing::CpuTuningOverride forced(CpuTuning::amd_zen4);
    EXPECT_EQ(detail::cpu_tuning(), CpuTuning::amd_zen4);
  }
  // The standard distances: 512 B - 1 KiB by the row length with K >= 8, else 1 KiB.
  EXPECT_EQ(cpu::finalize_prefetch_bytes(14336, 8, CpuTuning::standard), 1024);
  EXPECT_EQ(cpu::finalize_prefetch_bytes(8192, 8, CpuTuning::standard), 512);
  EXPECT_EQ(cpu::finalize_prefetch_bytes(4096, 8, CpuTuning::standard), 512);
  EXPECT_EQ(cpu::finalize_prefetch_bytes(8192, 2, CpuTuning::standard), 1024);
  // Zen 4: the whole row (rounded up to a line) with K >= 8, else 1 KiB.
  EXPECT_EQ(cpu::finalize_prefetch_bytes(14336, 8, CpuTuning::amd_zen4), 14336);
  EXPECT_EQ(cpu::finalize_prefetch_bytes(4096, 8, CpuTuning::amd_zen4), 4096);
  EXPECT_EQ(cpu::finalize_prefetch_bytes(48, 8, CpuTuning::amd_zen4), 64);
  EXPECT_EQ(cpu::finalize_prefetch_bytes(16384, 8, CpuTuning::amd_zen4), 16384);
  EXPECT_EQ(cpu::finalize_prefetch_bytes(65536, 8, CpuTuning::amd_zen4), 16384);  // the cap
  EXPECT_EQ(cpu::finalize_prefetch_bytes(8192, 2, CpuTuning::amd_zen4), 1024);
}

TEST(FinalizeRandom, EveryCpuTuningsPrefetchPolicyMatchesTheReference) {
  // Sources "far larger than the caches" (threshold 1): the standard distances request lines
  // ahead inside the rows, amd_zen4 each next row's sources whole at its start. Rows of 2048
  // and 7168 bf16 columns, K = 8, a row shorter than a line and one past the whole-row cap.
  testing::StreamingThresholdOverride small(1);
  testing::Random rng(21);
  for (detail::CpuTuning tuning : {detail::CpuTuning::standard, detail::CpuTuning::amd_zen4}) {
    testing::CpuTuningOverride forced(tuning);
    for (int64_t h : {int64_t(2048), int64_t(7168), int64_t(24), int64_t(8200)}) {
      FinalizeOptions o;
      o.scales = true, o.mixed_scales = true, o.x1 = true, o.drop_fraction = 0.1;
      FinalizeCase c =
          testing::make_finalize_case(rng, DType::bfloat16, 2, Numerics::atlas_a2, o, 6, 8, h);
      expect_all_runners_match(c, describe_case(c) + " tuning " + std::to_string(int(tuning)));
    }
  }
}

TEST(FinalizeRandom, StreamedOutputsMatchTheReference) {
  testing::StreamingThresholdOverride small(1);  // every output streams
  testing::Random rng(5);
  for (const testing::DtypeVariant& d : testing::kFinalizeDtypes)
    for (Numerics numerics : testing::kFinalizeNumerics) {
      FinalizeOptions o;
      o.scales = true, o.x1 = true, o.mixed_scales = d.mixed_scales;
      FinalizeCase c = testing::make_finalize_case(rng, d.dtype, 2, numerics, o, 9, 4, 300);
      expect_all_runners_match(c, describe_case(c));
    }
}

TEST(FinalizeRandom, SpecialValuesPropagateIdentically) {
  testing::Random rng(99);
  for (const testing::DtypeVariant& d : testing::kFinalizeDtypes)
    for (Numerics numerics : testing::kFinalizeNumerics)
      for (int64_t mode : {0, 3})
        for (bool x1 : {false, true}) {
          FinalizeOptions o;
          o.x1 = x1, o.x2 = x1, o.bias = !x1, o.scales = true, o.special = true;
          o.mixed_scales = d.mixed_scales, o.drop_fraction = 0.2;
          FinalizeCase c = testing::make_finalize_case(rng, d.dtype, mode, numerics, o, 16, 5, 50);
          testing::fill_special(rng, {&c.expanded_x, &c.x1, &c.x2, &c.bias, &c.scales, &c.x,
                                      &c.alpha1, &c.alpha2, &c.v});
          expect_all_runners_match(c, describe_case(c));
        }
}

TEST(FinalizeRandom, NanIsStoredAsTheCanonicalNan) {
  for (Numerics numerics : testing::kFinalizeNumerics)
    for (DType dtype : {DType::float32, DType::float16, DType::bfloat16}) {
      FloatBuffer ex = FloatBuffer::from_floats(dtype, {-std::nanf(""), 1});
      std::vector<int32_t> idx{0, 1};
      MoeFinalizeRoutingInputs in;
      in.expanded_x = TensorView(ex.data(), dtype, {2, 1});
      in.expanded_row_idx = TensorView(idx.data(), DType::int32, {2});
      MoeFinalizeRoutingAttrs attrs;
      attrs.drop_pad_mode = 2;
      attrs.top_k = 2;
      attrs.numerics = numerics;
      for (const testing::Runner& runner : testing::all_runners()) {
        FloatBuffer out(dtype, 1);
        ASSERT_TRUE(
            moe_finalize_routing(in, attrs, TensorView(out.data(), dtype, {1, 1}), runner.config())
                .is_ok());
        const uint32_t canonical = dtype == DType::float32   ? kCanonicalNanFloat32
                                   : dtype == DType::float16 ? kCanonicalNanFloat16
                                                             : kCanonicalNanBfloat16;
        EXPECT_EQ(out.bits(0), canonical) << runner.name() << ' ' << dtype_name(dtype);
      }
    }
}

TEST(FinalizeRandom, ThreadCountsAndRepeatedRunsGiveTheSameBits) {
  testing::Random rng(3);
  FinalizeOptions o;
  o.scales = true, o.mixed_scales = true, o.x1 = true, o.bias = true;
  FinalizeCase c =
      testing::make_finalize_case(rng, DType::bfloat16, 2, Numerics::atlas_a2, o, 257, 8, 300);
  const testing::Runner one{Backend::cpu, best_cpu_isa(), 1};
  const FloatBuffer first = testing::run_finalize_case(c, one);
  // With the built-in pool (which gives a job this small one thread), then split into pieces.
  testing::for_each_split({1, 2, 4, 7, 16}, [&](int threads, const std::string& what) {
    for (int repeat = 0; repeat < 3; ++repeat)
      EXPECT_TRUE(testing::bitwise_equal(
          first, testing::run_finalize_case(c, {Backend::cpu, best_cpu_isa(), threads})))
          << what << ", run " << repeat;
  });
  ASSERT_TRUE(set_num_threads(3).is_ok());
  EXPECT_TRUE(testing::bitwise_equal(
      first, testing::run_finalize_case(c, {Backend::automatic, CpuIsa::automatic, 0})));
  EXPECT_TRUE(set_num_threads(0).is_ok());
}

TEST(FinalizeRandom, EmptyInputsGiveCorrectlyShapedResults) {
  float dummy = 0.0f;
  std::vector<int32_t> idx{-1, -1, -1, -1};
  std::vector<float> x1{1, -2, 3, -0.0f}, out(4, 7.0f);
  for (Numerics numerics : testing::kFinalizeNumerics) {
    MoeFinalizeRoutingAttrs attrs;
    attrs.numerics = numerics;
    // N = 0: out [0, H].
    MoeFinalizeRoutingInputs in;
    in.expanded_x = TensorView(&dummy, DType::float32, {0, 5});
    in.expanded_row_idx = TensorView(idx.data(), DType::int32, {0});
    MoeFinalizeRoutingPlan plan;
    ASSERT_TRUE(infer_moe_finalize_routing(in, attrs, &plan).is_ok());
    EXPECT_EQ(plan.out.shape[0], 0);
    EXPECT_EQ(plan.out.shape[1], 5);
    EXPECT_TRUE(
        moe_finalize_routing(in, attrs, TensorView(out.data(), DType::float32, {0, 5})).is_ok());
    // H = 0: out [N, 0].
    in.expanded_x = TensorView(&dummy, DType::float32, {4, 0});
    in.expanded_row_idx = TensorView(idx.data(), DType::int32, {4});
    EXPECT_TRUE(
        moe_finalize_routing(in, attrs, TensorView(out.data(), DType::float32, {4, 0})).is_ok());
    // E*C = 0 in drop-pad: every pair dropped; out = x1 (+0 under atlas_a2) or +0.
    attrs.drop_pad_mode = 1;
    attrs.top_k = 2;
    in.expanded_x = TensorView(&dummy, DType::float32, {0, 3, 2});
    in.x1 = TensorView(x1.data(), DType::float32, {2, 2});
    for (const testing::Runner& runner : testing::all_runners()) {
      std::fill(out.begin(), out.end(), 7.0f);
      ASSERT_TRUE(moe_finalize_routing(in, attrs, TensorView(out.data(), DType::float32, {2, 2}),
                                       runner.config())
                      .is_ok());
      EXPECT_EQ(out[0], 1.0f);
      EXPECT_EQ(out[1], -2.0f);
      EXPECT_EQ(float_bits(out[3]), numerics == Numerics::atlas_a2 ? 0u : float_bits(-0.0f))
          << runner.name();
    }
    in.x1 = TensorView();
    std::fill(out.begin(), out.end(), 7.0f);
    ASSERT_TRUE(
        moe_finalize_routing(in, attrs, TensorView(out.data(), DType::float32, {2, 2})).is_ok());
    for (float v : out) EXPECT_EQ(float_bits(v), 0u);
  }
}

}  // namespace
}  // namespace moe_routing
