#include "cpu/routing_sort.h"

#include <algorithm>

#include "core/thread_pool.h"

namespace moe_routing::cpu {
namespace {

/// Items per block at least: a block's histogram costs `buckets` to clear and to scan.
constexpr int64_t kMinItemsPerBlock = 4096;

int64_t choose_blocks(int64_t n, uint64_t buckets, int num_threads) {
  const int64_t per_block = std::max<int64_t>(kMinItemsPerBlock, int64_t(buckets));
  return std::max<int64_t>(1, std::min<int64_t>(num_threads, n / per_block));
}

/// One stable counting pass. Item j is j itself (kIdentity; items whose key is kNotRouted are
/// skipped) or input[j]; its bucket is (keys[item] >> shift) & mask. Returns the items written.
template <bool kIdentity>
int64_t counting_pass(const int32_t* input, int64_t n, const uint32_t* keys, int shift,
                      uint32_t mask, uint64_t buckets, int num_threads, int32_t* out,
                      int64_t* totals, int32_t* rank, int64_t* offsets) {
  const int64_t blocks = choose_blocks(n, buckets, num_threads);
  std::fill(offsets, offsets + size_t(blocks) * size_t(buckets), int64_t(0));
  auto block_begin = [&](int64_t b) { return n * b / blocks; };
  auto item = [&](int64_t j) -> int32_t { return kIdentity ? int32_t(j) : input[j]; };

  // 1. One histogram per contiguous block of items.
  detail::parallel_for(blocks, num_threads, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      int64_t* histogram = offsets + size_t(b) * buckets;
      for (int64_t j = block_begin(b), end = block_begin(b + 1); j < end; ++j) {
        const uint32_t key = keys[item(j)];
        if (kIdentity && key == kNotRouted) continue;
        ++histogram[(key >> shift) & mask];
      }
    }
  });
  // 2. Exclusive offsets, bucket-major then block-minor: equal keys keep block order.
  int64_t running = 0;
  for (uint64_t k = 0; k < buckets; ++k) {
    const int64_t bucket_start = running;
    for (int64_t b = 0; b < blocks; ++b) {
      int64_t& slot = offsets[size_t(b) * buckets + k];
      const int64_t count = slot;
      slot = running;
      running += count;
    }
    if (totals != nullptr) totals[k] = running - bucket_start;
  }
  // 3. Scatter, each block in ascending item order (rank: only in identity passes).
  detail::parallel_for(blocks, num_threads, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      int64_t* next = offsets + size_t(b) * buckets;
      for (int64_t j = block_begin(b), end = block_begin(b + 1); j < end; ++j) {
        const int32_t position = item(j);
        const uint32_t key = keys[position];
        if (kIdentity && key == kNotRouted) {
          if (rank != nullptr) rank[position] = -1;
          continue;
        }
        const int64_t destination = next[(key >> shift) & mask]++;
        out[destination] = position;
        if (rank != nullptr) rank[position] = int32_t(destination);
      }
    }
  });
  return running;
}

}  // namespace

int64_t sort_offsets_entries(int64_t n, uint64_t max_range, int num_threads) {
  // A pass with b buckets over n' <= n items uses choose_blocks(n', b, t) * b entries, with
  // b <= min(max_range, 2^16) (the radix passes never exceed 2^16 buckets). For b <= 4096 the
  // block count does not depend on b; above, blocks * b <= max(b, min(t * b, n)).
  const int64_t t = std::max(1, num_threads);
  const int64_t most = int64_t(std::min<uint64_t>(max_range, kDirectBuckets));
  const int64_t small =
      std::min(most, kMinItemsPerBlock) * std::max<int64_t>(1, std::min(t, n / kMinItemsPerBlock));
  const int64_t large = most > kMinItemsPerBlock ? std::max(most, std::min(t * most, n)) : 0;
  return std::max(small, large);
}

int64_t stable_counting_sort(const uint32_t* keys, int64_t n, uint64_t range, int num_threads,
                             int32_t* order, int32_t* scratch, int64_t* totals, int32_t* rank,
                             int64_t* offsets) {
  if (range <= kDirectBuckets)
    return counting_pass<true>(nullptr, n, keys, 0, 0xffffffffu, range, num_threads, order, totals,
                               rank, offsets);
  // LSD radix: a stable pass on the low 16 bits, then a stable pass on the high bits.
  const int64_t m = counting_pass<true>(nullptr, n, keys, 0, 0xffffu, kDirectBuckets, num_threads,
                                        scratch, nullptr, nullptr, offsets);
  counting_pass<false>(scratch, m, keys, 16, 0xffffu, ((range - 1) >> 16) + 1, num_threads, order,
                       nullptr, nullptr, offsets);
  if (totals != nullptr) {
    std::fill(totals, totals + range, int64_t(0));
    for (int64_t d = 0; d < m; ++d) ++totals[keys[order[d]]];
  }
  if (rank != nullptr) {
    detail::parallel_for(n, num_threads, [&](int64_t begin, int64_t end) {
      std::fill(rank + begin, rank + end, -1);
    });
    detail::parallel_for(m, num_threads, [&](int64_t begin, int64_t end) {
      for (int64_t d = begin; d < end; ++d) rank[order[d]] = int32_t(d);
    });
  }
  return m;
}

}  // namespace moe_routing::cpu
