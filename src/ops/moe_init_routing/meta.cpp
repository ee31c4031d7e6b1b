// Shape inference and every check of moe_init_routing_v2 (docs/spec/moe_init_routing.md §2.3 as
// amended by docs/decisions.md §6, §10, §11, §14) and moe_init_routing
// (docs/spec/moe_init_routing.md §3.5, docs/decisions.md §6, §10-§12, §14), written once: infer_*
// for the shapes, validate_* for a whole call. The CLI, the C ABI, the torch Meta kernel and every
// backend call through here.
#include "ops/moe_init_routing/meta.h"

#include <algorithm>
#include <limits>
#include <string>

#include "cpu/cpu_backend.h"
#include "ops/validation.h"

namespace moe_routing {
namespace {

using detail::check_output_bytes;
using detail::CountFormat;
using detail::is_absent;
using detail::RoutingProblem;

constexpr const char* kOpV2 = "moe_init_routing_v2: ";
constexpr const char* kOp = "moe_init_routing: ";
constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

Status check_dims_non_negative(const char* op, const char* name, const TensorView& t) {
  for (int d = 0; d < t.ndim; ++d)
    if (t.shape[d] < 0)
      return invalid_argument(op, name, " dimensions must be >= 0, got ", shape_string(t));
  return Status::ok();
}

/// a * b, or -1 when it does not fit int64 (a, b >= 0).
int64_t checked_mul(int64_t a, int64_t b) {
  if (a == 0 || b == 0) return 0;
  if (a > kInt64Max / b) return -1;
  return a * b;
}

OutputSpec make_spec(bool produced, DType dtype, std::initializer_list<int64_t> shape) {
  OutputSpec spec;
  spec.produced = produced;
  spec.dtype = dtype;
  for (int64_t extent : shape) spec.shape[spec.ndim++] = extent;
  return spec;
}

/// x [N, H] and expert_idx [N, K] int32: ranks, dims, row counts, devices, the int32 pair limit.
Status check_x_and_expert_idx(const char* op, const TensorView& x, const TensorView& expert_idx) {
  if (x.ndim != 2) return invalid_argument(op, "x must be 2-D [N, H], got ", describe(x));
  if (expert_idx.ndim != 2)
    return invalid_argument(op, "expert_idx must be 2-D [N, K], got ", describe(expert_idx));
  MOE_ROUTING_RETURN_IF_ERROR(check_dims_non_negative(op, "x", x));
  MOE_ROUTING_RETURN_IF_ERROR(check_dims_non_negative(op, "expert_idx", expert_idx));
  if (expert_idx.dtype != DType::int32)
    return invalid_argument(op, "expert_idx must be int32, got ", dtype_name(expert_idx.dtype));
  if (expert_idx.shape[0] != x.shape[0])
    return invalid_argument(op, "expert_idx.size(0) must equal x.size(0) (", x.shape[0], "), got ",
                            expert_idx.shape[0]);
  if (expert_idx.device != x.device)
    return invalid_argument(op, "expert_idx must be on the device of x (", device_name(x.device),
                            "), got ", device_name(expert_idx.device));
  const int64_t pairs = checked_mul(expert_idx.shape[0], expert_idx.shape[1]);
  if (pairs < 0 || pairs > kInt32Max)
    return invalid_argument(op,
                            "expert_idx must have at most 2147483647 elements (N*K, int32 "
                            "indices), got ",
                            shape_string(expert_idx));
  if (x.numel() == kInt64Max)
    return invalid_argument(op, "x has too many elements, got ", shape_string(x));
  return Status::ok();
}

/// The decimal digits of an unsigned 128-bit value (a product of two int64 values).
std::string decimal(unsigned __int128 value) {
  std::string digits;
  do {
    digits.insert(digits.begin(), char('0' + int(value % 10)));
    value /= 10;
  } while (value != 0);
  return digits;
}

/// Drop-pad slot e*C + c is stored as an int32 value of expanded_row_idx (and the backward
/// addresses E*C rows with it), so E*C must fit int32; unchecked, slots past 2^31 - 1 wrapped to
/// negative numbers and no error was given (issue 17, item 1). E, C >= 1.
Status check_slots_fit_int32(const char* op, int64_t experts, int64_t capacity) {
  const unsigned __int128 slots = static_cast<unsigned __int128>(experts) * uint64_t(capacity);
  if (slots <= uint64_t(kInt32Max)) return Status::ok();
  return invalid_argument(op,
                          "expert_num * expert_capacity must be at most 2147483647 (drop-pad "
                          "slots e*C + c are int32 expanded_row_idx values), got ",
                          experts, " * ", capacity, " = ", decimal(slots));
}

std::string describe_optional(const TensorView& t) {
  return is_absent(t) ? std::string("none") : describe(t);
}

bool has_shape(const TensorView& t, DType dtype, std::initializer_list<int64_t> shape) {
  if (t.dtype != dtype || t.ndim != int(shape.size())) return false;
  int d = 0;
  for (int64_t extent : shape)
    if (t.shape[d++] != extent) return false;
  return true;
}

bool quant_mode_exists_in_cann(int64_t mode) {
  return (mode >= -1 && mode <= 9) || (mode >= 11 && mode <= 17);
}

}  // namespace

// ------------------------------------------------------------------------------------------
// moe_init_routing_v2
// ------------------------------------------------------------------------------------------

Status infer_moe_init_routing_v2(const TensorView& x, const TensorView& expert_idx,
                                 const MoeInitRoutingV2Attrs& attrs, MoeInitRoutingV2Plan* plan) {
  const char* op = kOpV2;
  if (attrs.drop_pad_mode != 0 && attrs.drop_pad_mode != 1)
    return invalid_argument(op, "drop_pad_mode must be 0 (dropless) or 1 (drop-pad), got ",
                            attrs.drop_pad_mode);
  if (attrs.active_num < 0)
    return invalid_argument(op, "active_num must be >= 0, got ", attrs.active_num);
  if (attrs.expert_capacity < 0)
    return invalid_argument(op, "expert_capacity must be >= 0, got ", attrs.expert_capacity);
  if (attrs.expert_num < 0)
    return invalid_argument(op, "expert_num must be >= 0, got ", attrs.expert_num);
  if (attrs.expert_num > kInt32Max)
    return invalid_argument(op, "expert_num must be at most 2147483647 (int32 expert ids), got ",
                            attrs.expert_num);
  const int64_t flag = attrs.expert_tokens_count_or_cumsum_flag;
  if (flag < 0 || flag > 2)
    return invalid_argument(op,
                            "expert_tokens_count_or_cumsum_flag must be 0 (none), 1 (cumsum) "
                            "or 2 (count), got ",
                            flag);
  const bool drop_pad = attrs.drop_pad_mode == 1;
  if (drop_pad && attrs.expert_capacity < 1)
    return invalid_argument(op, "expert_capacity must be >= 1 when drop_pad_mode=1, got ",
                            attrs.expert_capacity);
  if (drop_pad && attrs.expert_num < 1)
    return invalid_argument(op, "expert_num must be >= 1 when drop_pad_mode=1, got ",
                            attrs.expert_num);
  if (flag > 0 && attrs.expert_num < 1)
    return invalid_argument(op,
                            "expert_num must be >= 1 when expert_tokens_count_or_cumsum_flag "
                            "is 1 or 2, got ",
                            attrs.expert_num);

  MOE_ROUTING_RETURN_IF_ERROR(check_x_and_expert_idx(op, x, expert_idx));
  if (!is_floating(x.dtype))
    return invalid_argument(op, "x must be float16, bfloat16 or float32, got ",
                            dtype_name(x.dtype));
  const int64_t N = x.shape[0], H = x.shape[1], K = expert_idx.shape[1];
  const int64_t pairs = N * K;
  // CANN's infer-shape checks C <= N only for N > 0; an empty input stays valid (docs/decisions.md
  // §10).
  if (drop_pad && N > 0 && attrs.expert_capacity > N)
    return invalid_argument(op, "expert_capacity must be <= x.size(0) (", N,
                            ") when drop_pad_mode=1, got ", attrs.expert_capacity);

  MoeInitRoutingV2Plan result;
  result.dtype = x.dtype;
  result.num_rows = N;
  result.top_k = K;
  result.hidden = H;
  result.expert_num = attrs.expert_num;
  result.drop_pad = drop_pad;
  result.count_flag = drop_pad ? 0 : flag;
  const bool uses_expert_num = drop_pad || result.count_flag > 0;
  result.expert_id_limit = uses_expert_num ? attrs.expert_num : kInt64Max;
  if (drop_pad) {
    const int64_t E = attrs.expert_num, C = attrs.expert_capacity;
    MOE_ROUTING_RETURN_IF_ERROR(check_slots_fit_int32(op, E, C));
    result.expert_capacity = C;
    MOE_ROUTING_RETURN_IF_ERROR(check_output_bytes(op, "expanded_x", x.dtype, {E, C, H}));
    result.expanded_rows = E * C;
    result.expanded_x = make_spec(true, x.dtype, {E, C, H});
  } else {
    const int64_t rows = attrs.active_num == 0 ? pairs : std::min(attrs.active_num, pairs);
    MOE_ROUTING_RETURN_IF_ERROR(check_output_bytes(op, "expanded_x", x.dtype, {rows, H}));
    result.expanded_rows = rows;
    result.expanded_x = make_spec(true, x.dtype, {rows, H});
  }
  result.expanded_row_idx = make_spec(true, DType::int32, {pairs});
  result.expert_tokens_count_or_cumsum =
      make_spec(result.count_flag > 0, DType::int32, {attrs.expert_num});
  result.expert_tokens_before_capacity = make_spec(
      drop_pad && attrs.expert_tokens_before_capacity_flag, DType::int32, {attrs.expert_num});
  *plan = result;
  return Status::ok();
}

Status check_moe_init_routing_v2_expert_idx(const int32_t* expert_idx,
                                            const MoeInitRoutingV2Plan& plan) {
  const int64_t K = plan.top_k, pairs = plan.num_rows * plan.top_k;
  const int64_t limit = plan.expert_id_limit;
  for (int64_t p = 0; p < pairs; ++p) {
    const int64_t id = expert_idx[p];
    if (id >= 0 && id < limit) continue;
    return detail::v2_expert_id_error(K, limit, p, id);
  }
  return Status::ok();
}

// ------------------------------------------------------------------------------------------
// moe_init_routing (torch API / V4)
// ------------------------------------------------------------------------------------------

Status infer_moe_init_routing(const TensorView& x, const TensorView& expert_idx,
                              const TensorView& scale, const TensorView& offset,
                              const TensorView& topk_weight, const MoeInitRoutingAttrs& attrs,
                              MoeInitRoutingPlan* plan) {
  const char* op = kOp;
  const int64_t q = attrs.quant_mode;
  if (!quant_mode_exists_in_cann(q))
    return invalid_argument(op,
                            "quant_mode must be -1 (none), 0 (static int8), 1 (dynamic int8) "
                            "or one of CANN's modes 2-9, 11-17 (not supported here), got ",
                            q);
  if (q > 1)
    return not_supported(op,
                         "quant_mode must be one of the supported modes -1 (none), 0 (static "
                         "int8) or 1 (dynamic int8); CANN's MX/FP8/HiF8/INT4 modes are not "
                         "implemented, got ",
                         q);
  if (attrs.drop_pad_mode != 0 && attrs.drop_pad_mode != 1)
    return invalid_argument(op, "drop_pad_mode must be 0 (dropless) or 1 (drop-pad), got ",
                            attrs.drop_pad_mode);
  const int64_t E = attrs.expert_num;
  if (E < 1) return invalid_argument(op, "expert_num must be >= 1, got ", E);
  if (E > kInt32Max)
    return invalid_argument(op, "expert_num must be at most 2147483647 (int32 expert ids), got ",
                            E);
  int64_t s = 0, e_end = E;
  if (attrs.has_active_expert_range) {
    s = attrs.active_expert_range.start;
    e_end = attrs.active_expert_range.end;
    if (!(s >= 0 && s < e_end && e_end <= E))
      return invalid_argument(op,
                              "active_expert_range must be [start, end) with 0 <= start < end "
                              "<= expert_num (",
                              E, "), got [", s, ", ", e_end, "]");
  }
  const int64_t type = attrs.expert_tokens_num_type;
  if (type < 0 || type > 2)
    return invalid_argument(op,
                            "expert_tokens_num_type must be 0 (cumsum), 1 (count) or 2 "
                            "(key_value), got ",
                            type);
  if (attrs.row_idx_type != 0 && attrs.row_idx_type != 1)
    return invalid_argument(op, "row_idx_type must be 0 (gather) or 1 (scatter), got ",
                            attrs.row_idx_type);
  if (attrs.active_num < -1)
    return invalid_argument(op, "active_num must be -1 or 0 (keep every routed pair) or > 0, got ",
                            attrs.active_num);
  if (!is_valid_numerics(static_cast<int32_t>(attrs.numerics)))
    return invalid_argument(op, "numerics must be atlas_a2 or ascend_950, got ",
                            static_cast<int>(attrs.numerics));
  const bool drop_pad = attrs.drop_pad_mode == 1;
  if (drop_pad) {
    if (attrs.expert_capacity < 1)
      return invalid_argument(op, "expert_capacity must be >= 1 when drop_pad_mode=1, got ",
                              attrs.expert_capacity);
    if (attrs.row_idx_type != 0)
      return invalid_argument(op, "row_idx_type must be 0 when drop_pad_mode=1, got ",
                              attrs.row_idx_type);
    if (q != -1) return invalid_argument(op, "quant_mode must be -1 when drop_pad_mode=1, got ", q);
    if (s != 0 || e_end != E)
      return invalid_argument(op, "active_expert_range must be the full [0, expert_num) = [0, ", E,
                              ") when drop_pad_mode=1, got [", s, ", ", e_end, "]");
  }

  MOE_ROUTING_RETURN_IF_ERROR(check_x_and_expert_idx(op, x, expert_idx));
  const bool quantised = q == 0 || q == 1;
  if (quantised && !is_floating(x.dtype))
    return invalid_argument(op,
                            "x must be float16, bfloat16 or float32 when quant_mode is 0 or 1, "
                            "got ",
                            dtype_name(x.dtype));
  if (!quantised && !is_floating(x.dtype) && x.dtype != DType::int8)
    return invalid_argument(op, "x must be float16, bfloat16, float32 or int8, got ",
                            dtype_name(x.dtype));
  const int64_t N = x.shape[0], H = x.shape[1], K = expert_idx.shape[1];
  const int64_t pairs = N * K;
  if (drop_pad && N > 0 && attrs.expert_capacity > N)
    return invalid_argument(op, "expert_capacity must be <= x.size(0) (", N,
                            ") when drop_pad_mode=1, got ", attrs.expert_capacity);

  // Optional inputs: absent = default-constructed view. Present ones must sit on x's device.
  const TensorView* optional_inputs[] = {&scale, &offset, &topk_weight};
  const char* optional_names[] = {"scale", "offset", "topk_weight"};
  for (int i = 0; i < 3; ++i) {
    const TensorView& t = *optional_inputs[i];
    if (is_absent(t)) continue;
    MOE_ROUTING_RETURN_IF_ERROR(check_dims_non_negative(op, optional_names[i], t));
    if (t.device != x.device)
      return invalid_argument(op, optional_names[i], " must be on the device of x (",
                              device_name(x.device), "), got ", device_name(t.device));
  }
  const bool has_scale = !is_absent(scale);
  const int64_t range = e_end - s;
  int64_t scale_rows = 0;
  if (q == -1 && has_scale && !has_shape(scale, DType::float32, {N}))
    return invalid_argument(op, "scale must be 1-D float32 [N] = [", N,
                            "] (a per-token scale) when quant_mode=-1, got ", describe(scale));
  if (q == 0 && !has_scale)
    return invalid_argument(op,
                            "scale must be given (1-D float32 [1]) when quant_mode=0, got none");
  if (q == 0 && !has_shape(scale, DType::float32, {1}))
    return invalid_argument(op, "scale must be 1-D float32 [1] when quant_mode=0, got ",
                            describe(scale));
  if (q == 1 && has_scale) {
    if (has_shape(scale, DType::float32, {range, H}))
      scale_rows = range;
    else if (has_shape(scale, DType::float32, {1, H}))
      scale_rows = 1;
    else
      return invalid_argument(op, "scale must be 2-D float32 [end - start, H] = [", range, ", ", H,
                              "] or [1, ", H, "] (a smooth scale) when quant_mode=1, got ",
                              describe(scale));
  }
  const bool has_offset = !is_absent(offset);
  if (has_offset && q != 0)
    return invalid_argument(op,
                            "offset must be none unless quant_mode=0 (it is only used by "
                            "static quantisation), got ",
                            describe(offset), " with quant_mode=", q);
  if (has_offset && !has_shape(offset, DType::float32, {1}))
    return invalid_argument(op, "offset must be 1-D float32 [1] when quant_mode=0, got ",
                            describe(offset));
  const bool has_topk_weight = !is_absent(topk_weight);
  if (has_topk_weight && !has_shape(topk_weight, DType::float32, {N, K}))
    return invalid_argument(op, "topk_weight must be 2-D float32 [N, K] = [", N, ", ", K, "], got ",
                            describe_optional(topk_weight));

  MoeInitRoutingPlan result;
  result.x_dtype = x.dtype;
  result.num_rows = N;
  result.top_k = K;
  result.hidden = H;
  result.expert_num = E;
  result.drop_pad = drop_pad;
  result.range_start = s;
  result.range_end = e_end;
  result.row_limit = attrs.active_num > 0 ? attrs.active_num : pairs;
  result.quant_mode = q;
  result.numerics = attrs.numerics;
  result.row_idx_type = attrs.row_idx_type;
  result.expert_tokens_num_type = type;
  result.expert_tokens_num_flag = attrs.expert_tokens_num_flag;
  result.has_scale = has_scale;
  result.has_offset = has_offset;
  result.has_topk_weight = has_topk_weight;
  result.scale_rows = scale_rows;

  const DType out_dtype = quantised ? DType::int8 : x.dtype;
  int64_t rows = pairs;
  if (drop_pad) {
    const int64_t C = attrs.expert_capacity;
    MOE_ROUTING_RETURN_IF_ERROR(check_slots_fit_int32(op, E, C));
    result.expert_capacity = C;
    MOE_ROUTING_RETURN_IF_ERROR(check_output_bytes(op, "expanded_x", out_dtype, {E, C, H}));
    rows = E * C;
    result.expanded_x = make_spec(true, out_dtype, {E, C, H});
  } else {
    MOE_ROUTING_RETURN_IF_ERROR(check_output_bytes(op, "expanded_x", out_dtype, {pairs, H}));
    result.expanded_x = make_spec(true, out_dtype, {pairs, H});
  }
  result.expanded_row_idx = make_spec(true, DType::int32, {pairs});
  if (attrs.expert_tokens_num_flag && type == 2)
    result.expert_tokens_count_or_cumsum = make_spec(true, DType::int64, {E, 2});
  else
    result.expert_tokens_count_or_cumsum =
        make_spec(attrs.expert_tokens_num_flag, DType::int64, {range});
  result.expanded_scale = make_spec(q == 1 || (q == -1 && has_scale), DType::float32, {rows});
  if (has_topk_weight)
    result.expanded_topk_weight = make_spec(true, DType::float32, {rows, 1});
  else
    result.expanded_topk_weight = make_spec(false, DType::float32, {0});
  *plan = result;
  return Status::ok();
}

// ------------------------------------------------------------------------------------------
// Whole calls
// ------------------------------------------------------------------------------------------

namespace detail {

RoutingProblem routing_problem(const MoeInitRoutingV2Plan& plan) {
  RoutingProblem problem;
  problem.num_rows = plan.num_rows;
  problem.top_k = plan.top_k;
  problem.hidden = plan.hidden;
  problem.x_dtype = plan.dtype;
  // Every id is checked to be in [0, expert_id_limit), so every pair is routed.
  problem.range_start = 0;
  problem.range_end = plan.expert_id_limit;
  problem.drop_pad = plan.drop_pad;
  problem.expert_num = plan.expert_num;
  problem.expert_capacity = plan.expert_capacity;
  problem.row_limit = plan.expanded_rows;
  problem.expanded_rows = plan.expanded_rows;
  problem.count_dtype = DType::int32;
  if (plan.expert_tokens_count_or_cumsum.produced)
    problem.count_format = plan.count_flag == 1 ? CountFormat::cumsum : CountFormat::count;
  else if (plan.expert_tokens_before_capacity.produced)
    problem.count_format = CountFormat::count;
  return problem;
}

RoutingProblem routing_problem(const MoeInitRoutingPlan& plan) {
  RoutingProblem problem;
  problem.num_rows = plan.num_rows;
  problem.top_k = plan.top_k;
  problem.hidden = plan.hidden;
  problem.x_dtype = plan.x_dtype;
  problem.range_start = plan.range_start;
  problem.range_end = plan.range_end;
  problem.drop_pad = plan.drop_pad;
  problem.expert_num = plan.expert_num;
  problem.expert_capacity = plan.expert_capacity;
  problem.row_limit = plan.row_limit;
  problem.expanded_rows = plan.expanded_x.shape[0] * (plan.drop_pad ? plan.expanded_x.shape[1] : 1);
  problem.row_idx_type = plan.row_idx_type;
  problem.quant_mode = plan.quant_mode;
  problem.numerics = plan.numerics;
  problem.scale_rows = plan.scale_rows;
  problem.count_dtype = DType::int64;
  if (plan.expert_tokens_num_flag) {
    const CountFormat formats[] = {CountFormat::cumsum, CountFormat::count, CountFormat::key_value};
    problem.count_format = formats[plan.expert_tokens_num_type];
  }
  return problem;
}

int cpu_threads(const MoeInitRoutingV2Plan& plan, int num_threads) {
  return cpu::moe_init_routing_threads(routing_problem(plan), num_threads);
}

int cpu_threads(const MoeInitRoutingPlan& plan, int num_threads) {
  return cpu::moe_init_routing_threads(routing_problem(plan), num_threads);
}

namespace {

/// What the CPU kernels write into a caller's workspace (validate_call checks it); its size only
/// where validate_call reads it.
template <class Plan>
CallWorkspace routing_workspace(const Plan& plan, const TensorView& x, const ExecConfig& config,
                                const char* size_function) {
  CallWorkspace workspace;
  if (checks_caller_workspace(config, x.device))
    workspace.needed = cpu::workspace_bytes(routing_problem(plan), config.num_threads);
  workspace.size_function = size_function;
  workspace.depends_on_threads = true;
  return workspace;
}

}  // namespace

Status validate_moe_init_routing_v2(const TensorView& x, const TensorView& expert_idx,
                                    const MoeInitRoutingV2Attrs& attrs,
                                    const TensorView& expanded_x,
                                    const TensorView& expanded_row_idx,
                                    const TensorView& expert_tokens_count_or_cumsum,
                                    const TensorView& expert_tokens_before_capacity,
                                    const ExecConfig& config, MoeInitRoutingV2Plan* plan) {
  MOE_ROUTING_RETURN_IF_ERROR(infer_moe_init_routing_v2(x, expert_idx, attrs, plan));
  const CallWorkspace workspace =
      routing_workspace(*plan, x, config, "moe_init_routing_v2_workspace_size");
  return validate_call(kOpV2, {{"x", x}, {"expert_idx", expert_idx}},
                       {{"expanded_x", expanded_x, plan->expanded_x},
                        {"expanded_row_idx", expanded_row_idx, plan->expanded_row_idx},
                        {"expert_tokens_count_or_cumsum", expert_tokens_count_or_cumsum,
                         plan->expert_tokens_count_or_cumsum},
                        {"expert_tokens_before_capacity", expert_tokens_before_capacity,
                         plan->expert_tokens_before_capacity}},
                       config, workspace);
}

Status validate_moe_init_routing(const TensorView& x, const TensorView& expert_idx,
                                 const TensorView& scale, const TensorView& offset,
                                 const TensorView& topk_weight, const MoeInitRoutingAttrs& attrs,
                                 const TensorView& expanded_x, const TensorView& expanded_row_idx,
                                 const TensorView& expert_tokens_count_or_cumsum,
                                 const TensorView& expanded_scale,
                                 const TensorView& expanded_topk_weight, const ExecConfig& config,
                                 MoeInitRoutingPlan* plan) {
  MOE_ROUTING_RETURN_IF_ERROR(
      infer_moe_init_routing(x, expert_idx, scale, offset, topk_weight, attrs, plan));
  const CallWorkspace workspace =
      routing_workspace(*plan, x, config, "moe_init_routing_workspace_size");
  return validate_call(kOp,
                       {{"x", x},
                        {"expert_idx", expert_idx},
                        {"scale", scale},
                        {"offset", offset},
                        {"topk_weight", topk_weight}},
                       {{"expanded_x", expanded_x, plan->expanded_x},
                        {"expanded_row_idx", expanded_row_idx, plan->expanded_row_idx},
                        {"expert_tokens_count_or_cumsum", expert_tokens_count_or_cumsum,
                         plan->expert_tokens_count_or_cumsum},
                        {"expanded_scale", expanded_scale, plan->expanded_scale},
                        {"expanded_topk_weight", expanded_topk_weight, plan->expanded_topk_weight}},
                       config, workspace);
}

}  // namespace detail
}  // namespace moe_routing
