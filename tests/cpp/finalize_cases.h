// Random moe_finalize_routing and moe_finalize_routing_grad inputs for every layout, dtype and
// optional-input combination, and the helpers that run them on one Runner.
#pragma once

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>
#include <utility>

#include "test_util.h"

namespace moe_routing::testing {

const Numerics kFinalizeNumerics[] = {Numerics::atlas_a2, Numerics::ascend_950};

/// The dtypes with their scales: same dtype, and float32 scales with bfloat16 x.
struct DtypeVariant {
  DType dtype;
  bool mixed_scales;
};
const DtypeVariant kFinalizeDtypes[] = {{DType::float32, false},
                                        {DType::float16, false},
                                        {DType::bfloat16, false},
                                        {DType::bfloat16, true}};

/// Signed zeros, NaN, +-Inf, subnormals of every type, values whose sums overflow fp16 and bf16.
inline std::vector<float> special_floats() {
  const float inf = std::numeric_limits<float>::infinity();
  return {0.0f,
          -0.0f,
          inf,
          -inf,
          std::nanf(""),
          -std::nanf(""),
          std::numeric_limits<float>::denorm_min(),
          -std::ldexp(1.0f, -130),
          std::ldexp(1.0f, -24),
          -std::ldexp(1.0f, -133),
          65504.0f,
          -60000.0f,
          3.38e38f,
          1.0f,
          -1.0f};
}

/// Overwrites every element of the buffers with a random special value.
inline void fill_special(Random& rng, std::initializer_list<FloatBuffer*> buffers) {
  const std::vector<float> specials = special_floats();
  for (FloatBuffer* b : buffers)
    for (int64_t e = 0; e < b->count(); ++e)
      store_from_float(b->data(), b->dtype, e,
                       specials[size_t(rng.integer(0, int64_t(specials.size()) - 1))]);
}

/// One row of an error table: a change to a valid call, and what the call must then return.
template <class Fixture>
struct ErrorCase {
  const char* name;
  std::function<void(Fixture&)> change;
  StatusCode code;
  const char* message;
};

/// Runs every case on every runner: `call(fixture, runner)` (on a fresh, changed fixture) must
/// return the case's category and a message containing its text, and `unwritten(fixture)` must
/// hold afterwards. Cases named "cuda tensors" are skipped in builds with the CUDA backend.
template <class Fixture, class Call, class Unwritten>
void expect_error_table(const std::vector<ErrorCase<Fixture>>& cases, Call call,
                        Unwritten unwritten) {
  for (const ErrorCase<Fixture>& c : cases) {
    SCOPED_TRACE(c.name);
#if defined(MOE_ROUTING_HAVE_CUDA)
    if (std::string(c.name) == "cuda tensors") continue;
#endif
    for (const Runner& runner : all_runners()) {
      Fixture f;
      c.change(f);
      const Status s = call(f, runner);
      EXPECT_EQ(s.code(), c.code) << runner.name() << ": " << s.message();
      EXPECT_NE(s.message().find(c.message), std::string::npos)
          << runner.name() << ": message was: " << s.message();
      EXPECT_TRUE(unwritten(f)) << runner.name() << ": an output was written on error";
    }
  }
}

/// Which optional inputs a case has.
struct FinalizeOptions {
  bool x1 = false, x2 = false, bias = false, scales = false, expert_idx = false;
  bool special = false;       // zero / copy / constant expert ranges (api v2; needs expert_idx)
  bool mixed_scales = false;  // float32 scales with bfloat16 x
  double drop_fraction = 0.1;
  bool duplicates = false;  // some pairs share an expanded_x row
};

/// Floats spread over many binades so that rounding differs between orders and types.
inline float spread_value(Random& rng) { return rng.uniform(int(rng.integer(-10, 10))); }

inline FloatBuffer random_buffer(Random& rng, DType dtype, int64_t count) {
  std::vector<float> values(static_cast<size_t>(count));
  for (float& v : values) v = spread_value(rng);
  return FloatBuffer::from_floats(dtype, values);
}

/// A view of a buffer with a shape, or an absent view when the buffer is not used.
inline TensorView view_of(FloatBuffer& b, bool present, std::vector<int64_t> shape) {
  if (!present) return TensorView();
  return TensorView(b.data(), b.dtype, int(shape.size()), shape.data());
}

/// Random row indices for `pairs` pairs over `rows` rows: a permutation of [0, pairs) in dropless
/// layouts (values >= rows are pairs cut by active_num), slots or -1 in drop-pad; some -1 drops
/// and, with `duplicates`, some repeated rows.
inline std::vector<int32_t> random_row_indices(Random& rng, int64_t pairs, int64_t rows,
                                               bool drop_pad, double drop_fraction,
                                               bool duplicates) {
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

struct FinalizeCase {
  DType dtype = DType::float32;
  int64_t N = 0, K = 1, H = 0, E = 0;
  MoeFinalizeRoutingAttrs attrs;
  FinalizeOptions options;
  std::vector<int64_t> expanded_shape;
  FloatBuffer expanded_x, x1, x2, bias, scales, x, alpha1, alpha2, v;
  std::vector<int32_t> idx, expert_idx;

  MoeFinalizeRoutingInputs inputs() {
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
};

/// A valid random forward case. Special experts take the last three experts of [0, E).
inline FinalizeCase make_finalize_case(Random& rng, DType dtype, int64_t mode, Numerics numerics,
                                       FinalizeOptions o, int64_t N, int64_t K, int64_t H,
                                       FinalizeRoutingApi api = FinalizeRoutingApi::v2) {
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
    rows = rng.integer(0, 3) == 0 ? rng.integer(0, pairs) : pairs;  // sometimes cut by active_num
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

/// Runs a forward case on one runner into a poisoned output; the status must be ok.
inline FloatBuffer run_finalize_case(FinalizeCase& c, const Runner& runner) {
  FloatBuffer out(c.dtype, c.N * c.H);
  out.poison();
  const Status s = moe_finalize_routing(
      c.inputs(), c.attrs, TensorView(out.data(), c.dtype, {c.N, c.H}), runner.config());
  EXPECT_TRUE(s.is_ok()) << runner.name() << ": " << s.message();
  return out;
}

// ---- the grad ---------------------------------------------------------------------------------

struct GradOptions {
  bool scales = true, expanded_x = true, bias = false, grad_scales = true, grad_bias = false;
  bool mixed_scales = false;
  double drop_fraction = 0.1;
  bool duplicates = false;
};

struct FinalizeGradCase {
  DType dtype = DType::float32, scales_dtype = DType::float32;
  int64_t N = 0, K = 1, H = 0, E = 0, rows = 0;
  MoeFinalizeRoutingGradAttrs attrs;
  GradOptions options;
  std::vector<int64_t> expanded_shape;
  FloatBuffer grad_y, expanded_x, scales, bias;
  std::vector<int32_t> idx, expert_idx;

  MoeFinalizeRoutingGradInputs inputs() {
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
};

inline FinalizeGradCase make_finalize_grad_case(Random& rng, DType dtype, int64_t mode,
                                                Numerics numerics, GradOptions o, int64_t N,
                                                int64_t K, int64_t H) {
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

/// The three outputs of a grad run (grad_scales / grad_bias empty when not computed).
struct GradResult {
  FloatBuffer grad_expanded_x, grad_scales, grad_bias;
};

/// Runs a grad case on one runner into poisoned outputs (with the runner's caller workspace:
/// exactly the reported size, misaligned on purpose); the status must be ok.
/// Poisoned host outputs for a grad case, sized as the case asks (unwanted ones empty).
inline GradResult poisoned_grad_result(const FinalizeGradCase& c) {
  GradResult r{FloatBuffer(c.dtype, c.rows * c.H),
               FloatBuffer(c.scales_dtype, c.options.grad_scales ? c.N * c.K : 0),
               FloatBuffer(c.dtype, c.options.grad_bias ? c.E * c.H : 0)};
  r.grad_expanded_x.poison();
  r.grad_scales.poison();
  r.grad_bias.poison();
  return r;
}

/// Views of `r` as the case's outputs (unwanted ones absent).
inline MoeFinalizeRoutingGradOutputs grad_outputs(const FinalizeGradCase& c, GradResult& r) {
  MoeFinalizeRoutingGradOutputs out;
  out.grad_expanded_x = view_of(r.grad_expanded_x, true, c.expanded_shape);
  out.grad_scales = view_of(r.grad_scales, c.options.grad_scales, {c.N, c.K});
  out.grad_bias = view_of(r.grad_bias, c.options.grad_bias, {c.E, c.H});
  return out;
}

inline GradResult run_finalize_grad_case(FinalizeGradCase& c, const Runner& runner) {
  GradResult r = poisoned_grad_result(c);
  const MoeFinalizeRoutingGradOutputs out = grad_outputs(c, r);
  ExecConfig config = runner.config();
  std::vector<char> workspace;
  if (runner.caller_workspace) {
    MoeFinalizeRoutingGradPlan plan;
    const Status s = infer_moe_finalize_routing_grad(c.inputs(), c.attrs, &out, &plan);
    EXPECT_TRUE(s.is_ok()) << s.message();
    config.workspace_bytes = moe_finalize_routing_grad_workspace_size(plan, runner.threads);
    workspace.resize(size_t(config.workspace_bytes) + 1);
    config.workspace = workspace.data() + 1;
  }
  const Status s = moe_finalize_routing_grad(c.inputs(), c.attrs, out, config);
  EXPECT_TRUE(s.is_ok()) << runner.name() << ": " << s.message();
  return r;
}

inline ::testing::AssertionResult grad_results_equal(const GradResult& a, const GradResult& b) {
  auto r = bitwise_equal(a.grad_expanded_x, b.grad_expanded_x);
  if (!r) return r << " (grad_expanded_x)";
  r = bitwise_equal(a.grad_scales, b.grad_scales);
  if (!r) return r << " (grad_scales)";
  r = bitwise_equal(a.grad_bias, b.grad_bias);
  if (!r) return r << " (grad_bias)";
  return ::testing::AssertionSuccess();
}

}  // namespace moe_routing::testing
