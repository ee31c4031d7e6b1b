#include "moe_routing/tensor.h"

#if defined(MOE_ROUTING_HAVE_AVX2)
#include <cpuid.h>
#endif

namespace moe_routing {
namespace {

#if defined(MOE_ROUTING_HAVE_AVX2)
// F16C from CPUID leaf 1 (ECX bit 29): clang's __builtin_cpu_supports does not know "f16c".
// AVX2 being usable (checked by the builtin, OS support included) implies the YMM state F16C uses.
bool cpu_has_f16c() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid(1, &eax, &ebx, &ecx, &edx) == 0) return false;
  return (ecx & bit_F16C) != 0;
}
#endif

}  // namespace

const char* cpu_isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::automatic: return "automatic";
    case CpuIsa::baseline: return "baseline";
    case CpuIsa::avx2: return "avx2";
  }
  return "unknown";
}

bool cpu_isa_available(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::automatic:
    case CpuIsa::baseline: return true;
    case CpuIsa::avx2:
#if defined(MOE_ROUTING_HAVE_AVX2)
      return __builtin_cpu_supports("avx2") && cpu_has_f16c();
#else
      return false;
#endif
  }
  return false;
}

CpuIsa best_cpu_isa() {
  static const CpuIsa best = cpu_isa_available(CpuIsa::avx2) ? CpuIsa::avx2 : CpuIsa::baseline;
  return best;
}

}  // namespace moe_routing
