// Compiled twice for tests/checks, once for the baseline and once with -mavx2
// (ISA_FIXTURE_ENTRY names the entry point of each): both objects then define the weak symbol of
// the out-of-line inline function below, the hazard tools/checks/check_isa.sh must report.
__attribute__((noinline)) inline float isa_fixture_shared_sum(const float* v, int n) {
  float sum = 0.0f;
  for (int i = 0; i < n; ++i) sum += v[i];
  return sum;
}

float ISA_FIXTURE_ENTRY(const float* v, int n) { return isa_fixture_shared_sum(v, n); }
