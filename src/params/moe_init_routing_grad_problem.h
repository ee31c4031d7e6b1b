// What a moe_init_routing_grad backend sees: the plan shape inference made and the data
// pointers, already validated (shapes, dtypes, devices, index values). Every backend (reference,
// cpu, cuda) takes this one struct.
#pragma once

#include <cstdint>

#include "moe_routing/moe_init_routing_grad.h"

namespace moe_routing::detail {

struct GradProblem {
  const void* grad_expanded_x = nullptr;      // [plan.source_rows, plan.hidden] plan.dtype
  const int32_t* expanded_row_idx = nullptr;  // [plan.num_rows * plan.top_k]
  void* grad_x = nullptr;                     // [plan.num_rows, plan.hidden] plan.dtype
  MoeInitRoutingGradPlan plan;                // plan.order is resolved (tree or sequential)

  int64_t pairs() const { return plan.num_rows * plan.top_k; }
};

}  // namespace moe_routing::detail
