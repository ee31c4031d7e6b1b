// Random cases of the combine (moe_finalize_routing) and its backward (moe_finalize_routing_grad)
// for every layout, dtype and optional-input combination, and their runs on one Runner. Shared by
// the C++ tests (tests/cpp/finalize_cases.h adds their assertions), the CUDA tests, the C-ABI and
// CLI tests and tools/gpu_check.cpp.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "cases/random.h"
#include "cases/runner.h"
#include "cases/tensor.h"
#include "moe_routing/moe_finalize_routing.h"
#include "moe_routing/status.h"

namespace moe_routing::cases {

inline const Numerics kFinalizeNumerics[] = {Numerics::atlas_a2, Numerics::ascend_950};

/// The dtypes with their scales: same dtype, and float32 scales with bfloat16 x.
struct DtypeVariant {
  DType dtype;
  bool mixed_scales;
};
inline const DtypeVariant kFinalizeDtypes[] = {{DType::float32, false},
                                               {DType::float16, false},
                                               {DType::bfloat16, false},
                                               {DType::bfloat16, true}};

/// Overwrites every element of the buffers with a random one of special_floats().
void fill_special(Random& rng, std::initializer_list<FloatBuffer*> buffers);

/// Which optional inputs a case has.
struct FinalizeOptions {
  bool x1 = false, x2 = false, bias = false, scales = false, expert_idx = false;
  bool special = false;       // zero / copy / constant expert ranges (api v2; needs expert_idx)
  bool mixed_scales = false;  // float32 scales with bfloat16 x
  double drop_fraction = 0.1;
  bool duplicates = false;  // some pairs share an expanded_x row
  /// Dropless modes: sometimes fewer rows than pairs (the pairs beyond cut by active_num). Without
  /// it, every pair's row is in expanded_x.
  bool cut_rows = true;
};

/// Floats spread over many binades so that rounding differs between orders and types.
inline float spread_value(Random& rng) { return rng.uniform(int(rng.integer(-10, 10))); }

/// `count` values of spread_value narrowed (RNE) to `dtype`.
FloatBuffer random_buffer(Random& rng, DType dtype, int64_t count);

/// A view of a buffer with a shape, or an absent view when the buffer is not used.
inline TensorView view_of(FloatBuffer& b, bool present, std::vector<int64_t> shape) {
  if (!present) return TensorView();
  return TensorView(b.data(), b.dtype, int(shape.size()), shape.data());
}

/// Random row indices for `pairs` pairs over `rows` rows: a permutation of [0, pairs) in dropless
/// layouts (values >= rows are pairs cut by active_num), slots or -1 in drop-pad; some -1 drops
/// and, with `duplicates`, some repeated rows.
std::vector<int32_t> random_row_indices(Random& rng, int64_t pairs, int64_t rows, bool drop_pad,
                                        double drop_fraction, bool duplicates);

struct FinalizeCase {
  DType dtype = DType::float32;
  int64_t N = 0, K = 1, H = 0, E = 0;
  MoeFinalizeRoutingAttrs attrs;
  FinalizeOptions options;
  std::vector<int64_t> expanded_shape;
  FloatBuffer expanded_x, x1, x2, bias, scales, x, alpha1, alpha2, v;
  std::vector<int32_t> idx, expert_idx;

  /// Views of the case's inputs (absent where the options leave them out).
  MoeFinalizeRoutingInputs inputs();
};

/// A valid random forward case of N tokens, K pairs each, rows of H, in drop_pad_mode `mode`.
/// E is drawn in [4, 9]; special experts take the last three experts of [0, E).
FinalizeCase make_finalize_case(Random& rng, DType dtype, int64_t mode, Numerics numerics,
                                FinalizeOptions o, int64_t N, int64_t K, int64_t H,
                                FinalizeRoutingApi api = FinalizeRoutingApi::v2);

/// Runs a forward case on one runner into `out` [N, H], allocated here and poisoned first.
Status run_finalize(FinalizeCase& c, const Runner& runner, FloatBuffer* out);

/// Variant `options` (0..7) of the forward sweeps across front ends and backends: bit 0 x1,
/// bit 1 x2 (with x1), bit 2 bias with the special experts; scales always; some rows shared.
inline FinalizeOptions forward_variant_options(int options, bool mixed_scales) {
  FinalizeOptions o;
  o.x1 = options & 1, o.x2 = options & 2, o.bias = options & 4, o.scales = true;
  o.special = options >= 4, o.mixed_scales = mixed_scales, o.duplicates = true;
  return o;
}

/// The forward sweep of the bitwise comparisons between front ends and backends: every dtype
/// (float32 scales with bfloat16 included) x mode 0..3 x numerics x the eight variants of
/// forward_variant_options. `fn(dtype, mode, numerics, options, name)` makes and runs its own
/// case; `name` describes the variant for failure messages.
template <class Fn>
void for_each_forward_variant(Fn fn) {
  for (const DtypeVariant& d : kFinalizeDtypes)
    for (int64_t mode = 0; mode < 4; ++mode)
      for (Numerics numerics : kFinalizeNumerics)
        for (int options = 0; options < 8; ++options) {
          const std::string name = std::string(dtype_name(d.dtype)) +
                                   (d.mixed_scales ? " (float32 scales)" : "") + " mode " +
                                   std::to_string(mode) + ' ' + numerics_name(numerics) +
                                   " options " + std::to_string(options);
          fn(d.dtype, mode, numerics, forward_variant_options(options, d.mixed_scales), name);
        }
}

/// `in` with every tensor replaced by `copy(tensor)` (e.g. device copies of a case's host inputs;
/// `copy` keeps absent tensors absent).
template <class Copy>
MoeFinalizeRoutingInputs map_tensors(const MoeFinalizeRoutingInputs& in, Copy copy) {
  MoeFinalizeRoutingInputs out;
  out.expanded_x = copy(in.expanded_x), out.expanded_row_idx = copy(in.expanded_row_idx);
  out.x1 = copy(in.x1), out.x2 = copy(in.x2), out.bias = copy(in.bias);
  out.scales = copy(in.scales), out.expert_idx = copy(in.expert_idx), out.x = copy(in.x);
  out.alpha1 = copy(in.alpha1), out.alpha2 = copy(in.alpha2), out.v = copy(in.v);
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

  /// Views of the case's inputs (absent where the options leave them out).
  MoeFinalizeRoutingGradInputs inputs();
};

/// A valid random backward case (grad_scales only with scales and expanded_x, grad_bias only with
/// bias). E is drawn in [1, 8]; mode 0 sometimes has an active_num, mode 1 a random capacity.
FinalizeGradCase make_finalize_grad_case(Random& rng, DType dtype, int64_t mode, Numerics numerics,
                                         GradOptions o, int64_t N, int64_t K, int64_t H);

/// The three outputs of a grad run (grad_scales / grad_bias empty when not computed).
struct GradResult {
  FloatBuffer grad_expanded_x, grad_scales, grad_bias;
};

/// Poisoned host outputs for a grad case, sized as the case asks (unwanted ones empty).
GradResult poisoned_grad_result(const FinalizeGradCase& c);

/// Views of `r` as the case's outputs (unwanted ones absent).
MoeFinalizeRoutingGradOutputs grad_outputs(const FinalizeGradCase& c, GradResult& r);

/// Runs a grad case on one runner into `out`, made here by poisoned_grad_result. With the
/// runner's caller workspace: exactly the size moe_finalize_routing_grad_workspace_size reports
/// for this call, misaligned on purpose.
Status run_finalize_grad(FinalizeGradCase& c, const Runner& runner, GradResult* out);

/// As map_tensors of the forward's inputs, for the backward's inputs and its outputs.
template <class Copy>
MoeFinalizeRoutingGradInputs map_tensors(const MoeFinalizeRoutingGradInputs& in, Copy copy) {
  MoeFinalizeRoutingGradInputs out;
  out.grad_y = copy(in.grad_y), out.expanded_row_idx = copy(in.expanded_row_idx);
  out.expanded_x = copy(in.expanded_x), out.scales = copy(in.scales);
  out.expert_idx = copy(in.expert_idx), out.bias = copy(in.bias);
  return out;
}
template <class Copy>
MoeFinalizeRoutingGradOutputs map_tensors(const MoeFinalizeRoutingGradOutputs& out, Copy copy) {
  return {copy(out.grad_expanded_x), copy(out.grad_scales), copy(out.grad_bias)};
}

/// "" when the three outputs agree bit for bit; otherwise the first output that differs and how.
std::string difference(const GradResult& expected, const GradResult& got);

}  // namespace moe_routing::cases
