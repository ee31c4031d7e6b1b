// The AVX2 grad kernel's translation unit (src/cpu/grad_kernel_avx2.cpp) compiled once more, into
// the exhaustive narrowing test only, with the same -mavx2 -mf16c: its narrowing primitives live in
// an unnamed namespace, and this is how the test calls those very functions rather than a copy of
// their text. The file's one external function is renamed so that it cannot collide with the
// library's.
#define grad_kernel grad_kernel_compiled_for_the_narrowing_test
#include "cpu/grad_kernel_avx2.cpp"
#undef grad_kernel

#include "narrowing_sweep.h"

namespace moe_routing::testing {

void avx2_kernel_narrowing(const float* in, int64_t n, uint16_t* float16, uint16_t* bfloat16,
                           uint32_t* float32) {
  using Ops = cpu::avx2::Avx2Ops;
  for (int64_t i = 0; i < n; i += 8) {
    const __m256 v = _mm256_loadu_ps(in + i);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(float16 + i), Ops::narrow_fp16(v));
    // round_bf16_high leaves each result in the top half of its 32-bit lane.
    alignas(32) uint32_t high[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(high), Ops::round_bf16_high(v));
    for (int lane = 0; lane < 8; ++lane) bfloat16[i + lane] = uint16_t(high[lane] >> 16);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(float32 + i),
                        _mm256_castps_si256(Ops::canonical_fp32(v)));
  }
}

}  // namespace moe_routing::testing
