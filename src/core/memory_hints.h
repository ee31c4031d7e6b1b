// When the kernels write their outputs with non-temporal (cache-bypassing) stores.
#pragma once

#include <cstdint>

namespace moe_routing::detail {

/// Outputs at least this large are written with non-temporal stores: the size of one instance of
/// the last-level cache as Linux's sysfs reports it for CPU 0 (else sysconf's L3 size; at least
/// 8 MiB; 32 MiB where the OS does not tell). A smaller output is written
/// through the cache, where the next operation (the expert GEMM, the next layer) finds it; a
/// larger one would only evict everything else, and streaming it also saves the
/// read-for-ownership of every line. Measured on a 32 MiB-L3 VM: a 15-29 MB forward output
/// took 1.3-2.5x longer streamed, a 117 MB one twice as long cached.
int64_t streaming_store_threshold();

/// Tests only: overrides the threshold (bytes > 0), or restores the default (0).
void set_streaming_store_threshold_for_testing(int64_t bytes);

}  // namespace moe_routing::detail
