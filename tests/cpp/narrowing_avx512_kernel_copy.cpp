// The AVX-512 kernels' narrowing primitives (Avx512Ops in src/cpu/avx512_vector.h, the header the
// combine's AVX-512 kernels store through), compiled into the exhaustive narrowing test with the
// same flags as the library's AVX-512 objects: the test calls those very functions.
#define MOE_ROUTING_CPU_ISA avx512
#include "cpu/avx512_vector.h"
#include "narrowing_sweep.h"

namespace moe_routing::testing {

void avx512_kernel_narrowing(const float* in, int64_t n, uint16_t* float16, uint16_t* bfloat16,
                             uint16_t* bfloat16_store, uint32_t* float32) {
  using Ops = cpu::avx512::Avx512Ops;
  for (int64_t i = 0; i < n; i += 16) {
    const __m512 v = _mm512_loadu_ps(in + i);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(float16 + i), Ops::narrow_fp16(v));
    // round_bf16_high leaves each result in the top half of its 32-bit lane.
    alignas(64) uint32_t high[16];
    _mm512_store_si512(high, Ops::round_bf16_high(v));
    for (int lane = 0; lane < 16; ++lane) bfloat16[i + lane] = uint16_t(high[lane] >> 16);
    _mm512_storeu_si512(float32 + i, _mm512_castps_si512(Ops::canonical_fp32(v)));
  }
  // store_bf16 takes 32 columns as even (lo) and odd (hi) ones: in[i + k] as column 2k and
  // in[i + 16 + k] as column 2k + 1; the results go back to input order.
  for (int64_t i = 0; i < n; i += 32) {
    const Ops::V v{_mm512_loadu_ps(in + i), _mm512_loadu_ps(in + i + 16)};
    alignas(64) uint16_t columns[32];
    Ops::store_bf16<false>(columns, v);
    for (int k = 0; k < 16; ++k) {
      bfloat16_store[i + k] = columns[2 * k];
      bfloat16_store[i + 16 + k] = columns[2 * k + 1];
    }
  }
}

}  // namespace moe_routing::testing
