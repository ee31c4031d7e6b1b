// When the kernels write their outputs with non-temporal (cache-bypassing) stores, and what the
// library asks of the OS for the output buffers a front end allocates (huge pages).
#pragma once

#include <cstdint>

namespace moe_routing::detail {

/// Outputs at least this large are written with non-temporal stores:
/// streaming_store_threshold_for_cache(last_level_cache_bytes()). A smaller output is written
/// through the cache, where the next operation (the expert GEMM, the next layer) finds it; a
/// larger one would only evict everything else, and streaming it also saves the
/// read-for-ownership of every line. Kernels ask streams_output, which also looks at the reads.
int64_t streaming_store_threshold();

/// Whether a call writes its output with non-temporal stores: where the output, or what the call
/// reads, is at least streaming_store_threshold(). Writing through the cache costs a read for
/// ownership of every line of the output, in full, and leaves for the next operation only what
/// the call's later traffic did not evict: of an output written evenly by a call that moves T
/// bytes through a cache of C, about C / T. With reads of at least C that is less than the whole,
/// and it shrinks as the reads grow. Measured on an AMD Zen 4 VM (32 MiB L3, 2 threads, paired
/// calls): combines that read 32-128 MiB of rows into a 4-16 MiB output took 4-9 % less time
/// streamed, the dispatch backward of the same shapes 5-10 % less (docs/PERFORMANCE.md, "Outputs
/// of calls that read more than the cache").
/// Negative byte counts count as 0; callers pass saturated products.
bool streams_output(int64_t output_bytes, int64_t read_bytes);

/// Bytes of one instance of the last-level cache as Linux's sysfs reports it for CPU 0 (else
/// sysconf's L3 size); 0 where the OS does not tell.
int64_t last_level_cache_bytes();

/// The streaming threshold for a last-level cache of `cache_bytes` (0: unknown): the cache's size
/// within [8 MiB, 32 MiB], 32 MiB where unknown. Measured on a VM with a 32 MiB L3: a 15-29 MB
/// forward output took 1.3-2.5x longer streamed, a 117 MB one twice as long cached. The cap:
/// a larger reported cache is a big server's socket-wide L3, shared with cores the process does
/// not see (a 2-vCPU VM on such a host reports all 480 MiB of it as its own); written through
/// it, the 30-470 MB training-size outputs ran 1.1-2x slower than streamed (the dispatch's
/// forward 2x, the combine's backward 1.4x; docs/PERFORMANCE.md, "On an Intel VM").
int64_t streaming_store_threshold_for_cache(int64_t cache_bytes);
constexpr int64_t kStreamingStoreMinBytes = int64_t(8) << 20;
constexpr int64_t kStreamingStoreMaxBytes = int64_t(32) << 20;

/// Tests only: overrides the threshold (bytes > 0), or restores the default (0).
void set_streaming_store_threshold_for_testing(int64_t bytes);

/// Whether advise_huge_pages gives advice (and the output cache advises its new memory): on
/// Linux, unless the environment variable MOE_ROUTING_HUGE_PAGES is 0 - read once, at the first
/// use, as the library's other variables are (a getenv racing another thread's setenv is
/// undefined behaviour) - or set_huge_pages_enabled replaced it. Thread-safe.
bool huge_pages_enabled();

/// Turns the huge-page advice on or off for the process from now on (off Linux there is none).
/// What a process changes at run time instead of the environment. Thread-safe.
void set_huge_pages_enabled(bool enabled);

/// The setting MOE_ROUTING_HUGE_PAGES's value (nullptr: unset) gives: a whole number 0 (off) or 1
/// (on), read as core/environment.h reads every variable; anything else warns on stderr and gives
/// the default, on. Exposed for tests (the variable is read once per process).
bool huge_pages_from_env(const char* value);

/// Buffers smaller than this get no huge-page advice: they hold at most one aligned 2 MiB page,
/// and buffers of such sizes often come from the allocator's reused heap.
constexpr int64_t kHugePageAdviceMinBytes = int64_t(4) << 20;

/// Asks the OS for transparent huge pages (madvise MADV_HUGEPAGE) for the 2 MiB-aligned interior
/// of [data, data + bytes), if huge_pages_enabled(), bytes >= kHugePageAdviceMinBytes and the
/// interior is not in memory yet (its first page, mincore: reused memory gains nothing). For
/// the buffers a front end has just allocated for a call's outputs and nobody has written yet:
/// the interior's pages belong to that buffer alone, and the advice takes effect as they are
/// first touched - one fault and one zeroing per 2 MiB instead of 512 faults of 4 KiB. A fresh
/// training-size output took several times its kernel's time in 4 KiB faults
/// (docs/PERFORMANCE.md, "What a training step sees"). The advice changes no value and outlives
/// the buffer (the allocator may hand the range out again, still advised), as PyTorch's own
/// THP_MEM_ALLOC_ENABLE does. The OS may refuse it (no THP in the kernel) or ignore it (THP mode
/// `never`, no huge page free); errors are ignored. Returns whether the OS accepted the advice.
bool advise_huge_pages(void* data, int64_t bytes);

}  // namespace moe_routing::detail
