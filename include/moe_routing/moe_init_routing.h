// The forward MoE routing operators: sort the (token, expert) pairs by expert and copy the rows
// of x into expanded_x, returning the map between the two (expanded_row_idx) and per-expert counts.
//
//   moe_init_routing_v2  CANN aclnnMoeInitRoutingV2 (docs/spec/moe_init_routing.md §2):
//   fp16/bf16/fp32, dropless / active
//                        (active_num truncation) / drop-pad, int32 counts.
//   moe_init_routing     the torch API cann_ops_transformer.moe_init_routing, i.e. CANN V4
//                        (docs/spec/moe_init_routing.md §3): adds active_expert_range,
//                        row_idx_type, int64 counts (cumsum / count / key_value), topk_weight, and
//                        int8 quantisation (quant_mode 0 static, 1 dynamic) in the arithmetic of
//                        either device (Numerics).
//
// Pairs are numbered by their flat position p = i*K + t in expert_idx [N, K] (row-major). Both
// operators sort the routed pairs stably by (expert id, p): ties keep ascending flat position.
// expanded_row_idx is int32 and, unless stated otherwise, uses the "gather" convention: it is
// indexed by the source flat position p and holds the destination row (or slot) of pair p.
//
// Conventions shared by both entry points:
//  * infer_* validates shapes, dtypes and attributes without reading any data and gives the exact
//    shape and dtype of every output (the torch Meta kernel and the C ABI call it).
//  * An absent optional input is a default-constructed TensorView (data null, ndim 0).
//  * An output that the plan marks "not produced" may be passed as a TensorView with data null
//    (any shape); it is then ignored. If it has data, it must have the planned shape and dtype and
//    is filled with zeros.
//  * Every produced output is written completely: where CANN leaves rows or entries unspecified we
//    write zeros (rows past the valid count, key-value rows past the last expert) or the golden
//    order (the tail of row_idx_type=1), docs/decisions.md §11.
//  * On any error nothing is written to any output. Errors read
//    `<operator>: <argument> <constraint>, got <actual>`.
//  * Results are bitwise identical for every backend and thread count.
// See docs/moe_init_routing.md.
#pragma once

#include <cstdint>
#include <string>

#include "moe_routing/numerics.h"
#include "moe_routing/status.h"
#include "moe_routing/tensor.h"

namespace moe_routing {

// ------------------------------------------------------------------------------------------
// moe_init_routing_v2 (aclnnMoeInitRoutingV2)
// ------------------------------------------------------------------------------------------

struct MoeInitRoutingV2Attrs {
  /// >= 0. drop_pad_mode 0: 0 keeps every pair; A > 0 keeps the first min(A, N*K) sorted rows.
  int64_t active_num = 0;
  /// C, >= 0; used (and required >= 1 and <= N when N > 0) by drop_pad_mode 1, where E*C must
  /// be at most 2^31 - 1 (slot numbers are int32).
  int64_t expert_capacity = 0;
  /// E, >= 0; required >= 1 by drop_pad_mode 1 and by count outputs. Expert ids must be < E
  /// wherever E is used (counts, drop-pad); they must be >= 0 always.
  int64_t expert_num = 0;
  /// 0 = dropless (with active_num truncation), 1 = drop-pad ([E, C, H] slots).
  int64_t drop_pad_mode = 0;
  /// drop_pad_mode 0 only: 0 = none, 1 = cumsum, 2 = count (ignored in drop_pad_mode 1).
  int64_t expert_tokens_count_or_cumsum_flag = 0;
  /// drop_pad_mode 1 only: also output the per-expert counts before capacity (ignored in mode 0).
  bool expert_tokens_before_capacity_flag = false;
};

struct MoeInitRoutingV2Plan {
  DType dtype = DType::float32;  // of x and expanded_x
  int64_t num_rows = 0;          // N
  int64_t top_k = 0;             // K
  int64_t hidden = 0;            // H
  int64_t expert_num = 0;        // E
  int64_t expert_capacity = 0;   // C (drop-pad only)
  bool drop_pad = false;
  /// Rows of expanded_x that receive a copy of an x row: A' = min(active_num, N*K) (or N*K when
  /// active_num is 0) in dropless mode; every slot E*C in drop-pad mode (unfilled slots are 0).
  int64_t expanded_rows = 0;
  /// Upper bound (exclusive) the expert ids are checked against: E when counts or drop-pad use
  /// it, else INT64_MAX (ids need only be >= 0).
  int64_t expert_id_limit = 0;
  /// 0 = no count output, 1 = cumsum, 2 = count (the effective flag: 0 in drop-pad mode).
  int64_t count_flag = 0;

  OutputSpec expanded_x;                     // dropless [A', H]; drop-pad [E, C, H]; x.dtype
  OutputSpec expanded_row_idx;               // [N*K] int32
  OutputSpec expert_tokens_count_or_cumsum;  // [E] int32; produced in mode 0 when flag is 1 or 2
  OutputSpec expert_tokens_before_capacity;  // [E] int32; produced in mode 1 when the flag is set
};

/// Validates x ([N, H] fp16/bf16/fp32), expert_idx ([N, K] int32) and attrs (no data is read)
/// and fills `plan` with every output's shape and dtype.
Status infer_moe_init_routing_v2(const TensorView& x, const TensorView& expert_idx,
                                 const MoeInitRoutingV2Attrs& attrs, MoeInitRoutingV2Plan* plan);

/// Checks every expert id: >= 0, and < plan.expert_id_limit. The error (index_out_of_range) names
/// the first offending position, e.g. `expert_idx[1][0] = 7 is outside [0, 4)`. Reads
/// expert_idx (a CPU pointer); writes nothing.
Status check_moe_init_routing_v2_expert_idx(const int32_t* expert_idx,
                                            const MoeInitRoutingV2Plan& plan);

/// Computes the routing.
///   x:                             [N, H] fp16 / bf16 / fp32
///   expert_idx:                    [N, K] int32
///   expanded_x:                    dropless [A', H], drop-pad [E, C, H]; x.dtype
///       dropless: row d = x[sorted_pos[d] / K] for d < A' (sorted_pos = flat positions sorted
///       stably by expert id); drop-pad: slot e*C + c = the c-th pair (in flat order) routed to
///       expert e if c < C, else the slot is zero.
///   expanded_row_idx:              [N*K] int32, gather convention. Dropless: a full permutation
///       (values >= A' mark truncated pairs); drop-pad: slot e*C + c, or -1 for a dropped pair.
///   expert_tokens_count_or_cumsum: [E] int32 (mode 0, flag 1: inclusive cumsum, flag 2: count;
///       over all N*K pairs), or not produced.
///   expert_tokens_before_capacity: [E] int32 (mode 1 with the flag: counts before capacity), or
///       not produced.
Status moe_init_routing_v2(const TensorView& x, const TensorView& expert_idx,
                           const MoeInitRoutingV2Attrs& attrs, const TensorView& expanded_x,
                           const TensorView& expanded_row_idx,
                           const TensorView& expert_tokens_count_or_cumsum,
                           const TensorView& expert_tokens_before_capacity,
                           const ExecConfig& config = ExecConfig());

/// Bytes of scratch memory the CPU kernels need for a planned call with `num_threads` threads
/// (0 = the library default, as ExecConfig::num_threads). It depends on the plan and the thread
/// count only, never on the data: pass a buffer this large as ExecConfig::workspace (with the
/// same num_threads) and moe_init_routing_v2 allocates nothing.
uint64_t moe_init_routing_v2_workspace_size(const MoeInitRoutingV2Plan& plan, int num_threads = 0);

// ------------------------------------------------------------------------------------------
// moe_init_routing (torch API cann_ops_transformer.moe_init_routing / aclnnMoeInitRoutingV4)
// ------------------------------------------------------------------------------------------

/// Experts [start, end) handled by this call; pairs routed elsewhere are not routed.
struct ActiveExpertRange {
  int64_t start = 0;
  int64_t end = 0;
};

struct MoeInitRoutingAttrs {
  /// Dropless only. -1 or 0: keep every routed pair; > 0: keep the first min(active_num, routed
  /// pairs) sorted rows (docs/decisions.md §12). Other negative values are rejected. Ignored (apart
  /// from that check) in drop_pad_mode 1, where expert_capacity limits the rows.
  int64_t active_num = -1;
  /// C; drop_pad_mode 1 requires 1 <= C <= N (when N > 0) and E*C <= 2^31 - 1 (int32 slot
  /// numbers); ignored in drop_pad_mode 0.
  int64_t expert_capacity = -1;
  /// E, >= 1 (required: the torch default -1 is rejected).
  int64_t expert_num = -1;
  /// 0 = dropless, 1 = drop-pad (needs quant_mode -1, row_idx_type 0 and the full expert range).
  int64_t drop_pad_mode = 0;
  /// 0 = cumsum, 1 = count, 2 = key_value.
  int64_t expert_tokens_num_type = 0;
  /// Whether expert_tokens_count_or_cumsum is produced.
  bool expert_tokens_num_flag = false;
  /// -1 = none, 0 = static int8, 1 = dynamic int8 (2..17 exist in CANN; not supported here).
  int64_t quant_mode = -1;
  /// false: [0, expert_num). true: active_expert_range, 0 <= start < end <= expert_num.
  bool has_active_expert_range = false;
  ActiveExpertRange active_expert_range;
  /// 0 = gather (indexed by flat position, -1 for pairs not routed);
  /// 1 = scatter (indexed by destination row, holds the flat position).
  int64_t row_idx_type = 0;
  /// The int8 quantisation arithmetic of quant_mode 0 and 1 (numerics.h).
  Numerics numerics = Numerics::atlas_a2;
};

struct MoeInitRoutingPlan {
  DType x_dtype = DType::float32;
  int64_t num_rows = 0;         // N
  int64_t top_k = 0;            // K
  int64_t hidden = 0;           // H
  int64_t expert_num = 0;       // E
  int64_t expert_capacity = 0;  // C (drop-pad only, else 0)
  bool drop_pad = false;
  int64_t range_start = 0;  // s: pairs with s <= id < range_end are routed
  int64_t range_end = 0;    // e_end
  /// Dropless: at most this many routed rows are written (active_num > 0 ? active_num : N*K).
  int64_t row_limit = 0;
  int64_t quant_mode = -1;
  Numerics numerics = Numerics::atlas_a2;
  int64_t row_idx_type = 0;
  int64_t expert_tokens_num_type = 0;
  bool expert_tokens_num_flag = false;
  bool has_scale = false;
  bool has_offset = false;
  bool has_topk_weight = false;
  /// quant_mode 1 with a smooth scale: its rows (1 = broadcast, or e_end - s).
  int64_t scale_rows = 0;

  /// dropless [N*K, H]; drop-pad [E, C, H]; x.dtype (quant_mode -1) or int8 (quant_mode 0/1).
  /// Dropless rows d < R = min(row_limit, routed pairs) hold x[sorted_pos[d] / K] (quantised for
  /// quant_mode 0/1); rows d >= R are zero.
  OutputSpec expanded_x;
  /// [N*K] int32. row_idx_type 0: gather convention, -1 for pairs not routed (values >= R mark
  /// pairs cut by active_num). row_idx_type 1: entry d < routed pairs is sorted_pos[d]; the tail
  /// lists the pairs not routed: ids >= e_end by (id, p), then ids < s by p (the CANN golden).
  OutputSpec expanded_row_idx;
  /// int64. Type 0 (cumsum): [e_end - s], out[j] = #routed pairs with id <= s + j. Type 1
  /// (count): [e_end - s]. Type 2 (key_value): [E, 2], rows [id, count] for the experts in range
  /// with count > 0 in ascending id, then [0, 0] rows. Counts cover every routed pair (not cut by
  /// active_num or capacity). Not produced when expert_tokens_num_flag is false (shape
  /// [e_end - s] then, as the CANN torch wrapper allocates).
  OutputSpec expert_tokens_count_or_cumsum;
  /// fp32. Dropless [N*K], drop-pad [E*C]. quant_mode 1: the dynamic scale of each row;
  /// quant_mode -1 with scale [N]: scale[sorted_pos[d] / K]. Not produced for quant_mode 0 or
  /// quant_mode -1 without scale. Rows/slots without a pair are 0.
  OutputSpec expanded_scale;
  /// fp32. Dropless [N*K, 1], drop-pad [E*C, 1]: topk_weight at the pair's flat position, 0 for
  /// rows/slots without a pair. [0] and not produced when topk_weight is absent.
  OutputSpec expanded_topk_weight;
};

/// Validates every input shape and dtype and the attributes (no data is read) and fills `plan`.
///   x:           [N, H] fp16 / bf16 / fp32 (also int8 with quant_mode -1)
///   expert_idx:  [N, K] int32; ids outside the active expert range (e.g. -1) are not routed
///   scale:       optional fp32. quant_mode -1: [N] (per-token, gathered into expanded_scale);
///                quant_mode 0: [1] (required); quant_mode 1: [e_end - s, H] or [1, H] (smooth)
///   offset:      optional fp32 [1], quant_mode 0 only
///   topk_weight: optional fp32 [N, K]
/// quant_mode 2..17 give StatusCode::not_supported.
Status infer_moe_init_routing(const TensorView& x, const TensorView& expert_idx,
                              const TensorView& scale, const TensorView& offset,
                              const TensorView& topk_weight, const MoeInitRoutingAttrs& attrs,
                              MoeInitRoutingPlan* plan);

/// Computes the routing; outputs as documented on MoeInitRoutingPlan. Quantisation
/// (docs/spec/moe_init_routing.md §3.3):
///   quant_mode 0, atlas_a2:   q = sat_int8(round_half_even(float(x) * scale + offset)) in fp32;
///   quant_mode 0, ascend_950: the same in fp16 (x, scale, offset narrowed to fp16, each op
///                             rounded to fp16);
///   quant_mode 1: f = float(x) (* smooth scale row of the pair's expert), m = max |f|,
///                 sc = m / 127 (atlas_a2) or m * float32(1/127) (ascend_950),
///                 q = sat_int8(round_half_away(f / sc)); a NaN quotient gives 0 (so an all-zero
///                 row gives zeros and scale 0), +-inf saturates.
Status moe_init_routing(const TensorView& x, const TensorView& expert_idx, const TensorView& scale,
                        const TensorView& offset, const TensorView& topk_weight,
                        const MoeInitRoutingAttrs& attrs, const TensorView& expanded_x,
                        const TensorView& expanded_row_idx,
                        const TensorView& expert_tokens_count_or_cumsum,
                        const TensorView& expanded_scale, const TensorView& expanded_topk_weight,
                        const ExecConfig& config = ExecConfig());

/// moe_init_routing_v2_workspace_size for moe_init_routing.
uint64_t moe_init_routing_workspace_size(const MoeInitRoutingPlan& plan, int num_threads = 0);

}  // namespace moe_routing
