// Shape inference and every check of moe_finalize_routing that needs no tensor data, written once
// (docs/spec/moe_finalize_routing.md §1-§2 as amended by its Decisions and docs/decisions.md
// §14-§16): infer_* for the shapes, validate_* for a whole call. The C++ entry point, the C ABI's
// phase one, the CLI and the torch Meta kernel all call through here.
#include "ops/moe_finalize_routing/meta.h"

#include <cstring>
#include <iterator>
#include <limits>

#include "cpu/cpu_backend.h"
#include "ops/validation.h"
#include "params/finalize_routing_checks.h"

namespace moe_routing {
namespace {

constexpr const char* kOp = "moe_finalize_routing: ";
constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

/// An input and its argument name, for the checks every input shares.
struct NamedTensor {
  const char* name;
  const TensorView* tensor;
};

/// A present 2-D tensor must be `dtype` [rows, cols]; `what` names the extents for the message.
Status check_2d(const char* name, const TensorView& t, DType dtype, int64_t rows, int64_t cols,
                const char* what) {
  if (t.ndim == 2 && t.dtype == dtype && t.shape[0] == rows && t.shape[1] == cols)
    return Status::ok();
  return invalid_argument(kOp, name, " must be 2-D ", dtype_name(dtype), " [", rows, ", ", cols,
                          "] (", what, "), got ", describe(t));
}

Status check_range(const char* name, const ExpertRange& range) {
  if (!range.enabled()) return Status::ok();
  if (range.start < 0 || range.end <= range.start)
    return invalid_argument(kOp, name,
                            " must be [-1, -1] (none) or [start, end) with 0 <= start < end, got [",
                            range.start, ", ", range.end, ")");
  return Status::ok();
}

Status check_ranges_disjoint(const char* a_name, const ExpertRange& a, const char* b_name,
                             const ExpertRange& b) {
  if (a.enabled() && b.enabled() && a.start < b.end && b.start < a.end)
    return invalid_argument(kOp, a_name, " and ", b_name, " must not overlap, got [", a.start, ", ",
                            a.end, ") and [", b.start, ", ", b.end, ")");
  return Status::ok();
}

Status check_attrs(const MoeFinalizeRoutingAttrs& attrs) {
  if (attrs.drop_pad_mode < 0 || attrs.drop_pad_mode > 3)
    return invalid_argument(kOp,
                            "drop_pad_mode must be 0 (dropless, column), 1 (drop-pad, column), "
                            "2 (dropless, row) or 3 (drop-pad, row), got ",
                            attrs.drop_pad_mode);
  if (attrs.api != FinalizeRoutingApi::v1 && attrs.api != FinalizeRoutingApi::v2)
    return invalid_argument(kOp, "api must be v1 or v2, got ", static_cast<int>(attrs.api));
  if (!is_valid_numerics(static_cast<int32_t>(attrs.numerics)))
    return invalid_argument(kOp, "numerics must be atlas_a2 or ascend_950, got ",
                            static_cast<int>(attrs.numerics));
  if (attrs.top_k < 1) return invalid_argument(kOp, "top_k must be >= 1, got ", attrs.top_k);
  MOE_ROUTING_RETURN_IF_ERROR(check_range("zero_expert_range", attrs.zero_expert_range));
  MOE_ROUTING_RETURN_IF_ERROR(check_range("copy_expert_range", attrs.copy_expert_range));
  MOE_ROUTING_RETURN_IF_ERROR(check_range("constant_expert_range", attrs.constant_expert_range));
  MOE_ROUTING_RETURN_IF_ERROR(check_ranges_disjoint("zero_expert_range", attrs.zero_expert_range,
                                                    "copy_expert_range", attrs.copy_expert_range));
  MOE_ROUTING_RETURN_IF_ERROR(check_ranges_disjoint("zero_expert_range", attrs.zero_expert_range,
                                                    "constant_expert_range",
                                                    attrs.constant_expert_range));
  MOE_ROUTING_RETURN_IF_ERROR(check_ranges_disjoint("copy_expert_range", attrs.copy_expert_range,
                                                    "constant_expert_range",
                                                    attrs.constant_expert_range));
  if (attrs.api == FinalizeRoutingApi::v1) {
    if (attrs.drop_pad_mode != 0)
      return invalid_argument(kOp, "drop_pad_mode must be 0 with api v1 (its column layout), got ",
                              attrs.drop_pad_mode);
    if (attrs.zero_expert_range.enabled() || attrs.copy_expert_range.enabled() ||
        attrs.constant_expert_range.enabled())
      return invalid_argument(kOp,
                              "expert ranges must be [-1, -1] with api v1 (they are V3/V4's), "
                              "got an enabled range");
  }
  return Status::ok();
}

}  // namespace

const char* finalize_routing_api_name(FinalizeRoutingApi api) {
  switch (api) {
    case FinalizeRoutingApi::v1: return "v1";
    case FinalizeRoutingApi::v2: return "v2";
  }
  return "unknown";
}

bool parse_finalize_routing_api(const char* text, FinalizeRoutingApi* api) {
  if (text == nullptr) return false;
  if (std::strcmp(text, "v1") == 0) {
    *api = FinalizeRoutingApi::v1;
    return true;
  }
  if (std::strcmp(text, "v2") == 0) {
    *api = FinalizeRoutingApi::v2;
    return true;
  }
  return false;
}

Status infer_moe_finalize_routing(const MoeFinalizeRoutingInputs& in,
                                  const MoeFinalizeRoutingAttrs& attrs,
                                  MoeFinalizeRoutingPlan* plan) {
  using detail::is_absent;
  MOE_ROUTING_RETURN_IF_ERROR(check_attrs(attrs));
  const bool v1 = attrs.api == FinalizeRoutingApi::v1;
  const bool drop_pad = attrs.drop_pad_mode == 1 || attrs.drop_pad_mode == 3;
  // Every input; the optional ones follow the first two.
  const NamedTensor inputs[] = {{"expanded_x", &in.expanded_x},
                                {"expanded_row_idx", &in.expanded_row_idx},
                                {"x1", &in.x1},
                                {"x2", &in.x2},
                                {"bias", &in.bias},
                                {"scales", &in.scales},
                                {"expert_idx", &in.expert_idx},
                                {"x", &in.x},
                                {"alpha1", &in.alpha1},
                                {"alpha2", &in.alpha2},
                                {"v", &in.v}};
  const NamedTensor* const optional = inputs + 2;

  // expanded_x and expanded_row_idx.
  const TensorView& ex = in.expanded_x;
  if (!drop_pad && ex.ndim != 2)
    return invalid_argument(kOp, "expanded_x must be 2-D [R, H] when drop_pad_mode=",
                            attrs.drop_pad_mode, " (dropless), got ", describe(ex));
  if (drop_pad && ex.ndim != 3)
    return invalid_argument(kOp, "expanded_x must be 3-D [E, C, H] when drop_pad_mode=",
                            attrs.drop_pad_mode, " (drop-pad), got ", describe(ex));
  if (!is_floating(ex.dtype))
    return invalid_argument(kOp, "expanded_x must be float16, bfloat16 or float32, got ",
                            dtype_name(ex.dtype));
  MOE_ROUTING_RETURN_IF_ERROR(detail::check_dims_non_negative(kOp, "expanded_x", ex));
  MOE_ROUTING_RETURN_IF_ERROR(detail::check_element_count(kOp, "expanded_x", ex));
  const TensorView& idx = in.expanded_row_idx;
  MOE_ROUTING_RETURN_IF_ERROR(detail::check_expanded_row_idx_tensor(kOp, idx));
  const int64_t pairs = idx.shape[0];
  if (idx.device != ex.device)
    return invalid_argument(kOp, "expanded_row_idx must be on the device of expanded_x (",
                            device_name(ex.device), "), got ", device_name(idx.device));
  for (const NamedTensor* t = optional; t != std::end(inputs); ++t) {
    if (is_absent(*t->tensor)) continue;
    MOE_ROUTING_RETURN_IF_ERROR(detail::check_dims_non_negative(kOp, t->name, *t->tensor));
    if (t->tensor->device != ex.device)
      return invalid_argument(kOp, t->name, " must be on the device of expanded_x (",
                              device_name(ex.device), "), got ", device_name(t->tensor->device));
  }

  MoeFinalizeRoutingPlan p;
  p.dtype = ex.dtype;
  p.drop_pad_mode = attrs.drop_pad_mode;
  p.column_layout = attrs.drop_pad_mode <= 1;
  p.api = attrs.api;
  p.numerics = attrs.numerics;
  p.hidden = ex.shape[ex.ndim - 1];
  p.has_x1 = !is_absent(in.x1);
  p.has_x2 = !is_absent(in.x2);
  p.has_bias = !is_absent(in.bias);
  p.has_scales = !is_absent(in.scales);
  p.has_expert_idx = !is_absent(in.expert_idx);
  p.has_x = !is_absent(in.x);
  const bool has_alpha1 = !is_absent(in.alpha1), has_alpha2 = !is_absent(in.alpha2),
             has_v = !is_absent(in.v);

  // Which inputs the api and the other inputs require.
  if (v1) {
    const NamedTensor required[] = {
        {"x1", &in.x1}, {"bias", &in.bias}, {"scales", &in.scales}, {"expert_idx", &in.expert_idx}};
    for (const NamedTensor& t : required)
      if (is_absent(*t.tensor))
        return invalid_argument(kOp, t.name, " must be present with api v1, got none");
    const NamedTensor v3_only[] = {
        {"x", &in.x}, {"alpha1", &in.alpha1}, {"alpha2", &in.alpha2}, {"v", &in.v}};
    for (const NamedTensor& t : v3_only)
      if (!is_absent(*t.tensor))
        return invalid_argument(kOp, t.name,
                                " must be absent with api v1 (it belongs to V3/V4), got ",
                                describe(*t.tensor));
  }
  if (p.has_x2 && !p.has_x1)
    return invalid_argument(kOp, "x2 needs x1 (CANN adds x2 only to x1), got x2 without x1");
  if (p.has_bias && !p.has_expert_idx)
    return invalid_argument(kOp, "bias needs expert_idx (the row of bias of each pair), got none");
  const ExpertRange* ranges[] = {&attrs.zero_expert_range, &attrs.copy_expert_range,
                                 &attrs.constant_expert_range};
  const char* range_names[] = {"zero_expert_range", "copy_expert_range", "constant_expert_range"};
  for (int r = 0; r < 3; ++r)
    if (ranges[r]->enabled() && !p.has_expert_idx)
      return invalid_argument(kOp, range_names[r], " needs expert_idx, got none");
  for (int r = 1; r < 3; ++r)
    if (ranges[r]->enabled() && !p.has_x)
      return invalid_argument(kOp, range_names[r], " needs x (the tokens' input rows), got none");
  if (has_alpha1 != has_alpha2 || has_alpha1 != has_v)
    return invalid_argument(kOp, "alpha1, alpha2 and v must be given together, got ",
                            has_alpha1 ? "" : "no ", "alpha1, ", has_alpha2 ? "" : "no ",
                            "alpha2 and ", has_v ? "" : "no ", "v");
  if (attrs.constant_expert_range.enabled() && !has_alpha1)
    return invalid_argument(kOp, "constant_expert_range needs alpha1, alpha2 and v, got none");
  if (has_alpha1 && !attrs.constant_expert_range.enabled())
    return invalid_argument(kOp,
                            "alpha1, alpha2 and v need constant_expert_range, got [-1, -1] (none)");

  // K and N.
  if (p.has_scales) {
    const TensorView& s = in.scales;
    const bool mixed = ex.dtype == DType::bfloat16 && s.dtype == DType::float32;
    if (s.ndim != 2 || (s.dtype != ex.dtype && !mixed))
      return invalid_argument(
          kOp, "scales must be 2-D [N, K] of the dtype of expanded_x (", dtype_name(ex.dtype),
          ex.dtype == DType::bfloat16 ? ") or float32" : ")", ", got ", describe(s));
    if (s.shape[1] < 1)
      return invalid_argument(kOp, "scales.size(1) (K) must be >= 1, got ", s.shape[1]);
    if (attrs.top_k > 1 && attrs.top_k != s.shape[1])
      return invalid_argument(kOp, "top_k must be 1 or scales.size(1) (", s.shape[1],
                              ") when scales is given, got ", attrs.top_k);
    p.top_k = s.shape[1];
    p.scales_dtype = s.dtype;
  } else {
    p.top_k = attrs.top_k;
    p.scales_dtype = ex.dtype;
  }
  // K named by where it came from: scales.size(1), else the top_k attribute the caller gave.
  if (pairs % p.top_k != 0)
    return invalid_argument(kOp, "len(expanded_row_idx) must be a multiple of ",
                            p.has_scales ? "K" : "top_k", " (", p.top_k, "), got ", pairs);
  p.num_rows = pairs / p.top_k;
  const int64_t N = p.num_rows, K = p.top_k, H = p.hidden;
  if (p.has_scales && in.scales.shape[0] != N)
    return invalid_argument(kOp, "scales must be [N, K] = [", N, ", ", K, "], got ",
                            describe(in.scales));

  // The rows of expanded_x.
  if (drop_pad) {
    const int64_t experts = ex.shape[0], capacity = ex.shape[1];
    if (capacity != 0 && experts > kInt32Max / capacity)
      return invalid_argument(kOp,
                              "expanded_x must have at most 2147483647 rows E*C (int32 "
                              "indices), got ",
                              shape_string(ex));
    p.expanded_rows = experts * capacity;
    p.skip_to = p.expanded_rows;
  } else {
    p.expanded_rows = ex.shape[0];
    if (p.expanded_rows > pairs)
      return invalid_argument(kOp, "expanded_x.size(0) must be at most N*K (", pairs,
                              ") in dropless mode, got ", p.expanded_rows);
    p.skip_to = pairs;
  }

  // The other inputs' shapes and dtypes.
  if (p.has_x1) MOE_ROUTING_RETURN_IF_ERROR(check_2d("x1", in.x1, ex.dtype, N, H, "[N, H]"));
  if (p.has_x2) MOE_ROUTING_RETURN_IF_ERROR(check_2d("x2", in.x2, ex.dtype, N, H, "[N, H]"));
  if (p.has_expert_idx)
    MOE_ROUTING_RETURN_IF_ERROR(
        check_2d("expert_idx", in.expert_idx, DType::int32, N, K, "[N, K]"));
  if (p.has_bias) {
    const TensorView& b = in.bias;
    if (b.ndim != 2 || b.dtype != ex.dtype || b.shape[1] != H)
      return invalid_argument(kOp, "bias must be 2-D ", dtype_name(ex.dtype), " [E, ", H,
                              "] ([E, H]), got ", describe(b));
    if (drop_pad && b.shape[0] != ex.shape[0])
      return invalid_argument(kOp, "bias.size(0) must equal expanded_x.size(0) (E = ", ex.shape[0],
                              ") in drop-pad mode, got ", b.shape[0]);
    p.expert_num = b.shape[0];
  }
  if (p.has_x) MOE_ROUTING_RETURN_IF_ERROR(check_2d("x", in.x, ex.dtype, N, H, "[N, H]"));
  if (has_alpha1) {
    const int64_t c = attrs.constant_expert_range.size();
    const char* what = "[constant_expert_range size, H]";
    MOE_ROUTING_RETURN_IF_ERROR(check_2d("alpha1", in.alpha1, ex.dtype, c, H, what));
    MOE_ROUTING_RETURN_IF_ERROR(check_2d("alpha2", in.alpha2, ex.dtype, c, H, what));
    MOE_ROUTING_RETURN_IF_ERROR(check_2d("v", in.v, ex.dtype, c, H, what));
  }
  for (const NamedTensor* t = optional; t != std::end(inputs); ++t)
    if (!is_absent(*t->tensor))
      MOE_ROUTING_RETURN_IF_ERROR(detail::check_element_count(kOp, t->name, *t->tensor));
  p.zero_expert_range = attrs.zero_expert_range;
  p.copy_expert_range = attrs.copy_expert_range;
  p.constant_expert_range = attrs.constant_expert_range;

  MOE_ROUTING_RETURN_IF_ERROR(detail::check_output_bytes(kOp, "out", ex.dtype, {N, H}));
  p.out.produced = true;
  p.out.dtype = ex.dtype;
  p.out.ndim = 2;
  p.out.shape[0] = N;
  p.out.shape[1] = H;

  *plan = p;
  return Status::ok();
}

Status check_moe_finalize_routing_indices(const int32_t* expanded_row_idx,
                                          const int32_t* expert_idx,
                                          const MoeFinalizeRoutingPlan& plan) {
  const int64_t N = plan.num_rows, K = plan.top_k, R = plan.expanded_rows;
  MOE_ROUTING_RETURN_IF_ERROR(
      detail::check_finalize_row_indices(kOp, expanded_row_idx, N * K, R, plan.skip_to));
  if (!plan.has_bias || expert_idx == nullptr) return Status::ok();
  // Expert ids select a row of bias for every pair that reads one: not dropped, not a zero expert.
  for (int64_t i = 0; i < N; ++i)
    for (int64_t t = 0; t < K; ++t) {
      const int64_t r = expanded_row_idx[plan.column_layout ? t * N + i : i * K + t];
      const int64_t e = expert_idx[i * K + t];
      if (r < 0 || r >= R || plan.zero_expert_range.contains(e)) continue;
      if (e < 0 || e >= plan.expert_num)
        return detail::finalize_expert_error(kOp, i, t, e, plan.expert_num);
    }
  return Status::ok();
}

namespace detail {

Status validate_moe_finalize_routing(const MoeFinalizeRoutingInputs& in,
                                     const MoeFinalizeRoutingAttrs& attrs, const TensorView& out,
                                     const ExecConfig& config, MoeFinalizeRoutingPlan* plan) {
  MOE_ROUTING_RETURN_IF_ERROR(infer_moe_finalize_routing(in, attrs, plan));
  return validate_call(kOp,
                       {{"expanded_x", in.expanded_x},
                        {"expanded_row_idx", in.expanded_row_idx},
                        {"x1", in.x1},
                        {"x2", in.x2},
                        {"bias", in.bias},
                        {"scales", in.scales},
                        {"expert_idx", in.expert_idx},
                        {"x", in.x},
                        {"alpha1", in.alpha1},
                        {"alpha2", in.alpha2},
                        {"v", in.v}},
                       {{"out", out, plan->out}}, config);
}

int cpu_threads(const MoeFinalizeRoutingPlan& plan, int num_threads) {
  return cpu::moe_finalize_routing_threads(plan, num_threads);
}

}  // namespace detail
}  // namespace moe_routing
