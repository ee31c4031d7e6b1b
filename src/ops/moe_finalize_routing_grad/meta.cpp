// Shape inference and every check of moe_finalize_routing_grad that needs no tensor data, written
// once (docs/spec/moe_finalize_routing.md §1, §4 as amended by its Decisions and
// docs/decisions.md §14-§16): infer_* for the shapes, validate_* for a whole call.
#include "ops/moe_finalize_routing_grad/meta.h"

#include <limits>

#include "cpu/cpu_backend.h"
#include "ops/validation.h"
#include "params/finalize_routing_checks.h"

namespace moe_routing {
namespace {

constexpr const char* kOp = "moe_finalize_routing_grad: ";
constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

Status check_shape(const char* name, const TensorView& t, const OutputSpec& spec,
                   const char* what) {
  bool same = t.ndim == spec.ndim && t.dtype == spec.dtype;
  for (int d = 0; same && d < spec.ndim; ++d) same = t.shape[d] == spec.shape[d];
  if (same) return Status::ok();
  return invalid_argument(kOp, name, " must be ", spec.ndim, "-D ", dtype_name(spec.dtype), ' ',
                          shape_string(spec), " (", what, "), got ", describe(t));
}

OutputSpec spec_2d(DType dtype, int64_t rows, int64_t cols) {
  OutputSpec s;
  s.produced = true;
  s.dtype = dtype;
  s.ndim = 2;
  s.shape[0] = rows;
  s.shape[1] = cols;
  return s;
}

}  // namespace

Status infer_moe_finalize_routing_grad(const MoeFinalizeRoutingGradInputs& in,
                                       const MoeFinalizeRoutingGradAttrs& attrs,
                                       MoeFinalizeRoutingGradPlan* plan) {
  using detail::is_absent;
  if (attrs.drop_pad_mode != 0 && attrs.drop_pad_mode != 1)
    return invalid_argument(
        kOp, "drop_pad_mode must be 0 (dropless, row layout) or 1 (drop-pad, row layout), got ",
        attrs.drop_pad_mode);
  if (attrs.active_num < 0)
    return invalid_argument(kOp, "active_num must be >= 0, got ", attrs.active_num);
  if (attrs.expert_num < 0)
    return invalid_argument(kOp, "expert_num must be >= 0, got ", attrs.expert_num);
  if (attrs.expert_capacity < 0)
    return invalid_argument(kOp, "expert_capacity must be >= 0, got ", attrs.expert_capacity);
  if (!is_valid_numerics(static_cast<int32_t>(attrs.numerics)))
    return invalid_argument(kOp, "numerics must be atlas_a2 or ascend_950, got ",
                            static_cast<int>(attrs.numerics));

  const TensorView& gy = in.grad_y;
  if (gy.ndim != 2 || !is_floating(gy.dtype))
    return invalid_argument(kOp, "grad_y must be 2-D [N, H] float16, bfloat16 or float32, got ",
                            describe(gy));
  MOE_ROUTING_RETURN_IF_ERROR(detail::check_dims_non_negative(kOp, "grad_y", gy));
  MOE_ROUTING_RETURN_IF_ERROR(detail::check_element_count(kOp, "grad_y", gy));
  const TensorView& idx = in.expanded_row_idx;
  MOE_ROUTING_RETURN_IF_ERROR(detail::check_expanded_row_idx_tensor(kOp, idx));
  const int64_t pairs = idx.shape[0];
  // The inputs checked against grad_y.
  const struct {
    const char* name;
    const TensorView& tensor;
  } others[] = {{"expanded_row_idx", idx},
                {"expanded_x", in.expanded_x},
                {"scales", in.scales},
                {"expert_idx", in.expert_idx},
                {"bias", in.bias}};
  for (const auto& t : others) {
    if (is_absent(t.tensor)) continue;
    MOE_ROUTING_RETURN_IF_ERROR(detail::check_dims_non_negative(kOp, t.name, t.tensor));
    if (t.tensor.device != gy.device)
      return invalid_argument(kOp, t.name, " must be on the device of grad_y (",
                              device_name(gy.device), "), got ", device_name(t.tensor.device));
  }

  MoeFinalizeRoutingGradPlan p;
  p.dtype = gy.dtype;
  p.numerics = attrs.numerics;
  p.drop_pad = attrs.drop_pad_mode == 1;
  p.num_rows = gy.shape[0];
  p.hidden = gy.shape[1];
  p.has_scales = !is_absent(in.scales);
  p.has_expanded_x = !is_absent(in.expanded_x);
  p.has_bias = !is_absent(in.bias);
  p.has_expert_idx = !is_absent(in.expert_idx);
  const int64_t N = p.num_rows, H = p.hidden;

  if (p.has_scales) {
    const TensorView& s = in.scales;
    const bool mixed = gy.dtype == DType::bfloat16 && s.dtype == DType::float32;
    if (s.ndim != 2 || (s.dtype != gy.dtype && !mixed))
      return invalid_argument(
          kOp, "scales must be 2-D [N, K] of the dtype of grad_y (", dtype_name(gy.dtype),
          gy.dtype == DType::bfloat16 ? ") or float32" : ")", ", got ", describe(s));
    if (s.shape[0] != N || s.shape[1] < 1)
      return invalid_argument(kOp, "scales must be [N, K] with N = grad_y.size(0) (", N,
                              ") and K >= 1, got ", describe(s));
    MOE_ROUTING_RETURN_IF_ERROR(detail::check_element_count(kOp, "scales", s));  // N * K fits
    p.top_k = s.shape[1];
    p.scales_dtype = s.dtype;
    if (pairs != N * p.top_k)
      return invalid_argument(kOp, "len(expanded_row_idx) must be N*K (", N, " * ", p.top_k,
                              "), got ", pairs);
  } else {
    // Without scales every pair of a token adds grad_y[i] itself: K follows from the lengths.
    p.scales_dtype = gy.dtype;
    p.top_k = N > 0 ? pairs / N : 1;
    if (N > 0 ? pairs % N != 0 || pairs == 0 : pairs != 0)
      return invalid_argument(kOp, "len(expanded_row_idx) must be a positive multiple of N (", N,
                              ") when scales is absent, got ", pairs);
  }
  const int64_t K = p.top_k;

  // The rows of grad_expanded_x.
  if (p.drop_pad) {
    const int64_t E = attrs.expert_num, C = attrs.expert_capacity;
    // One expert's slots must be addressable even when E = 0 leaves the output empty: [0, C, H]
    // is still a tensor's shape, whose strides (C*H elements) must fit int64 (PyTorch computes
    // them when the binding allocates it).
    if (H > 0 && C > std::numeric_limits<int64_t>::max() / H / int64_t(dtype_size(gy.dtype)))
      return invalid_argument(kOp,
                              "grad_expanded_x would have more than 2^63 - 1 bytes per expert "
                              "(expert_capacity * H), got ",
                              C, " * ", H);
    if (C != 0 && E > kInt32Max / C)
      return invalid_argument(kOp,
                              "expert_num * expert_capacity must be at most 2147483647 "
                              "(int32 indices), got ",
                              E, " * ", C);
    p.expanded_rows = E * C;
    p.skip_to = p.expanded_rows;
    p.grad_expanded_x.produced = true;
    p.grad_expanded_x.dtype = gy.dtype;
    p.grad_expanded_x.ndim = 3;
    p.grad_expanded_x.shape[0] = E;
    p.grad_expanded_x.shape[1] = C;
    p.grad_expanded_x.shape[2] = H;
  } else {
    p.expanded_rows = attrs.active_num > 0 && attrs.active_num < pairs ? attrs.active_num : pairs;
    p.skip_to = pairs;
    p.grad_expanded_x = spec_2d(gy.dtype, p.expanded_rows, H);
  }
  if (H > 0 &&
      p.expanded_rows > std::numeric_limits<int64_t>::max() / H / int64_t(dtype_size(gy.dtype)))
    return invalid_argument(kOp, "grad_expanded_x would have more than 2^63 - 1 bytes, got ",
                            p.expanded_rows, " rows of ", H);

  if (p.has_expanded_x)
    MOE_ROUTING_RETURN_IF_ERROR(check_shape("expanded_x", in.expanded_x, p.grad_expanded_x,
                                            "the shape of grad_expanded_x"));
  if (p.has_expert_idx)
    MOE_ROUTING_RETURN_IF_ERROR(
        check_shape("expert_idx", in.expert_idx, spec_2d(DType::int32, N, K), "[N, K]"));
  if (p.has_bias) {
    if (!p.has_expert_idx)
      return invalid_argument(kOp,
                              "bias needs expert_idx (the row of bias of each pair), got none");
    const TensorView& b = in.bias;
    if (b.ndim != 2 || b.dtype != gy.dtype || b.shape[1] != H)
      return invalid_argument(kOp, "bias must be 2-D ", dtype_name(gy.dtype), " [E, ", H,
                              "] ([E, H]), got ", describe(b));
    if (p.drop_pad && b.shape[0] != attrs.expert_num)
      return invalid_argument(kOp, "bias.size(0) must equal expert_num (", attrs.expert_num,
                              ") in drop-pad mode, got ", b.shape[0]);
    // expert_idx holds int32 rows of bias, and the CPU backend lists the pairs per expert with
    // int32 offsets (its workspace holds E + 2 of them): more rows can never be addressed.
    if (b.shape[0] > kInt32Max)
      return invalid_argument(kOp,
                              "bias.size(0) (E) must be at most 2147483647 (expert_idx holds "
                              "int32 rows of bias), got ",
                              b.shape[0]);
    p.expert_num = b.shape[0];
    MOE_ROUTING_RETURN_IF_ERROR(detail::check_element_count(kOp, "bias", b));
  }
  if (p.has_bias) p.grad_bias = spec_2d(gy.dtype, p.expert_num, H);
  if (p.has_scales && p.has_expanded_x) p.grad_scales = spec_2d(p.scales_dtype, N, K);

  p.compute_grad_scales = p.grad_scales.produced;
  p.compute_grad_bias = p.grad_bias.produced;
  *plan = p;
  return Status::ok();
}

Status check_moe_finalize_routing_grad_indices(const int32_t* expanded_row_idx,
                                               const int32_t* expert_idx,
                                               const MoeFinalizeRoutingGradPlan& plan) {
  const int64_t K = plan.top_k, R = plan.expanded_rows, pairs = plan.num_rows * plan.top_k;
  MOE_ROUTING_RETURN_IF_ERROR(
      detail::check_finalize_row_indices(kOp, expanded_row_idx, pairs, R, plan.skip_to));
  if (!plan.has_bias || expert_idx == nullptr) return Status::ok();
  for (int64_t q = 0; q < pairs; ++q) {
    const int64_t r = expanded_row_idx[q], e = expert_idx[q];
    if (r < 0 || r >= R) continue;  // a dropped pair reads no bias row
    if (e < 0 || e >= plan.expert_num)
      return detail::finalize_expert_error(kOp, q / K, q % K, e, plan.expert_num);
  }
  return Status::ok();
}

namespace detail {

Status validate_moe_finalize_routing_grad(const MoeFinalizeRoutingGradInputs& in,
                                          const MoeFinalizeRoutingGradAttrs& attrs,
                                          const MoeFinalizeRoutingGradOutputs& out,
                                          const ExecConfig& config,
                                          MoeFinalizeRoutingGradPlan* plan) {
  MOE_ROUTING_RETURN_IF_ERROR(infer_moe_finalize_routing_grad(in, attrs, plan));
  // grad_scales and grad_bias are computed when the caller passes them (absent: not wanted);
  // wanting one the inputs cannot give is the caller's mistake.
  MoeFinalizeRoutingGradPlan& p = *plan;
  p.compute_grad_scales = !is_absent(out.grad_scales);
  if (p.compute_grad_scales && !p.grad_scales.produced)
    return invalid_argument(kOp, "grad_scales needs scales and expanded_x, got ",
                            p.has_scales ? "no expanded_x" : "no scales");
  p.compute_grad_bias = !is_absent(out.grad_bias);
  if (p.compute_grad_bias && !p.grad_bias.produced)
    return invalid_argument(kOp, "grad_bias needs bias, got none");
  OutputSpec grad_scales = p.grad_scales, grad_bias = p.grad_bias;
  grad_scales.produced = p.compute_grad_scales;
  grad_bias.produced = p.compute_grad_bias;
  // What the CPU backend writes into a caller's workspace (validate_call checks it); its size
  // only where validate_call reads it.
  CallWorkspace workspace;
  if (checks_caller_workspace(config, in.grad_y.device))
    workspace.needed = moe_finalize_routing_grad_workspace_size(p, config.num_threads);
  workspace.size_function = "moe_finalize_routing_grad_workspace_size";
  return validate_call(kOp,
                       {{"grad_y", in.grad_y},
                        {"expanded_row_idx", in.expanded_row_idx},
                        {"expanded_x", in.expanded_x},
                        {"scales", in.scales},
                        {"expert_idx", in.expert_idx},
                        {"bias", in.bias}},
                       {{"grad_expanded_x", out.grad_expanded_x, p.grad_expanded_x},
                        {"grad_scales", out.grad_scales, grad_scales},
                        {"grad_bias", out.grad_bias, grad_bias}},
                       config, workspace);
}

int cpu_threads(const MoeFinalizeRoutingGradPlan& plan, int num_threads) {
  return cpu::moe_finalize_routing_grad_threads(plan, num_threads);
}

}  // namespace detail
}  // namespace moe_routing
