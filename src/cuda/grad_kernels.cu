// moe_init_routing_grad on the GPU: a device-side index check, one read-back of its verdict, then
// the token-owned gather-reduce of grad_body.cuh. See docs/cuda.md.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "cuda/cuda_backend.h"
#include "cuda/cuda_runtime_util.h"
#include "cuda/grad_body.cuh"

namespace moe_routing::cuda {
namespace {

constexpr const char* kOp = "moe_init_routing_grad: ";
constexpr int kThreads = 256;
constexpr uint32_t kNoError = 0xffffffffu;

/// Finds the first flat position whose index is neither skipped nor in [0, source_rows). Reads
/// only expanded_row_idx; positions fit 32 bits (N*K <= INT32_MAX).
__global__ void __launch_bounds__(kThreads)
    check_grad_indices(const int32_t* __restrict__ indices, int64_t pairs, int64_t skip_from,
                       int64_t source_rows, uint32_t* __restrict__ first_bad) {
  for (int64_t p = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; p < pairs;
       p += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = __ldg(indices + p);
    if (r == -1 || r >= skip_from) continue;
    if (r < 0 || r >= source_rows) atomicMin(first_bad, uint32_t(p));
  }
}

template <class Tag, int kBytes, int D, int V, int kLevels>
__global__ void __launch_bounds__(kThreads, 2) grad_kernel(GradArgs args) {
  const int64_t total = args.num_rows * args.vectors_per_row;
  const int64_t chunk = int64_t(blockDim.x) * V;
  for (int64_t base = int64_t(blockIdx.x) * chunk; base < total; base += int64_t(gridDim.x) * chunk)
    grad_items<Tag, kBytes, D, V, kLevels>(args, base + threadIdx.x, blockDim.x);
}

/// Launches one instantiation over a grid of at most one wave of resident blocks.
template <class Tag, int kBytes, int D, int V, int kLevels>
Status launch_grad(const GradArgs& args, cudaStream_t stream) {
  auto kernel = grad_kernel<Tag, kBytes, D, V, kLevels>;
  int resident = 0;
  MOE_ROUTING_CUDA_CHECK(
      kOp, cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, kernel, kThreads, 0));
  const int64_t items = args.num_rows * args.vectors_per_row;
  const int64_t work_blocks = (items + int64_t(kThreads) * V - 1) / (int64_t(kThreads) * V);
  const int64_t blocks = grid_blocks(work_blocks, resident);
  kernel<<<unsigned(blocks), kThreads, 0, stream>>>(args);
  return check_launch(kOp, "grad_kernel");
}

/// Picks the loads-in-flight shape from K: D addends per round times V items per thread is 8
/// vector loads in flight (4 for the deep trees of K >= 16, whose stack of partial sums needs the
/// registers), and kLevels bounds the tree's depth. Registers are capped at 128 per thread (two
/// blocks of 256 per multiprocessor).
template <class Tag>
Status launch_for_dtype(const GradArgs& args, bool vectorized, int levels, cudaStream_t stream) {
  const int64_t K = args.top_k;
  if (!vectorized)
    return launch_grad<Tag, int(sizeof(typename Tag::Storage)), 8, 1, 6>(args, stream);
  if (K <= 2) return launch_grad<Tag, 16, 2, 4, 0>(args, stream);       // K <= 3 has one bin
  if (K <= 4) return launch_grad<Tag, 16, 4, 2, 1>(args, stream);       // at most 2 bins
  if (levels <= 2) return launch_grad<Tag, 16, 8, 1, 2>(args, stream);  // K < 16, or sequential
  return launch_grad<Tag, 16, 4, 1, 6>(args, stream);
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

Status moe_init_routing_grad(const detail::GradProblem& problem, void* stream_ptr) {
  const MoeInitRoutingGradPlan& plan = problem.plan;
  const void* grad_expanded_x = problem.grad_expanded_x;
  const int32_t* expanded_row_idx = problem.expanded_row_idx;
  void* grad_x = problem.grad_x;
  const cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  const size_t element = dtype_size(plan.dtype);
  const int64_t pairs = plan.num_rows * plan.top_k;
  DeviceScope scope(
      kOp, {{"grad_expanded_x", grad_expanded_x, size_t(plan.source_rows * plan.hidden) * element},
            {"expanded_row_idx", expanded_row_idx, size_t(pairs) * sizeof(int32_t)},
            {"grad_x", grad_x, size_t(plan.num_rows * plan.hidden) * element}});
  MOE_ROUTING_RETURN_IF_ERROR(scope.status());
  if (scope.empty()) return Status::ok();

  // 1. Check every index on the device; read the first bad position back once.
  if (pairs > 0) {
    Scratch scratch;
    MOE_ROUTING_RETURN_IF_ERROR(scratch.allocate(kOp, sizeof(uint32_t), stream));
    uint32_t* first_bad = reinterpret_cast<uint32_t*>(scratch.data());
    MOE_ROUTING_CUDA_CHECK(kOp, cudaMemsetAsync(first_bad, 0xff, sizeof(uint32_t), stream));
    const int64_t blocks = grid_blocks((pairs + kThreads - 1) / kThreads, 8);
    check_grad_indices<<<unsigned(blocks), kThreads, 0, stream>>>(
        expanded_row_idx, pairs, plan.skip_from, plan.source_rows, first_bad);
    MOE_ROUTING_RETURN_IF_ERROR(check_launch(kOp, "check_grad_indices"));
    uint32_t verdict = kNoError;
    MOE_ROUTING_RETURN_IF_ERROR(read_to_host(kOp, &verdict, first_bad, sizeof verdict, stream));
    if (verdict != kNoError) {
      int32_t value = 0;
      MOE_ROUTING_RETURN_IF_ERROR(
          read_to_host(kOp, &value, expanded_row_idx + verdict, sizeof value, stream));
      return grad_index_error(plan, int64_t(verdict), value);
    }
  }
  if (plan.num_rows == 0 || plan.hidden == 0) return Status::ok();

  // 2. The gather-reduce.
  const bool sequential = plan.order == AccumulationOrder::sequential;
  const TreeShape tree = tree_shape(plan.top_k);
  const bool vectorized =
      (plan.hidden * int64_t(element)) % 16 == 0 && aligned16(grad_expanded_x) && aligned16(grad_x);
  GradArgs args{};
  args.grad_expanded_x = grad_expanded_x;
  args.expanded_row_idx = expanded_row_idx;
  args.grad_x = grad_x;
  args.num_rows = plan.num_rows;
  args.top_k = plan.top_k;
  args.hidden = plan.hidden;
  args.skip_from = plan.skip_from;
  args.bins = sequential ? 1 : tree.bins;
  args.sequential = sequential;
  args.vectors_per_row = vectorized ? plan.hidden * int64_t(element) / 16 : plan.hidden;
  args.items_fit_32_bits = plan.num_rows * args.vectors_per_row <= int64_t(UINT32_MAX);
  const int levels = sequential ? 0 : tree.levels;
  switch (plan.dtype) {
    case DType::float32: return launch_for_dtype<num::Float32>(args, vectorized, levels, stream);
    case DType::float16: return launch_for_dtype<num::Float16>(args, vectorized, levels, stream);
    case DType::bfloat16: return launch_for_dtype<num::Bfloat16>(args, vectorized, levels, stream);
    default:
      return internal_error(kOp, "dtype must be float32, float16 or bfloat16 here, got ",
                            dtype_name(plan.dtype));
  }
}

}  // namespace moe_routing::cuda
