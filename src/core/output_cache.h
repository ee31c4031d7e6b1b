// A cache of large host buffers for the outputs a functional front end returns (the torch binding's
// new CPU tensors), so that a training or serving loop, which frees an output of the same size a
// step later, reuses memory that is already in place instead of having the OS fault in and zero
// new pages on every call (docs/PERFORMANCE.md, "What a training step sees": a fresh expanded_x
// cost 1.7-3.8x the kernel with huge pages, 12-19x without, all of it first touch). The same idea
// as PyTorch's CUDA caching allocator, for the host, bounded: buffers nobody uses are kept up to a
// limit of bytes and given back to the OS oldest first beyond it.
#pragma once

#include <cstdint>

namespace moe_routing::detail {

/// Outputs smaller than this are not cached: the C library's heap reuses them. From 1 MiB up it
/// did not always: glibc gave the top of its heap back and mapped it again between calls (a
/// 16-token DeepSeek-V3 forward's 1.8 MB expanded_x: 0.54 ms instead of 0.05 ms, PyTorch's
/// expression as slow).
constexpr int64_t kOutputCacheMinBytes = int64_t(1) << 20;

/// What the cache holds and has done (process-wide).
struct OutputCacheStats {
  int64_t limit_bytes = 0;   ///< most bytes kept idle (set_output_cache_limit / the environment)
  int64_t idle_bytes = 0;    ///< bytes of buffers kept for reuse, nobody using them
  int64_t in_use_bytes = 0;  ///< bytes of buffers handed out and not yet released
  int64_t hits = 0;          ///< acquisitions served by an idle buffer
  int64_t misses = 0;        ///< acquisitions that mapped new memory
  int64_t min_bytes = kOutputCacheMinBytes;  ///< front ends cache outputs of at least this size
};

/// A buffer of at least `bytes` bytes (2 MiB-aligned, its size rounded up to whole 2 MiB): an idle
/// one of that size (or at most 1/8 larger) if the cache holds one, the most recently released
/// first, else new memory from the OS, asked to be backed by huge pages where huge_pages_enabled()
/// (core/memory_hints.h). Its contents are unspecified (a reused buffer holds what its last user
/// wrote). nullptr when the OS refuses the memory or bytes > 2^62. Thread-safe.
void* acquire_output(int64_t bytes);

/// Returns a buffer from acquire_output to the cache: kept for reuse, after which the idle buffers
/// released longest ago are given back to the OS until at most the limit's bytes stay idle (a
/// buffer larger than the limit goes back to the OS at once). Pointers acquire_output did not
/// return are ignored. Thread-safe.
void release_output(void* data);

/// The limit of idle bytes, per process: MOE_ROUTING_OUTPUT_CACHE_MB (MiB; 0 turns the cache off:
/// every buffer goes back to the OS when released) when set to a whole number (else a warning on
/// stderr and the default), else 1/8 of the memory the process may use (physical memory, or the
/// cgroup's limit where lower). Read at the first use; set_output_cache_limit replaces it.
int64_t output_cache_limit();

/// Whether a front end takes an output of `bytes` bytes from the cache: at least
/// kOutputCacheMinBytes, and the cache on (its limit above 0). The one rule the torch binding and
/// the bench's functional calls follow.
bool output_cache_serves(int64_t bytes);

/// Sets the limit of idle bytes (>= 0), giving back what exceeds it now.
void set_output_cache_limit(int64_t bytes);

/// Gives every idle buffer back to the OS (buffers in use stay valid and are cached again when
/// released). Like torch.cuda.empty_cache for these outputs.
void empty_output_cache();

OutputCacheStats output_cache_stats();

/// The memory the default limit is 1/8 of: `physical` bytes, or the cap in the first of
/// `cap_files` that exists where it holds a smaller positive number (cgroup v2's memory.max, then
/// v1's memory.limit_in_bytes; "max" or v1's huge "no limit" value leave `physical`); 8 GiB when
/// neither gives a size. Exposed for tests (the real files cannot be set from a test).
int64_t memory_under_cgroup_cap(int64_t physical, const char* const* cap_files, int count);

}  // namespace moe_routing::detail
