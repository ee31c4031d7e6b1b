// The body of the CUDA backward kernel, as __host__ __device__ code so that the exact order can be
// unit-tested on a machine without a GPU (tests/cpp/test_cuda_host.cpp runs it on the CPU and
// compares with the reference).
//
// Thread mapping: an item is (output row i, column vector c) with c fastest; a vector is 16 bytes
// of columns (8 fp16/bf16 or 4 fp32) when rows and pointers are 16-byte aligned, else one element.
// A thread owns V items outright (no atomics, no cross-thread reduction): it walks the K addends of
// each in the order of the contract, loading D of them (for each of its V items) before using
// any, so D * V vector loads are in flight per thread, then sums them in float32 and stores each
// output vector once with one RNE narrowing.
//
// The order (docs/spec/moe_init_routing.md §1.6 / §1.7) as a walk: every addend is consumed exactly
// once, bin by bin.
//   tree:       bin b = (seed 2b, +0.0 if skipped) + even addends 2m (m = b + B, b + 2B, ...)
//               + odd addends 2m+1 (m = b, b + B, ...); the bins are then summed pairwise. The
//               pairwise tree over B = 2^L bins equals a binary-counter merge done as the bins
//               complete: bin b merges with the stacked partial sums of the levels where b has a
//               1 bit (stack[l] + carry, lower bins on the left) and is stacked at its lowest
//               0 bit; after bin B-1 the top of the stack is bin[0] of the in-place tree.
//   sequential: one bin, acc = +0.0, then acc + a_t for t = 0 .. K-1 (skipped addends add
//               nothing, and acc can never be -0.0, so skipping and adding +0.0 agree).
// Skipped addends (index -1, or >= skip_from) are never loaded.
#pragma once

#include <cstdint>

#include "cuda/numerics.cuh"

namespace moe_routing::cuda {

/// The walk over the K addends of one output element in contract order.
struct OrderWalk {
  int64_t top_k;
  int64_t bins;  // B (1 for sequential)
  bool sequential;
  int64_t step = 0, bin = 0, m = 0;
  bool odd = false;

  MOE_HD OrderWalk(int64_t top_k_, int64_t bins_, bool sequential_)
      : top_k(top_k_), bins(bins_), sequential(sequential_) {}

  /// The next addend: its slot t, the bin it belongs to, whether it opens the bin (start),
  /// whether it is the tree's seed (assigned, not added) and whether it closes the bin.
  /// (t < K <= INT32_MAX and bin < 64 fit 32 bits; the walk's own state is 64-bit.)
  MOE_HD void next(int32_t* t, int32_t* bin_of, bool* start, bool* seed, bool* end) {
    if (sequential) {
      *t = int32_t(step);
      *bin_of = 0;
      *start = step == 0;
      *seed = false;
      *end = step == top_k - 1;
      ++step;
      return;
    }
    *bin_of = int32_t(bin);
    if (!odd) {
      *t = int32_t(2 * m);
      *seed = *start = m == bin;
      m += bins;
      if (2 * m >= top_k) {  // even addends of this bin done: its odd ones follow
        odd = true;
        m = bin;
      }
    } else {
      *t = int32_t(2 * m + 1);
      *seed = *start = false;
      m += bins;
    }
    *end = odd && 2 * m + 1 >= top_k;
    if (*end) {
      ++bin;
      m = bin;
      odd = false;
    }
  }
};

/// Merges the finished bin `carry` (bin number b < B <= 2^kLevels) into the pairwise tree: it is
/// added to the stacked sums of the levels where b has a 1 bit and stacked at its lowest 0 bit.
/// `carry` keeps the merged sum, so after the last bin it holds the result (the last bin's merge
/// is the tree's root; what it would stack is never read, so kLevels stack levels suffice).
template <int kLevels, int W>
MOE_HD void merge_bin(float (&stack)[kLevels > 0 ? kLevels : 1][W], float (&carry)[W], int32_t b) {
  bool done = false;
  MOE_UNROLL
  for (int l = 0; l < kLevels; ++l) {
    if (!done) {
      if ((b >> l) & 1) {
        MOE_UNROLL
        for (int w = 0; w < W; ++w) carry[w] = num::add(stack[l][w], carry[w]);
      } else {
        MOE_UNROLL
        for (int w = 0; w < W; ++w) stack[l][w] = carry[w];
        done = true;
      }
    }
  }
}

/// `kBytes` bytes of `Tag::Storage` elements, loaded and stored as one access.
template <class Tag, int kBytes>
struct Vector {
  using S = typename Tag::Storage;
  static constexpr int W = kBytes / int(sizeof(S));
  struct alignas(kBytes) Pack {
    S e[W];
  };
  static_assert(sizeof(Pack) == size_t(kBytes), "a vector is kBytes bytes");

  MOE_HD static Pack load(const S* p) {
    Pack r;
#if defined(__CUDA_ARCH__)
    if constexpr (kBytes == 16) {
      const uint4 u = __ldg(reinterpret_cast<const uint4*>(p));
      memcpy(&r, &u, sizeof r);
    } else if constexpr (sizeof(S) == 4) {
      r.e[0] = __ldg(p);
    } else {
      r.e[0] = __ldg(reinterpret_cast<const unsigned short*>(p));
    }
#else
    std::memcpy(&r, p, sizeof r);
#endif
    return r;
  }
  MOE_HD static void store(S* p, const Pack& v) {
#if defined(__CUDA_ARCH__)
    *reinterpret_cast<Pack*>(p) = v;
#else
    std::memcpy(p, &v, sizeof v);
#endif
  }
};

/// All the kernel reads besides the template parameters.
struct GradArgs {
  const void* grad_expanded_x;      // [source_rows, H]
  const int32_t* expanded_row_idx;  // [N*K], every value checked (skipped or in range)
  void* grad_x;                     // [N, H]
  int64_t num_rows;                 // N
  int64_t top_k;                    // K
  int64_t hidden;                   // H
  int64_t skip_from;                // values >= skip_from (and -1) are skipped
  int64_t bins;                     // B of the tree order (1 for sequential)
  bool sequential;
  int64_t vectors_per_row;  // H / W
  bool items_fit_32_bits;   // N * vectors_per_row < 2^32: 32-bit division is enough
};

/// Computes the items first_item + k * item_stride, k < V (those below N * vectors_per_row).
/// D: addends loaded per round and item; kLevels: the tree's depth bound (B <= 2^kLevels).
template <class Tag, int kBytes, int D, int V, int kLevels>
MOE_HD void grad_items(const GradArgs& a, int64_t first_item, int64_t item_stride) {
  using Vec = Vector<Tag, kBytes>;
  using S = typename Tag::Storage;
  constexpr int W = Vec::W;
  const S* source = static_cast<const S*>(a.grad_expanded_x);
  S* output = static_cast<S*>(a.grad_x);
  const int64_t K = a.top_k, H = a.hidden;
  const int64_t total = a.num_rows * a.vectors_per_row;

  bool active[V];
  int64_t row[V];     // the item's output row
  int64_t column[V];  // its first column
  MOE_UNROLL
  for (int k = 0; k < V; ++k) {
    const int64_t item = first_item + int64_t(k) * item_stride;
    active[k] = item < total;
    row[k] = 0;
    if (active[k])
      row[k] = a.items_fit_32_bits ? int64_t(uint32_t(item) / uint32_t(a.vectors_per_row))
                                   : item / a.vectors_per_row;
    column[k] = active[k] ? (item - row[k] * a.vectors_per_row) * W : 0;
  }

  constexpr int kStack = kLevels > 0 ? kLevels : 1;
  float stack[V][kStack][W];  // every level is written before it is read (zeroed for compilers)
  float acc[V][W];            // the open bin; after the walk, the result
  MOE_UNROLL
  for (int k = 0; k < V; ++k) MOE_UNROLL
  for (int w = 0; w < W; ++w) {
    acc[k][w] = 0.0f;
    MOE_UNROLL
    for (int l = 0; l < kStack; ++l) stack[k][l][w] = 0.0f;
  }

  OrderWalk walk(K, a.bins, a.sequential);
  for (int64_t step0 = 0; step0 < K; step0 += D) {
    int32_t t[D], bin[D];
    bool valid[D], start[D], seed[D], end[D];
    MOE_UNROLL
    for (int u = 0; u < D; ++u) {
      valid[u] = step0 + u < K;
      t[u] = bin[u] = 0;
      start[u] = seed[u] = end[u] = false;
      if (valid[u]) walk.next(&t[u], &bin[u], &start[u], &seed[u], &end[u]);
    }
    // Round 1: the indices; round 2: the addend vectors (only the present ones).
    int32_t r[D][V];
    MOE_UNROLL
    for (int u = 0; u < D; ++u) MOE_UNROLL
    for (int k = 0; k < V; ++k) {
      const int32_t* index = a.expanded_row_idx + row[k] * K + t[u];
#if defined(__CUDA_ARCH__)
      r[u][k] = valid[u] && active[k] ? __ldg(index) : -1;
#else
      r[u][k] = valid[u] && active[k] ? *index : -1;
#endif
    }
    bool present[D][V];
    typename Vec::Pack value[D][V];
    MOE_UNROLL
    for (int u = 0; u < D; ++u) MOE_UNROLL
    for (int k = 0; k < V; ++k) {
      present[u][k] = !(r[u][k] == -1 || int64_t(r[u][k]) >= a.skip_from);
      value[u][k] = present[u][k] ? Vec::load(source + int64_t(r[u][k]) * H + column[k])
                                  : typename Vec::Pack{};
    }
    MOE_UNROLL
    for (int u = 0; u < D; ++u) {
      if (!valid[u]) continue;
      MOE_UNROLL
      for (int k = 0; k < V; ++k) {
        if (start[u]) MOE_UNROLL
        for (int w = 0; w < W; ++w) acc[k][w] = 0.0f;
        if (present[u][k]) {
          MOE_UNROLL
          for (int w = 0; w < W; ++w) {
            const float x = Tag::widen(value[u][k].e[w]);
            acc[k][w] = seed[u] ? x : num::add(acc[k][w], x);
          }
        }
        if constexpr (kLevels > 0) {  // kLevels 0: one bin, nothing to merge
          if (end[u]) merge_bin<kLevels, W>(stack[k], acc[k], bin[u]);
        }
      }
    }
  }
  MOE_UNROLL
  for (int k = 0; k < V; ++k) {
    if (!active[k]) continue;
    typename Vec::Pack out;
    MOE_UNROLL
    for (int w = 0; w < W; ++w) out.e[w] = Tag::narrow(acc[k][w]);
    Vec::store(output + row[k] * H + column[k], out);
  }
}

}  // namespace moe_routing::cuda
