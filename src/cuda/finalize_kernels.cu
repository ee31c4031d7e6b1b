// moe_finalize_routing and its grad on the GPU: a device-side index check read back once, then the
// element-owned kernels of finalize_body.cuh. The grad's pair lists (non-dropped pairs grouped by
// row of grad_expanded_x and by expert, increasing pair index within a group) come from an integer
// count, an exclusive scan and a stable radix sort: deterministic, whatever the launch.
#include <cuda_runtime.h>

#include <cstdint>
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>

#include "cuda/cuda_backend.h"
#include "cuda/cuda_runtime_util.h"
#include "cuda/finalize_body.cuh"

namespace moe_routing::cuda {
namespace {

constexpr const char* kOp = "moe_finalize_routing: ";
constexpr const char* kGradOp = "moe_finalize_routing_grad: ";
constexpr int kThreads = 256;

using detail::FinalizeRoutingGradProblem;
using detail::FinalizeRoutingProblem;

/// Blocks for a grid-stride loop over `items` (at least one, at most a few waves).
unsigned blocks_for(int64_t items) {
  return unsigned(grid_blocks((items + kThreads - 1) / kThreads, 8));
}

// ---- kernels ------------------------------------------------------------------------------------

/// The smallest bad position of expanded_row_idx and of expert_idx (flat [N, K]); reads only the
/// index tensors.
__global__ void __launch_bounds__(kThreads)
    check_forward(FinalizeRoutingProblem p, int64_t skip_to, int64_t experts, uint32_t* verdict) {
  const int64_t pairs = p.num_rows * p.top_k;
  for (int64_t q = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; q < pairs;
       q += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = q / p.top_k, t = q % p.top_k;
    const finalize::PairVerdict v = finalize::check_pair(p, skip_to, experts, i, t);
    if (!v.row_ok) atomicMin(verdict, uint32_t(p.index_position(i, t)));
    if (!v.expert_ok) atomicMin(verdict + 1, uint32_t(q));
  }
}

__global__ void __launch_bounds__(kThreads) forward(FinalizeRoutingProblem p) {
  const int64_t items = p.num_rows * p.hidden;
  for (int64_t item = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; item < items;
       item += int64_t(gridDim.x) * blockDim.x)
    finalize::finalize_item(p, item / p.hidden, item % p.hidden);
}

__global__ void __launch_bounds__(kThreads)
    check_grad(FinalizeRoutingGradProblem p, int64_t skip_to, uint32_t* verdict) {
  const int64_t pairs = p.num_rows * p.top_k;
  for (int64_t q = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; q < pairs;
       q += int64_t(gridDim.x) * blockDim.x) {
    const finalize::PairVerdict v = finalize::check_grad_pair(p, skip_to, q);
    if (!v.row_ok) atomicMin(verdict, uint32_t(q));
    if (!v.expert_ok) atomicMin(verdict + 1, uint32_t(q));
  }
}

/// Sort keys (row or expert of each pair; `key_count` for a dropped pair, sorted last), the pair
/// indices as values, and the integer count of each key.
__global__ void __launch_bounds__(kThreads)
    pair_keys(FinalizeRoutingGradProblem p, bool by_expert, int64_t key_count, int32_t* keys,
              int32_t* values, int32_t* counts) {
  const int64_t pairs = p.num_rows * p.top_k;
  for (int64_t q = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; q < pairs;
       q += int64_t(gridDim.x) * blockDim.x) {
    int32_t key = int32_t(key_count);
    if (!p.dropped(q)) {
      key = by_expert ? p.expert_idx[q] : p.expanded_row_idx[q];
      atomicAdd(counts + key, 1);
    }
    keys[q] = key;
    values[q] = int32_t(q);
  }
}

__global__ void __launch_bounds__(kThreads) grad_rows(FinalizeRoutingGradProblem p) {
  const int64_t items = p.expanded_rows * p.hidden;
  for (int64_t item = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; item < items;
       item += int64_t(gridDim.x) * blockDim.x)
    finalize::grad_row_item(p, item / p.hidden, item % p.hidden);
}

__global__ void __launch_bounds__(kThreads) grad_bias(FinalizeRoutingGradProblem p) {
  const int64_t items = p.expert_num * p.hidden;
  for (int64_t item = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; item < items;
       item += int64_t(gridDim.x) * blockDim.x)
    finalize::grad_bias_item(p, item / p.hidden, item % p.hidden);
}

__global__ void __launch_bounds__(kThreads) grad_scales(FinalizeRoutingGradProblem p) {
  const int64_t pairs = p.num_rows * p.top_k;
  for (int64_t q = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; q < pairs;
       q += int64_t(gridDim.x) * blockDim.x)
    finalize::grad_scales_item(p, q);
}

// ---- host helpers -------------------------------------------------------------------------------

/// Runs the check kernel `launch` over a two-word verdict, reads it back once and, on a bad
/// position, reads the value there.
template <class Launch>
Status read_verdict(const char* op, cudaStream_t stream, const int32_t* rows_index,
                    const int32_t* expert_index, Launch launch, IndexVerdict* verdict) {
  Scratch scratch;
  MOE_ROUTING_RETURN_IF_ERROR(scratch.allocate(op, 2 * sizeof(uint32_t), stream));
  uint32_t* device_verdict = reinterpret_cast<uint32_t*>(scratch.data());
  MOE_ROUTING_CUDA_CHECK(op, cudaMemsetAsync(device_verdict, 0xff, 2 * sizeof(uint32_t), stream));
  launch(device_verdict);
  MOE_ROUTING_RETURN_IF_ERROR(check_launch(op, "the index check"));
  uint32_t host[2];
  MOE_ROUTING_RETURN_IF_ERROR(read_to_host(op, host, device_verdict, sizeof host, stream));
  verdict->row_position = host[0];
  verdict->expert_position = host[1];
  if (host[0] != IndexVerdict::kNoBadIndex)
    return read_to_host(op, &verdict->row_value, rows_index + host[0], sizeof(int32_t), stream);
  if (host[1] != IndexVerdict::kNoBadIndex)
    return read_to_host(op, &verdict->expert_value, expert_index + host[1], sizeof(int32_t),
                        stream);
  return Status::ok();
}

size_t bytes_of(DType dtype, int64_t count) { return size_t(count) * dtype_size(dtype); }

/// The pair lists by `key_count` keys: offsets [key_count + 1] and the sorted pairs (the first
/// offsets[key_count] of them are the non-dropped pairs), in `layout`'s scratch.
Status build_pair_lists(const FinalizeRoutingGradProblem& p, bool by_expert, int64_t key_count,
                        ScratchLayout* layout, cudaStream_t stream, const int32_t** offsets_out,
                        const int32_t** pairs_out) {
  const int64_t pairs = p.num_rows * p.top_k;
  int32_t* counts = layout->take<int32_t>(size_t(key_count) + 1);
  int32_t* offsets = layout->take<int32_t>(size_t(key_count) + 1);
  int32_t* keys = layout->take<int32_t>(size_t(pairs));
  int32_t* sorted_keys = layout->take<int32_t>(size_t(pairs));
  int32_t* values = layout->take<int32_t>(size_t(pairs));
  int32_t* sorted_values = layout->take<int32_t>(size_t(pairs));
  size_t scan_bytes = 0, sort_bytes = 0;
  const int bits = finalize_sort_key_bits(key_count + 1);
  MOE_ROUTING_CUDA_CHECK(kGradOp,
                         cub::DeviceScan::ExclusiveSum(nullptr, scan_bytes, counts, offsets,
                                                       int(key_count + 1), stream));
  MOE_ROUTING_CUDA_CHECK(
      kGradOp, cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, keys, sorted_keys, values,
                                               sorted_values, int(pairs), 0, bits, stream));
  void* temp = layout->take<char>(scan_bytes > sort_bytes ? scan_bytes : sort_bytes);
  if (offsets_out == nullptr) return Status::ok();  // the sizing pass
  MOE_ROUTING_CUDA_CHECK(
      kGradOp, cudaMemsetAsync(counts, 0, (size_t(key_count) + 1) * sizeof(int32_t), stream));
  if (pairs > 0) {
    pair_keys<<<blocks_for(pairs), kThreads, 0, stream>>>(p, by_expert, key_count, keys, values,
                                                          counts);
    MOE_ROUTING_RETURN_IF_ERROR(check_launch(kGradOp, "pair_keys"));
  }
  MOE_ROUTING_CUDA_CHECK(kGradOp, cub::DeviceScan::ExclusiveSum(temp, scan_bytes, counts, offsets,
                                                                int(key_count + 1), stream));
  if (pairs > 0)
    MOE_ROUTING_CUDA_CHECK(
        kGradOp, cub::DeviceRadixSort::SortPairs(temp, sort_bytes, keys, sorted_keys, values,
                                                 sorted_values, int(pairs), 0, bits, stream));
  *offsets_out = offsets;
  *pairs_out = sorted_values;
  return Status::ok();
}

}  // namespace

Status moe_finalize_routing(const FinalizeRoutingProblem& p, const MoeFinalizeRoutingPlan& plan,
                            void* stream_ptr) {
  const cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  const int64_t N = p.num_rows, K = p.top_k, H = p.hidden, pairs = N * K;
  const int64_t C = plan.constant_expert_range.size();
  DeviceScope scope(kOp, {{"expanded_x", p.expanded_x, bytes_of(p.dtype, p.expanded_rows * H)},
                          {"expanded_row_idx", p.expanded_row_idx, size_t(pairs) * 4},
                          {"x1", p.x1, bytes_of(p.dtype, N * H)},
                          {"x2", p.x2, bytes_of(p.dtype, N * H)},
                          {"bias", p.bias, bytes_of(p.dtype, plan.expert_num * H)},
                          {"scales", p.scales, bytes_of(p.scales_dtype, pairs)},
                          {"expert_idx", p.expert_idx, size_t(pairs) * 4},
                          {"x", p.x, bytes_of(p.dtype, N * H)},
                          {"alpha1", p.alpha1, bytes_of(p.dtype, C * H)},
                          {"alpha2", p.alpha2, bytes_of(p.dtype, C * H)},
                          {"v", p.v, bytes_of(p.dtype, C * H)},
                          {"out", p.out, bytes_of(p.dtype, N * H)}});
  MOE_ROUTING_RETURN_IF_ERROR(scope.status());
  if (scope.empty()) return Status::ok();
  if (pairs > 0) {
    IndexVerdict verdict;
    MOE_ROUTING_RETURN_IF_ERROR(read_verdict(
        kOp, stream, p.expanded_row_idx, p.expert_idx,
        [&](uint32_t* v) {
          check_forward<<<blocks_for(pairs), kThreads, 0, stream>>>(p, plan.skip_to,
                                                                    plan.expert_num, v);
        },
        &verdict));
    MOE_ROUTING_RETURN_IF_ERROR(finalize_verdict_status(kOp, verdict, plan.expanded_rows,
                                                        plan.skip_to, K, plan.expert_num));
  }
  if (N == 0 || H == 0) return Status::ok();
  forward<<<blocks_for(N * H), kThreads, 0, stream>>>(p);
  return check_launch(kOp, "forward");
}

Status moe_finalize_routing_grad(FinalizeRoutingGradProblem p,
                                 const MoeFinalizeRoutingGradPlan& plan, void* stream_ptr) {
  const cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  const int64_t N = p.num_rows, K = p.top_k, H = p.hidden, pairs = N * K;
  const int64_t R = p.expanded_rows, E = p.expert_num;
  DeviceScope scope(kGradOp, {{"grad_y", p.grad_y, bytes_of(p.dtype, N * H)},
                              {"expanded_row_idx", p.expanded_row_idx, size_t(pairs) * 4},
                              {"expanded_x", p.expanded_x, bytes_of(p.dtype, R * H)},
                              {"scales", p.scales, bytes_of(p.scales_dtype, pairs)},
                              {"expert_idx", p.expert_idx, size_t(pairs) * 4},
                              {"bias", p.bias, bytes_of(p.dtype, E * H)},
                              {"grad_expanded_x", p.grad_expanded_x, bytes_of(p.dtype, R * H)},
                              {"grad_scales", p.grad_scales, bytes_of(p.scales_dtype, pairs)},
                              {"grad_bias", p.grad_bias, bytes_of(p.dtype, E * H)}});
  MOE_ROUTING_RETURN_IF_ERROR(scope.status());
  if (scope.empty()) return Status::ok();
  if (pairs > 0) {
    IndexVerdict verdict;
    MOE_ROUTING_RETURN_IF_ERROR(read_verdict(
        kGradOp, stream, p.expanded_row_idx, p.expert_idx,
        [&](uint32_t* v) {
          check_grad<<<blocks_for(pairs), kThreads, 0, stream>>>(p, plan.skip_to, v);
        },
        &verdict));
    MOE_ROUTING_RETURN_IF_ERROR(finalize_verdict_status(kGradOp, verdict, R, plan.skip_to, K, E));
  }
  // No columns: every pair's grad_scales is +0 (all-zero bits in every float dtype), and no list
  // is built (a drop-pad layout's rows would size them), as on the CPU.
  if (H == 0) {
    if (p.grad_scales != nullptr && pairs > 0)
      MOE_ROUTING_CUDA_CHECK(
          kGradOp, cudaMemsetAsync(p.grad_scales, 0, bytes_of(p.scales_dtype, pairs), stream));
    return Status::ok();
  }

  // The pair lists: a sizing pass over a null layout, then the real one. Only the lists that are
  // built are limited by the scans' int32 count of keys + 1 (rows always, experts only for
  // grad_bias); no columns or no grad_bias never reach the limit, as on the CPU.
  const bool bias_lists = p.grad_bias != nullptr && E > 0;
  if (R >= INT32_MAX || (bias_lists && E >= INT32_MAX))
    return not_supported(kGradOp,
                         "grad_expanded_x rows and bias rows must be fewer than "
                         "2147483647 on the GPU, got ",
                         R, " and ", E);
  ScratchLayout sizing;
  MOE_ROUTING_RETURN_IF_ERROR(build_pair_lists(p, false, R, &sizing, stream, nullptr, nullptr));
  if (bias_lists)
    MOE_ROUTING_RETURN_IF_ERROR(build_pair_lists(p, true, E, &sizing, stream, nullptr, nullptr));
  Scratch scratch;
  MOE_ROUTING_RETURN_IF_ERROR(scratch.allocate(kGradOp, sizing.bytes(), stream));
  ScratchLayout layout(scratch.data());
  MOE_ROUTING_RETURN_IF_ERROR(
      build_pair_lists(p, false, R, &layout, stream, &p.row_offsets, &p.row_pairs));
  if (bias_lists)
    MOE_ROUTING_RETURN_IF_ERROR(
        build_pair_lists(p, true, E, &layout, stream, &p.expert_offsets, &p.expert_pairs));

  if (R * H > 0) {
    grad_rows<<<blocks_for(R * H), kThreads, 0, stream>>>(p);
    MOE_ROUTING_RETURN_IF_ERROR(check_launch(kGradOp, "grad_rows"));
  }
  if (p.grad_scales != nullptr && pairs > 0) {
    grad_scales<<<blocks_for(pairs), kThreads, 0, stream>>>(p);
    MOE_ROUTING_RETURN_IF_ERROR(check_launch(kGradOp, "grad_scales"));
  }
  if (bias_lists && H > 0) {
    grad_bias<<<blocks_for(E * H), kThreads, 0, stream>>>(p);
    MOE_ROUTING_RETURN_IF_ERROR(check_launch(kGradOp, "grad_bias"));
  }
  return Status::ok();
}

}  // namespace moe_routing::cuda
