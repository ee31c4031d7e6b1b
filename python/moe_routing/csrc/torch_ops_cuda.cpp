// The CUDA kernels of the torch operators (schemas in torch_ops.cpp): compiled only when the torch
// being built against has CUDA and the library has its CUDA backend (python/CMakeLists.txt). Like
// the CPU registration it converts tensors to TensorViews and calls the C++ core, which runs them
// on the GPU (bitwise identical to the CPU kernels) on torch's current CUDA stream.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "moe_routing/moe_routing.hpp"

namespace {

using moe_routing::DType;
using moe_routing::Status;
using moe_routing::StatusCode;
using moe_routing::TensorView;

/// The core's error categories as Python exceptions (as the CPU registration maps them).
void raise_if_error(const Status& status) {
  if (status.is_ok()) return;
  switch (status.code()) {
    case StatusCode::invalid_argument: TORCH_CHECK_VALUE(false, status.message());
    case StatusCode::index_out_of_range: TORCH_CHECK_INDEX(false, status.message());
    case StatusCode::not_supported: TORCH_CHECK_NOT_IMPLEMENTED(false, status.message());
    default: TORCH_CHECK(false, status.message());
  }
}

DType core_dtype(const char* op, const char* name, const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: return DType::float32;
    case at::kHalf: return DType::float16;
    case at::kBFloat16: return DType::bfloat16;
    case at::kChar: return DType::int8;
    case at::kInt: return DType::int32;
    case at::kLong: return DType::int64;
    default:
      TORCH_CHECK_VALUE(
          false, op, ": ", name,
          " must have a dtype among float32, float16, bfloat16, int8, int32, int64, got ",
          t.scalar_type());
  }
}

at::ScalarType torch_dtype(DType dtype) {
  switch (dtype) {
    case DType::float32: return at::kFloat;
    case DType::float16: return at::kHalf;
    case DType::bfloat16: return at::kBFloat16;
    case DType::int8: return at::kChar;
    case DType::int32: return at::kInt;
    case DType::int64: return at::kLong;
  }
  TORCH_CHECK(false, "moe_routing: internal error: unknown dtype ", static_cast<int>(dtype));
}

/// A view of a contiguous tensor on `device` (the device of the operator's first input).
TensorView cuda_view(const char* op, const char* name, const at::Tensor& t,
                     const at::Device& device) {
  TORCH_CHECK_VALUE(t.dim() <= moe_routing::kMaxDims, op, ": ", name, " must have at most ",
                    moe_routing::kMaxDims, " dimensions, got ", t.dim());
  TORCH_CHECK_VALUE(t.device() == device, op, ": ", name, " must be on ", device,
                    " (the device of the "
                    "operator's first input), got ",
                    t.device());
  TensorView v;
  v.data = t.data_ptr();
  v.dtype = core_dtype(op, name, t);
  v.ndim = int(t.dim());
  for (int d = 0; d < v.ndim; ++d) v.shape[d] = t.size(d);
  v.device = moe_routing::Device::cuda;
  return v;
}

TensorView optional_cuda_view(const char* op, const char* name, const at::Tensor& t,
                              const at::Device& device) {
  return t.defined() ? cuda_view(op, name, t, device) : TensorView();
}

at::Tensor allocate(const moe_routing::OutputSpec& spec, const at::Tensor& like) {
  std::vector<int64_t> shape(spec.shape, spec.shape + spec.ndim);
  return at::empty(shape, like.options().dtype(torch_dtype(spec.dtype)));
}

/// Work goes on torch's current stream of the tensors' device.
moe_routing::ExecConfig cuda_exec_config() {
  moe_routing::ExecConfig config;
  config.stream = static_cast<void*>(c10::cuda::getCurrentCUDAStream().stream());
  return config;
}

at::Tensor moe_init_routing_grad_cuda(const at::Tensor& grad_expanded_x,
                                      const at::Tensor& expanded_row_idx, int64_t top_k,
                                      int64_t drop_pad_mode, int64_t active_num,
                                      c10::string_view order) {
  constexpr const char* op = "moe_init_routing_grad";
  const c10::cuda::CUDAGuard guard(grad_expanded_x.device());
  moe_routing::MoeInitRoutingGradAttrs attrs;
  attrs.top_k = top_k;
  attrs.drop_pad_mode = drop_pad_mode;
  attrs.active_num = active_num;
  const std::string order_text(order);
  TORCH_CHECK_VALUE(moe_routing::parse_accumulation_order(order_text.c_str(), &attrs.order), op,
                    ": order must be \"tree\" or \"sequential\", got \"", order_text, "\"");
  const at::Device device = grad_expanded_x.device();
  const at::Tensor grad = grad_expanded_x.contiguous();
  const at::Tensor idx = expanded_row_idx.contiguous();
  const TensorView grad_view = cuda_view(op, "grad_expanded_x", grad, device);
  const TensorView idx_view = cuda_view(op, "expanded_row_idx", idx, device);
  moe_routing::MoeInitRoutingGradPlan plan;
  raise_if_error(moe_routing::infer_moe_init_routing_grad(grad_view, idx_view, attrs, &plan));
  at::Tensor grad_x = at::empty({plan.grad_x_shape[0], plan.grad_x_shape[1]}, grad.options());
  raise_if_error(moe_routing::moe_init_routing_grad(
      grad_view, idx_view, attrs, cuda_view(op, "grad_x", grad_x, device), cuda_exec_config()));
  return grad_x;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> moe_init_routing_v2_cuda(
    const at::Tensor& x, const at::Tensor& expert_idx, int64_t active_num, int64_t expert_capacity,
    int64_t expert_num, int64_t drop_pad_mode, int64_t expert_tokens_count_or_cumsum_flag,
    bool expert_tokens_before_capacity_flag) {
  constexpr const char* op = "moe_init_routing_v2";
  const c10::cuda::CUDAGuard guard(x.device());
  moe_routing::MoeInitRoutingV2Attrs attrs;
  attrs.active_num = active_num;
  attrs.expert_capacity = expert_capacity;
  attrs.expert_num = expert_num;
  attrs.drop_pad_mode = drop_pad_mode;
  attrs.expert_tokens_count_or_cumsum_flag = expert_tokens_count_or_cumsum_flag;
  attrs.expert_tokens_before_capacity_flag = expert_tokens_before_capacity_flag;
  const at::Device device = x.device();
  const at::Tensor x_c = x.contiguous();
  const at::Tensor idx_c = expert_idx.contiguous();
  const TensorView x_view = cuda_view(op, "x", x_c, device);
  const TensorView idx_view = cuda_view(op, "expert_idx", idx_c, device);
  moe_routing::MoeInitRoutingV2Plan plan;
  raise_if_error(moe_routing::infer_moe_init_routing_v2(x_view, idx_view, attrs, &plan));
  at::Tensor expanded_x = allocate(plan.expanded_x, x_c);
  at::Tensor expanded_row_idx = allocate(plan.expanded_row_idx, x_c);
  at::Tensor counts = allocate(plan.expert_tokens_count_or_cumsum, x_c);
  at::Tensor before_capacity = allocate(plan.expert_tokens_before_capacity, x_c);
  raise_if_error(moe_routing::moe_init_routing_v2(
      x_view, idx_view, attrs, cuda_view(op, "expanded_x", expanded_x, device),
      cuda_view(op, "expanded_row_idx", expanded_row_idx, device),
      cuda_view(op, "expert_tokens_count_or_cumsum", counts, device),
      cuda_view(op, "expert_tokens_before_capacity", before_capacity, device), cuda_exec_config()));
  return {expanded_x, expanded_row_idx, counts, before_capacity};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> moe_init_routing_cuda(
    const at::Tensor& x, const at::Tensor& expert_idx, const std::optional<at::Tensor>& scale,
    const std::optional<at::Tensor>& offset, const std::optional<at::Tensor>& topk_weight,
    int64_t active_num, int64_t expert_capacity, int64_t expert_num, int64_t drop_pad_mode,
    int64_t expert_tokens_num_type, bool expert_tokens_num_flag, int64_t quant_mode,
    at::OptionalIntArrayRef active_expert_range, int64_t row_idx_type, c10::string_view numerics) {
  constexpr const char* op = "moe_init_routing";
  const c10::cuda::CUDAGuard guard(x.device());
  moe_routing::MoeInitRoutingAttrs attrs;
  attrs.active_num = active_num;
  attrs.expert_capacity = expert_capacity;
  attrs.expert_num = expert_num;
  attrs.drop_pad_mode = drop_pad_mode;
  attrs.expert_tokens_num_type = expert_tokens_num_type;
  attrs.expert_tokens_num_flag = expert_tokens_num_flag;
  attrs.quant_mode = quant_mode;
  attrs.row_idx_type = row_idx_type;
  if (active_expert_range.has_value()) {
    const auto range = *active_expert_range;
    TORCH_CHECK_VALUE(range.size() == 2, op,
                      ": active_expert_range must be a list of two ints [start, end], got ",
                      range.size(), " values");
    attrs.has_active_expert_range = true;
    attrs.active_expert_range = {range[0], range[1]};
  }
  const std::string numerics_text(numerics);
  TORCH_CHECK_VALUE(moe_routing::parse_numerics(numerics_text.c_str(), &attrs.numerics), op,
                    ": numerics must be \"atlas_a2\" or \"ascend_950\", got \"", numerics_text,
                    "\"");
  const at::Device device = x.device();
  const at::Tensor x_c = x.contiguous();
  const at::Tensor idx_c = expert_idx.contiguous();
  const at::Tensor scale_c = scale.has_value() ? scale->contiguous() : at::Tensor();
  const at::Tensor offset_c = offset.has_value() ? offset->contiguous() : at::Tensor();
  const at::Tensor weight_c = topk_weight.has_value() ? topk_weight->contiguous() : at::Tensor();
  const TensorView x_view = cuda_view(op, "x", x_c, device);
  const TensorView idx_view = cuda_view(op, "expert_idx", idx_c, device);
  const TensorView scale_view = optional_cuda_view(op, "scale", scale_c, device);
  const TensorView offset_view = optional_cuda_view(op, "offset", offset_c, device);
  const TensorView weight_view = optional_cuda_view(op, "topk_weight", weight_c, device);
  moe_routing::MoeInitRoutingPlan plan;
  raise_if_error(moe_routing::infer_moe_init_routing(x_view, idx_view, scale_view, offset_view,
                                                     weight_view, attrs, &plan));
  at::Tensor expanded_x = allocate(plan.expanded_x, x_c);
  at::Tensor expanded_row_idx = allocate(plan.expanded_row_idx, x_c);
  at::Tensor counts = allocate(plan.expert_tokens_count_or_cumsum, x_c);
  at::Tensor expanded_scale = allocate(plan.expanded_scale, x_c);
  at::Tensor expanded_topk_weight = allocate(plan.expanded_topk_weight, x_c);
  raise_if_error(moe_routing::moe_init_routing(
      x_view, idx_view, scale_view, offset_view, weight_view, attrs,
      cuda_view(op, "expanded_x", expanded_x, device),
      cuda_view(op, "expanded_row_idx", expanded_row_idx, device),
      cuda_view(op, "expert_tokens_count_or_cumsum", counts, device),
      cuda_view(op, "expanded_scale", expanded_scale, device),
      cuda_view(op, "expanded_topk_weight", expanded_topk_weight, device), cuda_exec_config()));
  return {expanded_x, expanded_row_idx, counts, expanded_scale, expanded_topk_weight};
}

}  // namespace

TORCH_LIBRARY_IMPL(moe_routing, CUDA, m) {
  m.impl("moe_init_routing_grad", &moe_init_routing_grad_cuda);
  m.impl("moe_init_routing_v2", &moe_init_routing_v2_cuda);
  m.impl("moe_init_routing", &moe_init_routing_cuda);
}
