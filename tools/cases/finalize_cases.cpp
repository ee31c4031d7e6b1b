#include "cases/finalize_cases.h"

#include <algorithm>
#include <numeric>
#include <utility>

namespace moe_routing::cases {

void fill_special(Random& rng, std::initializer_list<FloatBuffer*> buffers) {
  const std::vector<float> specials = special_floats();
  for (FloatBuffer* b : buffers)
    for (int64_t e = 0; e < b->count(); ++e)
      store_from_float(b->data(), b->dtype, e,
                       specials[size_t(rng.integer(0, int64_t(specials.size()) - 1))]);
}

FloatBuffer random_buffer(Random& rng, DType dtype, int64_t count) {
  std::vector<float> values(static_cast<size_t>(count));
  for (float& v : values) v = spread_value(rng);
  return FloatBuffer::from_floats(dtype, values);
}

std::vector<int32_t> random_row_indices(Random& rng, int64_t pairs, int64_t rows, bool drop_pad,
                                        double drop_fraction, bool duplicates) {
  std::vector<int32_t> idx(static_cast<size_t>(pairs));
  std::iota(idx.begin(), idx.end(), 0);
  for (int64_t q = pairs - 1; q > 0; --q) std::swap(idx[size_t(q)], idx[size_t(rng.integer(0, q))]);
  for (int32_t& r : idx) {
    if (drop_pad && r >= rows) r = -1;  // more pairs than slots: dropped
    if (rng.integer(0, 999) < int64_t(drop_fraction * 1000)) r = -1;
    if (duplicates && rows > 0 && rng.integer(0, 3) == 0) r = int32_t(rng.integer(0, rows - 1));
  }
  return idx;
}

MoeFinalizeRoutingInputs FinalizeCase::inputs() {
  const FinalizeOptions& o = options;
  const bool constant = attrs.constant_expert_range.enabled();
  const int64_t C = attrs.constant_expert_range.size();
  MoeFinalizeRoutingInputs in;
  in.expanded_x = view_of(expanded_x, true, expanded_shape);
  in.expanded_row_idx = TensorView(idx.data(), DType::int32, {int64_t(idx.size())});
  in.x1 = view_of(x1, o.x1, {N, H});
  in.x2 = view_of(x2, o.x2, {N, H});
  in.bias = view_of(bias, o.bias, {E, H});
  in.scales = view_of(scales, o.scales, {N, K});
  if (o.expert_idx) in.expert_idx = TensorView(expert_idx.data(), DType::int32, {N, K});
  in.x = view_of(x, o.special, {N, H});
  in.alpha1 = view_of(alpha1, constant, {C, H});
  in.alpha2 = view_of(alpha2, constant, {C, H});
  in.v = view_of(v, constant, {C, H});
  return in;
}

FinalizeCase make_finalize_case(Random& rng, DType dtype, int64_t mode, Numerics numerics,
                                FinalizeOptions o, int64_t N, int64_t K, int64_t H,
                                FinalizeRoutingApi api) {
  FinalizeCase c;
  c.dtype = dtype;
  c.N = N, c.K = K, c.H = H;
  if (o.x2) o.x1 = true;
  if (o.bias || o.special) o.expert_idx = true;
  c.options = o;
  c.attrs.drop_pad_mode = mode;
  c.attrs.api = api;
  c.attrs.numerics = numerics;
  if (!o.scales) c.attrs.top_k = K;
  const bool drop_pad = mode == 1 || mode == 3;
  const int64_t pairs = N * K;
  c.E = rng.integer(4, 9);
  int64_t rows = pairs;
  if (drop_pad) {
    const int64_t capacity = rng.integer(0, std::max<int64_t>(1, pairs / c.E + 1));
    rows = c.E * capacity;
    c.expanded_shape = {c.E, capacity, H};
  } else {
    if (o.cut_rows && rng.integer(0, 3) == 0) rows = rng.integer(0, pairs);
    c.expanded_shape = {rows, H};
  }
  c.idx = random_row_indices(rng, pairs, rows, drop_pad, o.drop_fraction, o.duplicates);
  c.expanded_x = random_buffer(rng, dtype, rows * H);
  c.x1 = random_buffer(rng, dtype, N * H);
  c.x2 = random_buffer(rng, dtype, N * H);
  c.bias = random_buffer(rng, dtype, c.E * H);
  c.scales = random_buffer(rng, o.mixed_scales ? DType::float32 : dtype, N * K);
  c.x = random_buffer(rng, dtype, N * H);
  c.expert_idx.resize(size_t(pairs));
  for (int32_t& e : c.expert_idx) e = int32_t(rng.integer(0, c.E - 1));
  if (o.special) {
    c.attrs.zero_expert_range = {c.E - 3, c.E - 2};
    c.attrs.copy_expert_range = {c.E - 2, c.E - 1};
    c.attrs.constant_expert_range = {c.E - 1, c.E};
    c.alpha1 = random_buffer(rng, dtype, H);
    c.alpha2 = random_buffer(rng, dtype, H);
    c.v = random_buffer(rng, dtype, H);
  }
  return c;
}

Status run_finalize(FinalizeCase& c, const Runner& runner, FloatBuffer* out) {
  *out = FloatBuffer(c.dtype, c.N * c.H);
  out->poison();
  return moe_finalize_routing(c.inputs(), c.attrs, TensorView(out->data(), c.dtype, {c.N, c.H}),
                              runner.config());
}

// ---- the grad ---------------------------------------------------------------------------------

MoeFinalizeRoutingGradInputs FinalizeGradCase::inputs() {
  const GradOptions& o = options;
  MoeFinalizeRoutingGradInputs in;
  in.grad_y = view_of(grad_y, true, {N, H});
  in.expanded_row_idx = TensorView(idx.data(), DType::int32, {int64_t(idx.size())});
  in.expanded_x = view_of(expanded_x, o.expanded_x, expanded_shape);
  in.scales = view_of(scales, o.scales, {N, K});
  if (o.bias) in.expert_idx = TensorView(expert_idx.data(), DType::int32, {N, K});
  in.bias = view_of(bias, o.bias, {E, H});
  return in;
}

FinalizeGradCase make_finalize_grad_case(Random& rng, DType dtype, int64_t mode, Numerics numerics,
                                         GradOptions o, int64_t N, int64_t K, int64_t H) {
  FinalizeGradCase c;
  if (!o.scales) o.grad_scales = false;
  if (!o.expanded_x) o.grad_scales = false;
  if (!o.bias) o.grad_bias = false;
  c.dtype = dtype;
  c.scales_dtype = o.mixed_scales ? DType::float32 : dtype;
  c.N = N, c.K = K, c.H = H;
  c.options = o;
  c.attrs.drop_pad_mode = mode;
  c.attrs.numerics = numerics;
  const int64_t pairs = N * K;
  c.E = rng.integer(1, 8);
  if (mode == 1) {
    c.attrs.expert_num = c.E;
    c.attrs.expert_capacity = rng.integer(0, std::max<int64_t>(1, pairs / c.E + 1));
    c.rows = c.E * c.attrs.expert_capacity;
    c.expanded_shape = {c.E, c.attrs.expert_capacity, H};
  } else {
    c.rows = pairs;
    if (pairs > 1 && rng.integer(0, 2) == 0) {
      c.attrs.active_num = rng.integer(1, pairs - 1);
      c.rows = c.attrs.active_num;
    }
    c.expanded_shape = {c.rows, H};
  }
  c.idx = random_row_indices(rng, pairs, c.rows, mode == 1, o.drop_fraction, o.duplicates);
  c.grad_y = random_buffer(rng, dtype, N * H);
  c.expanded_x = random_buffer(rng, dtype, c.rows * H);
  c.scales = random_buffer(rng, c.scales_dtype, N * K);
  c.bias = random_buffer(rng, dtype, c.E * H);
  c.expert_idx.resize(size_t(pairs));
  for (int32_t& e : c.expert_idx) e = int32_t(rng.integer(0, c.E - 1));
  return c;
}

GradResult poisoned_grad_result(const FinalizeGradCase& c) {
  GradResult r{FloatBuffer(c.dtype, c.rows * c.H),
               FloatBuffer(c.scales_dtype, c.options.grad_scales ? c.N * c.K : 0),
               FloatBuffer(c.dtype, c.options.grad_bias ? c.E * c.H : 0)};
  r.grad_expanded_x.poison();
  r.grad_scales.poison();
  r.grad_bias.poison();
  return r;
}

MoeFinalizeRoutingGradOutputs grad_outputs(const FinalizeGradCase& c, GradResult& r) {
  MoeFinalizeRoutingGradOutputs out;
  out.grad_expanded_x = view_of(r.grad_expanded_x, true, c.expanded_shape);
  out.grad_scales = view_of(r.grad_scales, c.options.grad_scales, {c.N, c.K});
  out.grad_bias = view_of(r.grad_bias, c.options.grad_bias, {c.E, c.H});
  return out;
}

Status run_finalize_grad(FinalizeGradCase& c, const Runner& runner, GradResult* out) {
  *out = poisoned_grad_result(c);
  const MoeFinalizeRoutingGradOutputs outputs = grad_outputs(c, *out);
  ExecConfig config = runner.config();
  std::vector<char> workspace;
  if (runner.caller_workspace) {
    // The plan of this call: infer's, computing the gradients the call asks for (the public
    // API's way to size a workspace exactly).
    MoeFinalizeRoutingGradPlan plan;
    const Status s = infer_moe_finalize_routing_grad(c.inputs(), c.attrs, &plan);
    if (!s.is_ok()) return s;
    plan.compute_grad_scales = c.options.grad_scales;
    plan.compute_grad_bias = c.options.grad_bias;
    config.workspace_bytes = moe_finalize_routing_grad_workspace_size(plan, runner.threads);
    workspace.resize(size_t(config.workspace_bytes) + 1);
    config.workspace = workspace.data() + 1;
  }
  return moe_finalize_routing_grad(c.inputs(), c.attrs, outputs, config);
}

std::string difference(const GradResult& expected, const GradResult& got) {
  const std::pair<const char*, const FloatBuffer GradResult::*> outputs[] = {
      {"grad_expanded_x", &GradResult::grad_expanded_x},
      {"grad_scales", &GradResult::grad_scales},
      {"grad_bias", &GradResult::grad_bias}};
  for (const auto& [name, member] : outputs) {
    const std::string d = difference(expected.*member, got.*member);
    if (!d.empty()) return std::string(name) + ": " + d;
  }
  return "";
}

}  // namespace moe_routing::cases
