#include "cases/grad_cases.h"

#include <algorithm>
#include <numeric>

namespace moe_routing::cases {

GradCase make_grad_case(Random& rng, GradScenario scenario, DType dtype, int64_t num_rows,
                        int64_t top_k, int64_t hidden, double drop_fraction) {
  GradCase c{scenario, dtype, num_rows, top_k, hidden, {}, {}, {}, {}};
  const int64_t pairs = num_rows * top_k;
  std::vector<int32_t> perm(static_cast<size_t>(pairs));
  std::iota(perm.begin(), perm.end(), 0);
  for (int64_t i = pairs - 1; i > 0; --i) std::swap(perm[i], perm[rng.integer(0, i)]);
  int64_t rows = pairs;
  c.attrs.top_k = top_k;
  if (scenario == GradScenario::dropless) {
    c.grad_shape = {rows, hidden};
  } else if (scenario == GradScenario::active) {
    rows = rng.integer(1, std::max<int64_t>(1, pairs));
    c.attrs.active_num = rows;
    c.grad_shape = {rows, hidden};
  } else {
    const int64_t experts = rng.integer(1, 9);
    const int64_t capacity = rng.integer(1, std::max<int64_t>(1, pairs / experts + 1));
    rows = experts * capacity;
    c.attrs.drop_pad_mode = 1;
    c.grad_shape = {experts, capacity, hidden};
    // Each slot used at most once; pairs beyond the slots are dropped (-1).
    for (int64_t p = 0; p < pairs; ++p) perm[p] = perm[p] < rows ? perm[p] : -1;
  }
  for (int64_t p = 0; p < pairs; ++p)
    if (rng.integer(0, 999) < int64_t(drop_fraction * 1000)) perm[p] = -1;
  c.expanded_row_idx = perm;
  std::vector<float> values(size_t(rows * hidden));
  for (float& v : values) v = random_value(rng);
  c.grad = FloatBuffer::from_floats(dtype, values);
  return c;
}

Status run_grad(GradCase& c, const Runner& runner, FloatBuffer* out) {
  *out = FloatBuffer(c.dtype, c.num_rows * c.hidden);
  out->poison();
  TensorView o(out->data(), c.dtype, {c.num_rows, c.hidden});
  return moe_init_routing_grad(c.grad_view(), c.idx_view(), c.attrs, o, runner.config());
}

}  // namespace moe_routing::cases
