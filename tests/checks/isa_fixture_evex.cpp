// A deliberately bad "AVX2" object for tests/checks: compiled with -mavx512f -mavx512vl, it holds
// AVX-512 (EVEX) instructions, which tools/checks/check_isa.sh must find when it is named an AVX2
// object: one on ymm registers only (found by its 0x62 escape byte alone) and ones on zmm.
#include <immintrin.h>

void isa_fixture_ternary8(const int* a, const int* b, const int* c, int* out) {
  const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a));
  const __m256i y = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b));
  const __m256i z = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm256_ternarylogic_epi32(x, y, z, 0x96));
}

void isa_fixture_add16(const float* a, const float* b, float* out) {
  _mm512_storeu_ps(out, _mm512_add_ps(_mm512_loadu_ps(a), _mm512_loadu_ps(b)));
}
