// The combine of an MoE layer and its backward (see docs/moe_finalize_routing.md).
//
//   moe_finalize_routing       CANN aclnnMoeFinalizeRouting (api v1) and aclnnMoeFinalizeRoutingV2
//                              / V3 / V4 (api v2): for every token i and column j
//     out[i, j] = x1[i, j] + x2[i, j]
//                 + sum over t in [0, K) of scales[i, t] * (term(i, t)[j] + bias[expert_idx[i, t],
//                 j]) where term(i, t) is the row of expanded_x the pair (i, t) names, or, for the
//                 V3/V4 special experts, nothing (zero experts), x[i] (copy experts) or
//                 alpha1[c] * x[i] + alpha2[c] * v[c] (constant experts, c = expert - start).
//   moe_finalize_routing_grad  CANN aclnnMoeFinalizeRoutingV2Grad: grad_expanded_x, grad_scales,
//                              and our grad_bias.
//
// Every step is one IEEE operation in a documented type and order (Numerics selects the device
// whose arithmetic is followed); every backend (reference, CPU at any thread count and ISA, CUDA)
// gives the same bits.
//
// Conventions (as moe_init_routing.h):
//  * An absent optional tensor is a default-constructed TensorView (data null, ndim 0).
//  * infer_* checks the attributes and the inputs' shapes, dtypes and devices and fills the plan
//    (every output's shape and dtype); it needs no data and no outputs (the torch Meta kernel and
//    the CLI size their outputs with it). The entry point checks the rest before it reads data:
//    the outputs against the plan, null data of non-empty tensors, outputs sharing bytes with
//    inputs, the device and the execution settings.
//  * check_*_indices checks the index data (CPU pointers); the entry point calls both before it
//    writes anything: on any error no output is written.
//  * Errors read `<operator>: <argument> <constraint>, got <actual>`; a bad index *value* is
//    StatusCode::index_out_of_range and names its flat position and value.
#pragma once

#include <cstdint>

#include "moe_routing/numerics.h"
#include "moe_routing/status.h"
#include "moe_routing/tensor.h"

namespace moe_routing {

// ------------------------------------------------------------------------------------------
// moe_finalize_routing (aclnnMoeFinalizeRouting, ...V2, ...V3, ...V4)
// ------------------------------------------------------------------------------------------

/// Which CANN entry point's contract a call follows.
enum class FinalizeRoutingApi : int32_t {
  /// aclnnMoeFinalizeRouting: the column layout of drop_pad_mode 0; x1, bias, scales and
  /// expert_idx required; under atlas_a2 bfloat16 is narrowed with ties away from zero.
  v1 = 1,
  /// aclnnMoeFinalizeRoutingV2 / V3 / V4 (V3 adds the special-expert ranges, V4 the attribute k).
  v2 = 2,
};

/// "v1" or "v2" ("unknown" otherwise).
const char* finalize_routing_api_name(FinalizeRoutingApi api);
/// Parses "v1" / "v2"; returns false (and leaves *api unchanged) otherwise.
bool parse_finalize_routing_api(const char* text, FinalizeRoutingApi* api);

/// Experts [start, end). CANN's default [-1, -1] means "no such experts"; otherwise
/// 0 <= start < end is required.
struct ExpertRange {
  int64_t start = -1;
  int64_t end = -1;

  bool enabled() const { return !(start == -1 && end == -1); }
  /// Never true for a disabled range.
  bool contains(int64_t expert) const { return expert >= start && expert < end; }
  int64_t size() const { return enabled() ? end - start : 0; }
};

struct MoeFinalizeRoutingAttrs {
  /// Layout of expanded_row_idx and expanded_x: 0 dropless, column layout (idx[t*N + i]);
  /// 1 drop-pad, column; 2 dropless, row layout (idx[i*K + t]); 3 drop-pad, row. Dropless:
  /// expanded_x [R, H] with R <= N*K; drop-pad: expanded_x [E, C, H]. api v1 requires 0.
  int64_t drop_pad_mode = 0;
  FinalizeRoutingApi api = FinalizeRoutingApi::v2;
  /// V3/V4 special experts (api v2 only; need expert_idx). Pairs routed to a zero expert add
  /// nothing; copy experts (need x) contribute x[i]; constant experts (need x, alpha1, alpha2, v)
  /// contribute alpha1[c] * x[i] + alpha2[c] * v[c], c = expert - start. Ranges must not overlap.
  ExpertRange zero_expert_range;
  ExpertRange copy_expert_range;
  ExpertRange constant_expert_range;
  /// CANN V4's k: K when scales is absent; with scales, a value > 1 must equal scales.size(1).
  int64_t top_k = 1;
  Numerics numerics = Numerics::atlas_a2;
};

/// The inputs; every optional one may be absent (a default TensorView).
struct MoeFinalizeRoutingInputs {
  TensorView expanded_x;        // [R, H] (drop_pad_mode 0/2) or [E, C, H] (1/3); fp32/fp16/bf16
  TensorView expanded_row_idx;  // [N*K] int32: the row of expanded_x of each pair
  TensorView x1;                // optional [N, H], dtype of expanded_x (required by api v1)
  TensorView x2;                // optional [N, H], dtype of expanded_x; needs x1
  TensorView bias;              // optional [E, H], dtype of expanded_x; needs expert_idx
  TensorView scales;            // optional [N, K]: dtype of expanded_x, or fp32 with bf16
  TensorView expert_idx;        // optional [N, K] int32, row-major in every mode
  TensorView x;                 // optional [N, H], dtype of expanded_x (copy/constant experts)
  TensorView alpha1;            // optional [constant range size, H], dtype of expanded_x
  TensorView alpha2;            // optional, as alpha1
  TensorView v;                 // optional, as alpha1
};

/// Everything shape inference decides; all a kernel needs besides the data pointers.
struct MoeFinalizeRoutingPlan {
  DType dtype = DType::float32;         // of expanded_x and out
  DType scales_dtype = DType::float32;  // of scales (dtype when absent)
  int64_t num_rows = 0;                 // N
  int64_t top_k = 0;                    // K
  int64_t hidden = 0;                   // H
  int64_t expanded_rows = 0;            // R: rows of expanded_x viewed as [R, H]
  int64_t expert_num = 0;               // E: rows of bias (0 without bias)
  int64_t drop_pad_mode = 0;
  bool column_layout = false;  // drop_pad_mode 0/1: pair (i, t) at idx[t*N + i], else idx[i*K + t]
  /// Index values in [expanded_rows, skip_to) are pairs cut by active_num: skipped (dropless
  /// modes: skip_to = N*K; drop-pad: skip_to = expanded_rows, nothing skipped this way).
  int64_t skip_to = 0;
  bool has_x1 = false, has_x2 = false, has_bias = false, has_scales = false;
  bool has_expert_idx = false, has_x = false;
  ExpertRange zero_expert_range, copy_expert_range, constant_expert_range;
  FinalizeRoutingApi api = FinalizeRoutingApi::v2;
  Numerics numerics = Numerics::atlas_a2;
  OutputSpec out;  // [N, H], dtype
};

/// Validates the inputs and attributes; fills `plan`. Reads no tensor data.
Status infer_moe_finalize_routing(const MoeFinalizeRoutingInputs& inputs,
                                  const MoeFinalizeRoutingAttrs& attrs,
                                  MoeFinalizeRoutingPlan* plan);

/// Checks the index data (CPU pointers; expert_idx may be null when the plan has none):
/// expanded_row_idx values -1 and, in dropless modes, [R, N*K) skip their pair; any other value
/// outside [0, R) is an error. With bias, the expert id of every pair that reads a bias row must
/// be in [0, E). Errors (index_out_of_range) name the first offending flat position. Writes
/// nothing.
Status check_moe_finalize_routing_indices(const int32_t* expanded_row_idx,
                                          const int32_t* expert_idx,
                                          const MoeFinalizeRoutingPlan& plan);

/// Computes out [N, H] (dtype of expanded_x; caller-allocated; fully written on success).
Status moe_finalize_routing(const MoeFinalizeRoutingInputs& inputs,
                            const MoeFinalizeRoutingAttrs& attrs, const TensorView& out,
                            const ExecConfig& config = ExecConfig());

// ------------------------------------------------------------------------------------------
// moe_finalize_routing_grad (aclnnMoeFinalizeRoutingV2Grad)
// ------------------------------------------------------------------------------------------

struct MoeFinalizeRoutingGradAttrs {
  /// Row layout (pair p = i*K + t at idx[p]) in both modes: 0 dropless (the forward's mode 2),
  /// 1 drop-pad (the forward's mode 3).
  int64_t drop_pad_mode = 0;
  /// Mode 0: 0 < active_num < N*K gives grad_expanded_x [active_num, H], and index values in
  /// [active_num, N*K) mark pairs cut by it (skipped). >= 0.
  int64_t active_num = 0;
  int64_t expert_num = 0;       // E, >= 0; mode 1: grad_expanded_x [E, C, H]
  int64_t expert_capacity = 0;  // C, >= 0; mode 1
  Numerics numerics = Numerics::atlas_a2;
};

struct MoeFinalizeRoutingGradInputs {
  TensorView grad_y;            // [N, H] fp32/fp16/bf16
  TensorView expanded_row_idx;  // [N*K] int32
  TensorView expanded_x;        // optional, the shape of grad_expanded_x; needed by grad_scales
  TensorView scales;            // optional [N, K]: dtype of grad_y, or fp32 with bf16
  TensorView expert_idx;        // optional [N, K] int32; needed by bias
  TensorView bias;              // optional [E', H], dtype of grad_y; E' = E in drop-pad
};

/// grad_scales and grad_bias are optional: absent (a default TensorView) means "not wanted".
struct MoeFinalizeRoutingGradOutputs {
  TensorView grad_expanded_x;  // [rows, H] (mode 0) or [E, C, H] (mode 1); dtype of grad_y
  TensorView grad_scales;      // [N, K], dtype of scales; needs scales and expanded_x
  TensorView grad_bias;        // [E', H], dtype of grad_y; needs bias (and so expert_idx)
};

struct MoeFinalizeRoutingGradPlan {
  DType dtype = DType::float32;         // of grad_y, expanded_x, bias, grad_expanded_x
  DType scales_dtype = DType::float32;  // of scales and grad_scales
  int64_t num_rows = 0;                 // N
  int64_t top_k = 0;                    // K: scales.size(1), else len(expanded_row_idx) / N
  int64_t hidden = 0;                   // H
  int64_t expanded_rows = 0;            // R: rows of grad_expanded_x viewed as [R, H]
  int64_t expert_num = 0;               // E': rows of bias (0 without bias)
  bool drop_pad = false;
  /// Index values in [expanded_rows, skip_to) are pairs cut by active_num (skipped).
  int64_t skip_to = 0;
  bool has_scales = false, has_expanded_x = false, has_bias = false, has_expert_idx = false;
  /// Whether the call computes grad_scales / grad_bias: after infer, whether the inputs give
  /// them; in a call, whether the caller also passed them (a call's plan, as the C ABI and
  /// moe_finalize_routing_grad_workspace_size see it).
  bool compute_grad_scales = false, compute_grad_bias = false;
  Numerics numerics = Numerics::atlas_a2;
  OutputSpec grad_expanded_x;
  OutputSpec grad_scales;  // produced with scales and expanded_x
  OutputSpec grad_bias;    // produced with bias
};

/// Validates inputs and attributes; fills `plan` (compute_grad_* say what the inputs can give).
/// Reads no tensor data.
Status infer_moe_finalize_routing_grad(const MoeFinalizeRoutingGradInputs& inputs,
                                       const MoeFinalizeRoutingGradAttrs& attrs,
                                       MoeFinalizeRoutingGradPlan* plan);

/// As check_moe_finalize_routing_indices, for the grad's row layout (-1 and [R, N*K) skipped).
Status check_moe_finalize_routing_grad_indices(const int32_t* expanded_row_idx,
                                               const int32_t* expert_idx,
                                               const MoeFinalizeRoutingGradPlan& plan);

/// Bytes of scratch memory the CPU kernels need for a planned call (the pair lists per row, the
/// order the rows are visited in and, when grad_bias is computed, the pair lists per expert). Pass
/// a buffer this large as ExecConfig::workspace and the call allocates nothing. With a plan from
/// infer alone, compute_grad_bias is whether bias is given: enough for a call that passes
/// grad_bias, and more than one that does not.
uint64_t moe_finalize_routing_grad_workspace_size(const MoeFinalizeRoutingGradPlan& plan,
                                                  int num_threads = 0);

/// Computes, for every pair p = i*K + t that is not dropped (-1, or cut by active_num), with row
/// r = idx[p] and expert e = expert_idx[p]:
///   grad_expanded_x[r] = sum over the pairs naming r, in increasing p, of
///                        f32(grad_y[i]) * f32(scales[p])  (grad_y[i] alone without scales);
///                        rows no pair names are zero.
///   grad_scales[p]     = sum over j of f32(f32(expanded_x[r, j] + bias[e, j]) * grad_y[i, j]) in
///                        the numerics' reduction order; 0 for a dropped pair.
///   grad_bias[e]       = sum over the pairs of expert e, in increasing p, of
///                        f32(scales[p]) * f32(grad_y[i])  (grad_y[i] alone without scales).
/// A sum over pairs starts with its first term (+0 when there is none); each result is rounded
/// once (round-to-nearest-even) to its output dtype.
Status moe_finalize_routing_grad(const MoeFinalizeRoutingGradInputs& inputs,
                                 const MoeFinalizeRoutingGradAttrs& attrs,
                                 const MoeFinalizeRoutingGradOutputs& outputs,
                                 const ExecConfig& config = ExecConfig());

}  // namespace moe_routing
