#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "core/cpu_tuning.h"
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
    case CpuIsa::avx512: return "avx512";
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
    case CpuIsa::avx512:
#if defined(MOE_ROUTING_HAVE_AVX512)
      // The builtins count an AVX-512 feature only where the OS saves the opmask and ZMM state
      // (XCR0), as for AVX2's YMM state.
      return cpu_isa_available(CpuIsa::avx2) && __builtin_cpu_supports("avx512f") &&
             __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
#else
      return false;
#endif
  }
  return false;
}

CpuIsa best_cpu_isa() {
  static const CpuIsa best = [] {
    CpuIsa isa = CpuIsa::baseline;
    for (CpuIsa level : kCpuIsas)
      if (cpu_isa_available(level)) isa = level;
    return isa;
  }();
  return best;
}

namespace detail {
namespace {

/// The first line of a small text file, or false (no allocation: this may run inside a C ABI
/// phase two, which allocates nothing).
bool read_small_file(const char* path, char* text, size_t capacity) {
  const int fd = ::open(path, O_RDONLY);
  if (fd < 0) return false;
  const ssize_t got = ::read(fd, text, capacity - 1);
  ::close(fd);
  if (got <= 0) return false;
  text[got] = '\0';
  text[std::strcspn(text, "\n")] = '\0';
  return true;
}

/// Bytes of one instance of CPU 0's highest-level data (or unified) cache as Linux describes it in
/// sysfs - the share one core can fill - if that is an L3 or beyond; 0 otherwise (machines whose
/// sysfs lists no L3 often have one it does not describe). sysconf(_SC_LEVEL3_CACHE_SIZE) is no
/// substitute: on AMD EPYC it reports the whole package's L3 (256 MiB on the machine measured,
/// whose cores each see a 32 MiB L3), which kept outputs up to 256 MiB on cached stores.
int64_t sysfs_last_level_cache_bytes() {
  int best_level = 0;
  int64_t best_bytes = 0;
  for (int index = 0; index < 16; ++index) {
    char path[96], text[64];
    std::snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/type", index);
    if (!read_small_file(path, text, sizeof text)) break;
    if (std::strcmp(text, "Instruction") == 0) continue;
    std::snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/level", index);
    if (!read_small_file(path, text, sizeof text)) continue;
    const int level = std::atoi(text);
    std::snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/size", index);
    if (!read_small_file(path, text, sizeof text)) continue;
    char* unit = nullptr;
    const long long value = std::strtoll(text, &unit, 10);
    if (value <= 0) continue;
    const int shift = *unit == 'K' ? 10 : *unit == 'M' ? 20 : *unit == 'G' ? 30 : 0;
    if (level > best_level) {
      best_level = level;
      best_bytes = int64_t(value) << shift;
    }
  }
  return best_level >= 3 ? best_bytes : 0;
}

}  // namespace

int64_t last_level_cache_bytes() {
  int64_t cache = sysfs_last_level_cache_bytes();
#if defined(_SC_LEVEL3_CACHE_SIZE)
  if (cache <= 0) cache = int64_t(sysconf(_SC_LEVEL3_CACHE_SIZE));
#endif
  return cache > 0 ? cache : 0;
}

int64_t streaming_store_threshold_for_cache(int64_t cache_bytes) {
  if (cache_bytes <= 0) return kStreamingStoreMaxBytes;  // the OS does not tell
  if (cache_bytes < kStreamingStoreMinBytes) return kStreamingStoreMinBytes;
  return cache_bytes > kStreamingStoreMaxBytes ? kStreamingStoreMaxBytes : cache_bytes;
}

namespace {

std::atomic<int64_t>& threshold_override() {
  static std::atomic<int64_t> value{0};
  return value;
}

}  // namespace

int64_t streaming_store_threshold() {
  static const int64_t default_value =
      streaming_store_threshold_for_cache(last_level_cache_bytes());
  const int64_t forced = threshold_override().load(std::memory_order_relaxed);
  return forced > 0 ? forced : default_value;
}

bool streams_output(int64_t output_bytes, int64_t read_bytes) {
  const int64_t threshold = streaming_store_threshold();
  return output_bytes >= threshold || read_bytes >= threshold;
}

void set_streaming_store_threshold_for_testing(int64_t bytes) {
  threshold_override().store(bytes > 0 ? bytes : 0);
}

CpuTuning cpu_tuning_for(bool amd, int family, bool avx512) {
  return amd && family == 0x19 && avx512 ? CpuTuning::amd_zen4 : CpuTuning::standard;
}

namespace {

CpuTuning detected_cpu_tuning() {
#if defined(MOE_ROUTING_HAVE_AVX2)
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid(0, &eax, &ebx, &ecx, &edx) == 0) return CpuTuning::standard;
  char vendor[13] = {};
  std::memcpy(vendor, &ebx, 4);
  std::memcpy(vendor + 4, &edx, 4);
  std::memcpy(vendor + 8, &ecx, 4);
  if (__get_cpuid(1, &eax, &ebx, &ecx, &edx) == 0) return CpuTuning::standard;
  const unsigned base_family = (eax >> 8) & 0xf;
  const int family = int(base_family == 0xf ? base_family + ((eax >> 20) & 0xff) : base_family);
  return cpu_tuning_for(std::strcmp(vendor, "AuthenticAMD") == 0, family,
                        cpu_isa_available(CpuIsa::avx512));
#else
  return CpuTuning::standard;
#endif
}

std::atomic<int>& tuning_override() {  // -1: none
  static std::atomic<int> value{-1};
  return value;
}

}  // namespace

CpuTuning cpu_tuning() {
  static const CpuTuning detected = detected_cpu_tuning();
  const int forced = tuning_override().load(std::memory_order_relaxed);
  return forced >= 0 ? CpuTuning(forced) : detected;
}

void set_cpu_tuning_for_testing(const CpuTuning* tuning) {
  tuning_override().store(tuning != nullptr ? int(*tuning) : -1);
}

}  // namespace detail
}  // namespace moe_routing
