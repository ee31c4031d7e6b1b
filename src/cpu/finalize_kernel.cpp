// The CPU launchers of moe_finalize_routing and its grad: units of work, threads, ISA. Results
// never depend on the split: every output element is computed whole by one unit in the fixed order.
#include "cpu/finalize_kernel.h"

#include <cstdint>
#include <cstring>
#include <memory>

#include "core/cpu_tuning.h"
#include "core/memory_hints.h"
#include "core/thread_pool.h"
#include "cpu/cpu_backend.h"

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

/// The forward's threads: its traffic is each output row, its sources and the inputs read per row.
int forward_threads(int64_t rows, int64_t top_k, int64_t hidden, DType dtype, int num_threads) {
  const int64_t bytes = detail::saturating_mul(
      detail::saturating_mul(rows, hidden),
      detail::saturating_mul(int64_t(dtype_size(dtype)), detail::saturating_add(top_k, 2)));
  return detail::threads_for_bytes(detail::resolve_num_threads(num_threads), bytes);
}

/// The backward's two parallel passes: rows of grad_expanded_x (each reads its pairs' grad_y rows,
/// and with grad_scales its expanded_x row too, and writes one row), then experts of grad_bias.
struct GradThreads {
  int rows = 1, bias = 1;
};

GradThreads grad_threads(int64_t expanded_rows, int64_t pairs, int64_t hidden, int64_t experts,
                         DType dtype, bool grad_scales, bool grad_bias, int num_threads) {
  const int requested = detail::resolve_num_threads(num_threads);
  const int64_t row_bytes = detail::saturating_mul(hidden, int64_t(dtype_size(dtype)));
  GradThreads threads;
  threads.rows = detail::threads_for_bytes(
      requested,
      detail::saturating_mul(
          detail::saturating_add(detail::saturating_mul(pairs, grad_scales ? 2 : 1), expanded_rows),
          row_bytes));
  if (grad_bias && experts > 0)
    threads.bias = detail::threads_for_bytes(
        requested, detail::saturating_mul(detail::saturating_add(experts, pairs), row_bytes));
  return threads;
}

}  // namespace

int64_t finalize_prefetch_bytes(int64_t row_bytes, int64_t top_k, detail::CpuTuning tuning) {
  if (top_k < 8) return 1024;
  if (tuning == detail::CpuTuning::amd_zen4) {
    const int64_t whole_row = (row_bytes + 63) / 64 * 64;
    return whole_row < kFinalizeWholeRowMaxBytes ? whole_row : kFinalizeWholeRowMaxBytes;
  }
  int64_t bytes = 512;
  while (bytes < 1024 && bytes * 16 < row_bytes) bytes *= 2;
  return bytes;
}

int moe_finalize_routing_threads(const MoeFinalizeRoutingPlan& plan, int num_threads) {
  return forward_threads(plan.num_rows, plan.top_k, plan.hidden, plan.dtype, num_threads);
}

int moe_finalize_routing_grad_threads(const MoeFinalizeRoutingGradPlan& plan, int num_threads) {
  // An upper bound of what a call of the plan uses: grad_scales and grad_bias as if requested.
  const GradThreads threads =
      grad_threads(plan.expanded_rows, plan.num_rows * plan.top_k, plan.hidden, plan.expert_num,
                   plan.dtype, plan.has_scales && plan.has_expanded_x, plan.has_bias, num_threads);
  return threads.rows > threads.bias ? threads.rows : threads.bias;
}

void moe_finalize_routing(const detail::FinalizeRoutingProblem& problem, int num_threads,
                          CpuIsa isa) {
  const int64_t N = problem.num_rows, K = problem.top_k, H = problem.hidden;
  if (N == 0 || H == 0) return;
  const int64_t element = int64_t(dtype_size(problem.dtype));
  const int threads = forward_threads(N, K, H, problem.dtype, num_threads);
  detail::reserve_threads(threads);  // before any output is written (it may throw)
  FinalizeKernelArgs args{problem, 0, 0, false, 0};
  args.tile_width =
      unit_width(N, H, threads, K > kFinalizeTermsPerPass ? kFinalizeAccColumns : INT64_MAX);
  args.tiles_per_row = (H + args.tile_width - 1) / args.tile_width;
  const int64_t row_bytes = H * element;  // out [N, H] holds at most 2^63 - 1 bytes (validated)
  const int64_t source_bytes = detail::saturating_mul(N * K, row_bytes);
  args.stream_output = detail::streams_output(N * row_bytes, source_bytes);
  // Sources beyond half the streaming threshold (the last-level cache within 8-32 MiB) are not
  // expected to be in the cache (see kFinalizePrefetchLines).
  if (source_bytes >= detail::streaming_store_threshold() / 2)
    args.prefetch = finalize_prefetch_bytes(row_bytes, K, detail::cpu_tuning());
  if (isa == CpuIsa::automatic) isa = best_cpu_isa();
  auto kernel = &baseline::finalize_kernel;
#if defined(MOE_ROUTING_HAVE_AVX2)
  if (isa == CpuIsa::avx2) kernel = &avx2::finalize_kernel;
#endif
#if defined(MOE_ROUTING_HAVE_AVX512)
  if (isa == CpuIsa::avx512) kernel = &avx512::finalize_kernel;
#endif
  detail::parallel_for(N * args.tiles_per_row, threads,
                       [&](int64_t begin, int64_t end) { kernel(args, begin, end); });
}

uint64_t finalize_grad_workspace_bytes(int64_t pairs, int64_t expanded_rows, int64_t experts,
                                       bool grad_bias) {
  uint64_t ints = 2 * uint64_t(expanded_rows) + 2 + uint64_t(pairs);
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

/// The order the rows of grad_expanded_x are visited in: the rows named by one pair in pair
/// order (token-major: a token's grad_y row is read from memory once and stays in the core's
/// cache for its K rows), with the other rows (named by no pair, or by several) spread evenly
/// among them, so that every thread's contiguous share of the order holds its share of both (a
/// drop-pad layout may leave many rows empty: write-only work). In the row order (expert-major
/// after a dispatch) each grad_y row was read again for each of its K rows once the batch
/// exceeded the caches: at 4096 tokens the pair order took 6-14 % less time
/// (docs/PERFORMANCE.md). Which thread computes a row changes nothing in it.
void build_visit_order(const detail::FinalizeRoutingGradProblem& p, int64_t rows,
                       const int32_t* row_offsets, int32_t* order) {
  auto single = [&](int64_t r) { return row_offsets[r + 1] - row_offsets[r] == 1; };
  int64_t others = 0;
  for (int64_t r = 0; r < rows; ++r) others += single(r) ? 0 : 1;
  int64_t q = 0, r = 0, placed_others = 0;
  for (int64_t k = 0; k < rows; ++k) {
    // After k + 1 places, floor((k + 1) * others / rows) of them hold other rows.
    if ((placed_others + 1) * rows <= (k + 1) * others) {
      while (single(r)) ++r;
      order[k] = int32_t(r++);
      ++placed_others;
    } else {
      // Each row named by one pair is that pair's: as many such pairs as such rows remain.
      while (p.dropped(q) || !single(p.expanded_row_idx[q])) ++q;
      order[k] = p.expanded_row_idx[q++];
    }
  }
}

}  // namespace

void moe_finalize_routing_grad(detail::FinalizeRoutingGradProblem p, int num_threads, CpuIsa isa,
                               void* workspace) {
  const int64_t N = p.num_rows, K = p.top_k, H = p.hidden, R = p.expanded_rows;
  const int64_t pairs = N * K, E = p.expert_num;
  const GradThreads threads = grad_threads(R, pairs, H, E, p.dtype, p.grad_scales != nullptr,
                                           p.grad_bias != nullptr, num_threads);
  // Threads and memory first: a refusal of either (an exception) leaves every output untouched.
  detail::reserve_threads(threads.rows > threads.bias ? threads.rows : threads.bias);
  std::unique_ptr<char[]> owned;
  if (workspace == nullptr) {
    owned.reset(new char[finalize_grad_workspace_bytes(pairs, R, E, p.grad_bias != nullptr)]);
    workspace = owned.get();
  }
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
  int32_t* row_order = row_pairs + pairs;
  build_visit_order(p, R, row_offsets, row_order);
  if (p.grad_bias != nullptr) {
    int32_t* expert_offsets = row_order + R;
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
  if (isa == CpuIsa::automatic) isa = best_cpu_isa();
  auto rows_kernel = &baseline::finalize_grad_rows;
  auto bias_kernel = &baseline::finalize_grad_bias;
#if defined(MOE_ROUTING_HAVE_AVX2)
  if (isa == CpuIsa::avx2) {
    rows_kernel = &avx2::finalize_grad_rows;
    bias_kernel = &avx2::finalize_grad_bias;
  }
#endif
#if defined(MOE_ROUTING_HAVE_AVX512)
  if (isa == CpuIsa::avx512) {
    rows_kernel = &avx512::finalize_grad_rows;
    bias_kernel = &avx512::finalize_grad_bias;
  }
#endif
  FinalizeGradKernelArgs args{p, 0, 0, false, false, false, row_order};
  // Reads: grad_y once, and expanded_x's rows where given. Saturated: with no rows, H may be any
  // size (grad_y [0, H] holds no byte).
  const int64_t row_bytes = detail::saturating_mul(H, element);
  const int64_t output_bytes = detail::saturating_mul(R, row_bytes);
  args.stream_output = detail::streams_output(
      output_bytes, detail::saturating_add(detail::saturating_mul(N, row_bytes),
                                           p.expanded_x != nullptr ? output_bytes : 0));
  args.prefetch = output_bytes >= detail::streaming_store_threshold() / 2;
  args.request_pages = args.prefetch && detail::cpu_tuning() == detail::CpuTuning::amd_zen4;
  detail::parallel_for(R, threads.rows,
                       [&](int64_t begin, int64_t end) { rows_kernel(args, begin, end); });
  if (p.grad_bias == nullptr || E == 0) return;
  args.bias_tile_width = unit_width(E, H, threads.bias, INT64_MAX);
  args.bias_tiles_per_row = (H + args.bias_tile_width - 1) / args.bias_tile_width;
  detail::parallel_for(E * args.bias_tiles_per_row, threads.bias,
                       [&](int64_t begin, int64_t end) { bias_kernel(args, begin, end); });
}

}  // namespace moe_routing::cpu
