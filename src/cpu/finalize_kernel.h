// Inside the CPU backend of moe_finalize_routing and its grad: what a kernel sees and the kernels,
// one translation unit per instruction set (finalize_kernel_{baseline,avx2,avx512}.cpp, each in the
// namespace of its ISA). The launchers (tiling, ISA choice, threads) are finalize_kernel.cpp;
// cpu_backend.h is the backend's entry point.
#pragma once

#include <cstdint>

#include "core/cpu_tuning.h"
#include "moe_routing/tensor.h"
#include "params/finalize_routing_problem.h"

namespace moe_routing::cpu {

/// The forward's work: units of (output row, column tile).
struct FinalizeKernelArgs {
  detail::FinalizeRoutingProblem problem;
  int64_t tile_width;     // columns per unit (the last tile of a row may be narrower)
  int64_t tiles_per_row;  // ceil(H / tile_width)
  bool stream_output;     // write out with non-temporal stores (large outputs)
  /// Sources larger than the caches: how far ahead (bytes, chosen by the row length) the full
  /// column steps request each source's lines, and how much of the next row's sources is
  /// requested at a row's start; 0: sources in the caches, only the next row's first lines.
  int64_t prefetch;
};

/// The forward's FinalizeKernelArgs::prefetch for sources far larger than the caches, rows of
/// `row_bytes` summed `top_k` at a time, on a CPU of `tuning`. Each row's K sources are short
/// streams, which the hardware prefetchers pick up only after their first misses.
/// - standard: with K >= 8, the smallest power of two >= row_bytes / 16 within [512, 1024] bytes,
///   requested ahead inside the rows (and as much of each next row at its start). Measured paired
///   (bf16, K = 8, two threads, 4096 tokens) on an AMD VM: at H = 7168 1 KiB is best (512 B: 4 %
///   more time); at H = 4096 512 B takes 4 % less than 1 KiB; at H = 2048 256 B took 12 % less
///   than 1 KiB. On an Intel VM at H = 2048 512 B took 6-7 % less than 256 B at 2048 and 4096
///   tokens, hence the lower bound (Qwen3-30B at 4096 tokens 83.7 % of its limit, from 74.9 %).
/// - amd_zen4: with K >= 8, each next row's sources whole, requested at its start, and nothing
///   inside the rows (the row length rounded up to a line: further than any column), for rows
///   of up to kFinalizeWholeRowMaxBytes (the longest measured: 14 KiB); a longer row gets that
///   much at its start and its lines that far ahead inside it. Measured
///   paired on a Zen 4 VM (two sets of five alternating rounds, 1024 and 4096 tokens, H =
///   2048-7168): 3-15 % less time than the standard distances by the median of the per-round
///   ratios in every training row of both sets; the standard distances had left four of the six
///   rows at 72-78 % of their limit there.
/// - K < 8 (Mixtral's K = 2): 1 KiB; 512 B measured slower there.
int64_t finalize_prefetch_bytes(int64_t row_bytes, int64_t top_k, detail::CpuTuning tuning);
constexpr int64_t kFinalizeWholeRowMaxBytes = 16384;

/// Terms of one row gathered per pass; a row with more runs several passes over each column
/// tile, keeping the running sums in a buffer of kFinalizeAccColumns floats per tile.
constexpr int64_t kFinalizeTermsPerPass = 32;
constexpr int64_t kFinalizeAccColumns = 1024;

/// The grad's work: rows of grad_expanded_x (with the grad_scales of their pairs), then units of
/// (expert, column tile) of grad_bias.
struct FinalizeGradKernelArgs {
  detail::FinalizeRoutingGradProblem problem;
  int64_t bias_tile_width;
  int64_t bias_tiles_per_row;
  bool stream_output;        // write grad_expanded_x with non-temporal stores
  bool prefetch;             // request grad_y's lines ahead (rows far larger than the caches)
  bool request_pages;        // with prefetch on AMD Zen 4: the pages of rows two runs ahead
  const int32_t* row_order;  // [R]: the rows of grad_expanded_x in the order threads visit them
};

namespace baseline {
void finalize_kernel(const FinalizeKernelArgs& args, int64_t unit_begin, int64_t unit_end);
void finalize_grad_rows(const FinalizeGradKernelArgs& args, int64_t row_begin, int64_t row_end);
void finalize_grad_bias(const FinalizeGradKernelArgs& args, int64_t unit_begin, int64_t unit_end);
}  // namespace baseline

namespace avx2 {
void finalize_kernel(const FinalizeKernelArgs& args, int64_t unit_begin, int64_t unit_end);
void finalize_grad_rows(const FinalizeGradKernelArgs& args, int64_t row_begin, int64_t row_end);
void finalize_grad_bias(const FinalizeGradKernelArgs& args, int64_t unit_begin, int64_t unit_end);
}  // namespace avx2

namespace avx512 {
void finalize_kernel(const FinalizeKernelArgs& args, int64_t unit_begin, int64_t unit_end);
void finalize_grad_rows(const FinalizeGradKernelArgs& args, int64_t row_begin, int64_t row_end);
void finalize_grad_bias(const FinalizeGradKernelArgs& args, int64_t unit_begin, int64_t unit_end);
}  // namespace avx512

}  // namespace moe_routing::cpu
