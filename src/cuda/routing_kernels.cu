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
// What each thread computes for one item is routing_body.cuh (host-tested without a GPU); this
// file holds the thread mapping, the block-wide reductions, CUB and the launches.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cub/block/block_scan.cuh>
#include <cub/device/device_radix_sort.cuh>
#include <limits>

#include "cuda/cuda_backend.h"
#include "cuda/cuda_runtime_util.h"
#include "cuda/numerics.cuh"
#include "cuda/routing_body.cuh"

namespace moe_routing::cuda {
namespace {

using detail::CountFormat;
using detail::RoutingProblem;

constexpr int kThreads = 256;

// ---- 1. keys --------------------------------------------------------------------------------

__global__ void __launch_bounds__(kThreads)
    routing_keys(const int32_t* __restrict__ expert_idx, int64_t pairs, int64_t range_start,
                 int64_t range_end, bool reject_unrouted, bool track_max,
                 uint32_t* __restrict__ keys, int32_t* __restrict__ positions,
                 Flags* __restrict__ flags) {
  uint32_t local_max = 0;
  for (int64_t p = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; p < pairs;
       p += int64_t(gridDim.x) * blockDim.x) {
    const uint32_t key = routing_key(__ldg(expert_idx + p), range_start, range_end);
    const bool routed = key != kNotRouted;
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

/// row_idx_type 1: the tail keys of the pairs that are not routed (tail_key).
__global__ void __launch_bounds__(kThreads)
    routing_tail_keys(const int32_t* __restrict__ expert_idx, int64_t pairs, int64_t range_start,
                      int64_t range_end, uint32_t* __restrict__ keys) {
  for (int64_t p = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; p < pairs;
       p += int64_t(gridDim.x) * blockDim.x) {
    keys[p] = tail_key(__ldg(expert_idx + p), range_start, range_end);
  }
}

// ---- 3. bounds ------------------------------------------------------------------------------

/// first[k] / end[k] and the routed count (bounds_at), one thread per sorted position.
__global__ void __launch_bounds__(kThreads)
    routing_bounds(const uint32_t* __restrict__ sorted_keys, int64_t pairs,
                   int32_t* __restrict__ first, int32_t* __restrict__ end,
                   Flags* __restrict__ flags) {
  for (int64_t d = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; d < pairs;
       d += int64_t(gridDim.x) * blockDim.x)
    bounds_at(sorted_keys, pairs, d, first, end, &flags->routed);
}

// ---- 5. expanded_row_idx --------------------------------------------------------------------

__global__ void __launch_bounds__(kThreads) routing_row_idx(RowIdxArgs a) {
  const int64_t routed = a.flags->routed;
  for (int64_t d = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; d < a.pairs;
       d += int64_t(gridDim.x) * blockDim.x)
    row_idx_at(a, routed, d);
}

// ---- 6. rows --------------------------------------------------------------------------------

constexpr int kCopyUnroll = 4;  // accesses in flight per thread of a row copy

/// quant_mode -1, one group of 2^lanes_log2 threads per token (scatter_token).
template <class T>
__global__ void __launch_bounds__(kThreads)
    scatter_rows(RowsArgs a, int lanes_log2, int64_t vectors_per_row) {
  const int lanes = 1 << lanes_log2;
  const int lane = int(threadIdx.x) & (lanes - 1);
  const int64_t groups = int64_t(blockDim.x) >> lanes_log2;
  const int64_t group = int64_t(threadIdx.x) >> lanes_log2;
  const int64_t limit = rows_with_data(a, a.flags->routed);
  for (int64_t token = int64_t(blockIdx.x) * groups + group; token < a.num_rows;
       token += int64_t(gridDim.x) * groups)
    scatter_token<T, kCopyUnroll>(a, limit, token, lane, lanes, vectors_per_row);
}

/// quant_mode -1: the rows no pair writes are zero (zero_row), one group per row.
template <class T>
__global__ void __launch_bounds__(kThreads)
    zero_rows(RowsArgs a, int lanes_log2, int64_t vectors_per_row) {
  const int lanes = 1 << lanes_log2;
  const int lane = int(threadIdx.x) & (lanes - 1);
  const int64_t groups = int64_t(blockDim.x) >> lanes_log2;
  const int64_t group = int64_t(threadIdx.x) >> lanes_log2;
  const int64_t routed = a.flags->routed;
  const int64_t first = a.drop_pad ? 0 : rows_with_data(a, routed);
  for (int64_t dest = first + int64_t(blockIdx.x) * groups + group; dest < a.rows;
       dest += int64_t(gridDim.x) * groups)
    zero_row<T>(a, routed, dest, lane, lanes, vectors_per_row);
}

/// quant_mode 0: one block per row (static_quant_columns).
template <class Tag>
__global__ void __launch_bounds__(kThreads) static_quant_rows(RowsArgs a) {
  const int64_t routed = a.flags->routed;
  const StaticQuant params = static_quant_params(a);
  for (int64_t dest = blockIdx.x; dest < a.rows; dest += gridDim.x) {
    const int64_t p = row_source(a, dest, routed);
    static_quant_columns<Tag>(a, params, dest, p, threadIdx.x, blockDim.x);
    if (threadIdx.x == 0) write_topk_weight(a, dest, p);
  }
}

/// quant_mode 1: one block per row. f (dynamic_f), m = max |f| reduced across the block
/// (abs_max_step: the order of a max does not matter), sc from m (dynamic_row_scale),
/// q = round_half_away(f / sc).
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
    const float* smooth = smooth_row(a, p);
    float local_max = 0.0f;
    int nan_seen = 0;
    for (int64_t j = threadIdx.x; j < H; j += blockDim.x)
      abs_max_step(dynamic_f<Tag>(in, smooth, j), &local_max, &nan_seen);
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
      row_scale = dynamic_row_scale(m, any_nan, a.ascend_950);
    }
    __syncthreads();
    const float sc = row_scale;
    for (int64_t j = threadIdx.x; j < H; j += blockDim.x)
      out[j] = num::int8_round_half_away(num::div(dynamic_f<Tag>(in, smooth, j), sc));
    if (threadIdx.x == 0) {
      a.expanded_scale[dest] = num::canonical(sc);
      write_topk_weight(a, dest, p);
    }
    __syncthreads();  // row_scale and the warp slots are reused by the next row
  }
}

// ---- 7. counts ------------------------------------------------------------------------------

/// One block walks the range in chunks; prefix sums carry across chunks.
__global__ void __launch_bounds__(kThreads) routing_counts(CountArgs a) {
  using Scan = cub::BlockScan<int64_t, kThreads>;
  __shared__ typename Scan::TempStorage temp;
  __shared__ int64_t carry;
  if (threadIdx.x == 0) carry = 0;
  __syncthreads();
  for (int64_t base = 0; base < a.range; base += kThreads) {
    const int64_t j = base + threadIdx.x;
    const int64_t count = count_at(a, j);
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
      if (has) write_key_value(a, before + row, j, count);
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

template <class Kernel>
int resident_blocks(Kernel kernel) {
  int resident = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, kernel, kThreads, 0) !=
      cudaSuccess) {
    // Not sticky: cleared, or the next launch check would report it as that launch's failure.
    static_cast<void>(cudaGetLastError());
    resident = 1;
  }
  return resident > 0 ? resident : 1;
}

template <class T>
Status launch_copy_rows(const char* op, const RowsArgs& a, int64_t row_bytes, cudaStream_t stream) {
  const int64_t n = row_bytes / int64_t(sizeof(T));
  const int lanes_log2 = copy_lanes_log2(n, kCopyUnroll, kThreads);
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
    switch (copy_width(row_bytes, pr.x, pr.expanded_x)) {
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
  const bool tail = scatter_tail(pr);

  // Scratch: sizing pass, then the real layout over one allocation.
  size_t sort_temp = 0;
  if (P > 0) {
    MOE_ROUTING_CUDA_CHECK(
        op, cub::DeviceRadixSort::SortPairs(
                nullptr, sort_temp, static_cast<const uint32_t*>(nullptr),
                static_cast<uint32_t*>(nullptr), static_cast<const int32_t*>(nullptr),
                static_cast<int32_t*>(nullptr), int(P), 0, 32, stream));
  }
  struct Buffers : RoutingBuffers {
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
    b.tail_order = l.take<int32_t>(tail ? pairs : 0);
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
    MOE_ROUTING_RETURN_IF_ERROR(read_to_host(op, &host, b.flags, sizeof host, stream));
    if (host.first_bad != kNoError) {
      int32_t id = 0;
      MOE_ROUTING_RETURN_IF_ERROR(
          read_to_host(op, &id, pr.expert_idx + host.first_bad, sizeof id, stream));
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
    if (tail) {
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
    const RowIdxArgs r = row_idx_args(pr, b);
    routing_row_idx<<<unsigned(pair_blocks), kThreads, 0, stream>>>(r);
    MOE_ROUTING_RETURN_IF_ERROR(check_launch(op, "routing_row_idx"));
  }

  // 6. The rows.
  if (pr.expanded_rows > 0) {
    const RowsArgs a = rows_args(pr, b);
    MOE_ROUTING_RETURN_IF_ERROR(launch_rows(op, pr, a, stream));
  }

  // 7. The counts.
  if (pr.count_format != CountFormat::none) {
    const CountArgs c = count_args(pr, b);
    routing_counts<<<1, kThreads, 0, stream>>>(c);
    MOE_ROUTING_RETURN_IF_ERROR(check_launch(op, "routing_counts"));
  }
  return Status::ok();
}

}  // namespace moe_routing::cuda
