// The body of the CUDA forward routing (moe_init_routing_v2 and moe_init_routing): what each
// thread of each kernel of routing_kernels.cu computes for one item of its index space, as
// __host__ __device__ code, and the host-side choices of the launcher (key bits, access width,
// sizes). tests/cpp/test_cuda_host.cpp runs these on the CPU over the kernels' index spaces, with
// a stable sort standing in for CUB's, and compares the outputs with the reference bit for bit,
// so the index and quantisation logic is checked on every machine that builds with CUDA, GPU or
// not. The kernels only add the thread mapping, the block-wide reductions and the launches.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cuda/numerics.cuh"
#include "params/moe_init_routing_problem.h"

namespace moe_routing::cuda {

constexpr uint32_t kNotRouted = 0xffffffffu;
constexpr uint32_t kNoError = 0xffffffffu;
constexpr int64_t kInt32Max = 2147483647;

/// Device-side results of the key pass and of the bounds pass.
struct Flags {
  uint32_t first_bad;  // V2 API: first position whose id is out of range (kNoError if none)
  uint32_t max_key;    // largest routed key (only tracked when the key range is unbounded)
  int32_t routed;      // number of routed pairs
  int32_t unused;
};

// ---- 1. keys --------------------------------------------------------------------------------

/// The sort key of a pair: its expert id minus the range start when routed, else kNotRouted
/// (which sorts after every routed key).
MOE_HD uint32_t routing_key(int64_t id, int64_t range_start, int64_t range_end) {
  return id >= range_start && id < range_end ? uint32_t(id - range_start) : kNotRouted;
}

/// row_idx_type 1: the key of a pair that is not routed, as the CANN golden orders them (ids at or
/// above the range by id; ids below it take INT32_MAX, which ties with an id of INT32_MAX, as in
/// the golden); routed pairs get kNotRouted and sort after every tail key (tail keys are < 2^31).
MOE_HD uint32_t tail_key(int64_t id, int64_t range_start, int64_t range_end) {
  const bool routed = id >= range_start && id < range_end;
  const int64_t golden = id >= range_end ? id : kInt32Max;
  return routed ? kNotRouted : uint32_t(golden - range_end);
}

// ---- 3. bounds ------------------------------------------------------------------------------

/// Sorted position d of `sorted_keys` [pairs]: first[k] / end[k] bound the sorted positions of
/// key k (when `first` is given), and *routed becomes the number of routed pairs at the last
/// routed position. Each entry has exactly one writer.
MOE_HD void bounds_at(const uint32_t* sorted_keys, int64_t pairs, int64_t d, int32_t* first,
                      int32_t* end, int32_t* routed) {
  const uint32_t key = sorted_keys[d];
  if (key == kNotRouted) return;
  const uint32_t next = d + 1 < pairs ? sorted_keys[d + 1] : kNotRouted;
  if (first != nullptr) {
    if (d == 0 || sorted_keys[d - 1] != key) first[key] = int32_t(d);
    if (next != key) end[key] = int32_t(d + 1);
  }
  if (next == kNotRouted) *routed = int32_t(d + 1);
}

// ---- 5. expanded_row_idx --------------------------------------------------------------------

enum class RowIdxLayout : int { gather = 0, scatter = 1, drop_pad = 2 };

struct RowIdxArgs {
  const int32_t* order;         // [P] positions sorted by (key, p), routed first
  const int32_t* tail_order;    // [P] scatter: positions not routed, in the golden order, first
  const uint32_t* sorted_keys;  // [P] drop-pad: the keys of `order`
  const int32_t* first;         // [range] drop-pad: first sorted position of each expert
  int64_t pairs;
  int64_t capacity;  // C (drop-pad)
  RowIdxLayout layout;
  const Flags* flags;
  int32_t* expanded_row_idx;  // [P]
  int32_t* rank;              // [P] scratch: the destination row / slot of each position, or -1
};

/// Sorted position d: expanded_row_idx and rank entries (each written by exactly one d).
MOE_HD void row_idx_at(const RowIdxArgs& a, int64_t routed, int64_t d) {
  switch (a.layout) {
    case RowIdxLayout::gather:  // indexed by position: the destination row, -1 if not routed
      a.expanded_row_idx[a.order[d]] = a.rank[a.order[d]] = d < routed ? int32_t(d) : -1;
      break;
    case RowIdxLayout::scatter:  // indexed by destination: the position, then the tail
      a.expanded_row_idx[d] = d < routed ? a.order[d] : a.tail_order[d - routed];
      a.rank[a.order[d]] = d < routed ? int32_t(d) : -1;
      break;
    case RowIdxLayout::drop_pad: {  // the c-th pair of expert e takes slot e*C + c if c < C
      int32_t slot = -1;
      if (d < routed) {
        const int64_t expert = a.sorted_keys[d];
        const int64_t c = d - a.first[expert];
        if (c < a.capacity) slot = int32_t(expert * a.capacity + c);
      }
      a.expanded_row_idx[a.order[d]] = a.rank[a.order[d]] = slot;
      break;
    }
  }
}

// ---- 6. rows --------------------------------------------------------------------------------

struct RowsArgs {
  const void* x;              // [N, H]
  const int32_t* expert_idx;  // [N*K]
  const float* scale;         // q -1: [N]; q 0: [1]; q 1: [scale_rows, H]; or null
  const float* offset;        // q 0: [1] or null
  const float* topk_weight;   // [N*K] or null
  int64_t scale_rows;
  int64_t num_rows, top_k, hidden;  // N, K, H
  int64_t range_start;
  const int32_t* order;  // sorted positions
  const int32_t* rank;   // [P] the destination row / slot of each position, or -1
  const int32_t* first;  // drop-pad: [E]
  const int32_t* end;    // drop-pad: [E]
  const Flags* flags;
  bool drop_pad;
  int64_t capacity;   // C
  int64_t row_limit;  // dropless: rows d < min(row_limit, routed) hold data
  int64_t rows;       // destination rows (dropless) or slots E*C (drop-pad)
  bool ascend_950;
  void* expanded_x;             // [rows, H] x dtype (q -1) or int8
  float* expanded_scale;        // [rows] or null
  float* expanded_topk_weight;  // [rows] or null
};

/// The pair whose token fills destination row (or slot) `dest`, or -1 for a zero row.
MOE_HD int64_t row_source(const RowsArgs& a, int64_t dest, int64_t routed) {
  if (a.drop_pad) {
    const int64_t e = dest / a.capacity, c = dest - e * a.capacity;
    const int64_t begin = a.first[e];
    return c < a.end[e] - begin ? int64_t(a.order[begin + c]) : -1;
  }
  const int64_t limit = a.row_limit < routed ? a.row_limit : routed;
  return dest < limit ? int64_t(a.order[dest]) : -1;
}

/// The rows of expanded_x that hold data: dropless, d < min(row_limit, routed); drop-pad, the
/// slots of kept pairs (every slot a rank names).
MOE_HD int64_t rows_with_data(const RowsArgs& a, int64_t routed) {
  if (a.drop_pad) return a.rows;
  return a.row_limit < routed ? a.row_limit : routed;
}

/// expanded_topk_weight of row `dest` (0 without a pair).
MOE_HD void write_topk_weight(const RowsArgs& a, int64_t dest, int64_t p) {
  if (a.expanded_topk_weight != nullptr)
    a.expanded_topk_weight[dest] = p < 0 ? 0.0f : num::ldg(a.topk_weight + p);
}

/// quant_mode -1, one lane of the group that copies token `token`: the lane's T-sized accesses
/// of the token's row [n accesses] are read once and written to the destination row or slot of
/// each of its pairs below `limit` (rows_with_data); lane 0 also writes their expanded_scale
/// (= scale[token]) and expanded_topk_weight. Reading each x row once, rather than once per pair,
/// keeps the traffic at the bytes that must move.
template <class T, int kUnroll>
MOE_HD void scatter_token(const RowsArgs& a, int64_t limit, int64_t token, int lane, int lanes,
                          int64_t n) {
  const T* in = static_cast<const T*>(a.x) + token * n;
  const int32_t* ranks = a.rank + token * a.top_k;
  for (int64_t v0 = lane; v0 < n; v0 += int64_t(lanes) * kUnroll) {
    T buffer[kUnroll]{};  // (initialised: the host compiler cannot see every read is guarded)
    MOE_UNROLL
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t v = v0 + int64_t(u) * lanes;
      if (v < n) buffer[u] = num::ldg(in + v);
    }
    for (int64_t t = 0; t < a.top_k; ++t) {
      const int64_t dest = num::ldg(ranks + t);
      if (dest < 0 || dest >= limit) continue;
      T* out = static_cast<T*>(a.expanded_x) + dest * n;
      MOE_UNROLL
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t v = v0 + int64_t(u) * lanes;
        if (v < n) out[v] = buffer[u];
      }
    }
  }
  if (lane == 0)
    for (int64_t t = 0; t < a.top_k; ++t) {
      const int64_t dest = num::ldg(ranks + t);
      if (dest < 0 || dest >= limit) continue;
      if (a.expanded_scale != nullptr) a.expanded_scale[dest] = num::ldg(a.scale + token);
      if (a.expanded_topk_weight != nullptr)
        a.expanded_topk_weight[dest] = num::ldg(a.topk_weight + token * a.top_k + t);
    }
}

/// quant_mode -1, one lane of the group that zeroes destination row `dest` [n T-sized accesses]
/// when no pair writes it (dropless rows past the data, empty drop-pad slots), with its
/// expanded_scale and expanded_topk_weight; a kept pair's slot is left to scatter_token.
template <class T>
MOE_HD void zero_row(const RowsArgs& a, int64_t routed, int64_t dest, int lane, int lanes,
                     int64_t n) {
  if (a.drop_pad && row_source(a, dest, routed) >= 0) return;
  T* out = static_cast<T*>(a.expanded_x) + dest * n;
  for (int64_t v = lane; v < n; v += lanes) out[v] = T{};
  if (lane == 0) {
    if (a.expanded_scale != nullptr) a.expanded_scale[dest] = 0.0f;
    if (a.expanded_topk_weight != nullptr) a.expanded_topk_weight[dest] = 0.0f;
  }
}

/// quant_mode 0: the static scale and offset of the call, prepared once (fp16-rounded for the
/// ascend_950 numerics), as quantize::static_params does.
struct StaticQuant {
  float scale, offset;
};
MOE_HD StaticQuant static_quant_params(const RowsArgs& a) {
  StaticQuant params{num::ldg(a.scale), a.offset != nullptr ? num::ldg(a.offset) : 0.0f};
  if (a.ascend_950) {
    params.scale = num::round_to_fp16(params.scale);
    params.offset = num::round_to_fp16(params.offset);
  }
  return params;
}

/// quant_mode 0, columns j0, j0 + stride, ... of destination row `dest` (from pair p, or zeros
/// when p < 0): every element independently (num::static_quantize).
template <class Tag>
MOE_HD void static_quant_columns(const RowsArgs& a, const StaticQuant& params, int64_t dest,
                                 int64_t p, int64_t j0, int64_t stride) {
  using S = typename Tag::Storage;
  const int64_t H = a.hidden;
  int8_t* out = static_cast<int8_t*>(a.expanded_x) + dest * H;
  if (p < 0) {
    for (int64_t j = j0; j < H; j += stride) out[j] = 0;
    return;
  }
  const S* in = static_cast<const S*>(a.x) + (p / a.top_k) * H;
  for (int64_t j = j0; j < H; j += stride)
    out[j] = num::static_quantize(Tag::widen(num::ldg(in + j)), params.scale, params.offset,
                                  a.ascend_950);
}

/// quant_mode 1: the smooth scale row of pair p's expert, or null without a smooth scale.
MOE_HD const float* smooth_row(const RowsArgs& a, int64_t p) {
  if (a.scale == nullptr) return nullptr;
  const int64_t row = a.scale_rows == 1 ? 0 : int64_t(num::ldg(a.expert_idx + p)) - a.range_start;
  return a.scale + row * a.hidden;
}

/// quant_mode 1: f_j = x_j (* smooth_j), exactly as quantize.h's reference sequence.
template <class Tag>
MOE_HD float dynamic_f(const typename Tag::Storage* in, const float* smooth, int64_t j) {
  const float f = Tag::widen(num::ldg(in + j));
  return smooth != nullptr ? num::mul(f, num::ldg(smooth + j)) : f;
}

/// One step of the reduction of max |f| over a row: the maximum of the non-NaN values (which
/// does not depend on the order, so it may be reduced across threads in any shape) and whether a
/// NaN was seen; a NaN makes the row's maximum NaN, as quantize::abs_max_step does.
MOE_HD void abs_max_step(float f, float* max, int* nan_seen) {
  const float m = num::abs(f);
  *nan_seen |= int(num::is_nan(m));
  *max = m > *max ? m : *max;  // false for NaN: NaN is tracked apart
}

/// The row's scale from the reduced maximum and NaN flag.
MOE_HD float dynamic_row_scale(float max, int nan_seen, bool ascend_950) {
  return num::dynamic_scale(nan_seen ? num::float_of(kCanonicalNanFloat32) : max, ascend_950);
}

// ---- 7. counts ------------------------------------------------------------------------------

struct CountArgs {
  const int32_t* first;  // [range]
  const int32_t* end;    // [range]
  int64_t range;
  int64_t range_start;
  int64_t expert_num;
  detail::CountFormat format;
  bool int64_output;
  void* counts;
};

MOE_HD void write_count(const CountArgs& a, int64_t index, int64_t value) {
  if (a.int64_output)
    static_cast<int64_t*>(a.counts)[index] = value;
  else
    static_cast<int32_t*>(a.counts)[index] = int32_t(value);
}

/// The pairs of expert range_start + j (0 past the range).
MOE_HD int64_t count_at(const CountArgs& a, int64_t j) {
  return j < a.range ? int64_t(a.end[j]) - a.first[j] : 0;
}

/// key_value: the row of expert range_start + j with `count` > 0 pairs, `row` rows after the
/// experts with pairs before it.
MOE_HD void write_key_value(const CountArgs& a, int64_t row, int64_t j, int64_t count) {
  write_count(a, 2 * row, a.range_start + j);
  write_count(a, 2 * row + 1, count);
}

// ---- host-side choices of the launcher ------------------------------------------------------

/// The scratch arrays the kernels share (device memory on the GPU; host memory in the tests).
struct RoutingBuffers {
  Flags* flags;
  uint32_t *keys, *sorted_keys;
  int32_t *positions, *order, *tail_order, *rank, *first, *end;
};

/// Whether row_idx_type 1's tail of pairs not routed is sorted (and written).
inline bool scatter_tail(const detail::RoutingProblem& pr) {
  return !pr.drop_pad && pr.row_idx_type == 1;
}

/// The arguments of the expanded_row_idx kernel (5).
inline RowIdxArgs row_idx_args(const detail::RoutingProblem& pr, const RoutingBuffers& b) {
  RowIdxArgs r{};
  r.order = b.order;
  r.tail_order = b.tail_order;
  r.sorted_keys = b.sorted_keys;
  r.first = b.first;
  r.pairs = pr.pairs();
  r.capacity = pr.expert_capacity;
  r.layout = pr.drop_pad        ? RowIdxLayout::drop_pad
             : scatter_tail(pr) ? RowIdxLayout::scatter
                                : RowIdxLayout::gather;
  r.flags = b.flags;
  r.expanded_row_idx = pr.expanded_row_idx;
  r.rank = b.rank;
  return r;
}

/// The arguments of the row kernels (6).
inline RowsArgs rows_args(const detail::RoutingProblem& pr, const RoutingBuffers& b) {
  RowsArgs a{};
  a.x = pr.x;
  a.expert_idx = pr.expert_idx;
  a.scale = pr.scale;
  a.offset = pr.offset;
  a.topk_weight = pr.topk_weight;
  a.scale_rows = pr.scale_rows;
  a.num_rows = pr.num_rows;
  a.top_k = pr.top_k;
  a.hidden = pr.hidden;
  a.range_start = pr.range_start;
  a.order = b.order;
  a.rank = b.rank;
  a.first = b.first;
  a.end = b.end;
  a.flags = b.flags;
  a.drop_pad = pr.drop_pad;
  a.capacity = pr.expert_capacity;
  a.row_limit = pr.row_limit;
  a.rows = pr.expanded_rows;
  a.ascend_950 = pr.numerics == Numerics::ascend_950;
  a.expanded_x = pr.expanded_x;
  a.expanded_scale = pr.expanded_scale;
  a.expanded_topk_weight = pr.expanded_topk_weight;
  return a;
}

/// The arguments of the counts kernel (7).
inline CountArgs count_args(const detail::RoutingProblem& pr, const RoutingBuffers& b) {
  CountArgs c{};
  c.first = b.first;
  c.end = b.end;
  c.range = pr.range_end - pr.range_start;
  c.range_start = pr.range_start;
  c.expert_num = pr.expert_num;
  c.format = pr.count_format;
  c.int64_output = pr.count_dtype == DType::int64;
  c.counts = pr.counts;
  return c;
}

/// Bits that hold every value in [0, n] (at least 1, at most 32): the radix sort's key width.
inline int key_bits(uint64_t n) {
  int bits = 1;
  while (bits < 32 && (n >> bits) != 0) ++bits;
  return bits;
}

/// quant_mode -1: the widest access (1, 2, 4, 8 or 16 bytes) that divides the row and both base
/// addresses, so that every access of the copy is aligned.
inline uint64_t copy_width(int64_t row_bytes, const void* x, const void* expanded_x) {
  const uint64_t alignment = uint64_t(row_bytes) | reinterpret_cast<uintptr_t>(x) |
                             reinterpret_cast<uintptr_t>(expanded_x) | 16u;
  return alignment & (~alignment + 1);  // the lowest set bit
}

/// Lanes (log2) of the group copying one row of n accesses: enough for kUnroll accesses each, at
/// most a block of `threads`.
inline int copy_lanes_log2(int64_t n, int unroll, int threads) {
  int lanes_log2 = 0;
  while ((int64_t(1) << lanes_log2) * unroll < n && (1 << lanes_log2) < threads) ++lanes_log2;
  return lanes_log2;
}

/// Bytes of the count output of a problem.
inline size_t count_bytes(const detail::RoutingProblem& pr) {
  const int64_t range = pr.range_end - pr.range_start;
  const size_t element = dtype_size(pr.count_dtype);
  switch (pr.count_format) {
    case detail::CountFormat::none: return 0;
    case detail::CountFormat::key_value: return size_t(pr.expert_num) * 2 * element;
    default: return size_t(range) * element;
  }
}

}  // namespace moe_routing::cuda
