// The index checks of moe_finalize_routing and its grad, and their messages: one wording for the
// CPU checks (src/ops/moe_finalize_routing*/meta.cpp) and the CUDA launchers, which find the first
// bad position on the device and report it through the same functions.
#pragma once

#include <cstdint>

#include "moe_routing/status.h"
#include "moe_routing/tensor.h"

namespace moe_routing::detail {

/// expanded_row_idx must be 1-D int32 with at most INT32_MAX entries (its positions are int32).
inline Status check_expanded_row_idx_tensor(const char* op, const TensorView& idx) {
  if (idx.ndim != 1 || idx.dtype != DType::int32)
    return invalid_argument(op, "expanded_row_idx must be 1-D int32, got ", describe(idx));
  if (idx.shape[0] < 0)
    return invalid_argument(op, "expanded_row_idx dimensions must be >= 0, got ",
                            shape_string(idx));
  if (idx.shape[0] > INT32_MAX)
    return invalid_argument(
        op, "len(expanded_row_idx) must be at most 2147483647 (int32 positions), got ",
        idx.shape[0]);
  return Status::ok();
}

/// The index_out_of_range error for expanded_row_idx[position] = value outside [0, rows);
/// `skip_to` > rows says that values in [rows, skip_to) are pairs cut by active_num.
inline Status finalize_row_index_error(const char* op, int64_t position, int64_t value,
                                       int64_t rows, int64_t skip_to) {
  if (skip_to > rows)
    return index_out_of_range(op, "expanded_row_idx[", position, "] must be in [0, ", rows,
                              ") (-1 marks a dropped pair, values in [", rows, ", ", skip_to,
                              ") pairs cut by active_num), got ", value);
  return index_out_of_range(op, "expanded_row_idx[", position, "] must be in [0, ", rows,
                            ") (-1 marks a dropped pair), got ", value);
}

/// Whether an index value is valid: -1 and [rows, skip_to) skip their pair, [0, rows) is a row
/// (skip_to >= rows).
inline bool finalize_row_index_ok(int64_t value, int64_t skip_to) {
  return value == -1 || (value >= 0 && value < skip_to);
}

/// Every index value is valid, or the error for the first that is not.
inline Status check_finalize_row_indices(const char* op, const int32_t* idx, int64_t pairs,
                                         int64_t rows, int64_t skip_to) {
  for (int64_t q = 0; q < pairs; ++q)
    if (!finalize_row_index_ok(idx[q], skip_to))
      return finalize_row_index_error(op, q, idx[q], rows, skip_to);
  return Status::ok();
}

/// The index_out_of_range error for expert_idx[i][t] = expert outside [0, experts).
inline Status finalize_expert_error(const char* op, int64_t i, int64_t t, int64_t expert,
                                    int64_t experts) {
  return index_out_of_range(op, "expert_idx[", i, "][", t, "] must be in [0, ", experts,
                            ") (the rows of bias), got ", expert);
}

}  // namespace moe_routing::detail
