// Shape inference and every check of moe_init_routing_grad, written once
// (docs/spec/moe_init_routing.md §1.3 as amended by docs/decisions.md §5, §7, §10, §14): infer_*
// for the shapes, validate_* for a whole call. The CLI, the C ABI, the torch Meta kernel and every
// backend call through here.
#include "ops/moe_init_routing_grad/meta.h"

#include <cstring>
#include <limits>

#include "cpu/cpu_backend.h"
#include "ops/validation.h"
#include "params/moe_init_routing_grad_problem.h"

namespace moe_routing {
namespace {

constexpr const char* kOp = "moe_init_routing_grad: ";

Status check_dims_non_negative(const char* name, const TensorView& t) {
  for (int d = 0; d < t.ndim; ++d)
    if (t.shape[d] < 0)
      return invalid_argument(kOp, name, " dimensions must be >= 0, got ", shape_string(t));
  return Status::ok();
}

}  // namespace

const char* accumulation_order_name(AccumulationOrder order) {
  switch (order) {
    case AccumulationOrder::from_numerics: return "from_numerics";
    case AccumulationOrder::tree: return "tree";
    case AccumulationOrder::sequential: return "sequential";
  }
  return "unknown";
}

bool parse_accumulation_order(const char* text, AccumulationOrder* order) {
  if (text == nullptr) return false;
  if (std::strcmp(text, "tree") == 0) {
    *order = AccumulationOrder::tree;
    return true;
  }
  if (std::strcmp(text, "sequential") == 0) {
    *order = AccumulationOrder::sequential;
    return true;
  }
  return false;
}

AccumulationOrder accumulation_order_of(Numerics numerics) {
  return numerics == Numerics::ascend_950 ? AccumulationOrder::sequential : AccumulationOrder::tree;
}

const char* grad_scenario_name(GradScenario scenario) {
  switch (scenario) {
    case GradScenario::dropless: return "dropless";
    case GradScenario::active: return "active";
    case GradScenario::drop_pad: return "drop_pad";
  }
  return "unknown";
}

Status infer_moe_init_routing_grad(const TensorView& grad_expanded_x,
                                   const TensorView& expanded_row_idx,
                                   const MoeInitRoutingGradAttrs& attrs,
                                   MoeInitRoutingGradPlan* plan) {
  if (attrs.drop_pad_mode != 0 && attrs.drop_pad_mode != 1)
    return invalid_argument(kOp, "drop_pad_mode must be 0 (dropless/active) or 1 (drop-pad), got ",
                            attrs.drop_pad_mode);
  if (attrs.top_k <= 0) return invalid_argument(kOp, "top_k must be > 0, got ", attrs.top_k);
  if (attrs.active_num < 0)
    return invalid_argument(kOp, "active_num must be >= 0, got ", attrs.active_num);
  if (!is_valid_numerics(static_cast<int32_t>(attrs.numerics)))
    return invalid_argument(kOp, "numerics must be atlas_a2 or ascend_950, got ",
                            static_cast<int>(attrs.numerics));
  if (attrs.order != AccumulationOrder::from_numerics && attrs.order != AccumulationOrder::tree &&
      attrs.order != AccumulationOrder::sequential)
    return invalid_argument(kOp, "order must be from_numerics, tree or sequential, got ",
                            static_cast<int>(attrs.order));

  const bool drop_pad = attrs.drop_pad_mode == 1;
  if (!drop_pad && grad_expanded_x.ndim != 2)
    return invalid_argument(kOp, "grad_expanded_x must be 2-D [rows, H] when drop_pad_mode=0, got ",
                            describe(grad_expanded_x));
  if (drop_pad && grad_expanded_x.ndim != 3)
    return invalid_argument(kOp, "grad_expanded_x must be 3-D [E, C, H] when drop_pad_mode=1, got ",
                            describe(grad_expanded_x));
  if (!is_floating(grad_expanded_x.dtype))
    return invalid_argument(kOp, "grad_expanded_x must be float16, bfloat16 or float32, got ",
                            dtype_name(grad_expanded_x.dtype));
  if (expanded_row_idx.ndim != 1 || expanded_row_idx.dtype != DType::int32)
    return invalid_argument(kOp, "expanded_row_idx must be 1-D int32, got ",
                            describe(expanded_row_idx));
  MOE_ROUTING_RETURN_IF_ERROR(check_dims_non_negative("grad_expanded_x", grad_expanded_x));
  MOE_ROUTING_RETURN_IF_ERROR(check_dims_non_negative("expanded_row_idx", expanded_row_idx));
  if (grad_expanded_x.device != expanded_row_idx.device)
    return invalid_argument(kOp, "expanded_row_idx must be on the device of grad_expanded_x (",
                            device_name(grad_expanded_x.device), "), got ",
                            device_name(expanded_row_idx.device));

  const int64_t pairs = expanded_row_idx.shape[0];
  if (pairs > std::numeric_limits<int32_t>::max())
    return invalid_argument(
        kOp, "len(expanded_row_idx) must be at most 2147483647 (int32 indices), got ", pairs);
  if (pairs % attrs.top_k != 0)
    return invalid_argument(kOp, "len(expanded_row_idx) must be divisible by top_k (", attrs.top_k,
                            "), got ", pairs);

  MoeInitRoutingGradPlan result;
  result.dtype = grad_expanded_x.dtype;
  result.top_k = attrs.top_k;
  result.num_rows = pairs / attrs.top_k;
  result.order = attrs.order == AccumulationOrder::from_numerics
                     ? accumulation_order_of(attrs.numerics)
                     : attrs.order;
  result.skip_from = std::numeric_limits<int64_t>::max();
  if (drop_pad) {
    const int64_t experts = grad_expanded_x.shape[0], capacity = grad_expanded_x.shape[1];
    result.scenario = GradScenario::drop_pad;
    result.hidden = grad_expanded_x.shape[2];
    if (capacity != 0 && experts > std::numeric_limits<int64_t>::max() / capacity)
      return invalid_argument(kOp, "grad_expanded_x has more than 2^63 rows, got ",
                              shape_string(grad_expanded_x));
    result.source_rows = experts * capacity;
  } else {
    result.hidden = grad_expanded_x.shape[1];
    result.source_rows = grad_expanded_x.shape[0];
    if (attrs.active_num == 0) {
      result.scenario = GradScenario::dropless;
      if (result.source_rows != pairs)
        return invalid_argument(kOp, "grad_expanded_x.size(0) must equal len(expanded_row_idx) (",
                                pairs, ") in the dropless scenario (active_num=0), got ",
                                result.source_rows);
    } else {
      result.scenario = GradScenario::active;
      result.skip_from = attrs.active_num;
      // CANN requires exactly active_num rows. The forward keeps min(active_num, N*K) rows, so
      // when active_num > N*K we also accept N*K rows (every index is then < N*K <= active_num).
      const bool exact = result.source_rows == attrs.active_num;
      const bool truncated = attrs.active_num > pairs && result.source_rows == pairs;
      if (!exact && !truncated)
        return invalid_argument(kOp, "grad_expanded_x.size(0) must equal active_num (",
                                attrs.active_num, ") in the active scenario, got ",
                                result.source_rows);
    }
  }
  if (grad_expanded_x.numel() == std::numeric_limits<int64_t>::max())
    return invalid_argument(kOp, "grad_expanded_x has too many elements, got ",
                            shape_string(grad_expanded_x));
  MOE_ROUTING_RETURN_IF_ERROR(detail::check_output_bytes(kOp, "grad_x", grad_expanded_x.dtype,
                                                         {result.num_rows, result.hidden}));
  result.grad_x_shape[0] = result.num_rows;
  result.grad_x_shape[1] = result.hidden;
  *plan = result;
  return Status::ok();
}

Status check_moe_init_routing_grad_indices(const int32_t* expanded_row_idx,
                                           const MoeInitRoutingGradPlan& plan) {
  const int64_t pairs = plan.num_rows * plan.top_k;
  for (int64_t p = 0; p < pairs; ++p) {
    const int64_t r = expanded_row_idx[p];
    if (r == -1 || r >= plan.skip_from) continue;  // dropped pair: skipped
    if (r < 0 || r >= plan.source_rows) return detail::grad_row_index_error(plan, p, r);
  }
  return Status::ok();
}

namespace detail {

OutputSpec grad_x_spec(const MoeInitRoutingGradPlan& plan) {
  OutputSpec spec;
  spec.produced = true;
  spec.dtype = plan.dtype;
  spec.ndim = 2;
  spec.shape[0] = plan.grad_x_shape[0];
  spec.shape[1] = plan.grad_x_shape[1];
  return spec;
}

int cpu_threads(const MoeInitRoutingGradPlan& plan, int num_threads) {
  return cpu::moe_init_routing_grad_threads(plan, num_threads);
}

Status validate_moe_init_routing_grad(const TensorView& grad_expanded_x,
                                      const TensorView& expanded_row_idx,
                                      const MoeInitRoutingGradAttrs& attrs,
                                      const TensorView& grad_x, const ExecConfig& config,
                                      MoeInitRoutingGradPlan* plan) {
  MOE_ROUTING_RETURN_IF_ERROR(
      infer_moe_init_routing_grad(grad_expanded_x, expanded_row_idx, attrs, plan));
  const OutputSpec spec = grad_x_spec(*plan);
  return validate_call(
      kOp, {{"grad_expanded_x", grad_expanded_x}, {"expanded_row_idx", expanded_row_idx}},
      {{"grad_x", grad_x, spec}}, config);
}

}  // namespace detail
}  // namespace moe_routing
