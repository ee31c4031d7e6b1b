#include "moe_routing/tensor.h"

namespace moe_routing {

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
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
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
