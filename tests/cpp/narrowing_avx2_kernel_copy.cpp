// The AVX2 kernels' narrowing primitives (Avx2Ops in src/cpu/avx2_vector.h, the header both AVX2
// kernels store through), compiled into the exhaustive narrowing test with the same -mavx2 -mf16c:
// the test calls those very functions, not a copy of their text.
#define MOE_ROUTING_CPU_ISA avx2
#include "cpu/avx2_vector.h"
#include "narrowing_sweep.h"

namespace moe_routing::testing {

void avx2_kernel_narrowing(const float* in, int64_t n, uint16_t* float16, uint16_t* bfloat16,
                           uint16_t* bfloat16_store, uint32_t* float32) {
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
  // store_bf16 takes 16 columns as even (lo) and odd (hi) ones: in[i + k] as column 2k and
  // in[i + 8 + k] as column 2k + 1; the results go back to input order.
  for (int64_t i = 0; i < n; i += 16) {
    const Ops::V v{_mm256_loadu_ps(in + i), _mm256_loadu_ps(in + i + 8)};
    alignas(32) uint16_t columns[16];
    Ops::store_bf16<false>(columns, v);
    for (int k = 0; k < 8; ++k) {
      bfloat16_store[i + k] = columns[2 * k];
      bfloat16_store[i + 8 + k] = columns[2 * k + 1];
    }
  }
}

}  // namespace moe_routing::testing
