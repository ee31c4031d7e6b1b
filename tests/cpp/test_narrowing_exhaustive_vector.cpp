// The vector kernels' narrowing primitives (narrow_fp16, round_bf16_high, store_bf16 and
// canonical_fp32 of Avx2Ops in src/cpu/avx2_vector.h and Avx512Ops in src/cpu/avx512_vector.h,
// reached through narrowing_avx{2,512}_kernel_copy.cpp) against the x86 hardware conversions for
// all 2^32 float32 bit patterns, with the references of test_narrowing_exhaustive.cpp: F16C for
// float16, AVX512_BF16 or the exact model for bfloat16, the canonical quiet NaN for NaN inputs
// (docs/decisions.md §4), the input itself for the float32 store. This file is compiled for the
// baseline ISA and calls an ISA's code only on a CPU that has it (the library's own check).
#include <gtest/gtest.h>

#include <cstdio>

#include "moe_routing/tensor.h"
#include "narrowing_sweep.h"

namespace moe_routing {
namespace {

using testing::Tally;
using KernelNarrowing = void (*)(const float*, int64_t, uint16_t*, uint16_t*, uint16_t*, uint32_t*);

void expect_kernel_narrowing_matches_the_hardware(KernelNarrowing kernel) {
  const bool hardware_bf16 = testing::cpu_has_avx512_bf16();
  std::printf("bfloat16 reference: %s\n", testing::bfloat16_reference_name(hardware_bf16));
  const std::vector<Tally> tallies = testing::sweep_every_float32(
      4, [hardware_bf16, kernel](uint32_t first, const float* in, int64_t n, Tally* t) {
        thread_local std::vector<uint16_t> float16(testing::kSweepBlockSize),
            bfloat16(testing::kSweepBlockSize), bfloat16_store(testing::kSweepBlockSize),
            expected16(testing::kSweepBlockSize), expected_bf(testing::kSweepBlockSize);
        thread_local std::vector<uint32_t> float32(testing::kSweepBlockSize),
            expected32(testing::kSweepBlockSize);
        kernel(in, n, float16.data(), bfloat16.data(), bfloat16_store.data(), float32.data());
        testing::reference_float16(first, in, n, expected16.data());
        testing::reference_bfloat16(first, in, n, hardware_bf16, expected_bf.data());
        for (int64_t i = 0; i < n; ++i) {
          const uint32_t bits = first + uint32_t(i);
          expected32[size_t(i)] =
              testing::is_nan_pattern(bits) ? testing::kExpectedNanFloat32 : bits;
        }
        t[0].add_block(first, float16.data(), expected16.data(), n);
        t[1].add_block(first, bfloat16.data(), expected_bf.data(), n);
        t[2].add_block(first, float32.data(), expected32.data(), n);
        t[3].add_block(first, bfloat16_store.data(), expected_bf.data(), n);
      });
  const char* names[] = {"narrow_fp16", "round_bf16_high", "canonical_fp32", "store_bf16"};
  for (int c = 0; c < 4; ++c) {
    EXPECT_EQ(tallies[size_t(c)].mismatches, 0u) << testing::describe(names[c], tallies[size_t(c)]);
    EXPECT_TRUE(tallies[size_t(c)].covers_every_pattern())
        << names[c] << ": " << tallies[size_t(c)].compared << " non-NaN and "
        << tallies[size_t(c)].nans << " NaN inputs compared";
  }
}

TEST(ExhaustiveNarrowing, Avx2KernelNarrowingMatchesTheHardwareForEveryFloat32) {
  if (!cpu_isa_available(CpuIsa::avx2))
    GTEST_SKIP() << "this CPU has no AVX2 + F16C: the library never runs its AVX2 kernels here";
  expect_kernel_narrowing_matches_the_hardware(&testing::avx2_kernel_narrowing);
}

TEST(ExhaustiveNarrowing, Avx512KernelNarrowingMatchesTheHardwareForEveryFloat32) {
  if (!cpu_isa_available(CpuIsa::avx512))
    GTEST_SKIP() << "this CPU has no AVX-512 F + BW + VL: the library never runs its AVX-512 "
                    "kernels here";
  expect_kernel_narrowing_matches_the_hardware(&testing::avx512_kernel_narrowing);
}

}  // namespace
}  // namespace moe_routing
