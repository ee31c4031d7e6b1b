// AVX2 + F16C (compiled with -mavx2 -mf16c; chosen at run time only where the CPU has both).
#define MOE_ROUTING_CPU_ISA avx2
#include "cpu/avx2_vector.h"
#include "cpu/finalize_kernel_impl.h"
#include "cpu/pair_trees_avx.h"

namespace moe_routing::cpu::avx2 {
namespace {

/// The shared AVX2 Ops (cpu/avx2_vector.h) and what only these kernels need: V1's bfloat16
/// narrowing and grad_scales' trees, whose lanes are in column order (the levels above the
/// 16-column pair sums in cpu/pair_trees_avx.h).
struct FinalizeAvx2Ops : Avx2Ops, PairTrees {
  static_assert(W == kTreeColumns, "one AVX2 vector of 16 columns gives one vector of pair sums");
  template <bool Stream>
  static void store_bf16_half_away(uint16_t* dst, V v) {
    store_bf16<Stream, true>(dst, v);
  }

  /// The 8 adjacent-pair sums of a vector's 16 columns, in column order: for bfloat16 (even
  /// columns in lo, odd ones in hi) lo + hi, for the others (columns 0-7 in lo)
  /// natural_pair_sums.
  template <class Tag>
  static __m256 pair_sums(V v) {
    if constexpr (std::is_same_v<Tag, Bf16Tag>)
      return _mm256_add_ps(v.lo, v.hi);
    else
      return natural_pair_sums(v.lo, v.hi);
  }
  /// The 8 pair sums of the products of the 16 columns at j (the sources in locals: stores to
  /// the caller's arrays may alias anything).
  template <class Tag>
  static __m256 product_pairs(const typename Tag::storage* x, const typename Tag::storage* bias,
                              V g, int64_t j) {
    V v = load<Tag>(x + j);
    if (bias != nullptr) v = add(v, load<Tag>(bias + j));
    return pair_sums<Tag>(mul(v, g));
  }
  /// The adjacent-pair tree of Products::lanes over `count` (64 or 512) lanes, 16 columns per
  /// vector, its first level pair_sums (vertical for bfloat16).
  template <class Tag>
  static float product_tree(const Products<typename Tag::storage>& pr, int64_t n, int64_t count,
                            int64_t fold, int64_t folded) {
    const typename Tag::storage *x = pr.x, *bias = pr.bias, *gy = pr.gy;
    const int64_t vectors = count / W;  // 4 or 32
    alignas(32) __m256 pairs[detail::kGradScalesGroup / W];
    for (int64_t k = 0; k < vectors; ++k) {
      const int64_t j = k * W;
      if (j + W <= n && j + W <= folded) {
        const V g = load<Tag>(gy + j), gf = load<Tag>(gy + j + fold);
        V v = load<Tag>(x + j), vf = load<Tag>(x + j + fold);
        if (bias != nullptr)
          v = add(v, load<Tag>(bias + j)), vf = add(vf, load<Tag>(bias + j + fold));
        pairs[k] = pair_sums<Tag>(add(mul(v, g), mul(vf, gf)));
      } else if (j + W <= n && j >= folded) {
        pairs[k] = product_pairs<Tag>(x, bias, load<Tag>(gy + j), j);
      } else {
        pairs[k] = j < n ? ragged_pairs<Tag>(pr, j, n, fold, folded) : _mm256_setzero_ps();
      }
    }
    for (int64_t k = vectors; k < 8; ++k) pairs[k] = _mm256_setzero_ps();  // tree8 reads 8
    return pairs_tree(pairs, vectors);
  }
  /// out[j] = narrow(gy[j] * scale) for j < n (n <= 512; out 32-byte aligned where Stream), and
  /// the 512-lane product tree of columns [0, n): a row of grad_expanded_x with one pair and its
  /// atlas_a2 group, in one pass over the columns (grad_y read once). grad_y's lines are
  /// requested kFinalizePrefetchBytes ahead while that stays below column prefetch_left, and
  /// next_x's (the expanded_x row requested a run ahead, or null) at the same columns into L2.
  template <class Tag, bool Stream>
  static float scaled_row_and_tree(const Products<typename Tag::storage>& pr, float scale,
                                   typename Tag::storage* out, int64_t n, int64_t prefetch_left,
                                   const typename Tag::storage* next_x) {
    using S = typename Tag::storage;
    const S *x = pr.x, *bias = pr.bias, *gy = pr.gy;
    const V s = broadcast(scale);
    alignas(32) __m256 pairs[detail::kGradScalesGroup / W];
    int64_t k = 0;
    auto full_vectors = [&](auto has_bias) {
      constexpr bool kBias = decltype(has_bias)::value;
      auto column_vector = [&](int64_t k) {
        // expanded_x loaded before out is stored: FinalizeScalarOps::scaled_row_and_tree.
        const V g = load<Tag>(gy + k * W);
        const __m256 products = product_pairs<Tag>(x, kBias ? bias : nullptr, g, k * W);
        store<Tag, Stream>(out + k * W, mul(g, s));
        pairs[k] = products;
      };
      // Two vectors per step (a cache line of 16-bit grad_y), its lines requested ahead.
      constexpr int64_t kAhead = kFinalizePrefetchBytes / int64_t(sizeof(S));
      for (; (k + 2) * W <= n; k += 2) {
        if (next_x != nullptr)
          for (int64_t b = 0; b < 2 * W * int64_t(sizeof(S)); b += 64)
            __builtin_prefetch(reinterpret_cast<const char*>(next_x + k * W) + b, 0,
                               kFinalizeNextRowHint);
        if (k * W + kAhead < prefetch_left)
          for (int64_t b = 0; b < 2 * W * int64_t(sizeof(S)); b += 64)
            __builtin_prefetch(reinterpret_cast<const char*>(gy + k * W + kAhead) + b, 0, 3);
        column_vector(k);
        column_vector(k + 1);
      }
      if ((k + 1) * W <= n) column_vector(k++);
    };
    if (bias != nullptr)  // decided once per group, not per vector
      full_vectors(std::true_type{});
    else
      full_vectors(std::false_type{});
    if (k * W < n) {  // the ragged last vector
      for (int64_t j = k * W; j < n; ++j)
        FinalizeScalarOps::store<Tag>(out + j, Tag::widen(gy + j) * scale);
      pairs[k] = ragged_pairs<Tag>(pr, k * W, n, 0, 0);
      ++k;
    }
    for (; k < detail::kGradScalesGroup / W; ++k) pairs[k] = _mm256_setzero_ps();
    return pairs_tree(pairs, detail::kGradScalesGroup / W);
  }
};

}  // namespace

void finalize_kernel(const FinalizeKernelArgs& args, int64_t unit_begin, int64_t unit_end) {
  finalize_dispatch<FinalizeAvx2Ops>(args, unit_begin, unit_end);
}

void finalize_grad_rows(const FinalizeGradKernelArgs& args, int64_t row_begin, int64_t row_end) {
  grad_rows_dispatch<FinalizeAvx2Ops>(args, row_begin, row_end);
}

void finalize_grad_bias(const FinalizeGradKernelArgs& args, int64_t unit_begin, int64_t unit_end) {
  grad_bias_dispatch<FinalizeAvx2Ops>(args, unit_begin, unit_end);
}

}  // namespace moe_routing::cpu::avx2
