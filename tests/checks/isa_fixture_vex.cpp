// A deliberately bad "baseline" object for tests/checks: compiled with -mavx2, it holds AVX
// instructions, which tools/checks/check_isa.sh must find when it is named a baseline object.
#include <immintrin.h>

void isa_fixture_add8(const float* a, const float* b, float* out) {
  _mm256_storeu_ps(out, _mm256_add_ps(_mm256_loadu_ps(a), _mm256_loadu_ps(b)));
}
