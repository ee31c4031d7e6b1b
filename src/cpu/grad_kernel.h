// CPU kernels of moe_init_routing_grad, one translation unit per instruction set.
#pragma once

#include <cstdint>

#include "moe_routing/moe_init_routing_grad.h"

namespace moe_routing::cpu {

/// All a CPU grad kernel sees. Work is split into units of (output row, column tile).
struct GradKernelArgs {
  const void* grad_expanded_x;      // [source_rows, H], plan.dtype
  const int32_t* expanded_row_idx;  // [N*K] int32, already checked
  void* grad_x;                     // [N, H], plan.dtype
  MoeInitRoutingGradPlan plan;
  int64_t tile_width;  // columns per unit (the last tile of a row may be narrower)
  int64_t tiles_per_row;
};

/// Largest tile: bins (B floats per column) stay within 16 KiB of L1 per thread.
constexpr int64_t kGradBinFloats = 4096;

inline int64_t grad_tile_width(const MoeInitRoutingGradPlan& plan) {
  const int64_t bins =
      plan.order == AccumulationOrder::tree ? tree_shape(plan.top_k).bins : int64_t(1);
  int64_t width = kGradBinFloats / bins;
  if (width > 1024) width = 1024;
  return width;  // a multiple of every vector width (>= 64)
}

/// Computes units [unit_begin, unit_end), unit u = (row u / tiles_per_row, tile u % tiles_per_row).
void grad_kernel_baseline(const GradKernelArgs& args, int64_t unit_begin, int64_t unit_end);
void grad_kernel_avx2(const GradKernelArgs& args, int64_t unit_begin, int64_t unit_end);

}  // namespace moe_routing::cpu
