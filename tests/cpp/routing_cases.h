// Helpers for the forward routing tests: owning tensors, running moe_init_routing(_v2) with
// outputs allocated from the inferred plan (poisoned first, so unwritten elements show), and
// byte-exact comparison of every output.
#pragma once

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "test_util.h"

namespace moe_routing::testing {

/// An owning, contiguous tensor; `present == false` stands for an absent optional input.
struct Tensor {
  bool present = false;
  DType dtype = DType::float32;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;

  Tensor() = default;
  Tensor(DType dtype_, std::vector<int64_t> shape_)
      : present(true), dtype(dtype_), shape(std::move(shape_)) {
    bytes.assign(size_t(numel()) * dtype_size(dtype), 0);
  }
  static Tensor from_spec(const OutputSpec& spec) {
    return Tensor(spec.dtype, std::vector<int64_t>(spec.shape, spec.shape + spec.ndim));
  }
  /// Floating tensor from float values (narrowed with RNE).
  static Tensor floats(DType dtype, std::vector<int64_t> shape, const std::vector<float>& values) {
    Tensor t(dtype, std::move(shape));
    for (size_t i = 0; i < values.size(); ++i)
      store_from_float(t.bytes.data(), dtype, int64_t(i), values[i]);
    return t;
  }
  static Tensor int32s(std::vector<int64_t> shape, const std::vector<int32_t>& values) {
    Tensor t(DType::int32, std::move(shape));
    if (!values.empty())
      std::memcpy(t.bytes.data(), values.data(), values.size() * sizeof(int32_t));
    return t;
  }
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d < 0 ? 0 : d;
    return n;
  }
  template <typename T>
  T* as() {
    return reinterpret_cast<T*>(bytes.data());
  }
  template <typename T>
  const T* as() const {
    return reinterpret_cast<const T*>(bytes.data());
  }
  template <typename T>
  std::vector<T> values() const {
    return std::vector<T>(as<T>(), as<T>() + numel());
  }
  /// Element i of a floating tensor widened to float32.
  float at(int64_t i) const { return load_as_float(bytes.data(), dtype, i); }
  std::vector<float> float_values() const {
    std::vector<float> v;
    for (int64_t i = 0; i < numel(); ++i) v.push_back(at(i));
    return v;
  }
  void poison(uint8_t byte = 0x5A) {
    if (!bytes.empty()) std::memset(bytes.data(), byte, bytes.size());
  }
  TensorView view() {
    if (!present) return TensorView();
    // A non-null pointer even for empty tensors (std::vector::data() may be null then).
    void* data = bytes.empty() ? static_cast<void*>(&empty_storage) : bytes.data();
    return TensorView(data, dtype, int(shape.size()), shape.data());
  }

 private:
  uint64_t empty_storage = 0;
};

/// Byte-exact comparison with a report of the first difference.
inline ::testing::AssertionResult same_tensor(const Tensor& expected, const Tensor& got) {
  if (expected.present != got.present || expected.dtype != got.dtype || expected.shape != got.shape)
    return ::testing::AssertionFailure() << "presence/dtype/shape differ";
  for (size_t i = 0; i < expected.bytes.size(); ++i)
    if (expected.bytes[i] != got.bytes[i]) {
      size_t differing = 0;
      for (size_t j = i; j < expected.bytes.size(); ++j)
        differing += expected.bytes[j] != got.bytes[j];
      const size_t element = i / dtype_size(expected.dtype);
      return ::testing::AssertionFailure()
             << differing << " bytes differ; first in element " << element << " (byte " << i
             << "): expected 0x" << std::hex << int(expected.bytes[i]) << ", got 0x"
             << int(got.bytes[i]);
    }
  return ::testing::AssertionSuccess();
}

// ---------------------------------------------------------------------------------------------
// moe_init_routing (torch API / V4)
// ---------------------------------------------------------------------------------------------

struct ForwardCase {
  Tensor x, expert_idx, scale, offset, topk_weight;
  MoeInitRoutingAttrs attrs;
};

struct ForwardResult {
  Status status;
  MoeInitRoutingPlan plan;
  Tensor expanded_x, expanded_row_idx, counts, expanded_scale, expanded_topk_weight;
};

/// The runner's settings; with a caller workspace, `buffer` holds it: exactly `size` bytes
/// starting one byte into the allocation (misaligned), so that any access past the reported size
/// is a heap overflow under AddressSanitizer.
inline ExecConfig forward_config(const Runner& runner, uint64_t size,
                                 std::vector<unsigned char>* buffer) {
  ExecConfig config = runner.config();
  if (runner.backend == Backend::cpu && runner.caller_workspace) {
    buffer->assign(size_t(size) + 1, 0xa5);
    config.workspace = buffer->data() + 1;
    config.workspace_bytes = size;
  }
  return config;
}

/// Infers the case's plan and allocates the produced outputs from it (poisoned); the others stay
/// absent. False (with r->status) when shape inference fails.
inline bool plan_outputs(ForwardCase& c, ForwardResult* r) {
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

/// Allocates the produced outputs from the plan (poisoned), passes absent views for the others.
inline ForwardResult run_forward(ForwardCase& c, const Runner& runner) {
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

inline ::testing::AssertionResult same_result(const ForwardResult& a, const ForwardResult& b) {
  if (a.status.code() != b.status.code())
    return ::testing::AssertionFailure()
           << "status " << a.status.message() << " vs " << b.status.message();
  const char* names[] = {"expanded_x", "expanded_row_idx", "expert_tokens_count_or_cumsum",
                         "expanded_scale", "expanded_topk_weight"};
  const Tensor* left[] = {&a.expanded_x, &a.expanded_row_idx, &a.counts, &a.expanded_scale,
                          &a.expanded_topk_weight};
  const Tensor* right[] = {&b.expanded_x, &b.expanded_row_idx, &b.counts, &b.expanded_scale,
                           &b.expanded_topk_weight};
  for (int i = 0; i < 5; ++i) {
    ::testing::AssertionResult same = same_tensor(*left[i], *right[i]);
    if (!same) return ::testing::AssertionFailure() << names[i] << ": " << same.message();
  }
  return ::testing::AssertionSuccess();
}

// ---------------------------------------------------------------------------------------------
// moe_init_routing_v2
// ---------------------------------------------------------------------------------------------

struct V2Case {
  Tensor x, expert_idx;
  MoeInitRoutingV2Attrs attrs;
};

struct V2Result {
  Status status;
  MoeInitRoutingV2Plan plan;
  Tensor expanded_x, expanded_row_idx, counts, before_capacity;
};

/// plan_outputs for moe_init_routing_v2.
inline bool plan_outputs(V2Case& c, V2Result* r) {
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

inline V2Result run_v2(V2Case& c, const Runner& runner) {
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

inline ::testing::AssertionResult same_result(const V2Result& a, const V2Result& b) {
  if (a.status.code() != b.status.code())
    return ::testing::AssertionFailure()
           << "status " << a.status.message() << " vs " << b.status.message();
  const char* names[] = {"expanded_x", "expanded_row_idx", "expert_tokens_count_or_cumsum",
                         "expert_tokens_before_capacity"};
  const Tensor* left[] = {&a.expanded_x, &a.expanded_row_idx, &a.counts, &a.before_capacity};
  const Tensor* right[] = {&b.expanded_x, &b.expanded_row_idx, &b.counts, &b.before_capacity};
  for (int i = 0; i < 4; ++i) {
    ::testing::AssertionResult same = same_tensor(*left[i], *right[i]);
    if (!same) return ::testing::AssertionFailure() << names[i] << ": " << same.message();
  }
  return ::testing::AssertionSuccess();
}

// ---------------------------------------------------------------------------------------------
// Random cases of both operators (the CPU tests and the CUDA backend's host test share them)
// ---------------------------------------------------------------------------------------------

enum class Scenario { dropless, partial_range, active, drop_pad };
inline const Scenario kScenarios[] = {Scenario::dropless, Scenario::partial_range, Scenario::active,
                                      Scenario::drop_pad};
inline const char* scenario_name(Scenario s) {
  switch (s) {
    case Scenario::dropless: return "dropless";
    case Scenario::partial_range: return "partial_range";
    case Scenario::active: return "active";
    case Scenario::drop_pad: return "drop_pad";
  }
  return "?";
}

/// Values spread over binades (integer_values: small integers, for exact dot products).
inline std::vector<float> random_values(Random& rng, int64_t n, bool integer_values) {
  std::vector<float> v(size_t(std::max<int64_t>(n, 0)));
  for (float& f : v)
    f = integer_values ? float(rng.integer(-3, 3)) : rng.uniform(int(rng.integer(-8, 8)));
  return v;
}

inline ForwardCase make_forward_case(Random& rng, DType dtype, Scenario scenario, int64_t quant,
                                     int64_t row_idx_type, bool integer_values) {
  ForwardCase c;
  const int64_t N = rng.integer(1, 24), K = rng.integer(1, 6), H = rng.integer(1, 19),
                E = rng.integer(1, 12);
  c.x = Tensor::floats(dtype, {N, H}, random_values(rng, N * H, integer_values));
  std::vector<int32_t> ids(size_t(N * K));
  for (int32_t& id : ids) id = int32_t(rng.integer(-1, E));  // -1 and E are never routed
  c.expert_idx = Tensor::int32s({N, K}, ids);
  MoeInitRoutingAttrs& a = c.attrs;
  a.expert_num = E;
  a.quant_mode = quant;
  a.row_idx_type = row_idx_type;
  a.numerics = rng.integer(0, 1) ? Numerics::ascend_950 : Numerics::atlas_a2;
  a.expert_tokens_num_flag = rng.integer(0, 3) != 0;
  a.expert_tokens_num_type = rng.integer(0, 2);
  int64_t range = E;
  if (scenario == Scenario::partial_range) {
    const int64_t s = rng.integer(0, E - 1), e = rng.integer(s + 1, E);
    a.has_active_expert_range = true;
    a.active_expert_range = {s, e};
    range = e - s;
  }
  if (scenario == Scenario::active) a.active_num = rng.integer(1, N * K + 2);
  if (scenario == Scenario::drop_pad) {
    a.drop_pad_mode = 1;
    a.expert_capacity = rng.integer(1, N);
  }
  if (rng.integer(0, 1))
    c.topk_weight = Tensor::floats(DType::float32, {N, K}, random_values(rng, N * K, false));
  if (quant == -1 && rng.integer(0, 1))
    c.scale = Tensor::floats(DType::float32, {N}, random_values(rng, N, false));
  if (quant == 0) {
    c.scale = Tensor::floats(DType::float32, {1}, {rng.uniform(6)});
    if (rng.integer(0, 1)) c.offset = Tensor::floats(DType::float32, {1}, {rng.uniform(4)});
  }
  if (quant == 1 && rng.integer(0, 2) != 0) {
    const int64_t rows = rng.integer(0, 1) ? range : 1;
    c.scale = Tensor::floats(DType::float32, {rows, H}, random_values(rng, rows * H, false));
  }
  return c;
}

inline V2Case make_v2_case(Random& rng, DType dtype, int mode, bool integer_values) {
  V2Case c;
  const int64_t N = rng.integer(1, 24), K = rng.integer(1, 6), H = rng.integer(1, 19),
                E = rng.integer(1, 12);
  c.x = Tensor::floats(dtype, {N, H}, random_values(rng, N * H, integer_values));
  std::vector<int32_t> ids(size_t(N * K));
  for (int32_t& id : ids) id = int32_t(rng.integer(0, E - 1));
  c.expert_idx = Tensor::int32s({N, K}, ids);
  c.attrs.expert_num = E;
  c.attrs.expert_tokens_count_or_cumsum_flag = rng.integer(0, 2);
  c.attrs.expert_tokens_before_capacity_flag = rng.integer(0, 1) != 0;
  if (mode == 1) c.attrs.active_num = rng.integer(1, N * K + 2);
  if (mode == 2) {
    c.attrs.drop_pad_mode = 1;
    c.attrs.expert_capacity = rng.integer(1, N);
  }
  return c;
}

}  // namespace moe_routing::testing
