// The PyTorch binding: operator schemas in the namespace `moe_routing` and their CPU kernels.
// It converts tensors to TensorViews and calls the C++ core; no semantics live here. Shapes for
// fake tensors come from python/moe_routing/_fake.py, which mirrors the core's shape inference
// symbolically (tests compare the two).
#include <ATen/ATen.h>
#include <ATen/Config.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

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
      TORCH_CHECK_VALUE(
          false, op, ": ", name,
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

/// An output tensor of the planned shape and dtype. Outputs a configuration does not produce get
/// their planned (possibly empty) shape too; the core fills them with zeros.
at::Tensor allocate(const moe_routing::OutputSpec& spec, const at::Tensor& like) {
  std::vector<int64_t> shape(spec.shape, spec.shape + spec.ndim);
  return at::empty(shape, like.options().dtype(torch_dtype(spec.dtype)));
}

/// A view of an optional input; absent -> the core's "absent" (default-constructed) view.
TensorView optional_view(const char* op, const char* name, const at::Tensor& t) {
  return t.defined() ? view_of(op, name, t) : TensorView();
}

/// The CPU kernels' parallel loops on PyTorch's own pool (at::parallel_for): with our pool beside
/// it, PyTorch's OpenMP workers - which keep spinning for a while after every PyTorch operator -
/// and ours fight over the same cores (a 128-token forward ran 1.5x slower right after a PyTorch
/// op). This file must be compiled with OpenMP for that (python/CMakeLists.txt): at::parallel_for
/// is a header template whose `#pragma omp parallel` is otherwise ignored, running every loop
/// serially. _parallel_loop_threads lets the tests check it. OpenMP's workers spin between jobs
/// and start a piece in microseconds, so the kernels split work from 256 KiB per thread (the
/// default of set_parallel_backend) instead of the built-in pool's 2 MiB.
void torch_parallel_for(int64_t num_tasks, int max_pieces,
                        void (*task)(void* context, int64_t begin, int64_t end), void* context) {
  const int64_t grain = (num_tasks + max_pieces - 1) / max_pieces;  // at most max_pieces pieces
  at::parallel_for(0, num_tasks, grain,
                   [&](int64_t begin, int64_t end) { task(context, begin, end); });
}

// With PyTorch's OpenMP backend at::parallel_for is parallel only in a file compiled with
// OpenMP; python/CMakeLists.txt links it where that gives one OpenMP runtime (GCC and a torch
// whose libgomp has the standard name). Otherwise the kernels keep the library's own pool.
#if defined(_OPENMP) || !AT_PARALLEL_OPENMP
constexpr bool kUseTorchPool = true;
#else
constexpr bool kUseTorchPool = false;
#endif

[[maybe_unused]] const bool kParallelBackendInstalled = [] {
  if (kUseTorchPool) moe_routing::set_parallel_backend(&torch_parallel_for);
  return kUseTorchPool;
}();

/// Whether the kernels' loops run on PyTorch's pool in this build (see kUseTorchPool).
bool uses_torch_pool() { return kUseTorchPool; }

/// How many distinct threads ran the pieces of a loop of `num_tasks` tasks through
/// torch_parallel_for with as many pieces as PyTorch's thread count (a check of the build: with
/// PyTorch's OpenMP backend and no OpenMP in this file it is always 1).
int64_t parallel_loop_threads(int64_t num_tasks) {
  TORCH_CHECK_VALUE(num_tasks >= 1, "_parallel_loop_threads: num_tasks must be >= 1, got ",
                    num_tasks);
  std::mutex mutex;
  std::set<std::thread::id> threads;
  struct Context {
    std::mutex* mutex;
    std::set<std::thread::id>* threads;
  } context{&mutex, &threads};
  torch_parallel_for(
      num_tasks, at::get_num_threads(),
      [](void* raw, int64_t, int64_t) {
        auto* c = static_cast<Context*>(raw);
        std::lock_guard<std::mutex> lock(*c->mutex);
        c->threads->insert(std::this_thread::get_id());
      },
      &context);
  return int64_t(threads.size());
}

moe_routing::ExecConfig torch_exec_config() {
  moe_routing::ExecConfig config;
  config.num_threads = at::get_num_threads();  // honours torch.set_num_threads
  return config;
}

/// An out= tensor must be exactly what the operator would allocate: the planned shape and dtype,
/// contiguous, on the CPU. (Resizing would hide a caller's mistake; we report it instead.)
void check_out(const char* op, const char* name, const at::Tensor& t, at::IntArrayRef shape,
               DType dtype) {
  TORCH_CHECK_VALUE(t.sizes() == shape && t.scalar_type() == torch_dtype(dtype) &&
                        t.is_contiguous() && t.device().is_cpu(),
                    op, ": out ", name, " must be a contiguous CPU ",
                    moe_routing::dtype_name(dtype), " tensor of shape ", shape, ", got ",
                    t.scalar_type(), " ", t.sizes(), t.is_contiguous() ? "" : " (non-contiguous)",
                    " on ", t.device());
}

/// The backward into `out` (allocated here when null).
at::Tensor moe_init_routing_grad_into(const at::Tensor& grad_expanded_x,
                                      const at::Tensor& expanded_row_idx, int64_t top_k,
                                      int64_t drop_pad_mode, int64_t active_num,
                                      c10::string_view order, const at::Tensor* out) {
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
  const std::vector<int64_t> shape{plan.grad_x_shape[0], plan.grad_x_shape[1]};
  at::Tensor grad_x;
  if (out != nullptr) {
    check_out(op, "grad_x", *out, shape, plan.dtype);
    grad_x = *out;
  } else {
    grad_x = at::empty(shape, grad.options());
  }
  raise_if_error(moe_routing::moe_init_routing_grad(
      grad_view, idx_view, attrs, view_of(op, "grad_x", grad_x), torch_exec_config()));
  return grad_x;
}

at::Tensor moe_init_routing_grad_cpu(const at::Tensor& grad_expanded_x,
                                     const at::Tensor& expanded_row_idx, int64_t top_k,
                                     int64_t drop_pad_mode, int64_t active_num,
                                     c10::string_view order) {
  return moe_init_routing_grad_into(grad_expanded_x, expanded_row_idx, top_k, drop_pad_mode,
                                    active_num, order, nullptr);
}

void moe_init_routing_grad_out_cpu(const at::Tensor& grad_expanded_x,
                                   const at::Tensor& expanded_row_idx, int64_t top_k,
                                   int64_t drop_pad_mode, int64_t active_num,
                                   c10::string_view order, at::Tensor& out) {
  moe_init_routing_grad_into(grad_expanded_x, expanded_row_idx, top_k, drop_pad_mode, active_num,
                             order, &out);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> moe_init_routing_v2_cpu(
    const at::Tensor& x, const at::Tensor& expert_idx, int64_t active_num, int64_t expert_capacity,
    int64_t expert_num, int64_t drop_pad_mode, int64_t expert_tokens_count_or_cumsum_flag,
    bool expert_tokens_before_capacity_flag) {
  constexpr const char* op = "moe_init_routing_v2";
  moe_routing::MoeInitRoutingV2Attrs attrs;
  attrs.active_num = active_num;
  attrs.expert_capacity = expert_capacity;
  attrs.expert_num = expert_num;
  attrs.drop_pad_mode = drop_pad_mode;
  attrs.expert_tokens_count_or_cumsum_flag = expert_tokens_count_or_cumsum_flag;
  attrs.expert_tokens_before_capacity_flag = expert_tokens_before_capacity_flag;
  const at::Tensor x_c = x.contiguous();
  const at::Tensor idx_c = expert_idx.contiguous();
  const TensorView x_view = view_of(op, "x", x_c);
  const TensorView idx_view = view_of(op, "expert_idx", idx_c);
  moe_routing::MoeInitRoutingV2Plan plan;
  raise_if_error(moe_routing::infer_moe_init_routing_v2(x_view, idx_view, attrs, &plan));
  at::Tensor expanded_x = allocate(plan.expanded_x, x_c);
  at::Tensor expanded_row_idx = allocate(plan.expanded_row_idx, x_c);
  at::Tensor counts = allocate(plan.expert_tokens_count_or_cumsum, x_c);
  at::Tensor before_capacity = allocate(plan.expert_tokens_before_capacity, x_c);
  raise_if_error(moe_routing::moe_init_routing_v2(
      x_view, idx_view, attrs, view_of(op, "expanded_x", expanded_x),
      view_of(op, "expanded_row_idx", expanded_row_idx),
      view_of(op, "expert_tokens_count_or_cumsum", counts),
      view_of(op, "expert_tokens_before_capacity", before_capacity), torch_exec_config()));
  return {expanded_x, expanded_row_idx, counts, before_capacity};
}

using RoutingOutputs = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

/// The torch-API forward into `out` (five tensors; allocated here when null).
RoutingOutputs moe_init_routing_into(
    const at::Tensor& x, const at::Tensor& expert_idx, const std::optional<at::Tensor>& scale,
    const std::optional<at::Tensor>& offset, const std::optional<at::Tensor>& topk_weight,
    int64_t active_num, int64_t expert_capacity, int64_t expert_num, int64_t drop_pad_mode,
    int64_t expert_tokens_num_type, bool expert_tokens_num_flag, int64_t quant_mode,
    at::OptionalIntArrayRef active_expert_range, int64_t row_idx_type, c10::string_view numerics,
    const at::Tensor* out) {
  constexpr const char* op = "moe_init_routing";
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
  const at::Tensor x_c = x.contiguous();
  const at::Tensor idx_c = expert_idx.contiguous();
  const at::Tensor scale_c = scale.has_value() ? scale->contiguous() : at::Tensor();
  const at::Tensor offset_c = offset.has_value() ? offset->contiguous() : at::Tensor();
  const at::Tensor weight_c = topk_weight.has_value() ? topk_weight->contiguous() : at::Tensor();
  const TensorView x_view = view_of(op, "x", x_c);
  const TensorView idx_view = view_of(op, "expert_idx", idx_c);
  const TensorView scale_view = optional_view(op, "scale", scale_c);
  const TensorView offset_view = optional_view(op, "offset", offset_c);
  const TensorView weight_view = optional_view(op, "topk_weight", weight_c);
  moe_routing::MoeInitRoutingPlan plan;
  raise_if_error(moe_routing::infer_moe_init_routing(x_view, idx_view, scale_view, offset_view,
                                                     weight_view, attrs, &plan));
  const moe_routing::OutputSpec* specs[5] = {&plan.expanded_x, &plan.expanded_row_idx,
                                             &plan.expert_tokens_count_or_cumsum,
                                             &plan.expanded_scale, &plan.expanded_topk_weight};
  const char* names[5] = {"expanded_x", "expanded_row_idx", "expert_tokens_count_or_cumsum",
                          "expanded_scale", "expanded_topk_weight"};
  at::Tensor outputs[5];
  for (int i = 0; i < 5; ++i) {
    if (out != nullptr) {
      check_out(op, names[i], out[i], at::IntArrayRef(specs[i]->shape, specs[i]->ndim),
                specs[i]->dtype);
      outputs[i] = out[i];
    } else {
      outputs[i] = allocate(*specs[i], x_c);
    }
  }
  at::Tensor &expanded_x = outputs[0], &expanded_row_idx = outputs[1], &counts = outputs[2],
             &expanded_scale = outputs[3], &expanded_topk_weight = outputs[4];
  raise_if_error(moe_routing::moe_init_routing(
      x_view, idx_view, scale_view, offset_view, weight_view, attrs,
      view_of(op, "expanded_x", expanded_x), view_of(op, "expanded_row_idx", expanded_row_idx),
      view_of(op, "expert_tokens_count_or_cumsum", counts),
      view_of(op, "expanded_scale", expanded_scale),
      view_of(op, "expanded_topk_weight", expanded_topk_weight), torch_exec_config()));
  return {expanded_x, expanded_row_idx, counts, expanded_scale, expanded_topk_weight};
}

RoutingOutputs moe_init_routing_cpu(
    const at::Tensor& x, const at::Tensor& expert_idx, const std::optional<at::Tensor>& scale,
    const std::optional<at::Tensor>& offset, const std::optional<at::Tensor>& topk_weight,
    int64_t active_num, int64_t expert_capacity, int64_t expert_num, int64_t drop_pad_mode,
    int64_t expert_tokens_num_type, bool expert_tokens_num_flag, int64_t quant_mode,
    at::OptionalIntArrayRef active_expert_range, int64_t row_idx_type, c10::string_view numerics) {
  return moe_init_routing_into(x, expert_idx, scale, offset, topk_weight, active_num,
                               expert_capacity, expert_num, drop_pad_mode, expert_tokens_num_type,
                               expert_tokens_num_flag, quant_mode, active_expert_range,
                               row_idx_type, numerics, nullptr);
}

void moe_init_routing_out_cpu(
    const at::Tensor& x, const at::Tensor& expert_idx, const std::optional<at::Tensor>& scale,
    const std::optional<at::Tensor>& offset, const std::optional<at::Tensor>& topk_weight,
    int64_t active_num, int64_t expert_capacity, int64_t expert_num, int64_t drop_pad_mode,
    int64_t expert_tokens_num_type, bool expert_tokens_num_flag, int64_t quant_mode,
    at::OptionalIntArrayRef active_expert_range, int64_t row_idx_type, c10::string_view numerics,
    at::Tensor& expanded_x, at::Tensor& expanded_row_idx, at::Tensor& expert_tokens_count_or_cumsum,
    at::Tensor& expanded_scale, at::Tensor& expanded_topk_weight) {
  const at::Tensor out[5] = {expanded_x, expanded_row_idx, expert_tokens_count_or_cumsum,
                             expanded_scale, expanded_topk_weight};
  moe_init_routing_into(x, expert_idx, scale, offset, topk_weight, active_num, expert_capacity,
                        expert_num, drop_pad_mode, expert_tokens_num_type, expert_tokens_num_flag,
                        quant_mode, active_expert_range, row_idx_type, numerics, out);
}

}  // namespace

TORCH_LIBRARY(moe_routing, m) {
  m.def(
      "moe_init_routing_grad(Tensor grad_expanded_x, Tensor expanded_row_idx, int top_k, "
      "int drop_pad_mode=0, int active_num=0, str order=\"tree\") -> Tensor");
  m.def(
      "moe_init_routing_v2(Tensor x, Tensor expert_idx, int active_num=0, int expert_capacity=0, "
      "int expert_num=0, int drop_pad_mode=0, int expert_tokens_count_or_cumsum_flag=0, "
      "bool expert_tokens_before_capacity_flag=False) -> (Tensor, Tensor, Tensor, Tensor)");
  m.def(
      "moe_init_routing(Tensor x, Tensor expert_idx, Tensor? scale=None, Tensor? offset=None, "
      "Tensor? topk_weight=None, int active_num=-1, int expert_capacity=-1, int expert_num=-1, "
      "int drop_pad_mode=0, int expert_tokens_num_type=0, bool expert_tokens_num_flag=False, "
      "int quant_mode=-1, int[]? active_expert_range=None, int row_idx_type=0, "
      "str numerics=\"atlas_a2\") -> (Tensor, Tensor, Tensor, Tensor, Tensor)");
  // out= overloads: write into caller-owned tensors of exactly the planned shapes (no allocation,
  // so no page faults of fresh memory on every call). They return nothing, as torch requires of
  // mutating custom operators.
  m.def(
      "moe_init_routing_grad.out(Tensor grad_expanded_x, Tensor expanded_row_idx, int top_k, "
      "int drop_pad_mode=0, int active_num=0, str order=\"tree\", *, Tensor(a!) out) -> ()");
  m.def(
      "moe_init_routing.out(Tensor x, Tensor expert_idx, Tensor? scale=None, Tensor? offset=None, "
      "Tensor? topk_weight=None, int active_num=-1, int expert_capacity=-1, int expert_num=-1, "
      "int drop_pad_mode=0, int expert_tokens_num_type=0, bool expert_tokens_num_flag=False, "
      "int quant_mode=-1, int[]? active_expert_range=None, int row_idx_type=0, "
      "str numerics=\"atlas_a2\", *, Tensor(a!) expanded_x, Tensor(b!) expanded_row_idx, "
      "Tensor(c!) expert_tokens_count_or_cumsum, Tensor(d!) expanded_scale, "
      "Tensor(e!) expanded_topk_weight) -> ()");
  // Internal: a check that the kernels' loops really run on several of PyTorch's threads.
  m.def("_parallel_loop_threads(int num_tasks) -> int", &parallel_loop_threads);
  m.def("_uses_torch_pool() -> bool", &uses_torch_pool);
}

TORCH_LIBRARY_IMPL(moe_routing, CPU, m) {
  m.impl("moe_init_routing_grad", &moe_init_routing_grad_cpu);
  m.impl("moe_init_routing_v2", &moe_init_routing_v2_cpu);
  m.impl("moe_init_routing", &moe_init_routing_cpu);
  m.impl("moe_init_routing_grad.out", &moe_init_routing_grad_out_cpu);
  m.impl("moe_init_routing.out", &moe_init_routing_out_cpu);
}
