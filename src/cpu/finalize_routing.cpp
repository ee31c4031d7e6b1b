// The CPU launchers of moe_finalize_routing and its grad: units of work, threads, ISA. Results
// never depend on the split: every output element is computed whole by one unit in the fixed order.
#include <cstdint>
#include <cstring>

#include "core/memory_hints.h"
#include "core/thread_pool.h"
#include "cpu/finalize_kernel.h"

namespace moe_routing::cpu {
namespace {

/// Columns per unit: whole rows when there are enough rows to feed every thread (four units each),
/// else rows cut into tiles (multiples of 64 columns, at least 256). Rows with more terms than one
/// pass takes keep running sums per tile, so their tiles are at most kFinalizeAccColumns wide.
int64_t unit_width(int64_t rows, int64_t hidden, int threads, int64_t max_width) {
  const int64_t H = hidden > 0 ? hidden : 1;
  const int64_t wanted_units = 4 * int64_t(threads);
  int64_t width = H;
  if (rows < wanted_units) {
    const int64_t pieces = (wanted_units + rows - 1) / (rows > 0 ? rows : 1);
    width = (H + pieces - 1) / pieces;
    width = (width + 63) / 64 * 64;
    width = width < 256 ? 256 : width;
  }
  return width < max_width ? width : max_width;
}

/// a * b, or INT64_MAX where that overflows (the byte counts only choose thread counts).
int64_t saturating_mul(int64_t a, int64_t b) {
  if (a == 0 || b == 0) return 0;
  return a > INT64_MAX / b ? INT64_MAX : a * b;
}

}  // namespace

void moe_finalize_routing(const detail::FinalizeRoutingProblem& problem, CpuIsa isa,
                          int num_threads) {
  const int64_t N = problem.num_rows, K = problem.top_k, H = problem.hidden;
  if (N == 0 || H == 0) return;
  const int64_t element = int64_t(dtype_size(problem.dtype));
  // Traffic: each output row, its sources and the inputs read per row.
  const int64_t bytes = saturating_mul(N * H * element, K + 2);
  const int threads = detail::threads_for_bytes(detail::resolve_num_threads(num_threads), bytes);
  FinalizeKernelArgs args{problem, 0, 0, false};
  args.tile_width =
      unit_width(N, H, threads, K > kFinalizeTermsPerPass ? kFinalizeAccColumns : INT64_MAX);
  args.tiles_per_row = (H + args.tile_width - 1) / args.tile_width;
  args.stream_output = N * H * element >= detail::streaming_store_threshold();
  auto kernel = &baseline::finalize_kernel;
#if defined(MOE_ROUTING_HAVE_AVX2)
  if (isa == CpuIsa::avx2) kernel = &avx2::finalize_kernel;
#else
  static_cast<void>(isa);
#endif
  detail::parallel_for(N * args.tiles_per_row, threads,
                       [&](int64_t begin, int64_t end) { kernel(args, begin, end); });
}

uint64_t finalize_grad_workspace_bytes(int64_t pairs, int64_t expanded_rows, int64_t experts,
                                       bool grad_bias) {
  uint64_t ints = uint64_t(expanded_rows) + 2 + uint64_t(pairs);
  if (grad_bias) ints += uint64_t(experts) + 2 + uint64_t(pairs);
  return ints * sizeof(int32_t) + alignof(int32_t);
}

namespace {

/// Counting sort of the non-dropped pairs by key (increasing pair index within a key): offsets
/// [keys + 2], of which [0, keys] are used (offsets[k] .. offsets[k + 1] are key k's pairs).
template <class KeyOf>
void build_pair_lists(int64_t pairs, int64_t keys, const detail::FinalizeRoutingGradProblem& p,
                      KeyOf key_of, int32_t* offsets, int32_t* sorted) {
  std::memset(offsets, 0, size_t(keys + 2) * sizeof(int32_t));
  for (int64_t q = 0; q < pairs; ++q)
    if (!p.dropped(q)) ++offsets[key_of(q) + 2];
  for (int64_t k = 2; k < keys + 2; ++k) offsets[k] += offsets[k - 1];
  for (int64_t q = 0; q < pairs; ++q)  // offsets[k + 1] runs from the start of k to its end
    if (!p.dropped(q)) sorted[offsets[key_of(q) + 1]++] = int32_t(q);
}

}  // namespace

void moe_finalize_routing_grad(detail::FinalizeRoutingGradProblem p, CpuIsa isa, int num_threads,
                               void* workspace) {
  const int64_t N = p.num_rows, K = p.top_k, H = p.hidden, R = p.expanded_rows;
  const int64_t pairs = N * K, E = p.expert_num;
  // The pair lists, in the caller's (or our) workspace, aligned for int32.
  uintptr_t base = reinterpret_cast<uintptr_t>(workspace);
  base = (base + alignof(int32_t) - 1) / alignof(int32_t) * alignof(int32_t);
  int32_t* ints = reinterpret_cast<int32_t*>(base);
  int32_t* row_offsets = ints;
  int32_t* row_pairs = row_offsets + R + 2;
  build_pair_lists(
      pairs, R, p, [&](int64_t q) { return int64_t(p.expanded_row_idx[q]); }, row_offsets,
      row_pairs);
  p.row_offsets = row_offsets;
  p.row_pairs = row_pairs;
  if (p.grad_bias != nullptr) {
    int32_t* expert_offsets = row_pairs + pairs;
    int32_t* expert_pairs = expert_offsets + E + 2;
    build_pair_lists(
        pairs, E, p, [&](int64_t q) { return int64_t(p.expert_idx[q]); }, expert_offsets,
        expert_pairs);
    p.expert_offsets = expert_offsets;
    p.expert_pairs = expert_pairs;
  }
  // A dropped pair's grad_scales is 0, and so is every pair's when there are no columns to sum.
  if (p.grad_scales != nullptr)
    for (int64_t q = 0; q < pairs; ++q)
      if (H == 0 || p.dropped(q)) store_from_float(p.grad_scales, p.scales_dtype, q, 0.0f);
  if (H == 0) return;

  const int64_t element = int64_t(dtype_size(p.dtype));
  auto rows_kernel = &baseline::finalize_grad_rows;
  auto bias_kernel = &baseline::finalize_grad_bias;
#if defined(MOE_ROUTING_HAVE_AVX2)
  if (isa == CpuIsa::avx2) {
    rows_kernel = &avx2::finalize_grad_rows;
    bias_kernel = &avx2::finalize_grad_bias;
  }
#else
  static_cast<void>(isa);
#endif
  const int requested = detail::resolve_num_threads(num_threads);
  FinalizeGradKernelArgs args{p, 0, 0, false};
  args.stream_output = R * H * element >= detail::streaming_store_threshold();
  // grad_expanded_x (and grad_scales): each row reads its pairs' grad_y rows (and its expanded_x
  // row twice over), writes one row.
  const int64_t row_bytes =
      saturating_mul(R + pairs * (p.grad_scales != nullptr ? 2 : 1), H * element);
  const int row_threads = detail::threads_for_bytes(requested, row_bytes);
  detail::parallel_for(R, row_threads,
                       [&](int64_t begin, int64_t end) { rows_kernel(args, begin, end); });
  if (p.grad_bias == nullptr || E == 0) return;
  const int bias_threads =
      detail::threads_for_bytes(requested, saturating_mul(E + pairs, H * element));
  args.bias_tile_width = unit_width(E, H, bias_threads, INT64_MAX);
  args.bias_tiles_per_row = (H + args.bias_tile_width - 1) / args.bias_tile_width;
  detail::parallel_for(E * args.bias_tiles_per_row, bias_threads,
                       [&](int64_t begin, int64_t end) { bias_kernel(args, begin, end); });
}

}  // namespace moe_routing::cpu
