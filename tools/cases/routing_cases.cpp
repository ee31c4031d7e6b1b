#include "cases/routing_cases.h"

#include <algorithm>
#include <utility>

namespace moe_routing::cases {

ExecConfig forward_config(const Runner& runner, uint64_t size, std::vector<unsigned char>* buffer) {
  ExecConfig config = runner.config();
  if (runner.backend == Backend::cpu && runner.caller_workspace) {
    buffer->assign(size_t(size) + 1, 0xa5);
    config.workspace = buffer->data() + 1;
    config.workspace_bytes = size;
  }
  return config;
}

bool plan_outputs(ForwardCase& c, ForwardResult* r) {
  r->status = infer_moe_init_routing(c.x.view(), c.expert_idx.view(), c.scale.view(),
                                     c.offset.view(), c.topk_weight.view(), c.attrs, &r->plan);
  if (!r->status.is_ok()) return false;
  Tensor* outputs[] = {&r->expanded_x, &r->expanded_row_idx, &r->counts, &r->expanded_scale,
                       &r->expanded_topk_weight};
  const OutputSpec* specs[] = {&r->plan.expanded_x, &r->plan.expanded_row_idx,
                               &r->plan.expert_tokens_count_or_cumsum, &r->plan.expanded_scale,
                               &r->plan.expanded_topk_weight};
  for (int i = 0; i < 5; ++i)
    if (specs[i]->produced) {
      *outputs[i] = Tensor::from_spec(*specs[i]);
      outputs[i]->poison();
    }
  return true;
}

bool plan_outputs(V2Case& c, V2Result* r) {
  r->status = infer_moe_init_routing_v2(c.x.view(), c.expert_idx.view(), c.attrs, &r->plan);
  if (!r->status.is_ok()) return false;
  Tensor* outputs[] = {&r->expanded_x, &r->expanded_row_idx, &r->counts, &r->before_capacity};
  const OutputSpec* specs[] = {&r->plan.expanded_x, &r->plan.expanded_row_idx,
                               &r->plan.expert_tokens_count_or_cumsum,
                               &r->plan.expert_tokens_before_capacity};
  for (int i = 0; i < 4; ++i)
    if (specs[i]->produced) {
      *outputs[i] = Tensor::from_spec(*specs[i]);
      outputs[i]->poison();
    }
  return true;
}

ForwardResult run_forward(ForwardCase& c, const Runner& runner) {
  ForwardResult r;
  if (!plan_outputs(c, &r)) return r;
  std::vector<unsigned char> workspace;
  r.status = moe_init_routing(
      c.x.view(), c.expert_idx.view(), c.scale.view(), c.offset.view(), c.topk_weight.view(),
      c.attrs, r.expanded_x.view(), r.expanded_row_idx.view(), r.counts.view(),
      r.expanded_scale.view(), r.expanded_topk_weight.view(),
      forward_config(runner, moe_init_routing_workspace_size(r.plan, runner.threads), &workspace));
  return r;
}

V2Result run_v2(V2Case& c, const Runner& runner) {
  V2Result r;
  if (!plan_outputs(c, &r)) return r;
  std::vector<unsigned char> workspace;
  r.status = moe_init_routing_v2(
      c.x.view(), c.expert_idx.view(), c.attrs, r.expanded_x.view(), r.expanded_row_idx.view(),
      r.counts.view(), r.before_capacity.view(),
      forward_config(runner, moe_init_routing_v2_workspace_size(r.plan, runner.threads),
                     &workspace));
  return r;
}

namespace {

template <size_t kOutputs>
std::string first_difference(const Status& a, const Status& b, const char* const (&names)[kOutputs],
                             const Tensor* const (&left)[kOutputs],
                             const Tensor* const (&right)[kOutputs]) {
  if (a.code() != b.code()) return "status " + a.message() + " vs " + b.message();
  for (size_t i = 0; i < kOutputs; ++i) {
    const std::string d = difference(*left[i], *right[i]);
    if (!d.empty()) return std::string(names[i]) + ": " + d;
  }
  return "";
}

}  // namespace

std::string difference(const ForwardResult& a, const ForwardResult& b) {
  const char* const names[] = {"expanded_x", "expanded_row_idx", "expert_tokens_count_or_cumsum",
                               "expanded_scale", "expanded_topk_weight"};
  const Tensor* const left[] = {&a.expanded_x, &a.expanded_row_idx, &a.counts, &a.expanded_scale,
                                &a.expanded_topk_weight};
  const Tensor* const right[] = {&b.expanded_x, &b.expanded_row_idx, &b.counts, &b.expanded_scale,
                                 &b.expanded_topk_weight};
  return first_difference(a.status, b.status, names, left, right);
}

std::string difference(const V2Result& a, const V2Result& b) {
  const char* const names[] = {"expanded_x", "expanded_row_idx", "expert_tokens_count_or_cumsum",
                               "expert_tokens_before_capacity"};
  const Tensor* const left[] = {&a.expanded_x, &a.expanded_row_idx, &a.counts, &a.before_capacity};
  const Tensor* const right[] = {&b.expanded_x, &b.expanded_row_idx, &b.counts, &b.before_capacity};
  return first_difference(a.status, b.status, names, left, right);
}

const char* scenario_name(Scenario s) {
  switch (s) {
    case Scenario::dropless: return "dropless";
    case Scenario::partial_range: return "partial_range";
    case Scenario::active: return "active";
    case Scenario::drop_pad: return "drop_pad";
  }
  return "?";
}

CaseSizes gpu_forward_sizes(bool large) {
  CaseSizes s;
  s.top_k = {1, 8};
  if (large) {
    s.tokens = {500, 3000};
    s.hidden = {1, 40};
    s.experts = {1, 300};
  } else {
    s.tokens = {1, 40};
    s.hidden_choices = {1, 5, 8, 16, 19, 64, 96, 1031, 4096};
    s.experts = {1, 40};
  }
  return s;
}

CaseSizes gpu_v2_sizes(int repeat) {
  CaseSizes s;
  s.tokens = {1, repeat < 3 ? 40 : 3000};
  s.top_k = {1, 8};
  if (repeat % 2) {
    s.hidden = {1, 20};
  } else {
    s.hidden = {1, 4};
    s.hidden_step = 64;
  }
  s.experts = {1, repeat < 3 ? 12 : 400};
  return s;
}

std::vector<float> random_values(Random& rng, int64_t n, bool integer_values) {
  std::vector<float> v(size_t(std::max<int64_t>(n, 0)));
  for (float& f : v)
    f = integer_values ? float(rng.integer(-3, 3)) : rng.uniform(int(rng.integer(-8, 8)));
  return v;
}

Tensor random_tensor(Random& rng, DType dtype, std::vector<int64_t> shape, bool integer_values) {
  Tensor t(dtype, std::move(shape));
  if (!is_floating(dtype)) {
    for (uint8_t& b : t.bytes) b = uint8_t(rng.next());
    return t;
  }
  const std::vector<float> values = random_values(rng, t.numel(), integer_values);
  for (size_t i = 0; i < values.size(); ++i)
    store_from_float(t.bytes.data(), dtype, int64_t(i), values[i]);
  return t;
}

std::vector<int32_t> random_ids(Random& rng, int64_t count, int64_t lo, int64_t hi) {
  std::vector<int32_t> ids(size_t(std::max<int64_t>(count, 0)));
  for (int32_t& id : ids) id = int32_t(rng.integer(lo, hi));
  return ids;
}

namespace {

struct Sizes {
  int64_t N, K, H, E;
};

Sizes draw(Random& rng, const CaseSizes& s) {
  Sizes d;
  d.N = rng.integer(s.tokens.lo, s.tokens.hi);
  d.K = rng.integer(s.top_k.lo, s.top_k.hi);
  d.H = s.hidden_choices.empty()
            ? s.hidden_step * rng.integer(s.hidden.lo, s.hidden.hi)
            : s.hidden_choices[size_t(rng.integer(0, int64_t(s.hidden_choices.size()) - 1))];
  d.E = rng.integer(s.experts.lo, s.experts.hi);
  return d;
}

}  // namespace

ForwardCase make_forward_case(Random& rng, const ForwardCaseSpec& spec) {
  ForwardCase c;
  const auto [N, K, H, E] = draw(rng, spec.sizes);
  c.x = random_tensor(rng, spec.dtype, {N, H}, spec.integer_values);
  std::vector<int32_t> ids = random_ids(rng, N * K, -1, E);  // -1 and E are never routed
  MoeInitRoutingAttrs& a = c.attrs;
  a.expert_num = E;
  a.quant_mode = spec.quant_mode;
  a.row_idx_type = spec.row_idx_type;
  a.numerics = rng.integer(0, 1) ? Numerics::ascend_950 : Numerics::atlas_a2;
  a.expert_tokens_num_flag = rng.integer(0, 3) != 0;
  a.expert_tokens_num_type = rng.integer(0, 2);
  int64_t range = E;
  if (spec.scenario == Scenario::partial_range) {
    const int64_t s = rng.integer(0, E - 1), e = rng.integer(s + 1, E);
    a.has_active_expert_range = true;
    a.active_expert_range = {s, e};
    range = e - s;
  }
  if (spec.scenario == Scenario::active) a.active_num = rng.integer(1, N * K + 2);
  if (spec.scenario == Scenario::drop_pad) {
    a.drop_pad_mode = 1;
    a.expert_capacity = rng.integer(1, std::max<int64_t>(1, N));
    if (spec.drop_pad_ids_in_range)
      for (int32_t& id : ids) id = id < 0 ? 0 : (id >= E ? int32_t(E - 1) : id);
  }
  c.expert_idx = Tensor::int32s({N, K}, ids);
  const int64_t quant = spec.quant_mode;
  if (rng.integer(0, 1)) c.topk_weight = random_tensor(rng, DType::float32, {N, K});
  if (quant == -1 && rng.integer(0, 1)) c.scale = random_tensor(rng, DType::float32, {N});
  if (quant == 0) {
    c.scale = Tensor::floats(DType::float32, {1}, {rng.uniform(6)});
    if (rng.integer(0, 1)) c.offset = Tensor::floats(DType::float32, {1}, {rng.uniform(4)});
  }
  if (quant == 1 && rng.integer(0, 2) != 0) {
    const int64_t rows = rng.integer(0, 1) ? range : 1;
    c.scale = random_tensor(rng, DType::float32, {rows, H});
  }
  return c;
}

V2Case make_v2_case(Random& rng, const V2CaseSpec& spec) {
  V2Case c;
  const auto [N, K, H, E] = draw(rng, spec.sizes);
  c.x = random_tensor(rng, spec.dtype, {N, H}, spec.integer_values);
  c.expert_idx = Tensor::int32s({N, K}, random_ids(rng, N * K, 0, E - 1));
  c.attrs.expert_num = E;
  c.attrs.expert_tokens_count_or_cumsum_flag = rng.integer(0, 2);
  c.attrs.expert_tokens_before_capacity_flag = rng.integer(0, 1) != 0;
  if (spec.mode == 1) c.attrs.active_num = rng.integer(1, N * K + 2);
  if (spec.mode == 2) {
    c.attrs.drop_pad_mode = 1;
    c.attrs.expert_capacity = rng.integer(1, std::max<int64_t>(1, N));
  }
  return c;
}

}  // namespace moe_routing::cases
