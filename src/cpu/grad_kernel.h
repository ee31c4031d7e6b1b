// Inside the CPU backend of moe_init_routing_grad: what a kernel sees, the tiling, and the kernels,
// one translation unit per instruction set (cpu_backend.h is the backend's entry point).
#pragma once

#include <cstdint>

#include "moe_routing/moe_init_routing_grad.h"

namespace moe_routing::cpu {

/// All a CPU grad kernel sees. Work is split into units of (output row, column tile).
struct GradKernelArgs {
  const void* grad_expanded_x = nullptr;      // [source_rows, H], plan.dtype
  const int32_t* expanded_row_idx = nullptr;  // [N*K] int32, already checked
  void* grad_x = nullptr;                     // [N, H], plan.dtype
  MoeInitRoutingGradPlan plan;
  int64_t tile_width = 0;  // columns per unit (the last one of a row may be narrower)
  int64_t tiles_per_row = 0;
  bool stream_output = false;  // write grad_x with non-temporal stores (large outputs)
  /// grad_register_bins(plan): the registers path's bin count, 0 for the L1 bins path. Decided
  /// by the dispatcher (baseline code) so that the per-ISA kernels call no function it shares.
  int register_bins = 0;
  /// Bins of the tree order: tree_shape(top_k).bins (1 for the sequential order).
  int64_t bins = 1;
};

/// Bins buffer of the L1 path: 16 KiB per thread.
constexpr int64_t kGradBinFloats = 4096;
/// Most addends the registers path takes per output row.
constexpr int64_t kGradRegisterMaxTopK = 32;

/// The registers path's bin count (1 for sequential), or 0 when the L1 bins path runs.
inline int grad_register_bins(const MoeInitRoutingGradPlan& plan) {
  if (plan.top_k > kGradRegisterMaxTopK) return 0;
  if (plan.order == AccumulationOrder::sequential) return 1;
  const int64_t bins = tree_shape(plan.top_k).bins;
  return bins <= 8 ? int(bins) : 0;
}

/// Columns per unit of work. The L1 path needs tiles whose bins fit kGradBinFloats; the
/// registers path takes whole rows, split only when there are too few rows to feed every thread.
inline int64_t grad_unit_width(const MoeInitRoutingGradPlan& plan, int threads) {
  if (grad_register_bins(plan) == 0) {
    const int64_t bins =
        plan.order == AccumulationOrder::tree ? tree_shape(plan.top_k).bins : int64_t(1);
    const int64_t width = kGradBinFloats / bins;
    return width > 1024 ? 1024 : width;  // >= 64, a multiple of every vector width
  }
  const int64_t H = plan.hidden > 0 ? plan.hidden : 1;
  const int64_t wanted_units = 4 * int64_t(threads);
  if (plan.num_rows >= wanted_units) return H;
  const int64_t pieces = (wanted_units + plan.num_rows - 1) / plan.num_rows;
  int64_t width = (H + pieces - 1) / pieces;
  width = (width + 63) / 64 * 64;
  return width < 256 ? 256 : width;
}

// The kernel, once per instruction set, each in the namespace of its ISA (grad_kernel_impl.h):
// an instance compiled with -mavx2 can then never stand in for a baseline one at link time.
// Computes units [unit_begin, unit_end), unit u = (row u / tiles_per_row, tile u % tiles_per_row).
namespace baseline {
void grad_kernel(const GradKernelArgs& args, int64_t unit_begin, int64_t unit_end);
}  // namespace baseline
namespace avx2 {
void grad_kernel(const GradKernelArgs& args, int64_t unit_begin, int64_t unit_end);
}  // namespace avx2

}  // namespace moe_routing::cpu
