// The reference implementation of moe_init_routing_grad: kept plain on purpose. Every fast kernel,
// golden file and benchmark --verify is compared against it bit for bit.
#include "reference/moe_init_routing_grad.h"

#include <vector>

#include "core/float_env.h"

namespace moe_routing::reference {

void moe_init_routing_grad(const detail::GradProblem& problem) {
  // The kernels' float environment: a caller's flush-to-zero (torch.set_flush_denormal) must not
  // change the definition's bits.
  detail::DefaultFloatEnvironment float_environment;
  const MoeInitRoutingGradPlan& plan = problem.plan;
  const void* grad_expanded_x = problem.grad_expanded_x;
  const int32_t* expanded_row_idx = problem.expanded_row_idx;
  void* grad_x = problem.grad_x;
  const int64_t N = plan.num_rows, K = plan.top_k, H = plan.hidden;
  const TreeShape tree = tree_shape(K);
  std::vector<float> addend(size_t(K), 0.0f);
  std::vector<bool> present(size_t(K), false);
  std::vector<float> bin(size_t(tree.bins), 0.0f);
  for (int64_t i = 0; i < N; ++i) {
    for (int64_t j = 0; j < H; ++j) {
      for (int64_t t = 0; t < K; ++t) {
        const int64_t r = expanded_row_idx[i * K + t];
        present[t] = !(r == -1 || r >= plan.skip_from);
        addend[t] = present[t] ? load_as_float(grad_expanded_x, plan.dtype, r * H + j) : 0.0f;
      }
      float result = 0.0f;
      if (plan.order == AccumulationOrder::sequential) {
        // Ascend 950: acc = +0.0, then acc + (present ? a : +0.0) for t = 0..K-1.
        float acc = 0.0f;
        for (int64_t t = 0; t < K; ++t) acc = acc + (present[t] ? addend[t] : 0.0f);
        result = acc;
      } else {
        // Atlas A2/A3. Step 1: seed bin b with addend 2b (+0.0 if skipped).
        const int64_t B = tree.bins;
        for (int64_t b = 0; b < B; ++b) bin[b] = present[2 * b] ? addend[2 * b] : 0.0f;
        // Step 2: the remaining even addends, dealt round-robin.
        for (int64_t m = B; 2 * m < K; ++m)
          if (present[2 * m]) bin[m % B] = bin[m % B] + addend[2 * m];
        // Step 3: the odd addends, dealt round-robin from bin 0.
        for (int64_t m = 0; 2 * m + 1 < K; ++m)
          if (present[2 * m + 1]) bin[m % B] = bin[m % B] + addend[2 * m + 1];
        // Step 4: pairwise tree over the bins.
        for (int64_t s = 1; s < B; s *= 2)
          for (int64_t q = s; q < B; q += 2 * s) bin[q - s] = bin[q - s] + bin[q];
        result = bin[0];
      }
      store_from_float(grad_x, plan.dtype, i * H + j, result);
    }
  }
}

}  // namespace moe_routing::reference
