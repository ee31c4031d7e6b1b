// Row copies of the forward routing. The streaming ones bypass the caches (non-temporal stores),
// for outputs far larger than the caches: no read-for-ownership of destination lines that are
// overwritten whole, and no eviction of the data still to be read; callers issue a store fence
// (_mm_sfence) before the data is published to another thread.
#pragma once

#include <cstddef>

// AVX2 code, in the namespace of its instruction set (see cpu/grad_kernel_impl.h).
namespace moe_routing::cpu::avx2 {

/// 32-byte streaming stores where dst is 32-byte aligned (plain copies for the ragged head and
/// tail). Only call where the CPU has AVX2.
void stream_copy(char* dst, const char* src, size_t bytes);

/// A plain vector copy (cached stores). Used for rows instead of memcpy, whose REP MOVSB path
/// runs up to 8x slower on some AMD CPUs when dst - src is not a multiple of 64 bytes (measured:
/// 14 KB rows, distance 16 mod 4096: 333 us vs 46 us for 128 rows). Only call where the CPU has
/// AVX2.
void copy(char* dst, const char* src, size_t bytes);

}  // namespace moe_routing::cpu::avx2
