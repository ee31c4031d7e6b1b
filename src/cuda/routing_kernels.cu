// The forward routing (moe_init_routing_v2 and moe_init_routing) on the GPU, from the same
// RoutingProblem as the CPU kernels:
//  1. keys: expert id - range start for routed pairs, 0xffffffff for the others (and, for the V2
//     API, the first position whose id is out of range, read back once: an error writes nothing);
//  2. a stable LSD radix sort (CUB) of the positions by key on only the bits the key range needs:
//     positions go in ascending, so equal keys keep ascending flat position, and pairs that are
//     not routed sort last;
//  3. from the sorted keys, without atomics: the routed count and each expert's [first, end) in
//     the sorted order (the counts);
//  4. row_idx_type 1: a second stable sort of the pairs that are not routed by the CANN golden's
//     key (ids >= e_end by (id, p), then ids < s by p);
//  5. expanded_row_idx, one thread per sorted position;
//  6. the rows, each written once: quant_mode -1 reads each token's row once (the widest aligned
//     access) and writes it to the destinations of its pairs, then the rows without a pair are
//     zeroed; int8 quantisation takes one block per destination row or slot;
//  7. the counts (cumsum / count / key_value) in one block with a block-wide scan.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cub/block/block_scan.cuh>
#include <cub/device/device_radix_sort.cuh>
#include <limits>

#include "cuda/cuda_backend.h"
#include "cuda/cuda_runtime_util.h"
#include "cuda/numerics.cuh"

namespace moe_routing::cuda {
namespace {

using detail::CountFormat;
using detail::RoutingProblem;

constexpr int kThreads = 256;
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

__global__ void __launch_bounds__(kThreads)
    routing_keys(const int32_t* __restrict__ expert_idx, int64_t pairs, int64_t range_start,
                 int64_t range_end, bool reject_unrouted, bool track_max,
                 uint32_t* __restrict__ keys, int32_t* __restrict__ positions,
                 Flags* __restrict__ flags) {
  uint32_t local_max = 0;
  for (int64_t p = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; p < pairs;
       p += int64_t(gridDim.x) * blockDim.x) {
    const int64_t id = __ldg(expert_idx + p);
    const bool routed = id >= range_start && id < range_end;
    const uint32_t key = routed ? uint32_t(id - range_start) : kNotRouted;
    keys[p] = key;
    positions[p] = int32_t(p);
    if (routed) local_max = key > local_max ? key : local_max;
    if (!routed && reject_unrouted) atomicMin(&flags->first_bad, uint32_t(p));
  }
  if (track_max) {  // uniform across the grid: every thread of every warp gets here
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
      const uint32_t other = __shfl_xor_sync(0xffffffffu, local_max, offset);
      local_max = other > local_max ? other : local_max;
    }
    if ((threadIdx.x & 31) == 0) atomicMax(&flags->max_key, local_max);
  }
}

/// row_idx_type 1: the pairs that are not routed, keyed as the CANN golden orders them (ids below
/// the range take INT32_MAX, which ties with an id of INT32_MAX, as in the golden); routed pairs
/// get 0xffffffff and sort after every tail key (tail keys are < 2^31).
__global__ void __launch_bounds__(kThreads)
    routing_tail_keys(const int32_t* __restrict__ expert_idx, int64_t pairs, int64_t range_start,
                      int64_t range_end, uint32_t* __restrict__ keys) {
  for (int64_t p = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; p < pairs;
       p += int64_t(gridDim.x) * blockDim.x) {
    const int64_t id = __ldg(expert_idx + p);
    const bool routed = id >= range_start && id < range_end;
    const int64_t golden = id >= range_end ? id : int64_t(kInt32Max);
    keys[p] = routed ? kNotRouted : uint32_t(golden - range_end);
  }
}

// ---- 3. bounds ------------------------------------------------------------------------------

/// first[k] / end[k]: the sorted positions [first, end) of key k (both left 0 for absent keys);
/// flags->routed: the number of routed pairs. Each entry has exactly one writer.
__global__ void __launch_bounds__(kThreads)
    routing_bounds(const uint32_t* __restrict__ sorted_keys, int64_t pairs,
                   int32_t* __restrict__ first, int32_t* __restrict__ end,
                   Flags* __restrict__ flags) {
  for (int64_t d = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; d < pairs;
       d += int64_t(gridDim.x) * blockDim.x) {
    const uint32_t key = sorted_keys[d];
    if (key == kNotRouted) continue;
    const uint32_t next = d + 1 < pairs ? sorted_keys[d + 1] : kNotRouted;
    if (first != nullptr) {
      if (d == 0 || sorted_keys[d - 1] != key) first[key] = int32_t(d);
      if (next != key) end[key] = int32_t(d + 1);
    }
    if (next == kNotRouted) flags->routed = int32_t(d + 1);
  }
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

__global__ void __launch_bounds__(kThreads) routing_row_idx(RowIdxArgs a) {
  const int64_t routed = a.flags->routed;
  for (int64_t d = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; d < a.pairs;
       d += int64_t(gridDim.x) * blockDim.x) {
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
__device__ __forceinline__ int64_t row_source(const RowsArgs& a, int64_t dest, int64_t routed) {
  if (a.drop_pad) {
    const int64_t e = dest / a.capacity, c = dest - e * a.capacity;
    const int64_t begin = a.first[e];
    return c < a.end[e] - begin ? int64_t(a.order[begin + c]) : -1;
  }
  return dest < min(a.row_limit, routed) ? int64_t(a.order[dest]) : -1;
}

/// expanded_topk_weight of row `dest` (0 without a pair).
__device__ __forceinline__ void write_topk_weight(const RowsArgs& a, int64_t dest, int64_t p) {
  if (a.expanded_topk_weight != nullptr)
    a.expanded_topk_weight[dest] = p < 0 ? 0.0f : __ldg(a.topk_weight + p);
}

/// The rows of `expanded_x` that hold data: dropless, d < min(row_limit, routed); drop-pad, the
/// slots of kept pairs (every slot a rank names).
__device__ __forceinline__ int64_t dropless_rows_with_data(const RowsArgs& a) {
  return a.drop_pad ? a.rows : min(a.row_limit, int64_t(a.flags->routed));
}

/// quant_mode -1, one group of 2^lanes_log2 threads per token: the token's row is read once
/// (T-sized accesses, kUnroll in flight per thread) and written to the destination row or slot of
/// each of its pairs that has one, with expanded_scale (= scale[token]) and expanded_topk_weight.
/// Reading each x row once, rather than once per pair, keeps the traffic at the bytes that must
/// move.
template <class T>
__global__ void __launch_bounds__(kThreads)
    scatter_rows(RowsArgs a, int lanes_log2, int64_t vectors_per_row) {
  constexpr int kUnroll = 4;
  const int lanes = 1 << lanes_log2;
  const int lane = int(threadIdx.x) & (lanes - 1);
  const int64_t groups = int64_t(blockDim.x) >> lanes_log2;
  const int64_t group = int64_t(threadIdx.x) >> lanes_log2;
  const int64_t limit = dropless_rows_with_data(a);
  const int64_t n = vectors_per_row, K = a.top_k;
  for (int64_t token = int64_t(blockIdx.x) * groups + group; token < a.num_rows;
       token += int64_t(gridDim.x) * groups) {
    const T* in = static_cast<const T*>(a.x) + token * n;
    const int32_t* ranks = a.rank + token * K;
    for (int64_t v0 = lane; v0 < n; v0 += int64_t(lanes) * kUnroll) {
      T buffer[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t v = v0 + int64_t(u) * lanes;
        if (v < n) buffer[u] = __ldg(in + v);
      }
      for (int64_t t = 0; t < K; ++t) {
        const int64_t dest = __ldg(ranks + t);
        if (dest < 0 || dest >= limit) continue;
        T* out = static_cast<T*>(a.expanded_x) + dest * n;
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const int64_t v = v0 + int64_t(u) * lanes;
          if (v < n) out[v] = buffer[u];
        }
      }
    }
    if (lane == 0)
      for (int64_t t = 0; t < K; ++t) {
        const int64_t dest = __ldg(ranks + t);
        if (dest < 0 || dest >= limit) continue;
        if (a.expanded_scale != nullptr) a.expanded_scale[dest] = __ldg(a.scale + token);
        if (a.expanded_topk_weight != nullptr)
          a.expanded_topk_weight[dest] = __ldg(a.topk_weight + token * K + t);
      }
  }
}

/// quant_mode -1: the rows no pair writes (dropless rows past the data, empty drop-pad slots) are
/// zero, and so are their expanded_scale and expanded_topk_weight.
template <class T>
__global__ void __launch_bounds__(kThreads)
    zero_rows(RowsArgs a, int lanes_log2, int64_t vectors_per_row) {
  const int lanes = 1 << lanes_log2;
  const int lane = int(threadIdx.x) & (lanes - 1);
  const int64_t groups = int64_t(blockDim.x) >> lanes_log2;
  const int64_t group = int64_t(threadIdx.x) >> lanes_log2;
  const int64_t first = a.drop_pad ? 0 : dropless_rows_with_data(a);
  const int64_t routed = a.flags->routed;
  const int64_t n = vectors_per_row;
  for (int64_t dest = first + int64_t(blockIdx.x) * groups + group; dest < a.rows;
       dest += int64_t(gridDim.x) * groups) {
    if (a.drop_pad && row_source(a, dest, routed) >= 0) continue;  // a kept pair's slot
    T* out = static_cast<T*>(a.expanded_x) + dest * n;
    for (int64_t v = lane; v < n; v += lanes) out[v] = T{};
    if (lane == 0) {
      if (a.expanded_scale != nullptr) a.expanded_scale[dest] = 0.0f;
      if (a.expanded_topk_weight != nullptr) a.expanded_topk_weight[dest] = 0.0f;
    }
  }
}

/// quant_mode 0: one block per row; every element independently (num::static_quantize).
template <class Tag>
__global__ void __launch_bounds__(kThreads) static_quant_rows(RowsArgs a) {
  using S = typename Tag::Storage;
  const int64_t routed = a.flags->routed;
  const int64_t H = a.hidden;
  float scale = __ldg(a.scale);
  float offset = a.offset != nullptr ? __ldg(a.offset) : 0.0f;
  if (a.ascend_950) {
    scale = num::round_to_fp16(scale);
    offset = num::round_to_fp16(offset);
  }
  for (int64_t dest = blockIdx.x; dest < a.rows; dest += gridDim.x) {
    const int64_t p = row_source(a, dest, routed);
    int8_t* out = static_cast<int8_t*>(a.expanded_x) + dest * H;
    if (p >= 0) {
      const S* in = static_cast<const S*>(a.x) + (p / a.top_k) * H;
      for (int64_t j = threadIdx.x; j < H; j += blockDim.x)
        out[j] = num::static_quantize(Tag::widen(__ldg(in + j)), scale, offset, a.ascend_950);
    } else {
      for (int64_t j = threadIdx.x; j < H; j += blockDim.x) out[j] = 0;
    }
    if (threadIdx.x == 0) write_topk_weight(a, dest, p);
  }
}

template <class Tag>
__device__ __forceinline__ float widen_at(const typename Tag::Storage* in, int64_t j) {
  return Tag::widen(__ldg(in + j));
}

/// quant_mode 1: one block per row. f = x (* smooth row of the pair's expert); m = max |f| (a
/// max does not depend on the order of the non-NaN values, so it is reduced across threads; any
/// NaN makes m NaN, as quantize::abs_max_step does); sc from m; q = round_half_away(f / sc).
template <class Tag>
__global__ void __launch_bounds__(kThreads) dynamic_quant_rows(RowsArgs a) {
  using S = typename Tag::Storage;
  __shared__ float warp_max[kThreads / 32];
  __shared__ int warp_nan[kThreads / 32];
  __shared__ float row_scale;
  const int64_t routed = a.flags->routed;
  const int64_t H = a.hidden;
  const int warp = int(threadIdx.x) >> 5, lane = int(threadIdx.x) & 31;
  for (int64_t dest = blockIdx.x; dest < a.rows; dest += gridDim.x) {
    const int64_t p = row_source(a, dest, routed);  // the same for the whole block
    int8_t* out = static_cast<int8_t*>(a.expanded_x) + dest * H;
    if (p < 0) {
      for (int64_t j = threadIdx.x; j < H; j += blockDim.x) out[j] = 0;
      if (threadIdx.x == 0) {
        a.expanded_scale[dest] = 0.0f;
        write_topk_weight(a, dest, p);
      }
      continue;
    }
    const S* in = static_cast<const S*>(a.x) + (p / a.top_k) * H;
    const float* smooth = nullptr;
    if (a.scale != nullptr)
      smooth = a.scale +
               (a.scale_rows == 1 ? 0 : (int64_t(__ldg(a.expert_idx + p)) - a.range_start)) * H;
    float local_max = 0.0f;
    int nan_seen = 0;
    for (int64_t j = threadIdx.x; j < H; j += blockDim.x) {
      float f = widen_at<Tag>(in, j);
      if (smooth != nullptr) f = num::mul(f, __ldg(smooth + j));
      const float m = num::abs(f);
      nan_seen |= int(num::is_nan(m));
      local_max = m > local_max ? m : local_max;  // false for NaN: NaN is tracked apart
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
      const float other = __shfl_xor_sync(0xffffffffu, local_max, offset);
      local_max = other > local_max ? other : local_max;
    }
    nan_seen = __any_sync(0xffffffffu, nan_seen);
    if (lane == 0) {
      warp_max[warp] = local_max;
      warp_nan[warp] = nan_seen;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      float m = 0.0f;
      int any_nan = 0;
      for (int w = 0; w < kThreads / 32; ++w) {
        m = warp_max[w] > m ? warp_max[w] : m;
        any_nan |= warp_nan[w];
      }
      if (any_nan) m = num::float_of(kCanonicalNanFloat32);
      row_scale = num::dynamic_scale(m, a.ascend_950);
    }
    __syncthreads();
    const float sc = row_scale;
    for (int64_t j = threadIdx.x; j < H; j += blockDim.x) {
      float f = widen_at<Tag>(in, j);
      if (smooth != nullptr) f = num::mul(f, __ldg(smooth + j));
      out[j] = num::int8_round_half_away(num::div(f, sc));
    }
    if (threadIdx.x == 0) {
      a.expanded_scale[dest] = num::canonical(sc);
      write_topk_weight(a, dest, p);
    }
    __syncthreads();  // row_scale and the warp slots are reused by the next row
  }
}

// ---- 7. counts ------------------------------------------------------------------------------

struct CountArgs {
  const int32_t* first;  // [range]
  const int32_t* end;    // [range]
  int64_t range;
  int64_t range_start;
  int64_t expert_num;
  CountFormat format;
  bool int64_output;
  void* counts;
};

__device__ __forceinline__ void write_count(const CountArgs& a, int64_t index, int64_t value) {
  if (a.int64_output)
    static_cast<int64_t*>(a.counts)[index] = value;
  else
    static_cast<int32_t*>(a.counts)[index] = int32_t(value);
}

/// One block walks the range in chunks; prefix sums carry across chunks.
__global__ void __launch_bounds__(kThreads) routing_counts(CountArgs a) {
  using Scan = cub::BlockScan<int64_t, kThreads>;
  __shared__ typename Scan::TempStorage temp;
  __shared__ int64_t carry;
  if (threadIdx.x == 0) carry = 0;
  __syncthreads();
  for (int64_t base = 0; base < a.range; base += kThreads) {
    const int64_t j = base + threadIdx.x;
    const int64_t count = j < a.range ? int64_t(a.end[j]) - a.first[j] : 0;
    if (a.format == CountFormat::count) {
      if (j < a.range) write_count(a, j, count);
      continue;
    }
    const int64_t before = carry;
    if (a.format == CountFormat::cumsum) {
      int64_t inclusive = 0, total = 0;
      Scan(temp).InclusiveSum(count, inclusive, total);
      if (j < a.range) write_count(a, j, before + inclusive);
      __syncthreads();
      if (threadIdx.x == 0) carry = before + total;
    } else {  // key_value: [id, count] rows for the experts with pairs, in ascending id
      const int64_t has = count > 0 ? 1 : 0;
      int64_t row = 0, total = 0;
      Scan(temp).ExclusiveSum(has, row, total);
      if (has) {
        write_count(a, 2 * (before + row), a.range_start + j);
        write_count(a, 2 * (before + row) + 1, count);
      }
      __syncthreads();
      if (threadIdx.x == 0) carry = before + total;
    }
    __syncthreads();
  }
  if (a.format == CountFormat::key_value)  // then [0, 0] rows up to expert_num
    for (int64_t row = carry + threadIdx.x; row < a.expert_num; row += blockDim.x) {
      write_count(a, 2 * row, 0);
      write_count(a, 2 * row + 1, 0);
    }
}

// ---- host side --------------------------------------------------------------------------------

/// Bits that hold every value in [0, n] (at least 1, at most 32).
int key_bits(uint64_t n) {
  int bits = 1;
  while (bits < 32 && (n >> bits) != 0) ++bits;
  return bits;
}

template <class Kernel>
int resident_blocks(Kernel kernel) {
  int resident = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, kernel, kThreads, 0) !=
          cudaSuccess ||
      resident <= 0)
    resident = 1;
  return resident;
}

template <class T>
Status launch_copy_rows(const char* op, const RowsArgs& a, int64_t row_bytes, cudaStream_t stream) {
  constexpr int kUnroll = 4;
  const int64_t n = row_bytes / int64_t(sizeof(T));
  int lanes_log2 = 0;  // threads per row: enough for kUnroll accesses each, at most the block
  while ((int64_t(1) << lanes_log2) * kUnroll < n && (1 << lanes_log2) < kThreads) ++lanes_log2;
  const int64_t groups = kThreads >> lanes_log2;
  if (a.num_rows > 0) {
    const int64_t blocks =
        grid_blocks((a.num_rows + groups - 1) / groups, resident_blocks(scatter_rows<T>));
    scatter_rows<T><<<unsigned(blocks), kThreads, 0, stream>>>(a, lanes_log2, n);
    MOE_ROUTING_RETURN_IF_ERROR(check_launch(op, "scatter_rows"));
  }
  const int64_t blocks = grid_blocks((a.rows + groups - 1) / groups, resident_blocks(zero_rows<T>));
  zero_rows<T><<<unsigned(blocks), kThreads, 0, stream>>>(a, lanes_log2, n);
  return check_launch(op, "zero_rows");
}

Status launch_rows(const char* op, const RoutingProblem& pr, const RowsArgs& a,
                   cudaStream_t stream) {
  if (pr.quant_mode == -1) {
    const int64_t row_bytes = pr.hidden * int64_t(dtype_size(pr.x_dtype));
    // The widest access that divides the row and both base addresses.
    const uint64_t alignment = uint64_t(row_bytes) | reinterpret_cast<uintptr_t>(pr.x) |
                               reinterpret_cast<uintptr_t>(pr.expanded_x) | 16u;
    const uint64_t width = alignment & (~alignment + 1);  // lowest set bit: 1, 2, 4, 8 or 16
    switch (width) {
      case 16: return launch_copy_rows<uint4>(op, a, row_bytes, stream);
      case 8: return launch_copy_rows<uint2>(op, a, row_bytes, stream);
      case 4: return launch_copy_rows<uint32_t>(op, a, row_bytes, stream);
      case 2: return launch_copy_rows<uint16_t>(op, a, row_bytes, stream);
      default: return launch_copy_rows<uint8_t>(op, a, row_bytes, stream);
    }
  }
  auto launch = [&](auto kernel, const char* name) -> Status {
    const int64_t blocks = grid_blocks(a.rows, resident_blocks(kernel));
    kernel<<<unsigned(blocks), kThreads, 0, stream>>>(a);
    return check_launch(op, name);
  };
  const bool dynamic = pr.quant_mode == 1;
  switch (pr.x_dtype) {
    case DType::float32:
      return dynamic ? launch(dynamic_quant_rows<num::Float32>, "dynamic_quant_rows")
                     : launch(static_quant_rows<num::Float32>, "static_quant_rows");
    case DType::float16:
      return dynamic ? launch(dynamic_quant_rows<num::Float16>, "dynamic_quant_rows")
                     : launch(static_quant_rows<num::Float16>, "static_quant_rows");
    case DType::bfloat16:
      return dynamic ? launch(dynamic_quant_rows<num::Bfloat16>, "dynamic_quant_rows")
                     : launch(static_quant_rows<num::Bfloat16>, "static_quant_rows");
    default:
      return internal_error(op, "x must be float32, float16 or bfloat16 for quant_mode ",
                            pr.quant_mode, ", got ", dtype_name(pr.x_dtype));
  }
}

size_t count_bytes(const RoutingProblem& pr) {
  const int64_t range = pr.range_end - pr.range_start;
  const size_t element = dtype_size(pr.count_dtype);
  switch (pr.count_format) {
    case CountFormat::none: return 0;
    case CountFormat::key_value: return size_t(pr.expert_num) * 2 * element;
    default: return size_t(range) * element;
  }
}

}  // namespace

Status moe_init_routing(const char* op, const RoutingProblem& pr, bool reject_unrouted,
                        void* stream_ptr) {
  const cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  const int64_t P = pr.pairs(), N = pr.num_rows, H = pr.hidden;
  const size_t x_element = dtype_size(pr.x_dtype);
  const size_t out_element = pr.quant_mode == -1 ? x_element : 1;
  size_t scale_bytes = 0;
  if (pr.scale != nullptr)
    scale_bytes = pr.quant_mode == -1  ? size_t(N) * 4
                  : pr.quant_mode == 0 ? 4
                                       : size_t(pr.scale_rows * H) * 4;
  DeviceScope scope(
      op, {{"x", pr.x, size_t(N * H) * x_element},
           {"expert_idx", pr.expert_idx, size_t(P) * 4},
           {"scale", pr.scale, scale_bytes},
           {"offset", pr.offset, pr.offset != nullptr ? size_t(4) : 0},
           {"topk_weight", pr.topk_weight, pr.topk_weight != nullptr ? size_t(P) * 4 : 0},
           {"expanded_x", pr.expanded_x, size_t(pr.expanded_rows * H) * out_element},
           {"expanded_row_idx", pr.expanded_row_idx, size_t(P) * 4},
           {"expanded_scale", pr.expanded_scale, size_t(pr.expanded_rows) * 4},
           {"expanded_topk_weight", pr.expanded_topk_weight, size_t(pr.expanded_rows) * 4},
           {"expert_tokens_count_or_cumsum", pr.counts, count_bytes(pr)}});
  MOE_ROUTING_RETURN_IF_ERROR(scope.status());
  if (scope.empty()) return Status::ok();

  const int64_t range = pr.range_end - pr.range_start;
  const bool needs_bounds = pr.needs_counts();  // then range <= E: one int32 pair per expert
  // The V2 API without counts or drop-pad routes ids in [0, INT64_MAX): the key range is only
  // known after the key pass (whose verdict is read back anyway).
  const bool track_max = range > kInt32Max;
  const bool scatter_tail = !pr.drop_pad && pr.row_idx_type == 1;

  // Scratch: sizing pass, then the real layout over one allocation.
  size_t sort_temp = 0;
  if (P > 0) {
    MOE_ROUTING_CUDA_CHECK(
        op, cub::DeviceRadixSort::SortPairs(
                nullptr, sort_temp, static_cast<const uint32_t*>(nullptr),
                static_cast<uint32_t*>(nullptr), static_cast<const int32_t*>(nullptr),
                static_cast<int32_t*>(nullptr), int(P), 0, 32, stream));
  }
  struct Buffers {
    Flags* flags;
    uint32_t *keys, *sorted_keys;
    int32_t *positions, *order, *tail_order, *rank, *first, *end;
    char* sort_temp;
  };
  auto layout = [&](ScratchLayout& l) {
    Buffers b{};
    b.flags = l.take<Flags>(1);
    const size_t pairs = P > 0 ? size_t(P) : 0;
    b.keys = l.take<uint32_t>(pairs);
    b.sorted_keys = l.take<uint32_t>(pairs);
    b.positions = l.take<int32_t>(pairs);
    b.order = l.take<int32_t>(pairs);
    b.tail_order = l.take<int32_t>(scatter_tail ? pairs : 0);
    b.rank = l.take<int32_t>(pairs);
    b.first = l.take<int32_t>(needs_bounds ? size_t(range) : 0);
    b.end = l.take<int32_t>(needs_bounds ? size_t(range) : 0);
    b.sort_temp = l.take<char>(sort_temp);
    return b;
  };
  ScratchLayout sizing;
  layout(sizing);
  Scratch scratch;
  MOE_ROUTING_RETURN_IF_ERROR(scratch.allocate(op, sizing.bytes(), stream));
  ScratchLayout real(scratch.data());
  const Buffers b = layout(real);

  MOE_ROUTING_CUDA_CHECK(op, cudaMemsetAsync(b.flags, 0, sizeof(Flags), stream));
  MOE_ROUTING_CUDA_CHECK(op, cudaMemsetAsync(&b.flags->first_bad, 0xff, sizeof(uint32_t), stream));
  if (needs_bounds) {
    MOE_ROUTING_CUDA_CHECK(op, cudaMemsetAsync(b.first, 0, size_t(range) * 4, stream));
    MOE_ROUTING_CUDA_CHECK(op, cudaMemsetAsync(b.end, 0, size_t(range) * 4, stream));
  }
  const int64_t pair_blocks = grid_blocks((P + kThreads - 1) / kThreads, 8);

  // 1. Keys (and the V2 check, read back once: on error nothing has been written).
  if (P > 0) {
    routing_keys<<<unsigned(pair_blocks), kThreads, 0, stream>>>(
        pr.expert_idx, P, pr.range_start, pr.range_end, reject_unrouted, track_max, b.keys,
        b.positions, b.flags);
    MOE_ROUTING_RETURN_IF_ERROR(check_launch(op, "routing_keys"));
  }
  int bits = key_bits(uint64_t(std::min<int64_t>(range, int64_t(1) << 32)));
  if (reject_unrouted || track_max) {
    Flags host{};
    MOE_ROUTING_CUDA_CHECK(
        op, cudaMemcpyAsync(&host, b.flags, sizeof host, cudaMemcpyDeviceToHost, stream));
    MOE_ROUTING_CUDA_CHECK(op, cudaStreamSynchronize(stream));
    if (host.first_bad != kNoError) {
      int32_t id = 0;
      MOE_ROUTING_CUDA_CHECK(op, cudaMemcpyAsync(&id, pr.expert_idx + host.first_bad, sizeof id,
                                                 cudaMemcpyDeviceToHost, stream));
      MOE_ROUTING_CUDA_CHECK(op, cudaStreamSynchronize(stream));
      return v2_expert_id_error(pr.top_k, pr.range_end, int64_t(host.first_bad), id);
    }
    if (track_max) bits = key_bits(uint64_t(host.max_key) + 1);
  }

  // 2-4. The stable sorts and the bounds.
  if (P > 0) {
    size_t temp_bytes = sort_temp;
    MOE_ROUTING_CUDA_CHECK(
        op, cub::DeviceRadixSort::SortPairs(b.sort_temp, temp_bytes, b.keys, b.sorted_keys,
                                            b.positions, b.order, int(P), 0, bits, stream));
    routing_bounds<<<unsigned(pair_blocks), kThreads, 0, stream>>>(
        b.sorted_keys, P, needs_bounds ? b.first : nullptr, needs_bounds ? b.end : nullptr,
        b.flags);
    MOE_ROUTING_RETURN_IF_ERROR(check_launch(op, "routing_bounds"));
    if (scatter_tail) {
      routing_tail_keys<<<unsigned(pair_blocks), kThreads, 0, stream>>>(
          pr.expert_idx, P, pr.range_start, pr.range_end, b.keys);
      MOE_ROUTING_RETURN_IF_ERROR(check_launch(op, "routing_tail_keys"));
      // The routed pairs' sorted keys are no longer needed: reuse the buffer for the tail sort.
      temp_bytes = sort_temp;
      MOE_ROUTING_CUDA_CHECK(
          op, cub::DeviceRadixSort::SortPairs(b.sort_temp, temp_bytes, b.keys, b.sorted_keys,
                                              b.positions, b.tail_order, int(P), 0, 32, stream));
    }

    // 5. expanded_row_idx.
    RowIdxArgs r{};
    r.order = b.order;
    r.tail_order = b.tail_order;
    r.sorted_keys = b.sorted_keys;
    r.first = b.first;
    r.pairs = P;
    r.capacity = pr.expert_capacity;
    r.layout = pr.drop_pad    ? RowIdxLayout::drop_pad
               : scatter_tail ? RowIdxLayout::scatter
                              : RowIdxLayout::gather;
    r.flags = b.flags;
    r.expanded_row_idx = pr.expanded_row_idx;
    r.rank = b.rank;
    routing_row_idx<<<unsigned(pair_blocks), kThreads, 0, stream>>>(r);
    MOE_ROUTING_RETURN_IF_ERROR(check_launch(op, "routing_row_idx"));
  }

  // 6. The rows.
  if (pr.expanded_rows > 0) {
    RowsArgs a{};
    a.x = pr.x;
    a.expert_idx = pr.expert_idx;
    a.scale = pr.scale;
    a.offset = pr.offset;
    a.topk_weight = pr.topk_weight;
    a.scale_rows = pr.scale_rows;
    a.num_rows = pr.num_rows;
    a.top_k = pr.top_k;
    a.hidden = H;
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
    MOE_ROUTING_RETURN_IF_ERROR(launch_rows(op, pr, a, stream));
  }

  // 7. The counts.
  if (pr.count_format != CountFormat::none) {
    CountArgs c{};
    c.first = b.first;
    c.end = b.end;
    c.range = range;
    c.range_start = pr.range_start;
    c.expert_num = pr.expert_num;
    c.format = pr.count_format;
    c.int64_output = pr.count_dtype == DType::int64;
    c.counts = pr.counts;
    routing_counts<<<1, kThreads, 0, stream>>>(c);
    MOE_ROUTING_RETURN_IF_ERROR(check_launch(op, "routing_counts"));
  }
  return Status::ok();
}

}  // namespace moe_routing::cuda
