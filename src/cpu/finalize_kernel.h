// Inside the CPU backend of moe_finalize_routing and its grad: what a kernel sees and the kernels,
// one translation unit per instruction set (finalize_kernel_{baseline,avx2,avx512}.cpp, each in the
// namespace of its ISA). The launchers (tiling, ISA choice, threads) are finalize_kernel.cpp;
// cpu_backend.h is the backend's entry point.
#pragma once

#include <cstdint>

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
