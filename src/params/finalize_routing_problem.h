// What the backends of moe_finalize_routing and its grad see: the problem structs (pointers,
// sizes and the arithmetic the numerics select, decided once here from the plan), which term a
// pair contributes, and the shapes of the grad_scales reduction orders. Shared by the reference,
// the CPU kernels and the CUDA kernels (the functions are __host__ __device__ under nvcc and
// always inlined on the host, so no per-ISA translation unit emits a copy of its own).
#pragma once

#include <cstdint>

#include "moe_routing/dtype.h"
#include "moe_routing/moe_finalize_routing.h"

#if defined(__CUDACC__)
#define MOE_ROUTING_PARAMS_FN __host__ __device__ __forceinline__
#else
#define MOE_ROUTING_PARAMS_FN inline __attribute__((always_inline))
#endif

namespace moe_routing::detail {

/// What a pair (i, t) adds to out[i].
enum class FinalizeTerm : int32_t {
  skip = 0,      // nothing: a dropped pair (-1, or cut by active_num) or a zero expert
  row = 1,       // the expanded_x row the index names
  copy = 2,      // x[i] (copy expert)
  constant = 3,  // alpha1[c] * x[i] + alpha2[c] * v[c], c = expert - constant start
};

/// All a forward kernel sees. Index data has been checked (every index is -1, cut, or a row).
struct FinalizeRoutingProblem {
  const void* expanded_x;           // [R, H]
  const int32_t* expanded_row_idx;  // [N*K]
  const void* x1;                   // [N, H] or null
  const void* x2;                   // [N, H] or null (only with x1)
  const void* bias;                 // [E, H] or null
  const void* scales;               // [N, K] (scales_dtype) or null
  const int32_t* expert_idx;        // [N, K] or null
  const void* x;                    // [N, H] or null
  const void* alpha1;               // [constant range size, H] or null
  const void* alpha2;
  const void* v;
  void* out;  // [N, H]
  DType dtype;
  DType scales_dtype;
  int64_t num_rows, top_k, hidden, expanded_rows;
  bool column_layout;
  // The arithmetic (docs/spec/moe_finalize_routing.md §3), decided by numerics, dtype and api:
  bool fp16_accumulate;      // atlas_a2 float16: every step rounded to float16
  bool first_term_assigned;  // atlas_a2: without x1 the first term is assigned, not added to +0
  bool x1_plus_zero;         // atlas_a2: x1 without x2 is added to +0 (-0 becomes +0)
  bool zero_bias;            // atlas_a2 float32/float16 without bias: each term gets + 0
  bool bf16_half_away;       // api v1 under atlas_a2: bfloat16 rounded with ties away from zero
  int64_t zero_start, zero_end, copy_start, copy_end, constant_start, constant_end;

  /// Where pair (i, t) sits in expanded_row_idx.
  MOE_ROUTING_PARAMS_FN int64_t index_position(int64_t i, int64_t t) const {
    return column_layout ? t * num_rows + i : i * top_k + t;
  }

  /// The term pair (i, t) contributes; *row is its expanded_x row (kind row), *expert its expert
  /// id (-1 without expert_idx). The index is tested first, as the Ascend 950 kernel does: a
  /// dropped pair adds nothing whatever its expert.
  MOE_ROUTING_PARAMS_FN FinalizeTerm term(int64_t i, int64_t t, int64_t* row,
                                          int64_t* expert) const {
    const int64_t r = expanded_row_idx[index_position(i, t)];
    *row = r;
    *expert = expert_idx != nullptr ? int64_t(expert_idx[i * top_k + t]) : -1;
    if (r < 0 || r >= expanded_rows) return FinalizeTerm::skip;  // -1, or cut by active_num
    if (expert_idx == nullptr) return FinalizeTerm::row;
    const int64_t e = *expert;
    if (e >= zero_start && e < zero_end) return FinalizeTerm::skip;
    if (e >= copy_start && e < copy_end) return FinalizeTerm::copy;
    if (e >= constant_start && e < constant_end) return FinalizeTerm::constant;
    return FinalizeTerm::row;
  }
};

/// The sizes and dtypes the forward's and the grad's plans and problems share.
template <class Plan, class Problem>
inline void copy_sizes(const Plan& plan, Problem* p) {
  p->dtype = plan.dtype;
  p->scales_dtype = plan.scales_dtype;
  p->num_rows = plan.num_rows;
  p->top_k = plan.top_k;
  p->hidden = plan.hidden;
  p->expanded_rows = plan.expanded_rows;
}

inline FinalizeRoutingProblem make_finalize_routing_problem(const MoeFinalizeRoutingPlan& plan,
                                                            const MoeFinalizeRoutingInputs& in,
                                                            void* out) {
  FinalizeRoutingProblem p{};
  p.expanded_x = in.expanded_x.data;
  p.expanded_row_idx = static_cast<const int32_t*>(in.expanded_row_idx.data);
  p.x1 = plan.has_x1 ? in.x1.data : nullptr;
  p.x2 = plan.has_x2 ? in.x2.data : nullptr;
  p.bias = plan.has_bias ? in.bias.data : nullptr;
  p.scales = plan.has_scales ? in.scales.data : nullptr;
  p.expert_idx = plan.has_expert_idx ? static_cast<const int32_t*>(in.expert_idx.data) : nullptr;
  p.x = plan.has_x ? in.x.data : nullptr;
  const bool constant = plan.constant_expert_range.enabled();
  p.alpha1 = constant ? in.alpha1.data : nullptr;
  p.alpha2 = constant ? in.alpha2.data : nullptr;
  p.v = constant ? in.v.data : nullptr;
  p.out = out;
  copy_sizes(plan, &p);
  p.column_layout = plan.column_layout;
  const bool a2 = plan.numerics == Numerics::atlas_a2;
  p.fp16_accumulate = a2 && plan.dtype == DType::float16;
  p.first_term_assigned = a2;
  p.x1_plus_zero = a2;
  p.zero_bias = a2 && !plan.has_bias && plan.dtype != DType::bfloat16;
  p.bf16_half_away = a2 && plan.api == FinalizeRoutingApi::v1 && plan.dtype == DType::bfloat16;
  // A disabled range [-1, -1) contains nothing.
  p.zero_start = plan.zero_expert_range.start, p.zero_end = plan.zero_expert_range.end;
  p.copy_start = plan.copy_expert_range.start, p.copy_end = plan.copy_expert_range.end;
  p.constant_start = plan.constant_expert_range.start;
  p.constant_end = plan.constant_expert_range.end;
  return p;
}

/// float32 bits -> bfloat16 rounded with ties away from zero (the V1 kernel's CAST_ROUND); NaN
/// gives the canonical NaN. Adding half an ulp to the magnitude bits carries into the exponent
/// exactly where rounding up must (values from the largest bfloat16 + half an ulp up become inf).
MOE_ROUTING_PARAMS_FN uint16_t bf16_half_away_from_bits(uint32_t bits) {
  if ((bits & 0x7fffffffu) > 0x7f800000u) return kCanonicalNanBfloat16;
  return uint16_t((bits + 0x8000u) >> 16);
}

// ---- the grad ---------------------------------------------------------------------------------

/// All a grad kernel sees. The pair lists are the non-dropped pairs grouped by row of
/// grad_expanded_x (and by expert), each group in increasing pair index: the order in which a
/// row's (an expert's) terms are summed, whatever thread computes it.
struct FinalizeRoutingGradProblem {
  const void* grad_y;               // [N, H]
  const int32_t* expanded_row_idx;  // [N*K], checked
  const void* expanded_x;           // [R, H] or null (never null where grad_scales is not)
  const void* scales;               // [N, K] or null
  const int32_t* expert_idx;        // [N, K] or null
  const void* bias;                 // [E, H] or null
  void* grad_expanded_x;            // [R, H]
  void* grad_scales;                // [N, K] or null (not computed)
  void* grad_bias;                  // [E, H] or null (not computed)
  DType dtype;
  DType scales_dtype;
  int64_t num_rows, top_k, hidden, expanded_rows, expert_num;
  bool tree_order;                // atlas_a2: chunked 512-lane trees; ascend_950: the fold
  int64_t chunk;                  // atlas_a2: products per chunk (grad_scales_chunk)
  const int32_t* row_offsets;     // [R + 1]: row r's pairs are row_pairs[row_offsets[r] ..)
  const int32_t* row_pairs;       // the non-dropped pairs by (row, p)
  const int32_t* expert_offsets;  // [E + 1] (grad_bias only)
  const int32_t* expert_pairs;    // the non-dropped pairs by (expert, p)

  /// Whether pair p adds nothing (its index is -1 or cut by active_num).
  MOE_ROUTING_PARAMS_FN bool dropped(int64_t p) const {
    const int64_t r = expanded_row_idx[p];
    return r < 0 || r >= expanded_rows;
  }
};

/// atlas_a2 grad_scales: the lanes of one adjacent-pair tree.
constexpr int64_t kGradScalesGroup = 512;
/// ascend_950 grad_scales: the lanes of one adjacent-pair tree.
constexpr int64_t kGradScalesBlock = 64;

/// atlas_a2 grad_scales: products per chunk, from the kernel's 192 KiB unified buffer less 256 B
/// divided among its per-element buffers (docs/spec/moe_finalize_routing.md §4).
MOE_ROUTING_PARAMS_FN int64_t grad_scales_chunk(DType dtype, bool has_bias) {
  if (dtype == DType::float32) return has_bias ? 12264 : 16352;
  return has_bias ? 14016 : 19616;
}

/// ascend_950 grad_scales: Q, the largest power of two <= h (h >= 1).
MOE_ROUTING_PARAMS_FN int64_t grad_scales_fold(int64_t h) {
  int64_t q = 1;
  while (q <= h / 2) q *= 2;
  return q;
}

/// The problem of a planned grad call; the pair lists are filled in by the backend.
inline FinalizeRoutingGradProblem make_finalize_routing_grad_problem(
    const MoeFinalizeRoutingGradPlan& plan, const MoeFinalizeRoutingGradInputs& in,
    const MoeFinalizeRoutingGradOutputs& out) {
  FinalizeRoutingGradProblem p{};
  p.grad_y = in.grad_y.data;
  p.expanded_row_idx = static_cast<const int32_t*>(in.expanded_row_idx.data);
  p.expanded_x = plan.has_expanded_x ? in.expanded_x.data : nullptr;
  p.scales = plan.has_scales ? in.scales.data : nullptr;
  p.expert_idx = plan.has_expert_idx ? static_cast<const int32_t*>(in.expert_idx.data) : nullptr;
  p.bias = plan.has_bias ? in.bias.data : nullptr;
  p.grad_expanded_x = out.grad_expanded_x.data;
  p.grad_scales = plan.compute_grad_scales ? out.grad_scales.data : nullptr;
  p.grad_bias = plan.compute_grad_bias ? out.grad_bias.data : nullptr;
  copy_sizes(plan, &p);
  p.expert_num = plan.expert_num;
  p.tree_order = plan.numerics == Numerics::atlas_a2;
  p.chunk = grad_scales_chunk(plan.dtype, plan.has_bias);
  return p;
}

}  // namespace moe_routing::detail
