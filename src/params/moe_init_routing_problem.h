// What a forward routing backend sees: both entry points (moe_init_routing_v2 and
// moe_init_routing) reduce to this one description, so every backend (reference, cpu, cuda) is
// written once for both.
#pragma once

#include <cstdint>
#include <limits>

#include "moe_routing/moe_init_routing.h"
#include "moe_routing/status.h"

namespace moe_routing::detail {

/// How the per-expert counts over [range_start, range_end) are written.
enum class CountFormat : int32_t {
  none = 0,
  cumsum = 1,     // [range] inclusive prefix sum
  count = 2,      // [range]
  key_value = 3,  // [expert_num, 2]: [id, count] for count > 0 in ascending id, then [0, 0]
};

struct RoutingProblem {
  // Sizes.
  int64_t num_rows = 0;  // N
  int64_t top_k = 0;     // K
  int64_t hidden = 0;    // H
  DType x_dtype = DType::float32;

  // Routing. Pair p is routed iff range_start <= expert_idx[p] < range_end.
  int64_t range_start = 0;
  int64_t range_end = 0;
  bool drop_pad = false;
  int64_t expert_num = 0;       // E (drop-pad, key_value)
  int64_t expert_capacity = 0;  // C (drop-pad)
  /// Dropless: rows d < min(row_limit, routed pairs) hold data, rows up to expanded_rows are zero.
  int64_t row_limit = 0;
  int64_t expanded_rows = 0;  // dropless: rows of expanded_x; drop-pad: E*C
  int64_t row_idx_type = 0;   // 0 gather, 1 scatter (dropless only)
  int64_t quant_mode = -1;    // -1, 0, 1
  Numerics numerics = Numerics::atlas_a2;

  // Inputs (CPU pointers, already validated).
  const void* x = nullptr;              // [N, H] x_dtype
  const int32_t* expert_idx = nullptr;  // [N*K]
  const float* scale = nullptr;         // q -1: [N]; q 0: [1]; q 1: [scale_rows, H]; or null
  int64_t scale_rows = 0;               // q 1: 1 (broadcast) or range_end - range_start
  const float* offset = nullptr;        // q 0: [1] or null (= 0)
  const float* topk_weight = nullptr;   // [N*K] or null

  // Outputs; a null pointer means "not written".
  void* expanded_x = nullptr;             // [expanded_rows, H] x_dtype (q -1) or int8
  int32_t* expanded_row_idx = nullptr;    // [N*K]
  float* expanded_scale = nullptr;        // [expanded_rows]
  float* expanded_topk_weight = nullptr;  // [expanded_rows]
  CountFormat count_format = CountFormat::none;
  DType count_dtype = DType::int64;  // int32 (V2) or int64 (torch API)
  void* counts = nullptr;

  int64_t pairs() const { return num_rows * top_k; }
  bool needs_counts() const { return count_format != CountFormat::none || drop_pad; }
  /// Whether a destination row holds anything: bytes of expanded_x (hidden > 0) or a per-row
  /// value. When not, no backend visits the rows, however many there are: an empty output costs
  /// nothing (issue 17, item 8: hidden 0 with 2^31 - 1 drop-pad slots took seconds).
  bool writes_rows() const {
    return hidden > 0 || expanded_scale != nullptr || expanded_topk_weight != nullptr;
  }
};

/// The index_out_of_range error for moe_init_routing_v2's expert_idx at pair `position` (row
/// position / top_k, column position % top_k) = id outside [0, limit); limit is INT64_MAX when
/// only negative ids are refused. The one wording of every backend's check.
inline Status v2_expert_id_error(int64_t top_k, int64_t limit, int64_t position, int64_t id) {
  const char* op = "moe_init_routing_v2: ";
  if (limit == std::numeric_limits<int64_t>::max())
    return index_out_of_range(op, "expert_idx[", position / top_k, "][", position % top_k,
                              "] must be >= 0 (expert ids are never negative), got ", id);
  return index_out_of_range(op, "expert_idx[", position / top_k, "][", position % top_k,
                            "] must be in [0, ", limit, ") (expert_num), got ", id);
}

}  // namespace moe_routing::detail
