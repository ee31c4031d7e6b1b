// The PyTorch binding: operator schemas in the namespace `moe_routing` and their CPU kernels.
// It converts tensors to TensorViews and calls the C++ core; no semantics live here. Shapes for
// fake tensors come from python/moe_routing/_fake.py, which mirrors the core's shape inference
// symbolically (tests compare the two).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <string>

#include "moe_routing/moe_routing.hpp"

namespace {

using moe_routing::DType;
using moe_routing::Status;
using moe_routing::StatusCode;
using moe_routing::TensorView;

/// Raises the Python exception of the status's category with the core's message unchanged:
/// invalid argument -> ValueError, index value -> IndexError, not supported ->
/// NotImplementedError, anything else -> RuntimeError.
void raise_if_error(const Status& status) {
  if (status.is_ok()) return;
  switch (status.code()) {
    case StatusCode::invalid_argument: TORCH_CHECK_VALUE(false, status.message());
    case StatusCode::index_out_of_range: TORCH_CHECK_INDEX(false, status.message());
    case StatusCode::not_supported: TORCH_CHECK_NOT_IMPLEMENTED(false, status.message());
    default: TORCH_CHECK(false, status.message());
  }
}

/// The core dtype of a torch dtype; unsupported ones get the core's message format.
DType core_dtype(const char* op, const char* name, const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: return DType::float32;
    case at::kHalf: return DType::float16;
    case at::kBFloat16: return DType::bfloat16;
    case at::kChar: return DType::int8;
    case at::kInt: return DType::int32;
    case at::kLong: return DType::int64;
    default:
      TORCH_CHECK_VALUE(false, op, ": ", name,
                        " must have a dtype among float32, float16, bfloat16, int8, int32, int64, got ",
                        t.scalar_type());
  }
}

/// A view of a contiguous CPU tensor. `t` must outlive the view.
TensorView view_of(const char* op, const char* name, const at::Tensor& t) {
  TORCH_CHECK_VALUE(t.dim() <= moe_routing::kMaxDims, op, ": ", name, " must have at most ",
                    moe_routing::kMaxDims, " dimensions, got ", t.dim());
  TORCH_CHECK_NOT_IMPLEMENTED(t.device().is_cpu(), op, ": ", name,
                              " must be a CPU tensor in this build, got ", t.device());
  TensorView v;
  v.data = t.data_ptr();
  v.dtype = core_dtype(op, name, t);
  v.ndim = int(t.dim());
  for (int d = 0; d < v.ndim; ++d) v.shape[d] = t.size(d);
  return v;
}

moe_routing::ExecConfig torch_exec_config() {
  moe_routing::ExecConfig config;
  config.num_threads = at::get_num_threads();  // honours torch.set_num_threads
  return config;
}

at::Tensor moe_init_routing_grad_cpu(const at::Tensor& grad_expanded_x,
                                     const at::Tensor& expanded_row_idx, int64_t top_k,
                                     int64_t drop_pad_mode, int64_t active_num,
                                     c10::string_view order) {
  constexpr const char* op = "moe_init_routing_grad";
  moe_routing::MoeInitRoutingGradAttrs attrs;
  attrs.top_k = top_k;
  attrs.drop_pad_mode = drop_pad_mode;
  attrs.active_num = active_num;
  const std::string order_text(order);
  TORCH_CHECK_VALUE(moe_routing::parse_accumulation_order(order_text.c_str(), &attrs.order), op,
                    ": order must be \"tree\" or \"sequential\", got \"", order_text, "\"");
  const at::Tensor grad = grad_expanded_x.contiguous();
  const at::Tensor idx = expanded_row_idx.contiguous();
  const TensorView grad_view = view_of(op, "grad_expanded_x", grad);
  const TensorView idx_view = view_of(op, "expanded_row_idx", idx);
  moe_routing::MoeInitRoutingGradPlan plan;
  raise_if_error(moe_routing::infer_moe_init_routing_grad(grad_view, idx_view, attrs, &plan));
  at::Tensor grad_x = at::empty({plan.grad_x_shape[0], plan.grad_x_shape[1]}, grad.options());
  raise_if_error(moe_routing::moe_init_routing_grad(grad_view, idx_view, attrs,
                                                    view_of(op, "grad_x", grad_x),
                                                    torch_exec_config()));
  return grad_x;
}

}  // namespace

TORCH_LIBRARY(moe_routing, m) {
  m.def(
      "moe_init_routing_grad(Tensor grad_expanded_x, Tensor expanded_row_idx, int top_k, "
      "int drop_pad_mode=0, int active_num=0, str order=\"tree\") -> Tensor");
}

TORCH_LIBRARY_IMPL(moe_routing, CPU, m) {
  m.impl("moe_init_routing_grad", &moe_init_routing_grad_cpu);
}
