// Row copies whose destination bypasses the caches (non-temporal stores), for outputs far larger
// than the caches: no read-for-ownership of destination lines that are overwritten whole, and no
// eviction of the data still to be read. Callers issue a store fence (_mm_sfence) before the
// data is published to another thread.
#pragma once

#include <cstddef>

namespace moe_routing::cpu {

/// AVX2: 32-byte streaming stores where dst is 32-byte aligned (plain copies for the ragged
/// head and tail). Only call where the CPU has AVX2.
void stream_copy_avx2(char* dst, const char* src, size_t bytes);

}  // namespace moe_routing::cpu
