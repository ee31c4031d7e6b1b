// AVX-512 F + BW + VL with AVX2 and F16C (compiled with -mavx512f -mavx512bw -mavx512vl -mavx2
// -mf16c; chosen at run time only where the CPU, and the OS's register state, have all of them).
// The combine's kernels only: the other operators run their AVX2 code at this level.
#define MOE_ROUTING_CPU_ISA avx512
#include "cpu/avx512_vector.h"
#include "cpu/finalize_kernel_impl.h"
#include "cpu/pair_trees_avx.h"

namespace moe_routing::cpu::avx512 {
namespace {

/// The AVX-512 Ops and what only these kernels need, as FinalizeAvx2Ops has them: V1's bfloat16
/// narrowing and grad_scales' trees. The trees' levels above the pair sums are the AVX2 ones
/// (cpu/pair_trees_avx.h), on the two 8-float halves of each vector's 16 pair sums.
struct FinalizeAvx512Ops : Avx512Ops, PairTrees {
  template <bool Stream>
  static void store_bf16_half_away(uint16_t* dst, V v) {
    store_bf16<Stream, true>(dst, v);
  }

  /// The 16 adjacent-pair sums (even column + odd column, as every ISA adds them) of a vector's
  /// 32 columns, in column order: for bfloat16 (even columns in lo, odd ones in hi) lo + hi, for
  /// the others (columns 0-15 in lo) the even and the odd columns gathered from lo:hi.
  template <class Tag>
  static __m512 pair_sums(V v) {
    if constexpr (std::is_same_v<Tag, Bf16Tag>) {
      return _mm512_add_ps(v.lo, v.hi);
    } else {
      const __m512i even =
          _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
      const __m512i odd =
          _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
      return _mm512_add_ps(_mm512_permutex2var_ps(v.lo, even, v.hi),
                           _mm512_permutex2var_ps(v.lo, odd, v.hi));
    }
  }
  /// 16 pair sums of 32 columns as the trees take them: two 8-float vectors of 16 columns.
  static void split(__m512 sums, __m256* pairs) {
    pairs[0] = _mm512_castps512_ps256(sums);
    pairs[1] = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(sums), 1));
  }
  /// The pair sums of the products of the 32 columns at j (the sources in locals: stores to
  /// the caller's arrays may alias anything).
  template <class Tag>
  static __m512 product_pairs(const typename Tag::storage* x, const typename Tag::storage* bias,
                              V g, int64_t j) {
    V v = load<Tag>(x + j);
    if (bias != nullptr) v = add(v, load<Tag>(bias + j));
    return pair_sums<Tag>(mul(v, g));
  }
  /// The 16-column pair sums of a ragged vector at j: from the scalar definition, up to n.
  template <class Tag>
  static void ragged_vector(const Products<typename Tag::storage>& pr, int64_t j, int64_t n,
                            int64_t fold, int64_t folded, __m256* pairs) {
    for (int64_t h = 0; h < W / kTreeColumns; ++h) {
      const int64_t c = j + h * kTreeColumns;
      pairs[h] = c < n ? ragged_pairs<Tag>(pr, c, n, fold, folded) : _mm256_setzero_ps();
    }
  }
  /// The adjacent-pair tree of Products::lanes over `count` (64 or 512) lanes, 32 columns per
  /// vector, its first level pair_sums.
  template <class Tag>
  static float product_tree(const Products<typename Tag::storage>& pr, int64_t n, int64_t count,
                            int64_t fold, int64_t folded) {
    const typename Tag::storage *x = pr.x, *bias = pr.bias, *gy = pr.gy;
    const int64_t vectors = count / kTreeColumns;  // 4 or 32 vectors of pair sums
    alignas(32) __m256 pairs[detail::kGradScalesGroup / kTreeColumns];
    for (int64_t j = 0; j < count; j += W) {
      __m256* at = pairs + j / kTreeColumns;
      if (j + W <= n && j + W <= folded) {
        const V g = load<Tag>(gy + j), gf = load<Tag>(gy + j + fold);
        V v = load<Tag>(x + j), vf = load<Tag>(x + j + fold);
        if (bias != nullptr)
          v = add(v, load<Tag>(bias + j)), vf = add(vf, load<Tag>(bias + j + fold));
        split(pair_sums<Tag>(add(mul(v, g), mul(vf, gf))), at);
      } else if (j + W <= n && j >= folded) {
        split(product_pairs<Tag>(x, bias, load<Tag>(gy + j), j), at);
      } else {
        ragged_vector<Tag>(pr, j, n, fold, folded, at);
      }
    }
    for (int64_t k = vectors; k < 8; ++k) pairs[k] = _mm256_setzero_ps();  // tree8 reads 8
    return pairs_tree(pairs, vectors);
  }
  /// out[j] = narrow(gy[j] * scale) for j < n (n <= 512; out kStreamAlign-aligned where Stream),
  /// and the 512-lane product tree of columns [0, n), in one pass over the columns (grad_y read
  /// once), as FinalizeAvx2Ops does. grad_y's lines are requested kFinalizePrefetchBytes ahead
  /// while that stays below column prefetch_left, and next_x's (the expanded_x row a run ahead, or
  /// null) at the same columns into L2.
  template <class Tag, bool Stream>
  static float scaled_row_and_tree(const Products<typename Tag::storage>& pr, float scale,
                                   typename Tag::storage* out, int64_t n, int64_t prefetch_left,
                                   const typename Tag::storage* next_x) {
    using S = typename Tag::storage;
    const S *x = pr.x, *bias = pr.bias, *gy = pr.gy;
    const V s = broadcast(scale);
    alignas(32) __m256 pairs[detail::kGradScalesGroup / kTreeColumns];
    int64_t j = 0;
    auto full_vectors = [&](auto has_bias) {
      constexpr bool kBias = decltype(has_bias)::value;
      constexpr int64_t kAhead = kFinalizePrefetchBytes / int64_t(sizeof(S));
      // One vector per step: a cache line of 16-bit grad_y, two of float32.
      for (; j + W <= n; j += W) {
        if (next_x != nullptr)
          for (int64_t b = 0; b < W * int64_t(sizeof(S)); b += 64)
            __builtin_prefetch(reinterpret_cast<const char*>(next_x + j) + b, 0,
                               kFinalizeNextRowHint);
        if (j + kAhead < prefetch_left)
          for (int64_t b = 0; b < W * int64_t(sizeof(S)); b += 64)
            __builtin_prefetch(reinterpret_cast<const char*>(gy + j + kAhead) + b, 0, 3);
        // expanded_x loaded before out is stored: FinalizeScalarOps::scaled_row_and_tree.
        const V g = load<Tag>(gy + j);
        const __m512 products = product_pairs<Tag>(x, kBias ? bias : nullptr, g, j);
        store<Tag, Stream>(out + j, mul(g, s));
        split(products, pairs + j / kTreeColumns);
      }
    };
    if (bias != nullptr)  // decided once per group, not per vector
      full_vectors(std::true_type{});
    else
      full_vectors(std::false_type{});
    if (j < n) {  // the ragged last vector
      for (int64_t c = j; c < n; ++c)
        FinalizeScalarOps::store<Tag>(out + c, Tag::widen(gy + c) * scale);
      ragged_vector<Tag>(pr, j, n, 0, 0, pairs + j / kTreeColumns);
      j += W;
    }
    for (int64_t k = j / kTreeColumns; k < detail::kGradScalesGroup / kTreeColumns; ++k)
      pairs[k] = _mm256_setzero_ps();
    return pairs_tree(pairs, detail::kGradScalesGroup / kTreeColumns);
  }
};

}  // namespace

void finalize_kernel(const FinalizeKernelArgs& args, int64_t unit_begin, int64_t unit_end) {
  finalize_dispatch<FinalizeAvx512Ops>(args, unit_begin, unit_end);
}

void finalize_grad_rows(const FinalizeGradKernelArgs& args, int64_t row_begin, int64_t row_end) {
  grad_rows_dispatch<FinalizeAvx512Ops>(args, row_begin, row_end);
}

void finalize_grad_bias(const FinalizeGradKernelArgs& args, int64_t unit_begin, int64_t unit_end) {
  grad_bias_dispatch<FinalizeAvx512Ops>(args, unit_begin, unit_end);
}

}  // namespace moe_routing::cpu::avx512
