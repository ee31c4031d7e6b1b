// The bodies of the CUDA kernels of moe_finalize_routing and its grad, as __host__ __device__ code
// so that their exact order can be tested on a machine without a GPU (tests/cpp/
// test_cuda_finalize_host.cpp runs them on the CPU and compares with the reference).
//
// Thread mapping (no atomics on data, no cross-thread reduction): an item is one output element.
//  * forward: item (token i, column j), c fastest; the thread walks the K pairs of token i in
//    increasing t, exactly the reference's steps (docs/moe_finalize_routing.md).
//  * grad_expanded_x: item (row r, column j); the thread sums row r's pairs from the pair lists
//    (the non-dropped pairs grouped by row in increasing pair index), first term assigned.
//  * grad_bias: item (expert e, column j), the same over expert e's pairs.
//  * grad_scales: one thread per pair, the whole reduction in the numerics' order: the
//    adjacent-pair trees are evaluated leaf by leaf with a binary-counter stack (the same
//    expression tree as level-by-level pairing), the ascend_950 halvings as the tree over
//    bit-reversed block sums that they are.
// Every operation is one IEEE operation (num::add / num::mul: __fadd_rn / __fmul_rn on the device);
// float16 and bfloat16 rounding goes through the hardware's round-to-nearest-even conversions
// (an fp16 (bf16) operation done in float32 and rounded once is the correctly rounded fp16 (bf16)
// operation: 24 >= 2*11 + 2 (2*8 + 2) bits).
#pragma once

#include <cstdint>

#include "cuda/numerics.cuh"
#include "params/finalize_routing_problem.h"

namespace moe_routing::cuda::finalize {

using detail::FinalizeRoutingGradProblem;
using detail::FinalizeRoutingProblem;
using detail::FinalizeTerm;

/// Element i of a floating tensor of `dtype`, widened exactly.
MOE_HD float load(const void* data, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::float16: return num::fp16_to_float(static_cast<const uint16_t*>(data)[i]);
    case DType::bfloat16: return num::bf16_to_float(static_cast<const uint16_t*>(data)[i]);
    default: return static_cast<const float*>(data)[i];
  }
}

/// v rounded once to `dtype` (round-to-nearest-even) and stored; NaN canonical.
MOE_HD void store(void* data, DType dtype, int64_t i, float v) {
  switch (dtype) {
    case DType::float16: static_cast<uint16_t*>(data)[i] = num::float_to_fp16(v); break;
    case DType::bfloat16: static_cast<uint16_t*>(data)[i] = num::float_to_bf16(v); break;
    default: static_cast<float*>(data)[i] = num::canonical(v); break;
  }
}

/// v rounded to `dtype` and widened back.
MOE_HD float round_to(DType dtype, float v) {
  switch (dtype) {
    case DType::float16: return num::round_to_fp16(v);
    case DType::bfloat16: return num::bf16_to_float(num::float_to_bf16(v));
    default: return v;
  }
}

// ---- the forward --------------------------------------------------------------------------------

/// out[i, j].
MOE_HD void finalize_item(const FinalizeRoutingProblem& p, int64_t i, int64_t j) {
  const int64_t H = p.hidden, K = p.top_k;
  const DType dt = p.dtype;
  auto step = [&p](float v) { return p.fp16_accumulate ? num::round_to_fp16(v) : v; };
  float acc = 0.0f;
  bool taken = false;
  if (p.x1 != nullptr) {
    const float a = load(p.x1, dt, i * H + j);
    if (p.x2 != nullptr)
      acc = step(num::add(a, load(p.x2, dt, i * H + j)));
    else
      acc = p.x1_plus_zero ? step(num::add(a, 0.0f)) : a;
    taken = true;
  } else if (!p.first_term_assigned) {
    taken = true;  // ascend_950: from +0, every term added
  }
  for (int64_t t = 0; t < K; ++t) {
    int64_t row = 0, expert = 0;
    const FinalizeTerm kind = p.term(i, t, &row, &expert);
    if (kind == FinalizeTerm::skip) continue;
    float e;
    if (kind == FinalizeTerm::row) {
      e = load(p.expanded_x, dt, row * H + j);
    } else if (kind == FinalizeTerm::copy) {
      e = load(p.x, dt, i * H + j);
    } else {
      const int64_t c = (expert - p.constant_start) * H + j;
      const float xv = load(p.x, dt, i * H + j);
      const float a1 = round_to(dt, num::mul(xv, load(p.alpha1, dt, c)));
      const float a2 = round_to(dt, num::mul(load(p.v, dt, c), load(p.alpha2, dt, c)));
      e = round_to(dt, num::add(a1, a2));
    }
    if (p.bias != nullptr)
      e = step(num::add(e, load(p.bias, dt, expert * H + j)));
    else if (p.zero_bias)
      e = step(num::add(e, 0.0f));
    if (p.scales != nullptr) e = step(num::mul(e, load(p.scales, p.scales_dtype, i * K + t)));
    acc = taken ? step(num::add(acc, e)) : e;
    taken = true;
  }
  if (p.bf16_half_away)
    static_cast<uint16_t*>(p.out)[i * H + j] = detail::bf16_half_away_from_bits(num::bits_of(acc));
  else
    store(p.out, dt, i * H + j, acc);
}

/// The index check of one pair, as check_moe_finalize_routing_indices: whether its row index is
/// valid (-1, cut by active_num, or a row) and, with bias, whether its expert id selects a row of
/// bias wherever one is read.
struct PairVerdict {
  bool row_ok;
  bool expert_ok;
};

MOE_HD PairVerdict check_pair(const FinalizeRoutingProblem& p, int64_t skip_to, int64_t experts,
                              int64_t i, int64_t t) {
  const int64_t r = p.expanded_row_idx[p.index_position(i, t)];
  PairVerdict v{r == -1 || (r >= 0 && r < skip_to), true};
  if (v.row_ok && p.bias != nullptr && r >= 0 && r < p.expanded_rows) {
    const int64_t e = p.expert_idx[i * p.top_k + t];
    const bool zero = e >= p.zero_start && e < p.zero_end;
    v.expert_ok = zero || (e >= 0 && e < experts);
  }
  return v;
}

// ---- the grad -----------------------------------------------------------------------------------

/// The index check of one grad pair q, as check_moe_finalize_routing_grad_indices.
MOE_HD PairVerdict check_grad_pair(const FinalizeRoutingGradProblem& p, int64_t skip_to,
                                   int64_t q) {
  const int64_t r = p.expanded_row_idx[q];
  PairVerdict v{r == -1 || (r >= 0 && r < skip_to), true};
  if (v.row_ok && p.bias != nullptr && r >= 0 && r < p.expanded_rows) {
    const int64_t e = p.expert_idx[q];
    v.expert_ok = e >= 0 && e < p.expert_num;
  }
  return v;
}

/// The sum over pairs[0, n) at column j: the first pair's term, then + each next one; a term is
/// f32(grad_y[i]) * f32(scales[q]), or grad_y[i] alone. +0 for no pairs.
MOE_HD float sum_pairs(const FinalizeRoutingGradProblem& p, const int32_t* pairs, int64_t n,
                       int64_t j) {
  float acc = 0.0f;
  for (int64_t k = 0; k < n; ++k) {
    const int64_t q = pairs[k];
    float term = load(p.grad_y, p.dtype, (q / p.top_k) * p.hidden + j);
    if (p.scales != nullptr) term = num::mul(term, load(p.scales, p.scales_dtype, q));
    acc = k == 0 ? term : num::add(acc, term);
  }
  return acc;
}

/// grad_expanded_x[r, j].
MOE_HD void grad_row_item(const FinalizeRoutingGradProblem& p, int64_t r, int64_t j) {
  const int32_t k0 = p.row_offsets[r];
  store(p.grad_expanded_x, p.dtype, r * p.hidden + j,
        sum_pairs(p, p.row_pairs + k0, p.row_offsets[r + 1] - k0, j));
}

/// grad_bias[e, j].
MOE_HD void grad_bias_item(const FinalizeRoutingGradProblem& p, int64_t e, int64_t j) {
  const int32_t k0 = p.expert_offsets[e];
  store(p.grad_bias, p.dtype, e * p.hidden + j,
        sum_pairs(p, p.expert_pairs + k0, p.expert_offsets[e + 1] - k0, j));
}

/// An adjacent-pair tree evaluated leaf by leaf: leaf s is added to the stacked sums of the levels
/// where s has a 1 bit (left operand the stacked one) and stacked at its lowest 0 bit; after the
/// last leaf of 2^L, `carry` is the root. kLevels bounds L.
template <int kLevels>
struct TreeStack {
  float stack[kLevels];
  float carry = 0.0f;
  int64_t leaves = 0;

  MOE_HD void push(float leaf) {
    carry = leaf;
    for (int level = 0; level < kLevels; ++level) {
      if (((leaves >> level) & 1) == 0) {
        stack[level] = carry;
        break;
      }
      carry = num::add(stack[level], carry);
    }
    ++leaves;
  }
};

/// f32(f32(x[r, j] + bias[e, j]) * grad_y[i, j]) (no bias: f32(x * grad_y)), 0 beyond H.
struct PairProducts {
  const FinalizeRoutingGradProblem* p;
  int64_t x_row, bias_row, gy_row;  // element offsets, bias_row < 0 without bias

  MOE_HD float operator()(int64_t j) const {
    if (j >= p->hidden) return 0.0f;
    float v = load(p->expanded_x, p->dtype, x_row + j);
    if (bias_row >= 0) v = num::add(v, load(p->bias, p->dtype, bias_row + j));
    return num::mul(v, load(p->grad_y, p->dtype, gy_row + j));
  }
};

/// atlas_a2: per chunk, a 512-lane tree per group (missing lanes +0) added in order; chunks in
/// order from +0.
MOE_HD float reduce_atlas_a2(const FinalizeRoutingGradProblem& p, const PairProducts& product) {
  constexpr int64_t G = detail::kGradScalesGroup;
  float total = 0.0f;
  for (int64_t c0 = 0; c0 < p.hidden; c0 += p.chunk) {
    const int64_t c1 = p.hidden - c0 < p.chunk ? p.hidden : c0 + p.chunk;
    float chunk_sum = 0.0f;
    for (int64_t g0 = c0; g0 < c1; g0 += G) {
      TreeStack<9> tree;  // 2^9 = 512 leaves
      for (int64_t k = 0; k < G; ++k) tree.push(g0 + k < c1 ? product(g0 + k) : 0.0f);
      chunk_sum = num::add(chunk_sum, tree.carry);
    }
    total = num::add(total, chunk_sum);
  }
  return total;
}

/// ascend_950: H <= 64 one 64-lane tree; else the fold at Q, 64-lane block trees, the halvings
/// (the tree over block sums m + sums * bitrev(s)), a final 64-lane tree.
MOE_HD float reduce_ascend_950(const FinalizeRoutingGradProblem& p, const PairProducts& product) {
  constexpr int64_t B = detail::kGradScalesBlock;
  const int64_t H = p.hidden;
  if (H <= B) {
    TreeStack<6> tree;
    for (int64_t k = 0; k < B; ++k) tree.push(product(k));
    return tree.carry;
  }
  const int64_t Q = detail::grad_scales_fold(H);
  const int64_t blocks = Q / B, sums = blocks < B ? blocks : B, leaves = blocks / sums;
  int leaf_bits = 0;
  while ((int64_t(1) << leaf_bits) < leaves) ++leaf_bits;
  TreeStack<6> final_tree;
  for (int64_t m = 0; m < B; ++m) {
    if (m >= sums) {
      final_tree.push(0.0f);
      continue;
    }
    TreeStack<32> halvings;
    for (int64_t s = 0; s < leaves; ++s) {
      int64_t reversed = 0;
      for (int b = 0; b < leaf_bits; ++b) reversed |= ((s >> b) & 1) << (leaf_bits - 1 - b);
      const int64_t j0 = (m + sums * reversed) * B;
      TreeStack<6> block;
      for (int64_t k = 0; k < B; ++k) {
        const int64_t j = j0 + k;
        block.push(j < H - Q ? num::add(product(j), product(j + Q)) : product(j));
      }
      halvings.push(block.carry);
    }
    final_tree.push(halvings.carry);
  }
  return final_tree.carry;
}

/// grad_scales[q].
MOE_HD void grad_scales_item(const FinalizeRoutingGradProblem& p, int64_t q) {
  float result = 0.0f;  // a dropped pair's gradient is 0
  if (!p.dropped(q)) {
    const int64_t H = p.hidden;
    PairProducts product{&p, int64_t(p.expanded_row_idx[q]) * H,
                         p.bias != nullptr ? int64_t(p.expert_idx[q]) * H : -1, (q / p.top_k) * H};
    result = p.tree_order ? reduce_atlas_a2(p, product) : reduce_ascend_950(p, product);
  }
  store(p.grad_scales, p.scales_dtype, q, result);
}

}  // namespace moe_routing::cuda::finalize
