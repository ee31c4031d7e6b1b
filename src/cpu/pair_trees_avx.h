// grad_scales' adjacent-pair trees on 8-float registers, shared by the AVX2 and AVX-512 combine
// kernels (finalize_kernel_avx2.cpp, finalize_kernel_avx512.cpp): both hand their pair sums over
// as 8-float vectors of 16 columns each, in column order, and the levels above are the same
// operations. Only for translation units that define MOE_ROUTING_CPU_ISA (avx2, avx512) and are
// compiled with at least -mavx2: each gets its own copy in its ISA's namespace
// (docs/ARCHITECTURE.md, "Per-ISA code").
#pragma once

#if !defined(MOE_ROUTING_CPU_ISA)
#error "define MOE_ROUTING_CPU_ISA (avx2, avx512) before including cpu/pair_trees_avx.h"
#endif

#include <immintrin.h>

#include <cstdint>

#include "cpu/finalize_kernel_impl.h"
#include "params/finalize_routing_problem.h"

namespace moe_routing::cpu::MOE_ROUTING_CPU_ISA {

struct PairTrees {
  /// Columns per vector of pair sums: 16 columns give one 8-float vector of adjacent-pair sums.
  static constexpr int64_t kTreeColumns = 16;
  /// Lane k of the result is the adjacent-pair tree ((v0 + v1) + (v2 + v3)) + ((v4 + v5) +
  /// (v6 + v7)) of vector k's lanes, for 8 vectors: two rounds of hadd sum adjacent pairs within
  /// 128-bit halves, the third adds the halves.
  static __m256 tree8(const __m256* v) {
    const __m256 a = _mm256_hadd_ps(_mm256_hadd_ps(v[0], v[1]), _mm256_hadd_ps(v[2], v[3]));
    const __m256 b = _mm256_hadd_ps(_mm256_hadd_ps(v[4], v[5]), _mm256_hadd_ps(v[6], v[7]));
    // a = [t0 t1 t2 t3 | u0 u1 u2 u3] (t: lanes 0-3 of v0..v3, u: lanes 4-7), b likewise for
    // v4..v7.
    return _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
  }
  /// The 8 adjacent-pair sums of the columns [0, 8) and [8, 16) in a and b, in column order:
  /// hadd gives [a01 a23 b01 b23 | a45 a67 b45 b67], the 64-bit permute puts b01 b23 after a67.
  static __m256 natural_pair_sums(__m256 a, __m256 b) {
    return _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_hadd_ps(a, b)), 0xd8));
  }
  /// The pair sums of Products::lanes for the 16 columns at j of a ragged vector (it ends past n
  /// or straddles `folded`), from the scalar definition.
  template <class Tag>
  static __m256 ragged_pairs(const Products<typename Tag::storage>& pr, int64_t j, int64_t n,
                             int64_t fold, int64_t folded) {
    alignas(32) float lanes[kTreeColumns];
    const int64_t f = folded - j;
    pr.at(j).template lanes<Tag>(n - j < kTreeColumns ? n - j : kTreeColumns, kTreeColumns, fold,
                                 f < 0 ? 0 : f, lanes);
    return natural_pair_sums(_mm256_load_ps(lanes), _mm256_load_ps(lanes + 8));
  }
  /// The tree of up to 32 vectors of pair sums (64 or 512 lanes): each 8 become one vector of
  /// 16-column trees (tree8); with 512 lanes the four of those become the four 128-column trees.
  static float pairs_tree(__m256* pairs, int64_t vectors) {
    __m256 blocks[8];
    for (int64_t b = 0; b < 8; ++b)
      blocks[b] = 8 * b < vectors ? tree8(pairs + 8 * b) : _mm256_setzero_ps();
    const __m256 top = vectors > 8 ? tree8(blocks) : blocks[0];
    alignas(32) float last[8];
    _mm256_store_ps(last, top);
    return (last[0] + last[1]) + (last[2] + last[3]);
  }
  /// The adjacent-pair tree over `count` lanes (64 or 512: 8 or 64 vectors).
  static float tree(const float* lanes, int64_t count) {
    __m256 level[detail::kGradScalesGroup / 8];
    int64_t vectors = count / 8;
    for (int64_t k = 0; k < vectors; ++k) level[k] = _mm256_loadu_ps(lanes + 8 * k);
    for (; vectors > 1; vectors /= 8)
      for (int64_t k = 0; k < vectors / 8; ++k) level[k] = tree8(level + 8 * k);
    alignas(32) float last[8];
    _mm256_store_ps(last, level[0]);
    return ((last[0] + last[1]) + (last[2] + last[3])) +
           ((last[4] + last[5]) + (last[6] + last[7]));
  }
};

}  // namespace moe_routing::cpu::MOE_ROUTING_CPU_ISA
