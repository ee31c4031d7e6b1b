// The stable counting sort of the forward routing: positions sorted by expert id, ties in
// ascending position, never a comparison sort.
#pragma once

#include <cstdint>

namespace moe_routing::cpu {

/// Key of a position that takes no part in the sort.
constexpr uint32_t kNotRouted = 0xffffffffu;
/// Key ranges up to this many buckets are sorted in one counting pass; larger ones (only ever
/// seen with huge expert ids) take two 16-bit LSD radix passes, each a stable counting pass.
constexpr uint64_t kDirectBuckets = uint64_t(1) << 16;

/// int64 entries of the `offsets` buffer stable_counting_sort needs, at most, for any n' <= n keys
/// whose range is <= max_range, with num_threads threads (a bound from sizes only, never data).
int64_t sort_offsets_entries(int64_t n, uint64_t max_range, int num_threads);

/// Writes the positions p in [0, n) whose keys[p] != kNotRouted into order[0, m), sorted stably
/// by key (equal keys keep ascending p), and returns m. Every key is < range (range <= 2^32 - 1).
///   scratch: n int32, used only when range > kDirectBuckets.
///   totals:  null, or `range` int64 that receive the number of positions with each key.
///   rank:    null, or n int32 that receive the inverse map: rank[order[d]] = d, and -1 for the
///            positions that are not sorted. In the one-pass case written during the scatter, in
///            ascending position (sequential writes).
///   offsets: sort_offsets_entries(n, range, num_threads) int64 (the per-block histograms).
/// Each pass splits [0, n) into contiguous blocks, one histogram per block; offsets are assigned
/// bucket-major then block-minor and every block scatters in ascending position, so the result is
/// the same for every thread count. Allocates nothing.
int64_t stable_counting_sort(const uint32_t* keys, int64_t n, uint64_t range, int num_threads,
                             int32_t* order, int32_t* scratch, int64_t* totals, int32_t* rank,
                             int64_t* offsets);

}  // namespace moe_routing::cpu
