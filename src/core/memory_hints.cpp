// Huge-page advice for the output buffers a front end allocates (core/memory_hints.h).
#include "core/memory_hints.h"

#include <cstdlib>
#include <cstring>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace moe_routing::detail {

bool huge_pages_enabled() {
#if defined(__linux__)
  const char* setting = std::getenv("MOE_ROUTING_HUGE_PAGES");
  return setting == nullptr || std::strcmp(setting, "0") != 0;
#else
  return false;
#endif
}

bool advise_huge_pages(void* data, int64_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  if (data == nullptr || bytes < kHugePageAdviceMinBytes || !huge_pages_enabled()) return false;
  constexpr uintptr_t kHugePage = uintptr_t(2) << 20;
  const uintptr_t begin = reinterpret_cast<uintptr_t>(data);
  const uintptr_t lo = (begin + kHugePage - 1) & ~(kHugePage - 1);
  const uintptr_t hi = (begin + uintptr_t(bytes)) & ~(kHugePage - 1);
  if (hi <= lo) return false;
  // Memory the allocator reused (its pages already in memory; glibc serves sizes under 32 MiB
  // from its heap once one was freed) faults no more: advice there would only split the mapping
  // under the process's memory-map lock and have khugepaged copy the pages into huge ones later,
  // which made a 128-token Qwen3-235B forward 45 % slower. The interior's first page tells.
  unsigned char resident = 0;
  if (::mincore(reinterpret_cast<void*>(lo), 1, &resident) != 0 || (resident & 1) != 0)
    return false;
  return ::madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_HUGEPAGE) == 0;
#else
  (void)data, (void)bytes;
  return false;
#endif
}

}  // namespace moe_routing::detail
