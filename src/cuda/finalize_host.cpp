// Host-side logic of the CUDA launchers of moe_finalize_routing(_grad) that needs no GPU.
#include "cuda/finalize_backend.h"
#include "params/finalize_routing_checks.h"

namespace moe_routing::cuda {

Status finalize_verdict_status(const char* op, const IndexVerdict& verdict, int64_t rows,
                               int64_t skip_to, int64_t top_k, int64_t experts) {
  if (verdict.row_position != IndexVerdict::kNoBadIndex)
    return detail::finalize_row_index_error(op, verdict.row_position, verdict.row_value, rows,
                                            skip_to);
  if (verdict.expert_position != IndexVerdict::kNoBadIndex)
    return detail::finalize_expert_error(op, verdict.expert_position / top_k,
                                         verdict.expert_position % top_k, verdict.expert_value,
                                         experts);
  return Status::ok();
}

int finalize_sort_key_bits(int64_t key_count) {
  int bits = 1;
  while (bits < 62 && (int64_t(1) << bits) < key_count) ++bits;
  return bits;
}

}  // namespace moe_routing::cuda
