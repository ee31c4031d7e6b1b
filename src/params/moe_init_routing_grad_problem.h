// What a moe_init_routing_grad backend sees: the plan shape inference made and the data
// pointers, already validated (shapes, dtypes, devices, index values). Every backend (reference,
// cpu, cuda) takes this one struct.
#pragma once

#include <cstdint>

#include "moe_routing/moe_init_routing_grad.h"
#include "moe_routing/status.h"

namespace moe_routing::detail {

struct GradProblem {
  const void* grad_expanded_x = nullptr;      // [plan.source_rows, plan.hidden] plan.dtype
  const int32_t* expanded_row_idx = nullptr;  // [plan.num_rows * plan.top_k]
  void* grad_x = nullptr;                     // [plan.num_rows, plan.hidden] plan.dtype
  MoeInitRoutingGradPlan plan;                // plan.order is resolved (tree or sequential)

  int64_t pairs() const { return plan.num_rows * plan.top_k; }
};

/// The index_out_of_range error for expanded_row_idx[position] = value outside [0, source_rows)
/// (and not a skipped -1 or active_num cut): the one wording of every backend's check.
inline Status grad_row_index_error(const MoeInitRoutingGradPlan& plan, int64_t position,
                                   int64_t value) {
  const char* op = "moe_init_routing_grad: ";
  if (value < 0)
    return index_out_of_range(op, "expanded_row_idx[", position, "] must be in [0, ",
                              plan.source_rows,
                              ") (-1, which marks a dropped pair, is the only negative value "
                              "allowed), got ",
                              value);
  return index_out_of_range(op, "expanded_row_idx[", position, "] must be in [0, ",
                            plan.source_rows, "), got ", value);
}

}  // namespace moe_routing::detail
