// The reference implementation of the forward routing: kept plain on purpose (a stable comparison
// sort and one loop per output). The CPU kernels, golden files and benchmark --verify are compared
// against it bit for bit.
#include "reference/moe_init_routing.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "core/float_env.h"
#include "params/quantize.h"

namespace moe_routing::reference {
namespace {

using detail::CountFormat;
using detail::RoutingProblem;

/// Writes destination row `dest` of every row-shaped output from pair `p`, or zeros when p < 0.
/// `f` is scratch of H floats (dynamic quantisation).
void write_row(const RoutingProblem& pr, int64_t dest, int64_t p,
               const quantize::StaticParams& static_params, std::vector<float>& f) {
  const int64_t H = pr.hidden;
  if (p < 0) {
    const size_t out_size = pr.quant_mode == -1 ? dtype_size(pr.x_dtype) : 1;
    if (H > 0)
      std::memset(static_cast<char*>(pr.expanded_x) + size_t(dest * H) * out_size, 0,
                  size_t(H) * out_size);
    if (pr.expanded_scale != nullptr) pr.expanded_scale[dest] = 0.0f;
    if (pr.expanded_topk_weight != nullptr) pr.expanded_topk_weight[dest] = 0.0f;
    return;
  }
  const int64_t token = p / pr.top_k;
  const int64_t expert = pr.expert_idx[p];
  if (pr.quant_mode == -1) {
    const size_t size = dtype_size(pr.x_dtype);
    if (H > 0)
      std::memcpy(static_cast<char*>(pr.expanded_x) + size_t(dest * H) * size,
                  static_cast<const char*>(pr.x) + size_t(token * H) * size, size_t(H) * size);
    if (pr.expanded_scale != nullptr) pr.expanded_scale[dest] = pr.scale[token];
  } else if (pr.quant_mode == 0) {
    int8_t* out = static_cast<int8_t*>(pr.expanded_x) + dest * H;
    for (int64_t j = 0; j < H; ++j)
      out[j] =
          quantize::static_quantize(load_as_float(pr.x, pr.x_dtype, token * H + j), static_params);
  } else {
    // Dynamic: f = x (* smooth scale row of the pair's expert), sc from max |f|, q = f / sc.
    for (int64_t j = 0; j < H; ++j) f[j] = load_as_float(pr.x, pr.x_dtype, token * H + j);
    if (pr.scale != nullptr) {
      const int64_t row = pr.scale_rows == 1 ? 0 : expert - pr.range_start;
      for (int64_t j = 0; j < H; ++j) f[j] = f[j] * pr.scale[row * H + j];
    }
    float abs_max = 0.0f;
    for (int64_t j = 0; j < H; ++j) abs_max = quantize::abs_max_step(abs_max, f[j]);
    const float sc = quantize::dynamic_scale(abs_max, pr.numerics);
    int8_t* out = static_cast<int8_t*>(pr.expanded_x) + dest * H;
    for (int64_t j = 0; j < H; ++j) out[j] = quantize::dynamic_quantize(f[j], sc);
    pr.expanded_scale[dest] = canonicalize_nan(sc);
  }
  if (pr.expanded_topk_weight != nullptr) pr.expanded_topk_weight[dest] = pr.topk_weight[p];
}

void write_count(const RoutingProblem& pr, int64_t index, int64_t value) {
  if (pr.count_dtype == DType::int32)
    static_cast<int32_t*>(pr.counts)[index] = int32_t(value);
  else
    static_cast<int64_t*>(pr.counts)[index] = value;
}

}  // namespace

void moe_init_routing(const RoutingProblem& pr) {
  detail::DefaultFloatEnvironment float_environment;
  const int64_t P = pr.pairs();
  auto routed = [&](int64_t p) {
    const int64_t id = pr.expert_idx[p];
    return id >= pr.range_start && id < pr.range_end;
  };

  // 1. The routed pairs, sorted stably by expert id: ties keep ascending flat position.
  std::vector<int64_t> order;
  for (int64_t p = 0; p < P; ++p)
    if (routed(p)) order.push_back(p);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return pr.expert_idx[a] < pr.expert_idx[b]; });
  const int64_t num_routed = int64_t(order.size());

  // 2. row_idx_type 1 tail, as the CANN golden builds it: ids below the range become INT32_MAX,
  //    then the pairs not routed are sorted stably by that key.
  std::vector<int64_t> tail;
  if (!pr.drop_pad && pr.row_idx_type == 1) {
    for (int64_t p = 0; p < P; ++p)
      if (!routed(p)) tail.push_back(p);
    auto golden_key = [&](int64_t p) -> int64_t {
      const int64_t id = pr.expert_idx[p];
      return id < pr.range_start ? int64_t(std::numeric_limits<int32_t>::max()) : id;
    };
    std::stable_sort(tail.begin(), tail.end(),
                     [&](int64_t a, int64_t b) { return golden_key(a) < golden_key(b); });
  }

  // 3. The counts of the experts with routed pairs, as (id - range start, count) in ascending id:
  //    the runs of equal ids in `order`. (A table over the whole range could have 2^31 - 1
  //    entries for a few pairs.)
  std::vector<std::pair<int64_t, int64_t>> runs;
  if (pr.count_format != CountFormat::none)
    for (int64_t p : order) {
      const int64_t key = pr.expert_idx[p] - pr.range_start;
      if (runs.empty() || runs.back().first != key) runs.emplace_back(key, 0);
      ++runs.back().second;
    }

  // 4. Drop-pad: the c-th pair (in sorted order) of expert e takes slot e*C + c if c < C. `kept`
  //    lists the filled slots with their pairs in ascending slot order (the order is sorted by
  //    expert): nothing is kept per slot or per expert, whose numbers may reach 2^31 - 1.
  std::vector<std::pair<int64_t, int64_t>> kept;  // (slot, pair)
  std::vector<int32_t> drop_pad_row_idx;
  if (pr.drop_pad) {
    const int64_t C = pr.expert_capacity;
    drop_pad_row_idx.assign(size_t(P), -1);
    int64_t c = 0;
    for (size_t d = 0; d < order.size(); ++d) {
      const int64_t e = pr.expert_idx[order[d]];
      c = d > 0 && pr.expert_idx[order[d - 1]] == e ? c + 1 : 0;
      if (c >= C) continue;
      kept.emplace_back(e * C + c, order[d]);
      drop_pad_row_idx[size_t(order[d])] = int32_t(e * C + c);
    }
  }
  // Only when a row is quantised: an empty expanded_x may have any H (x [0, H] is valid).
  std::vector<float> scratch(size_t(pr.quant_mode == 1 && pr.expanded_rows > 0 ? pr.hidden : 0));
  quantize::StaticParams static_params;
  if (pr.quant_mode == 0) static_params = quantize::static_params(pr.numerics, pr.scale, pr.offset);

  // Every allocation is done; from here on the outputs are written.
  // A row that holds nothing (hidden 0, no per-row value) is not visited, however many there are.
  const int64_t rows = pr.writes_rows() ? pr.expanded_rows : 0;
  if (pr.drop_pad) {
    for (int64_t p = 0; p < P; ++p) pr.expanded_row_idx[p] = drop_pad_row_idx[size_t(p)];
    size_t next = 0;  // the first entry of `kept` not written yet
    for (int64_t slot = 0; slot < rows; ++slot) {
      const bool filled = next < kept.size() && kept[next].first == slot;
      write_row(pr, slot, filled ? kept[next++].second : -1, static_params, scratch);
    }
  } else {
    if (pr.row_idx_type == 0) {
      for (int64_t p = 0; p < P; ++p) pr.expanded_row_idx[p] = -1;
      for (int64_t d = 0; d < num_routed; ++d) pr.expanded_row_idx[order[size_t(d)]] = int32_t(d);
    } else {
      for (int64_t d = 0; d < num_routed; ++d) pr.expanded_row_idx[d] = int32_t(order[size_t(d)]);
      for (size_t j = 0; j < tail.size(); ++j)
        pr.expanded_row_idx[num_routed + int64_t(j)] = int32_t(tail[j]);
    }
    const int64_t rows_with_data = std::min(pr.row_limit, num_routed);
    for (int64_t d = 0; d < rows; ++d)
      write_row(pr, d, d < rows_with_data ? order[size_t(d)] : -1, static_params, scratch);
  }

  const int64_t range = pr.range_end - pr.range_start;
  size_t next_run = 0;  // count_of is asked for ascending keys
  auto count_of = [&](int64_t key) -> int64_t {
    if (next_run < runs.size() && runs[next_run].first == key) return runs[next_run++].second;
    return 0;
  };
  switch (pr.count_format) {
    case CountFormat::none: break;
    case CountFormat::cumsum: {
      int64_t running = 0;
      for (int64_t j = 0; j < range; ++j) write_count(pr, j, running += count_of(j));
      break;
    }
    case CountFormat::count:
      for (int64_t j = 0; j < range; ++j) write_count(pr, j, count_of(j));
      break;
    case CountFormat::key_value: {
      int64_t row = 0;
      for (const auto& [key, count] : runs) {
        write_count(pr, 2 * row, pr.range_start + key);
        write_count(pr, 2 * row + 1, count);
        ++row;
      }
      for (; row < pr.expert_num; ++row) {
        write_count(pr, 2 * row, 0);
        write_count(pr, 2 * row + 1, 0);
      }
      break;
    }
  }
}

}  // namespace moe_routing::reference
