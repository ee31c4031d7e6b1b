// Random cases of the backward (moe_init_routing_grad) for every scenario, and the sizes they are
// drawn at. Shared by the C++ tests, the CUDA backend's host and GPU tests, the C-ABI and CLI
// tests and tools/gpu_check.cpp.
#pragma once

#include <cstdint>
#include <vector>

#include "cases/random.h"
#include "cases/runner.h"
#include "cases/tensor.h"
#include "moe_routing/moe_init_routing_grad.h"
#include "moe_routing/status.h"

namespace moe_routing::cases {

struct GradCase {
  GradScenario scenario;
  DType dtype;
  int64_t num_rows, top_k, hidden;
  MoeInitRoutingGradAttrs attrs;
  std::vector<int64_t> grad_shape;
  FloatBuffer grad;
  std::vector<int32_t> expanded_row_idx;

  TensorView grad_view() {
    return TensorView(grad.data(), dtype, int(grad_shape.size()), grad_shape.data());
  }
  TensorView idx_view() {
    return TensorView(expanded_row_idx.data(), DType::int32, {int64_t(expanded_row_idx.size())});
  }
};

/// Floats spread over many binades so float32 rounding differs between orders.
inline float random_value(Random& rng) { return rng.uniform(int(rng.integer(-12, 12))); }

/// A valid random case of N = num_rows tokens, K = top_k, H = hidden. drop_fraction marks some
/// pairs -1 (skipped in every scenario); active: a random active_num; drop-pad: 1 to 9 experts of
/// a random capacity.
GradCase make_grad_case(Random& rng, GradScenario scenario, DType dtype, int64_t num_rows,
                        int64_t top_k, int64_t hidden, double drop_fraction = 0.1);

/// Runs a case on one runner into `out`, allocated here and poisoned first.
Status run_grad(GradCase& c, const Runner& runner, FloatBuffer* out);

/// Sizes (N, K, H) of the backward's comparisons across backends (the CUDA tests, gpu_check, the
/// C ABI against C++): a single element; K from 1 to 130, on and beside powers of two; H with and
/// without a tail beyond multiples of 8, a prime (257), model rows (7168: deepseek-v3, 4096:
/// qwen3-235b and mixtral).
struct GradShape {
  int64_t num_rows, top_k, hidden;
};
inline const GradShape kGradShapes[] = {
    {1, 1, 1},    {7, 2, 8},    {7, 3, 33},    {33, 3, 24},   {33, 8, 17}, {5, 4, 64},  {5, 128, 3},
    {13, 5, 100}, {9, 8, 7168}, {17, 8, 4096}, {8, 9, 40},    {6, 16, 16}, {6, 16, 72}, {6, 17, 72},
    {4, 33, 8},   {3, 128, 16}, {2, 130, 24},  {97, 2, 4096}, {64, 8, 257}};
/// Shapes with no element: no token, and no column.
inline const GradShape kEmptyGradShapes[] = {{0, 2, 5}, {13, 5, 0}};

}  // namespace moe_routing::cases
