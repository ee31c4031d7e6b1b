// A deliberately bad "AVX2" object for tests/checks: compiled with -mavx512f, it holds AVX-512
// (EVEX) instructions, which tools/checks/check_isa.sh must find when it is named an AVX2 object.
#include <immintrin.h>

void isa_fixture_add16(const float* a, const float* b, float* out) {
  _mm512_storeu_ps(out, _mm512_add_ps(_mm512_loadu_ps(a), _mm512_loadu_ps(b)));
}
