// The CPU backend of moe_init_routing_grad: the thread count, the tiling into units of work, the
// instruction set, the parallel loop. The kernels themselves are grad_kernel_<isa>.cpp.
#include "cpu/grad_kernel.h"

#include <algorithm>

#include "core/memory_hints.h"
#include "core/thread_pool.h"
#include "cpu/cpu_backend.h"

namespace moe_routing::cpu {

int moe_init_routing_grad_threads(const MoeInitRoutingGradPlan& plan, int num_threads) {
  // num_rows * top_k * (hidden * element + 4), saturating instead of overflowing (no rows: any
  // hidden size is valid).
  const int64_t bytes = detail::saturating_mul(
      detail::saturating_mul(plan.num_rows, plan.top_k),
      detail::saturating_add(detail::saturating_mul(plan.hidden, int64_t(dtype_size(plan.dtype))),
                             4));
  return detail::threads_for_bytes(detail::resolve_num_threads(num_threads), bytes);
}

void moe_init_routing_grad(const detail::GradProblem& problem, int num_threads, CpuIsa isa) {
  const MoeInitRoutingGradPlan& plan = problem.plan;
  const int threads = moe_init_routing_grad_threads(plan, num_threads);
  detail::reserve_threads(threads);
  GradKernelArgs args;
  args.grad_expanded_x = problem.grad_expanded_x;
  args.expanded_row_idx = problem.expanded_row_idx;
  args.grad_x = problem.grad_x;
  args.plan = plan;
  args.register_bins = grad_register_bins(plan);
  args.bins = plan.order == AccumulationOrder::tree ? tree_shape(plan.top_k).bins : 1;
  const int64_t element = int64_t(dtype_size(plan.dtype));
  // Reads: a row of grad_expanded_x per pair, at most its source_rows.
  const int64_t rows_read =
      std::min(detail::saturating_mul(plan.num_rows, plan.top_k), plan.source_rows);
  const int64_t row_bytes = detail::saturating_mul(plan.hidden, element);
  args.stream_output = detail::streams_output(detail::saturating_mul(plan.num_rows, row_bytes),
                                              detail::saturating_mul(rows_read, row_bytes));
  args.tile_width = grad_unit_width(plan, threads);
  args.tiles_per_row = (plan.hidden + args.tile_width - 1) / args.tile_width;
  if (isa == CpuIsa::automatic) isa = best_cpu_isa();
  auto kernel = &baseline::grad_kernel;
#if defined(MOE_ROUTING_HAVE_AVX2)
  if (runs_avx2_code(isa)) kernel = &avx2::grad_kernel;
#endif
  detail::parallel_for(plan.num_rows * args.tiles_per_row, threads,
                       [&](int64_t begin, int64_t end) { kernel(args, begin, end); });
}

}  // namespace moe_routing::cpu
