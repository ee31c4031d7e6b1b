#include <unistd.h>

#include <atomic>
#include <cstdint>

#include "core/memory_hints.h"
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

namespace detail {
namespace {

int64_t default_streaming_store_threshold() {
  constexpr int64_t kMinimum = int64_t(8) << 20, kUnknown = int64_t(32) << 20;
  int64_t cache = 0;
#if defined(_SC_LEVEL3_CACHE_SIZE)
  cache = int64_t(sysconf(_SC_LEVEL3_CACHE_SIZE));
#endif
  if (cache <= 0) return kUnknown;
  return cache < kMinimum ? kMinimum : cache;
}

std::atomic<int64_t>& threshold_override() {
  static std::atomic<int64_t> value{0};
  return value;
}

}  // namespace

int64_t streaming_store_threshold() {
  static const int64_t default_value = default_streaming_store_threshold();
  const int64_t forced = threshold_override().load(std::memory_order_relaxed);
  return forced > 0 ? forced : default_value;
}

void set_streaming_store_threshold_for_testing(int64_t bytes) {
  threshold_override().store(bytes > 0 ? bytes : 0);
}

}  // namespace detail
}  // namespace moe_routing
