// The reference of moe_finalize_routing_grad, kept plain on purpose
// (docs/spec/moe_finalize_routing.md §4 and its Decisions).
#include "reference/moe_finalize_routing_grad.h"

#include <vector>

#include "core/float_env.h"

namespace moe_routing::reference {
namespace {

/// The adjacent-pair binary tree over `lanes` (a power of two): level by level, lane k of the
/// next level is lane 2k + lane 2k+1 of this one.
float adjacent_tree(std::vector<float> lanes) {
  for (size_t width = lanes.size(); width > 1; width /= 2)
    for (size_t k = 0; k < width / 2; ++k) lanes[k] = lanes[2 * k] + lanes[2 * k + 1];
  return lanes[0];
}

/// `count` values from `values` into a tree of `width` lanes; missing lanes are +0.
float padded_tree(const float* values, int64_t count, int64_t width) {
  std::vector<float> lanes(size_t(width), 0.0f);
  for (int64_t k = 0; k < count; ++k) lanes[size_t(k)] = values[k];
  return adjacent_tree(lanes);
}

/// atlas_a2: chunks of `chunk` products; in each, 512-lane trees over consecutive groups added in
/// order; the chunk sums added in order from +0.
float sum_atlas_a2(const std::vector<float>& products, int64_t chunk) {
  const int64_t H = int64_t(products.size());
  float total = 0.0f;
  for (int64_t c0 = 0; c0 < H; c0 += chunk) {
    const int64_t c1 = c0 + chunk < H ? c0 + chunk : H;
    float chunk_sum = 0.0f;
    for (int64_t g0 = c0; g0 < c1; g0 += detail::kGradScalesGroup) {
      const int64_t n = c1 - g0 < detail::kGradScalesGroup ? c1 - g0 : detail::kGradScalesGroup;
      chunk_sum = chunk_sum + padded_tree(products.data() + g0, n, detail::kGradScalesGroup);
    }
    total = total + chunk_sum;
  }
  return total;
}

/// ascend_950: one 64-lane tree for H <= 64; else the fold at Q (the largest power of two <= H),
/// a 64-lane tree per block of 64, halving while more than 64 block sums remain, a final tree.
float sum_ascend_950(std::vector<float> products) {
  const int64_t H = int64_t(products.size()), B = detail::kGradScalesBlock;
  if (H <= B) return padded_tree(products.data(), H, B);
  const int64_t Q = detail::grad_scales_fold(H);
  for (int64_t j = 0; j < H - Q; ++j)
    products[size_t(j)] = products[size_t(j)] + products[size_t(j + Q)];
  std::vector<float> blocks;
  for (int64_t b = 0; b < Q; b += B) blocks.push_back(padded_tree(products.data() + b, B, B));
  while (blocks.size() > size_t(B)) {
    const size_t half = blocks.size() / 2;
    for (size_t m = 0; m < half; ++m) blocks[m] = blocks[m] + blocks[m + half];
    blocks.resize(half);
  }
  return padded_tree(blocks.data(), int64_t(blocks.size()), B);
}

}  // namespace

void moe_finalize_routing_grad(const detail::FinalizeRoutingGradProblem& p) {
  detail::DefaultFloatEnvironment float_environment;
  const int64_t N = p.num_rows, K = p.top_k, H = p.hidden, R = p.expanded_rows;
  const DType dt = p.dtype;
  // The non-dropped pairs of each row and of each expert, in increasing pair index.
  std::vector<std::vector<int64_t>> row_pairs(static_cast<size_t>(R));
  std::vector<std::vector<int64_t>> expert_pairs(static_cast<size_t>(p.expert_num));
  for (int64_t q = 0; q < N * K; ++q) {
    if (p.dropped(q)) continue;
    row_pairs[size_t(p.expanded_row_idx[q])].push_back(q);
    if (p.grad_bias != nullptr) expert_pairs[size_t(p.expert_idx[q])].push_back(q);
  }
  // The term pair q adds at column j: f32(grad_y) * f32(scale), or grad_y alone.
  auto term = [&](int64_t q, int64_t j) {
    const float g = load_as_float(p.grad_y, dt, (q / K) * H + j);
    return p.scales != nullptr ? g * load_as_float(p.scales, p.scales_dtype, q) : g;
  };
  // A sum over pairs starts with its first term; +0 when there is none.
  auto sum_pairs = [&](const std::vector<int64_t>& pairs, int64_t j) {
    float acc = 0.0f;
    for (size_t k = 0; k < pairs.size(); ++k)
      acc = k == 0 ? term(pairs[k], j) : acc + term(pairs[k], j);
    return acc;
  };
  // grad_scales first, into scratch: its trees allocate, and nothing may be allocated once an
  // output has been written (an allocation failure would leave outputs half written).
  std::vector<float> grad_scales;
  if (p.grad_scales != nullptr) {
    grad_scales.assign(size_t(N * K), 0.0f);  // a dropped pair's gradient is 0
    std::vector<float> products(static_cast<size_t>(H));
    for (int64_t q = 0; q < N * K; ++q) {
      if (p.dropped(q)) continue;
      const int64_t r = p.expanded_row_idx[q], i = q / K;
      for (int64_t j = 0; j < H; ++j) {
        float xv = load_as_float(p.expanded_x, dt, r * H + j);
        if (p.bias != nullptr) xv = xv + load_as_float(p.bias, dt, p.expert_idx[q] * H + j);
        products[size_t(j)] = xv * load_as_float(p.grad_y, dt, i * H + j);
      }
      grad_scales[size_t(q)] =
          p.tree_order ? sum_atlas_a2(products, p.chunk) : sum_ascend_950(products);
    }
  }
  for (int64_t r = 0; r < R; ++r)
    for (int64_t j = 0; j < H; ++j)
      store_from_float(p.grad_expanded_x, dt, r * H + j, sum_pairs(row_pairs[size_t(r)], j));
  if (p.grad_bias != nullptr)
    for (int64_t e = 0; e < p.expert_num; ++e)
      for (int64_t j = 0; j < H; ++j)
        store_from_float(p.grad_bias, dt, e * H + j, sum_pairs(expert_pairs[size_t(e)], j));
  for (size_t q = 0; q < grad_scales.size(); ++q)
    store_from_float(p.grad_scales, p.scales_dtype, int64_t(q), grad_scales[q]);
}

}  // namespace moe_routing::reference
