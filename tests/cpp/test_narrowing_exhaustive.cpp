// The library's scalar narrowing (float_to_fp16, float_to_bf16 in <moe_routing/dtype.h>, which the
// reference, the baseline CPU kernels, the quantisation and the CUDA host code all use) against the
// x86 hardware conversions for all 2^32 float32 bit patterns: F16C for float16; AVX512_BF16 for
// bfloat16 where the CPU has it (denormal inputs, which that instruction reads as zero, and CPUs
// without it: an exact rounding-by-distance model); NaN inputs against the canonical quiet NaN
// (docs/decisions.md §4). The AVX2 kernel's narrowing has its own executable
// (test_narrowing_exhaustive_avx2.cpp), so that nothing compiled with -mavx2 is linked here.
//
// Seconds on every core of the machine; not built in the sanitizer trees (4 billion register-only
// conversions, nothing for a sanitizer to check, ~10x slower there).
#include <gtest/gtest.h>

#include <cstdio>

#include "moe_routing/dtype.h"
#include "narrowing_sweep.h"

namespace moe_routing {
namespace {

using testing::Tally;

/// Every float32 pattern through `narrow` (a scalar narrowing of dtype.h), against
/// reference(first, inputs, count, expected) block by block.
template <class Narrow, class Reference>
Tally sweep_scalar(Narrow narrow, Reference reference) {
  return testing::sweep_every_float32(1, [&](uint32_t first, const float* in, int64_t n, Tally* t) {
    thread_local std::vector<uint16_t> got(testing::kSweepBlockSize),
        expected(testing::kSweepBlockSize);
    reference(first, in, n, expected.data());
    for (int64_t i = 0; i < n; ++i) got[size_t(i)] = narrow(in[i]);
    t[0].add_block(first, got.data(), expected.data(), n);
  })[0];
}

void expect_no_mismatch_over_every_pattern(const char* what, const Tally& tally) {
  EXPECT_EQ(tally.mismatches, 0u) << testing::describe(what, tally);
  EXPECT_TRUE(tally.covers_every_pattern())
      << what << ": " << tally.compared << " non-NaN and " << tally.nans << " NaN inputs compared";
}

TEST(ExhaustiveNarrowing, Float16MatchesF16cForEveryFloat32) {
  if (!testing::cpu_has_f16c())
    GTEST_SKIP() << "this CPU has no F16C, the hardware reference of the float16 narrowing";
  expect_no_mismatch_over_every_pattern(
      "float_to_fp16", sweep_scalar([](float v) { return float_to_fp16(v); },
                                    [](uint32_t first, const float* in, int64_t n, uint16_t* out) {
                                      testing::reference_float16(first, in, n, out);
                                    }));
}

TEST(ExhaustiveNarrowing, Bfloat16MatchesTheHardwareOrAnExactModelForEveryFloat32) {
  const bool hardware = testing::cpu_has_avx512_bf16();
  std::printf("bfloat16 reference: %s\n", testing::bfloat16_reference_name(hardware));
  expect_no_mismatch_over_every_pattern(
      "float_to_bf16",
      sweep_scalar([](float v) { return float_to_bf16(v); },
                   [hardware](uint32_t first, const float* in, int64_t n, uint16_t* out) {
                     testing::reference_bfloat16(first, in, n, hardware, out);
                   }));
}

// The references themselves, on values whose results are known, so that a broken reference
// cannot make the sweeps above pass by agreeing with a broken library.
TEST(ExhaustiveNarrowing, ReferencesGiveKnownResults) {
  struct Case {
    uint32_t input;
    uint16_t float16, bfloat16;
  };
  const Case cases[] = {
      {0x3f800000u, 0x3c00u, 0x3f80u},  // 1
      {0x3f808000u, 0x3c04u, 0x3f80u},  // 1 + 2^-8: bf16 tie, to even (down)
      {0x3f818000u, 0x3c0cu, 0x3f82u},  // 1 + 3*2^-8: bf16 tie, to even (up)
      {0x3f801000u, 0x3c00u, 0x3f80u},  // 1 + 2^-11: fp16 tie, to even (down)
      {0x3f803000u, 0x3c02u, 0x3f80u},  // 1 + 3*2^-11: fp16 tie, to even (up)
      {0x477ff000u, 0x7c00u, 0x4780u},  // 65520: fp16 overflow to inf
      {0x477fefffu, 0x7bffu, 0x4780u},  // just below 65520: 65504
      {0x33800000u, 0x0001u, 0x3380u},  // 2^-24: smallest fp16 subnormal
      {0x33000000u, 0x0000u, 0x3300u},  // 2^-25: tie between 0 and 2^-24, to even (0)
      {0x33000001u, 0x0001u, 0x3300u},  // just above 2^-25: rounds up
      {0x7f7fffffu, 0x7c00u, 0x7f80u},  // FLT_MAX: bf16 rounds to inf
      {0x00000001u, 0x0000u, 0x0000u},  // smallest denormal: bf16 rounds to 0 (kept, not flushed)
      {0x00008000u, 0x0000u, 0x0000u},  // tie between 0 and the smallest bf16 denormal: even (0)
      {0x00018000u, 0x0000u, 0x0002u},  // 1.5 bf16 denormal units: tie, to even (2)
      {0x807fffffu, 0x8000u, 0x8080u},  // largest negative denormal: bf16 rounds up to -2^-126
      {0xff800000u, 0xfc00u, 0xff80u},  // -inf
  };
  const bool f16c = testing::cpu_has_f16c();
  const bool bf16 = testing::cpu_has_avx512_bf16();
  for (const Case& c : cases) {
    alignas(64) float in[16];
    alignas(64) uint16_t out[16];
    for (float& v : in) v = testing::pattern_float(c.input);
    if (f16c) {
      testing::hardware_float16(in, 16, out);
      EXPECT_EQ(out[0], c.float16) << std::hex << "F16C, input 0x" << c.input;
    }
    if (bf16 && !testing::is_denormal_pattern(c.input)) {
      testing::hardware_bfloat16(in, 16, out);
      EXPECT_EQ(out[0], c.bfloat16) << std::hex << "AVX512_BF16, input 0x" << c.input;
    }
    EXPECT_EQ(testing::model_bfloat16(c.input), c.bfloat16)
        << std::hex << "model, input 0x" << c.input;
    EXPECT_EQ(float_to_fp16(in[0]), c.float16) << std::hex << "float_to_fp16, input 0x" << c.input;
    EXPECT_EQ(float_to_bf16(in[0]), c.bfloat16) << std::hex << "float_to_bf16, input 0x" << c.input;
  }
}

}  // namespace
}  // namespace moe_routing
