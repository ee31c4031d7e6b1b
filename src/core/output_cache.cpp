// The cache of large output buffers (core/output_cache.h).
#include "core/output_cache.h"

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "core/environment.h"
#include "core/memory_hints.h"

#if defined(__linux__)
#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>
#endif

namespace moe_routing::detail {
namespace {

constexpr int64_t kBlock = int64_t(2) << 20;  // sizes are whole huge pages

/// Requests above this are refused (nullptr): rounding them up could overflow, and no machine has
/// the memory (the binding's caller then gets PyTorch's allocator and its out-of-memory error).
constexpr int64_t kMaxRequestBytes = int64_t(1) << 62;

}  // namespace

int64_t memory_under_cgroup_cap(int64_t physical, const char* const* cap_files, int count) {
  int64_t memory = physical > 0 ? physical : 0;
  for (int i = 0; i < count; ++i) {
    if (std::FILE* f = std::fopen(cap_files[i], "r")) {
      long long cap = 0;
      const bool numeric = std::fscanf(f, "%lld", &cap) == 1;  // "max": no cap
      std::fclose(f);
      if (numeric && cap > 0 && (memory == 0 || cap < memory)) memory = cap;
      break;  // the first file that exists decides
    }
  }
  return memory > 0 ? memory : int64_t(8) << 30;
}

namespace {

/// The memory this process may use: physical memory, or less where the cgroup (v2, else v1) caps
/// it, as in a container.
int64_t usable_memory() {
  int64_t physical = 0;
#if defined(__linux__)
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  if (pages > 0 && page > 0) physical = int64_t(pages) * page;
  static const char* const kCapFiles[] = {"/sys/fs/cgroup/memory.max",
                                          "/sys/fs/cgroup/memory/memory.limit_in_bytes"};
  return memory_under_cgroup_cap(physical, kCapFiles, 2);
#else
  return memory_under_cgroup_cap(physical, nullptr, 0);
#endif
}

int64_t default_limit() {
  if (const char* mib = std::getenv("MOE_ROUTING_OUTPUT_CACHE_MB")) {
    const EnvNumber value = parse_env_number(mib);
    if (value.valid && value.value >= 0)
      return value.value >= (int64_t(1) << 40) ? int64_t(1) << 60 : value.value << 20;
    warn_env_ignored("MOE_ROUTING_OUTPUT_CACHE_MB", "a whole number of MiB >= 0", mib,
                     "the default (1/8 of the memory this process may use)");
  }
  return usable_memory() / 8;
}

/// New memory of `size` bytes (a multiple of kBlock), kBlock-aligned.
void* map_block(int64_t size) {
#if defined(__linux__)
  // Over-map by one block and trim, so that the buffer starts on a huge-page boundary and every
  // page of it can be a huge one.
  const size_t span = size_t(size + kBlock);
  void* raw = ::mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  const uintptr_t begin = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = (begin + uintptr_t(kBlock) - 1) & ~uintptr_t(kBlock - 1);
  if (aligned > begin) ::munmap(raw, aligned - begin);
  const uintptr_t tail = begin + span - (aligned + uintptr_t(size));
  if (tail > 0) ::munmap(reinterpret_cast<void*>(aligned + uintptr_t(size)), tail);
  void* data = reinterpret_cast<void*>(aligned);
#if defined(MADV_HUGEPAGE)
  if (huge_pages_enabled()) ::madvise(data, size_t(size), MADV_HUGEPAGE);  // errors: no advice
#endif
  return data;
#else
  return std::aligned_alloc(size_t(kBlock), size_t(size));
#endif
}

void unmap_block(void* data, int64_t size) {
#if defined(__linux__)
  ::munmap(data, size_t(size));
#else
  (void)size;
  std::free(data);
#endif
}

struct Idle {
  void* data;
  int64_t size;
  uint64_t released;  // release order: the smallest was released longest ago
};

/// The process-wide state. Never destroyed: tensors freed while the program exits still release
/// their buffers here.
struct Cache {
  std::mutex mutex;
  bool limit_read = false;
  int64_t limit = 0;
  std::unordered_map<void*, int64_t> in_use;  // buffer -> size
  std::vector<Idle> idle;
  OutputCacheStats stats;
  uint64_t clock = 0;

  int64_t limit_locked() {
    if (!limit_read) limit = default_limit(), limit_read = true;
    return limit;
  }
  /// Gives back the idle buffers released longest ago until at most `keep` bytes stay idle; the
  /// buffers to unmap are returned, so that munmap runs outside the lock.
  std::vector<Idle> trim_locked(int64_t keep) {
    std::vector<Idle> freed;
    while (stats.idle_bytes > keep && !idle.empty()) {
      size_t oldest = 0;
      for (size_t i = 1; i < idle.size(); ++i)
        if (idle[i].released < idle[oldest].released) oldest = i;
      freed.push_back(idle[oldest]);
      stats.idle_bytes -= idle[oldest].size;
      idle[oldest] = idle.back();
      idle.pop_back();
    }
    return freed;
  }
};

extern Cache* the_cache;

Cache* create_cache() {
  Cache* c = new Cache;
#if defined(__linux__)
  // A child forked while another thread held the lock would wait for it forever: every fork
  // takes it first and both sides release it. The child inherits the idle buffers (its own
  // copies of the mappings) and uses them as its own.
  ::pthread_atfork([] { the_cache->mutex.lock(); }, [] { the_cache->mutex.unlock(); },
                   [] { the_cache->mutex.unlock(); });
#endif
  return c;
}

// Created while the library is loaded (static initialisation: one thread), not at the first use:
// a function-local static's initialisation guard, held by a thread creating the cache while
// another thread forked, left the child waiting for it forever (1 child in ~100 in
// OutputCacheFork). Nothing runs acquire_output from a static initialiser, and a use before this
// one would have created the cache itself (the_cache is zero before its dynamic initialisation),
// still on the one thread of static initialisation.
Cache* the_cache = the_cache != nullptr ? the_cache : create_cache();

Cache& cache() {
  if (the_cache == nullptr) the_cache = create_cache();
  return *the_cache;
}

void unmap_all(const std::vector<Idle>& freed) {
  for (const Idle& block : freed) unmap_block(block.data, block.size);
}

}  // namespace

void* acquire_output(int64_t bytes) {
  if (bytes > kMaxRequestBytes) return nullptr;
  if (bytes <= 0) bytes = 1;
  const int64_t size = (bytes + kBlock - 1) / kBlock * kBlock;
  Cache& c = cache();
  {
    std::lock_guard<std::mutex> lock(c.mutex);
    // Best fit within 1/8 more than asked; among equals the most recently released (its pages
    // are the likeliest to still sit in the caches and the TLB).
    size_t best = c.idle.size();
    for (size_t i = 0; i < c.idle.size(); ++i) {
      const Idle& b = c.idle[i];
      if (b.size < size || b.size > size + size / 8) continue;
      if (best == c.idle.size() || b.size < c.idle[best].size ||
          (b.size == c.idle[best].size && b.released > c.idle[best].released))
        best = i;
    }
    if (best != c.idle.size()) {
      const Idle block = c.idle[best];
      c.idle[best] = c.idle.back();
      c.idle.pop_back();
      c.stats.idle_bytes -= block.size;
      c.stats.in_use_bytes += block.size;
      ++c.stats.hits;
      c.in_use.emplace(block.data, block.size);
      return block.data;
    }
  }
  void* data = map_block(size);
  if (data == nullptr) return nullptr;
  std::lock_guard<std::mutex> lock(c.mutex);
  ++c.stats.misses;
  c.stats.in_use_bytes += size;
  c.in_use.emplace(data, size);
  return data;
}

void release_output(void* data) {
  Cache& c = cache();
  std::vector<Idle> freed;
  {
    std::lock_guard<std::mutex> lock(c.mutex);
    const auto it = c.in_use.find(data);
    if (it == c.in_use.end()) return;
    const int64_t size = it->second;
    c.in_use.erase(it);
    c.stats.in_use_bytes -= size;
    if (size > c.limit_locked()) {
      // It could never stay: give it back at once rather than evict every older buffer first.
      freed.push_back(Idle{data, size, 0});
    } else {
      c.idle.push_back(Idle{data, size, ++c.clock});
      c.stats.idle_bytes += size;
      freed = c.trim_locked(c.limit_locked());
    }
  }
  unmap_all(freed);
}

int64_t output_cache_limit() {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  return c.limit_locked();
}

bool output_cache_serves(int64_t bytes) {
  return bytes >= kOutputCacheMinBytes && output_cache_limit() > 0;
}

void set_output_cache_limit(int64_t bytes) {
  Cache& c = cache();
  std::vector<Idle> freed;
  {
    std::lock_guard<std::mutex> lock(c.mutex);
    c.limit = bytes < 0 ? 0 : bytes;
    c.limit_read = true;
    freed = c.trim_locked(c.limit);
  }
  unmap_all(freed);
}

void empty_output_cache() {
  Cache& c = cache();
  std::vector<Idle> freed;
  {
    std::lock_guard<std::mutex> lock(c.mutex);
    freed = c.trim_locked(0);
  }
  unmap_all(freed);
}

OutputCacheStats output_cache_stats() {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  OutputCacheStats s = c.stats;
  s.limit_bytes = c.limit_locked();
  return s;
}

}  // namespace moe_routing::detail
