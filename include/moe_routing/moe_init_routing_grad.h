// moe_init_routing_grad: the backward of moe_init_routing (CANN aclnnMoeInitRoutingV2Grad).
//
//   grad_x[i, :] = sum over t in [0, top_k) of grad_expanded_x_rows[expanded_row_idx[i*top_k + t],
//   :]
//
// summed in float32 in a documented order (AccumulationOrder), skipping dropped pairs, and rounded
// once (round-to-nearest-even) to the dtype of grad_expanded_x. See docs/moe_init_routing_grad.md.
#pragma once

#include <cstdint>

#include "moe_routing/numerics.h"
#include "moe_routing/status.h"
#include "moe_routing/tensor.h"

namespace moe_routing {

/// The float32 order in which each output element's addends are summed. Both orders are
/// contracts: every backend gives the same bits for the same inputs and order.
enum class AccumulationOrder : int32_t {
  /// The order of the attrs' numerics (the default): tree for atlas_a2, sequential for
  /// ascend_950. Shape inference resolves it; a plan never holds it.
  from_numerics = -1,
  /// Atlas A2/A3 kernel order: addends dealt into 2^L bins, bins summed pairwise.
  tree = 0,
  /// Ascend 950 kernel order: acc = +0.0; acc += addend for t = 0 .. top_k-1.
  sequential = 1,
};

/// "from_numerics", "tree" or "sequential".
const char* accumulation_order_name(AccumulationOrder order);
/// Parses "tree" / "sequential" (the explicit orders); returns false for anything else.
bool parse_accumulation_order(const char* text, AccumulationOrder* order);
/// The order of a device's backward kernel: tree (atlas_a2) or sequential (ascend_950).
AccumulationOrder accumulation_order_of(Numerics numerics);

/// The three scenarios, decided by drop_pad_mode and active_num.
enum class GradScenario : int32_t {
  dropless = 0,  // drop_pad_mode 0, active_num 0: grad_expanded_x [N*K, H]
  active = 1,    // drop_pad_mode 0, active_num > 0: grad_expanded_x [active rows, H]; idx >=
                 // active_num skipped
  drop_pad = 2,  // drop_pad_mode 1: grad_expanded_x [E, C, H] viewed as [E*C, H]; idx -1 skipped
};

/// "dropless", "active", "drop_pad".
const char* grad_scenario_name(GradScenario scenario);

struct MoeInitRoutingGradAttrs {
  int64_t top_k = 0;          // K, > 0
  int64_t drop_pad_mode = 0;  // 0 = dropless/active, 1 = drop-pad
  int64_t active_num = 0;     // >= 0; > 0 selects the active scenario when drop_pad_mode == 0
  /// An explicit order overrides the numerics' one (from_numerics: none).
  AccumulationOrder order = AccumulationOrder::from_numerics;
  /// The device whose backward is reproduced: its accumulation order (numerics.h).
  Numerics numerics = Numerics::atlas_a2;
};

/// Everything shape inference decides; all a kernel needs besides the data pointers.
struct MoeInitRoutingGradPlan {
  GradScenario scenario = GradScenario::dropless;
  DType dtype = DType::float32;  // of grad_expanded_x and grad_x
  int64_t num_rows = 0;          // N = len(expanded_row_idx) / top_k
  int64_t top_k = 0;             // K
  int64_t hidden = 0;            // H
  int64_t source_rows = 0;       // rows of grad_expanded_x viewed as [rows, H]
  /// Index values >= skip_from are skipped (active_num in the active scenario, else INT64_MAX).
  int64_t skip_from = 0;
  /// The resolved order: tree or sequential, never from_numerics.
  AccumulationOrder order = AccumulationOrder::tree;
  int64_t grad_x_shape[2] = {0, 0};  // [N, H]
};

/// Validates shapes, dtypes and attributes (no data is read) and fills `plan`.
/// Error messages name the operator, the argument, the constraint and what arrived.
Status infer_moe_init_routing_grad(const TensorView& grad_expanded_x,
                                   const TensorView& expanded_row_idx,
                                   const MoeInitRoutingGradAttrs& attrs,
                                   MoeInitRoutingGradPlan* plan);

/// Checks every index value against the plan: -1 and (active scenario) values >= active_num are
/// skipped; any other value outside [0, source_rows) is an index_out_of_range error naming the
/// first such flat position. Reads expanded_row_idx (a CPU pointer); writes nothing.
Status check_moe_init_routing_grad_indices(const int32_t* expanded_row_idx,
                                           const MoeInitRoutingGradPlan& plan);

/// Computes grad_x.
///   grad_expanded_x: [N*K, H] (dropless), [A, H] (active), [E, C, H] (drop-pad); fp32/fp16/bf16
///   expanded_row_idx: [N*K] int32
///   grad_x: [N, H], same dtype as grad_expanded_x; caller-allocated; fully written on success
/// On any error nothing is written to grad_x.
Status moe_init_routing_grad(const TensorView& grad_expanded_x, const TensorView& expanded_row_idx,
                             const MoeInitRoutingGradAttrs& attrs, const TensorView& grad_x,
                             const ExecConfig& config = ExecConfig());

/// The tree order's shape for a given K: B = 2^L bins, L tree levels (docs/spec/moe_init_routing.md
/// §1.6).
struct TreeShape {
  int64_t bins;
  int levels;
};
/// Atlas A2/A3 tiling: K >= 128 -> 64 bins, 6 levels; else L = max(0, floor(log2 K) - 1).
/// constexpr: the CPU kernels instantiate loops for the bin counts of common K at compile time.
constexpr TreeShape tree_shape(int64_t top_k) {
  if (top_k >= 128) return {64, 6};
  int floor_log2 = 0;
  while ((int64_t(2) << floor_log2) <= top_k) ++floor_log2;
  const int levels = floor_log2 >= 1 ? floor_log2 - 1 : 0;
  return {int64_t(1) << levels, levels};
}

}  // namespace moe_routing
