// The PyTorch binding: operator schemas in the namespace `moe_routing` and one device-generic
// implementation of each, registered for CPU and, in the CUDA build of the extension
// (MOE_ROUTING_TORCH_CUDA, python/CMakeLists.txt), for CUDA. Each implementation converts tensors
// to TensorViews on the device of the operator's first input and calls the C++ core; no semantics
// live here. Shapes for fake and meta tensors come from python/moe_routing/_fake.py, which mirrors
// the core's shape inference symbolically (tests compare the two).
#include <ATen/ATen.h>
#include <ATen/Config.h>
#include <ATen/EmptyTensor.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/InferenceMode.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/library.h>

#include <initializer_list>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "core/memory_hints.h"
#include "core/output_cache.h"
#include "moe_routing/moe_routing.hpp"

namespace {

using moe_routing::DType;
using moe_routing::Numerics;
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

/// An argument that an operator's schema names otherwise than the core: the core's name in its
/// messages, and the schema's (what a Python caller passes).
struct ArgumentName {
  const char* core;
  const char* schema;
};

/// moe_finalize_routing's top_k is `k` in CANN's torch-extension schema (ours): the Python caller
/// passes k; the core and the CLI (--top-k) keep top_k (the C ABI infers K from the shapes).
constexpr ArgumentName kFinalizeRoutingNames[] = {{"top_k", "k"}};

bool is_identifier_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

/// raise_if_error with the core's message naming each argument of `names` as the schema does: an
/// occurrence of the core's name is replaced only where it is a whole identifier (never inside a
/// longer one such as grad_top_k). The one place where the binding renames the core's words.
void raise_if_error(const Status& status, c10::ArrayRef<ArgumentName> names) {
  if (status.is_ok()) return;
  std::string message = status.message();
  for (const ArgumentName& name : names) {
    const std::string core(name.core);
    std::string renamed;
    size_t done = 0;
    for (size_t at = message.find(core); at != std::string::npos; at = message.find(core, at + 1)) {
      const size_t end = at + core.size();
      if ((at > 0 && is_identifier_char(message[at - 1])) ||
          (end < message.size() && is_identifier_char(message[end])))
        continue;
      renamed.append(message, done, at - done).append(name.schema);
      done = end;
    }
    message = renamed.append(message, done, std::string::npos);
  }
  raise_if_error(Status(status.code(), std::move(message)));
}

/// A torch dtype as messages name it: "float32", "float64" (torch.float64 in Python), not c10's
/// "Float" / "Double".
std::string dtype_text(at::ScalarType dtype) {
  return std::string(c10::getDtypeNames(dtype).first);
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
          dtype_text(t.scalar_type()));
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

/// A contiguous copy (or the tensor itself) of an optional input; absent -> an undefined tensor.
at::Tensor optional_contiguous(const std::optional<at::Tensor>& t) {
  return t.has_value() ? t->contiguous() : at::Tensor();
}

/// An optional input as a tensor reference for the overlap checks (undefined when absent).
const at::Tensor& or_absent(const std::optional<at::Tensor>& t) {
  static const at::Tensor absent;
  return t.has_value() ? *t : absent;
}

// ---- numerics ---------------------------------------------------------------------------------
// The one place where the binding's `numerics` (and the backward's explicit `order`) meet the
// core's attributes.

/// Text as the core's parsers read it: a C string, so a NUL inside (which Python strings may hold)
/// would end it early ("ascend_950\0junk" read as "ascend_950"); such text is refused with the
/// parser's message (the NUL shown as \0).
bool parsable(const std::string& value) { return value.find('\0') == std::string::npos; }
std::string shown(std::string value) {
  for (size_t at = value.find('\0'); at != std::string::npos; at = value.find('\0', at + 2))
    value.replace(at, 1, "\\0");
  return value;
}

Numerics parse_numerics(const char* op, c10::string_view text) {
  const std::string value(text);
  Numerics numerics = Numerics::atlas_a2;
  TORCH_CHECK_VALUE(parsable(value) && moe_routing::parse_numerics(value.c_str(), &numerics), op,
                    ": numerics must be \"atlas_a2\" or \"ascend_950\", got \"", shown(value),
                    "\"");
  return numerics;
}

/// The forward's quantisation arithmetic.
void set_numerics(Numerics numerics, moe_routing::MoeInitRoutingAttrs* attrs) {
  attrs->numerics = numerics;
}

/// The backward's float32 accumulation order: Atlas A2/A3 sum in the tree order, Ascend 950 in
/// the sequential one; `order` (when given) overrides what numerics implies.
void set_numerics(Numerics numerics, const std::optional<c10::string_view>& order,
                  moe_routing::MoeInitRoutingGradAttrs* attrs) {
  attrs->numerics = numerics;
  attrs->order = moe_routing::AccumulationOrder::from_numerics;
  if (!order.has_value()) return;
  const std::string text(*order);
  TORCH_CHECK_VALUE(
      parsable(text) && moe_routing::parse_accumulation_order(text.c_str(), &attrs->order),
      "moe_init_routing_grad: order must be \"tree\" or \"sequential\", got \"", shown(text), "\"");
}

// ---- execution on the operator's device -------------------------------------------------------

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

// ---- new CPU outputs ------------------------------------------------------------------------

/// The allocator of the large CPU outputs the operators return: buffers of the library's output
/// cache (core/output_cache.h), given back to it when the tensor's storage dies. A storage that
/// is resized (Tensor.resize_) gets its new memory here too; sizes the cache does not serve
/// (output_cache_serves), and memory the OS refused the cache, come from PyTorch's CPU allocator.
struct OutputCacheAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t n) override {
    if (moe_routing::detail::output_cache_serves(int64_t(n)))
      if (void* data = moe_routing::detail::acquire_output(int64_t(n)))
        return {data, data, &release, c10::Device(c10::DeviceType::CPU)};
    return c10::GetCPUAllocator()->allocate(n);
  }
  static void release(void* data) { moe_routing::detail::release_output(data); }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
};

c10::Allocator& output_cache_allocator() {
  static OutputCacheAllocator* const allocator = new OutputCacheAllocator;  // outlives tensors
  return *allocator;
}

/// The bytes of a tensor of `shape` and `dtype`, for an output whose shape is checked here
/// (`op` and `name` name the caller and the output in the errors): entries >= 0, at most 2^62
/// bytes.
int64_t checked_output_bytes(at::IntArrayRef shape, at::ScalarType dtype, const char* op,
                             const char* name) {
  for (const int64_t d : shape)
    TORCH_CHECK_VALUE(d >= 0, op, ": ", name, "'s shape entries must be >= 0, got ", shape);
  // An empty tensor has no bytes whatever its other extents ([2^40, 0, 4] is a valid output; the
  // running product used to overflow before it reached the zero).
  for (const int64_t d : shape)
    if (d == 0) return 0;
  int64_t bytes = int64_t(at::elementSize(dtype));
  for (const int64_t d : shape) {
    TORCH_CHECK_VALUE(bytes <= (int64_t(1) << 62) / d, op, ": ", name,
                      " must have at most 2^62 bytes (a CPU tensor's limit here), got ",
                      dtype_text(dtype), " ", shape);
    bytes *= d;
  }
  return bytes;
}

/// A new CPU tensor for an operator's output: of kOutputCacheMinBytes or more, from the output
/// cache while it is on, else from PyTorch's allocator (huge pages asked for from 4 MiB up,
/// before anything touches it). The shape is checked as checked_output_bytes says (the
/// operators' output shapes are validated before: there the checks hold, a few compares).
at::Tensor new_cpu_output(at::IntArrayRef shape, at::ScalarType dtype, const char* op,
                          const char* name) {
  if (moe_routing::detail::output_cache_serves(checked_output_bytes(shape, dtype, op, name)))
    return at::detail::empty_generic(shape, &output_cache_allocator(),
                                     c10::DispatchKeySet(c10::DispatchKey::CPU), dtype,
                                     std::nullopt);
  at::Tensor fresh = at::empty(shape, at::TensorOptions(at::kCPU).dtype(dtype));
  moe_routing::detail::advise_huge_pages(fresh.data_ptr(), int64_t(fresh.nbytes()));
  return fresh;
}

/// new_cpu_output for the Python package's own large CPU buffers (moe_routing.distributed's
/// received rows): shape entries >= 0, at most 2^62 bytes.
at::Tensor empty_from_output_cache(std::vector<int64_t> shape, at::ScalarType dtype) {
  return new_cpu_output(shape, dtype, "_empty_from_output_cache", "the tensor");
}

/// What the output cache holds and has done: [limit, idle, in use] bytes, hits, misses, and the
/// smallest output it serves.
std::vector<int64_t> output_cache_stats() {
  const moe_routing::detail::OutputCacheStats s = moe_routing::detail::output_cache_stats();
  return {s.limit_bytes, s.idle_bytes, s.in_use_bytes, s.hits, s.misses, s.min_bytes};
}

void set_output_cache_limit(int64_t bytes) {
  TORCH_CHECK_VALUE(bytes >= 0, "set_output_cache_limit: bytes must be >= 0, got ", bytes);
  moe_routing::detail::set_output_cache_limit(bytes);
}

void empty_output_cache() { moe_routing::detail::empty_output_cache(); }

/// Whether new CPU outputs get huge pages asked for (MOE_ROUTING_HUGE_PAGES at the first use, read
/// once; _set_huge_pages replaces it without touching the environment).
bool huge_pages_enabled() { return moe_routing::detail::huge_pages_enabled(); }
void set_huge_pages(bool enabled) { moe_routing::detail::set_huge_pages_enabled(enabled); }

/// The library's environment variables (MOE_ROUTING_HUGE_PAGES, MOE_ROUTING_OUTPUT_CACHE_MB,
/// MOE_ROUTING_NUM_THREADS) are each read once, at their first use. That first use is here, while
/// the extension loads under Python's import (the GIL held), not inside an operator call: PyTorch
/// runs those without the GIL, while another Python thread may write os.environ, and a getenv
/// racing a setenv is undefined behaviour.
[[maybe_unused]] const bool kEnvironmentRead = [] {
  moe_routing::detail::huge_pages_enabled();
  moe_routing::detail::output_cache_limit();
  moe_routing::get_num_threads();
  return true;
}();

/// One operator call on the device of its first input: every tensor must be there. Holds the
/// device current for the call (a no-op on the CPU) and converts tensors for the core.
class Call {
 public:
  Call(const char* op, const at::Tensor& first)
      : op_(op), device_(first.device()), guard_(device_) {
    TORCH_CHECK_NOT_IMPLEMENTED(device_.is_cpu() || device_.is_cuda(), op_,
                                ": tensors must be on the CPU or a CUDA device, got ", device_);
  }

  /// A view of a contiguous tensor. `t` must outlive the view. Its elements must lie within its
  /// storage: a storage shrunk after the tensor was made (untyped_storage().resize_) leaves a
  /// tensor whose shape reaches past its memory, which the kernels would read or write out of
  /// bounds (PyTorch's own operators corrupt the heap there).
  TensorView view(const char* name, const at::Tensor& t) const {
    check_device(name, t);
    if (t.numel() > 0 && t.has_storage()) {
      const int64_t item = int64_t(t.element_size());
      const int64_t storage_bytes = int64_t(t.storage().nbytes());
      // numel * item is the tensor's bytes (at most the storage's once the check passes); the
      // offset is compared first, so no product below overflows.
      TORCH_CHECK_VALUE(t.storage_offset() <= storage_bytes / item &&
                            t.numel() <= (storage_bytes / item - t.storage_offset()),
                        op_, ": ", name,
                        " must lie within its storage (was the storage resized after the tensor "
                        "was made?), got ",
                        t.numel(), " elements from element ", t.storage_offset(),
                        " of a storage of ", storage_bytes, " bytes");
    }
    TORCH_CHECK_VALUE(t.dim() <= moe_routing::kMaxDims, op_, ": ", name, " must have at most ",
                      moe_routing::kMaxDims, " dimensions, got ", t.dim());
    TensorView v;
    v.data = t.data_ptr();
    v.dtype = core_dtype(op_, name, t);
    v.ndim = int(t.dim());
    for (int d = 0; d < v.ndim; ++d) v.shape[d] = t.size(d);
    v.device = device_.is_cuda() ? moe_routing::Device::cuda : moe_routing::Device::cpu;
    return v;
  }

  /// A view of an optional input; absent -> the core's "absent" (default-constructed) view.
  TensorView optional_view(const char* name, const at::Tensor& t) const {
    return t.defined() ? view(name, t) : TensorView();
  }

  /// The output `spec` describes: `out` when the caller gave one (it must be exactly what would be
  /// allocated - resizing would hide a caller's mistake), else a new tensor. A new CPU tensor of
  /// a few MiB or more comes from the library's output cache (OutputCacheAllocator): memory a
  /// freed output of about that size left in place, else new memory with huge pages asked for.
  /// With the cache off (MOE_ROUTING_OUTPUT_CACHE_MB=0) it comes from PyTorch's allocator, with
  /// huge pages asked for before anything touches it (detail::advise_huge_pages;
  /// moe_routing.set_huge_pages(False) or MOE_ROUTING_HUGE_PAGES=0 turns that off). The first
  /// touch of new pages - for a training-size expanded_x longer than the kernel itself - is then
  /// paid once, not per call.
  at::Tensor output(const char* name, at::IntArrayRef shape, DType core_type,
                    const at::Tensor* out) const {
    const at::ScalarType dtype = torch_dtype(core_type);
    if (out == nullptr)
      return device_.is_cpu() ? new_cpu_output(shape, dtype, op_, name)
                              : at::empty(shape, at::TensorOptions(device_).dtype(dtype));
    TORCH_CHECK_VALUE(out->sizes() == shape && out->scalar_type() == dtype &&
                          out->is_contiguous() && out->device() == device_,
                      op_, ": out ", name, " must be a contiguous ",
                      moe_routing::dtype_name(core_type), " tensor of shape ", shape, " on ",
                      device_, " (the device of the operator's first input), got ",
                      dtype_text(out->scalar_type()), " ", out->sizes(),
                      out->is_contiguous() ? "" : " (non-contiguous)", " on ", out->device());
    // PyTorch refuses an in-place update of an inference tensor outside inference mode (its out=
    // operators raise after writing; here nothing is written). The ADInplaceOrView kernel that
    // would raise it is not even reached when every argument is an inference tensor.
    TORCH_CHECK(!out->is_inference() || c10::InferenceMode::is_enabled(), op_, ": out ", name,
                " must not be an inference tensor outside torch.inference_mode() (PyTorch allows "
                "no in-place update of one there), got an inference tensor");
    return *out;
  }
  at::Tensor output(const char* name, const moe_routing::OutputSpec& spec,
                    const at::Tensor* out) const {
    return output(name, at::IntArrayRef(spec.shape, spec.ndim), spec.dtype, out);
  }

  /// out= tensors must share no memory with the inputs or with each other (the kernels read
  /// inputs while they write outputs): PyTorch's own out= operators' check and message.
  static void check_no_overlap(std::initializer_list<const at::Tensor*> outputs,
                               std::initializer_list<const at::Tensor*> inputs) {
    for (auto out = outputs.begin(); out != outputs.end(); ++out) {
      if (!(*out)->defined()) continue;  // an optional output not asked for
      for (const at::Tensor* input : inputs) {
        if (input->defined()) at::assert_no_overlap(**out, *input);
      }
      for (auto other = outputs.begin(); other != out; ++other)
        if ((*other)->defined()) at::assert_no_overlap(**out, **other);
    }
  }

  /// CPU: PyTorch's thread count (honours torch.set_num_threads). CUDA: torch's current stream
  /// of the device.
  moe_routing::ExecConfig exec_config() const {
    moe_routing::ExecConfig config;
    if (device_.is_cpu()) {
      config.num_threads = at::get_num_threads();
    } else {
      const c10::impl::VirtualGuardImpl impl(device_.type());
      config.stream = impl.getStreamNativeHandle(impl.getStream(device_));
    }
    return config;
  }

 private:
  void check_device(const char* name, const at::Tensor& t) const {
    TORCH_CHECK_VALUE(t.device() == device_, op_, ": ", name, " must be on ", device_,
                      " (the device of the operator's first input), got ", t.device());
  }

  const char* op_;
  at::Device device_;
  c10::DeviceGuard guard_;
};

// ---- operators --------------------------------------------------------------------------------

/// The backward into `out` (allocated when null).
at::Tensor moe_init_routing_grad_into(const at::Tensor& grad_expanded_x,
                                      const at::Tensor& expanded_row_idx, int64_t top_k,
                                      int64_t drop_pad_mode, int64_t active_num,
                                      c10::string_view numerics,
                                      std::optional<c10::string_view> order,
                                      const at::Tensor* out) {
  constexpr const char* op = "moe_init_routing_grad";
  const Call call(op, grad_expanded_x);
  moe_routing::MoeInitRoutingGradAttrs attrs;
  attrs.top_k = top_k;
  attrs.drop_pad_mode = drop_pad_mode;
  attrs.active_num = active_num;
  set_numerics(parse_numerics(op, numerics), order, &attrs);
  const at::Tensor grad = grad_expanded_x.contiguous();
  const at::Tensor idx = expanded_row_idx.contiguous();
  const TensorView grad_view = call.view("grad_expanded_x", grad);
  const TensorView idx_view = call.view("expanded_row_idx", idx);
  moe_routing::MoeInitRoutingGradPlan plan;
  raise_if_error(moe_routing::infer_moe_init_routing_grad(grad_view, idx_view, attrs, &plan));
  const at::Tensor grad_x =
      call.output("grad_x", at::IntArrayRef(plan.grad_x_shape, 2), plan.dtype, out);
  if (out != nullptr) Call::check_no_overlap({&grad_x}, {&grad_expanded_x, &expanded_row_idx});
  raise_if_error(moe_routing::moe_init_routing_grad(
      grad_view, idx_view, attrs, call.view("grad_x", grad_x), call.exec_config()));
  return grad_x;
}

at::Tensor moe_init_routing_grad(const at::Tensor& grad_expanded_x,
                                 const at::Tensor& expanded_row_idx, int64_t top_k,
                                 int64_t drop_pad_mode, int64_t active_num,
                                 c10::string_view numerics, std::optional<c10::string_view> order) {
  return moe_init_routing_grad_into(grad_expanded_x, expanded_row_idx, top_k, drop_pad_mode,
                                    active_num, numerics, order, nullptr);
}

void moe_init_routing_grad_out(const at::Tensor& grad_expanded_x,
                               const at::Tensor& expanded_row_idx, int64_t top_k,
                               int64_t drop_pad_mode, int64_t active_num, c10::string_view numerics,
                               std::optional<c10::string_view> order, at::Tensor& out) {
  moe_init_routing_grad_into(grad_expanded_x, expanded_row_idx, top_k, drop_pad_mode, active_num,
                             numerics, order, &out);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> moe_init_routing_v2(
    const at::Tensor& x, const at::Tensor& expert_idx, int64_t active_num, int64_t expert_capacity,
    int64_t expert_num, int64_t drop_pad_mode, int64_t expert_tokens_count_or_cumsum_flag,
    bool expert_tokens_before_capacity_flag, c10::string_view numerics) {
  constexpr const char* op = "moe_init_routing_v2";
  const Call call(op, x);
  moe_routing::MoeInitRoutingV2Attrs attrs;
  attrs.active_num = active_num;
  attrs.expert_capacity = expert_capacity;
  attrs.expert_num = expert_num;
  attrs.drop_pad_mode = drop_pad_mode;
  attrs.expert_tokens_count_or_cumsum_flag = expert_tokens_count_or_cumsum_flag;
  attrs.expert_tokens_before_capacity_flag = expert_tokens_before_capacity_flag;
  // Nothing in this forward depends on the numerics; the argument is there so that autograd can
  // carry it to the backward, and is checked like everywhere else.
  parse_numerics(op, numerics);
  const at::Tensor x_c = x.contiguous();
  const at::Tensor idx_c = expert_idx.contiguous();
  const TensorView x_view = call.view("x", x_c);
  const TensorView idx_view = call.view("expert_idx", idx_c);
  moe_routing::MoeInitRoutingV2Plan plan;
  raise_if_error(moe_routing::infer_moe_init_routing_v2(x_view, idx_view, attrs, &plan));
  const at::Tensor expanded_x = call.output("expanded_x", plan.expanded_x, nullptr);
  const at::Tensor expanded_row_idx =
      call.output("expanded_row_idx", plan.expanded_row_idx, nullptr);
  const at::Tensor counts =
      call.output("expert_tokens_count_or_cumsum", plan.expert_tokens_count_or_cumsum, nullptr);
  const at::Tensor before_capacity =
      call.output("expert_tokens_before_capacity", plan.expert_tokens_before_capacity, nullptr);
  raise_if_error(moe_routing::moe_init_routing_v2(
      x_view, idx_view, attrs, call.view("expanded_x", expanded_x),
      call.view("expanded_row_idx", expanded_row_idx),
      call.view("expert_tokens_count_or_cumsum", counts),
      call.view("expert_tokens_before_capacity", before_capacity), call.exec_config()));
  return {expanded_x, expanded_row_idx, counts, before_capacity};
}

using RoutingOutputs = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

/// The torch-API forward into `out` (five tensors; allocated when null).
RoutingOutputs moe_init_routing_into(
    const at::Tensor& x, const at::Tensor& expert_idx, const std::optional<at::Tensor>& scale,
    const std::optional<at::Tensor>& offset, const std::optional<at::Tensor>& topk_weight,
    int64_t active_num, int64_t expert_capacity, int64_t expert_num, int64_t drop_pad_mode,
    int64_t expert_tokens_num_type, bool expert_tokens_num_flag, int64_t quant_mode,
    at::OptionalIntArrayRef active_expert_range, int64_t row_idx_type,
    std::optional<int64_t> x_dtype, c10::string_view numerics, const at::Tensor* out) {
  constexpr const char* op = "moe_init_routing";
  const Call call(op, x);
  // CANN declares with x_dtype the real type of data stored as uint8 (float4_e2m1, hifloat8,
  // int4) for its quant modes 2..17, none of which exists here.
  TORCH_CHECK_NOT_IMPLEMENTED(!x_dtype.has_value(), op,
                              ": x_dtype must be None (CANN's float4/hifloat8/int4 data types "
                              "are not supported), got ",
                              x_dtype.value_or(0));
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
  set_numerics(parse_numerics(op, numerics), &attrs);
  const at::Tensor x_c = x.contiguous();
  const at::Tensor idx_c = expert_idx.contiguous();
  const at::Tensor scale_c = optional_contiguous(scale);
  const at::Tensor offset_c = optional_contiguous(offset);
  const at::Tensor weight_c = optional_contiguous(topk_weight);
  const TensorView x_view = call.view("x", x_c);
  const TensorView idx_view = call.view("expert_idx", idx_c);
  const TensorView scale_view = call.optional_view("scale", scale_c);
  const TensorView offset_view = call.optional_view("offset", offset_c);
  const TensorView weight_view = call.optional_view("topk_weight", weight_c);
  moe_routing::MoeInitRoutingPlan plan;
  raise_if_error(moe_routing::infer_moe_init_routing(x_view, idx_view, scale_view, offset_view,
                                                     weight_view, attrs, &plan));
  const moe_routing::OutputSpec* specs[5] = {&plan.expanded_x, &plan.expanded_row_idx,
                                             &plan.expert_tokens_count_or_cumsum,
                                             &plan.expanded_scale, &plan.expanded_topk_weight};
  const char* names[5] = {"expanded_x", "expanded_row_idx", "expert_tokens_count_or_cumsum",
                          "expanded_scale", "expanded_topk_weight"};
  at::Tensor o[5];
  for (int i = 0; i < 5; ++i) o[i] = call.output(names[i], *specs[i], out ? &out[i] : nullptr);
  if (out != nullptr) {
    Call::check_no_overlap(
        {&o[0], &o[1], &o[2], &o[3], &o[4]},
        {&x, &expert_idx, &or_absent(scale), &or_absent(offset), &or_absent(topk_weight)});
  }
  raise_if_error(moe_routing::moe_init_routing(
      x_view, idx_view, scale_view, offset_view, weight_view, attrs, call.view(names[0], o[0]),
      call.view(names[1], o[1]), call.view(names[2], o[2]), call.view(names[3], o[3]),
      call.view(names[4], o[4]), call.exec_config()));
  return {o[0], o[1], o[2], o[3], o[4]};
}

RoutingOutputs moe_init_routing(const at::Tensor& x, const at::Tensor& expert_idx,
                                const std::optional<at::Tensor>& scale,
                                const std::optional<at::Tensor>& offset,
                                const std::optional<at::Tensor>& topk_weight, int64_t active_num,
                                int64_t expert_capacity, int64_t expert_num, int64_t drop_pad_mode,
                                int64_t expert_tokens_num_type, bool expert_tokens_num_flag,
                                int64_t quant_mode, at::OptionalIntArrayRef active_expert_range,
                                int64_t row_idx_type, std::optional<int64_t> x_dtype,
                                c10::string_view numerics) {
  return moe_init_routing_into(x, expert_idx, scale, offset, topk_weight, active_num,
                               expert_capacity, expert_num, drop_pad_mode, expert_tokens_num_type,
                               expert_tokens_num_flag, quant_mode, active_expert_range,
                               row_idx_type, x_dtype, numerics, nullptr);
}

void moe_init_routing_out(const at::Tensor& x, const at::Tensor& expert_idx,
                          const std::optional<at::Tensor>& scale,
                          const std::optional<at::Tensor>& offset,
                          const std::optional<at::Tensor>& topk_weight, int64_t active_num,
                          int64_t expert_capacity, int64_t expert_num, int64_t drop_pad_mode,
                          int64_t expert_tokens_num_type, bool expert_tokens_num_flag,
                          int64_t quant_mode, at::OptionalIntArrayRef active_expert_range,
                          int64_t row_idx_type, std::optional<int64_t> x_dtype,
                          c10::string_view numerics, at::Tensor& expanded_x,
                          at::Tensor& expanded_row_idx, at::Tensor& expert_tokens_count_or_cumsum,
                          at::Tensor& expanded_scale, at::Tensor& expanded_topk_weight) {
  const at::Tensor out[5] = {expanded_x, expanded_row_idx, expert_tokens_count_or_cumsum,
                             expanded_scale, expanded_topk_weight};
  moe_init_routing_into(x, expert_idx, scale, offset, topk_weight, active_num, expert_capacity,
                        expert_num, drop_pad_mode, expert_tokens_num_type, expert_tokens_num_flag,
                        quant_mode, active_expert_range, row_idx_type, x_dtype, numerics, out);
}

// ---- the combine: moe_finalize_routing and its grad -------------------------------------------

/// An expert-range attribute of CANN's V3/V4: None is "no such experts" ([-1, -1]); otherwise
/// exactly two ints [start, end).
moe_routing::ExpertRange expert_range(const char* op, const char* name,
                                      at::OptionalIntArrayRef range) {
  moe_routing::ExpertRange r;
  if (!range.has_value()) return r;
  TORCH_CHECK_VALUE(range->size() == 2, op, ": ", name,
                    " must be a list of two ints [start, end], got ", range->size(), " values");
  r.start = (*range)[0];
  r.end = (*range)[1];
  return r;
}

moe_routing::FinalizeRoutingApi parse_api(const char* op, c10::string_view text) {
  const std::string value(text);
  moe_routing::FinalizeRoutingApi api = moe_routing::FinalizeRoutingApi::v2;
  TORCH_CHECK_VALUE(parsable(value) && moe_routing::parse_finalize_routing_api(value.c_str(), &api),
                    op, ": api must be \"v1\" or \"v2\", got \"", shown(value), "\"");
  return api;
}

/// The functional and the out= kernel of an operator computed by `Into(out, args...)` (`out` null:
/// allocated), so that its long argument list is written once.
template <auto Into>
struct FunctionalAndOut;
template <typename... Args, at::Tensor (*Into)(const at::Tensor*, Args...)>
struct FunctionalAndOut<Into> {
  static at::Tensor functional(Args... args) { return Into(nullptr, args...); }
  static void out(Args... args, at::Tensor& out) { Into(&out, args...); }
};

/// The forward into `out` (allocated when null). CANN's schema types drop_pad_mode and k as
/// optional ints: None is their default (0 and 1).
at::Tensor moe_finalize_routing_into(
    const at::Tensor* out, const at::Tensor& expanded_x, const at::Tensor& expanded_row_idx,
    const std::optional<at::Tensor>& x1, const std::optional<at::Tensor>& x2,
    const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& scales,
    const std::optional<at::Tensor>& expert_idx, const std::optional<at::Tensor>& x,
    const std::optional<at::Tensor>& alpha1, const std::optional<at::Tensor>& alpha2,
    const std::optional<at::Tensor>& v, std::optional<int64_t> drop_pad_mode,
    at::OptionalIntArrayRef zero_expert_range, at::OptionalIntArrayRef copy_expert_range,
    at::OptionalIntArrayRef constant_expert_range, std::optional<int64_t> k,
    c10::string_view numerics, c10::string_view api) {
  constexpr const char* op = "moe_finalize_routing";
  const Call call(op, expanded_x);
  moe_routing::MoeFinalizeRoutingAttrs attrs;
  attrs.drop_pad_mode = drop_pad_mode.value_or(0);
  attrs.top_k = k.value_or(1);
  attrs.zero_expert_range = expert_range(op, "zero_expert_range", zero_expert_range);
  attrs.copy_expert_range = expert_range(op, "copy_expert_range", copy_expert_range);
  attrs.constant_expert_range = expert_range(op, "constant_expert_range", constant_expert_range);
  attrs.numerics = parse_numerics(op, numerics);
  attrs.api = parse_api(op, api);
  const at::Tensor ex_c = expanded_x.contiguous();
  const at::Tensor idx_c = expanded_row_idx.contiguous();
  constexpr int kOptionals = 9;
  const std::optional<at::Tensor>* optionals[kOptionals] = {
      &x1, &x2, &bias, &scales, &expert_idx, &x, &alpha1, &alpha2, &v};
  const char* names[kOptionals] = {"x1", "x2",     "bias",   "scales", "expert_idx",
                                   "x",  "alpha1", "alpha2", "v"};
  moe_routing::MoeFinalizeRoutingInputs in;
  TensorView* views[kOptionals] = {&in.x1, &in.x2,     &in.bias,   &in.scales, &in.expert_idx,
                                   &in.x,  &in.alpha1, &in.alpha2, &in.v};
  at::Tensor contiguous[kOptionals];
  in.expanded_x = call.view("expanded_x", ex_c);
  in.expanded_row_idx = call.view("expanded_row_idx", idx_c);
  for (int i = 0; i < kOptionals; ++i) {
    contiguous[i] = optional_contiguous(*optionals[i]);
    *views[i] = call.optional_view(names[i], contiguous[i]);
  }
  moe_routing::MoeFinalizeRoutingPlan plan;
  raise_if_error(moe_routing::infer_moe_finalize_routing(in, attrs, &plan), kFinalizeRoutingNames);
  const at::Tensor result = call.output("y", plan.out, out);
  if (out != nullptr) {
    Call::check_no_overlap(
        {&result}, {&expanded_x, &expanded_row_idx, &or_absent(x1), &or_absent(x2),
                    &or_absent(bias), &or_absent(scales), &or_absent(expert_idx), &or_absent(x),
                    &or_absent(alpha1), &or_absent(alpha2), &or_absent(v)});
  }
  raise_if_error(
      moe_routing::moe_finalize_routing(in, attrs, call.view("out", result), call.exec_config()),
      kFinalizeRoutingNames);
  return result;
}

using FinalizeGradOutputs = std::tuple<at::Tensor, at::Tensor, at::Tensor>;

/// The grad: (grad_expanded_x, grad_scales, grad_bias). Functional (`out` null): grad_scales /
/// grad_bias are computed when asked for and the inputs allow it (scales and expanded_x / bias),
/// and are empty [0] tensors otherwise. out= (`out` three tensors): exactly the defined ones are
/// computed; the core refuses one that the inputs cannot produce.
FinalizeGradOutputs moe_finalize_routing_grad_into(
    const at::Tensor& grad_y, const at::Tensor& expanded_row_idx,
    const std::optional<at::Tensor>& expanded_x, const std::optional<at::Tensor>& scales,
    const std::optional<at::Tensor>& expert_idx, const std::optional<at::Tensor>& bias,
    int64_t drop_pad_mode, int64_t active_num, int64_t expert_num, int64_t expert_capacity,
    c10::string_view numerics, bool compute_grad_scales, bool compute_grad_bias,
    const at::Tensor* out) {
  constexpr const char* op = "moe_finalize_routing_grad";
  const Call call(op, grad_y);
  moe_routing::MoeFinalizeRoutingGradAttrs attrs;
  attrs.drop_pad_mode = drop_pad_mode;
  attrs.active_num = active_num;
  attrs.expert_num = expert_num;
  attrs.expert_capacity = expert_capacity;
  attrs.numerics = parse_numerics(op, numerics);
  const at::Tensor gy_c = grad_y.contiguous();
  const at::Tensor idx_c = expanded_row_idx.contiguous();
  const at::Tensor ex_c = optional_contiguous(expanded_x);
  const at::Tensor scales_c = optional_contiguous(scales);
  const at::Tensor expert_c = optional_contiguous(expert_idx);
  const at::Tensor bias_c = optional_contiguous(bias);
  moe_routing::MoeFinalizeRoutingGradInputs in;
  in.grad_y = call.view("grad_y", gy_c);
  in.expanded_row_idx = call.view("expanded_row_idx", idx_c);
  in.expanded_x = call.optional_view("expanded_x", ex_c);
  in.scales = call.optional_view("scales", scales_c);
  in.expert_idx = call.optional_view("expert_idx", expert_c);
  in.bias = call.optional_view("bias", bias_c);
  moe_routing::MoeFinalizeRoutingGradPlan plan;
  raise_if_error(moe_routing::infer_moe_finalize_routing_grad(in, attrs, &plan));

  // An optional output: out=, planned -> checked like any out=; out=, not producible -> passed
  // on for the core's message; functional -> allocated when wanted and producible, else [0].
  const auto optional_output = [&](const char* name, const moe_routing::OutputSpec& spec,
                                   DType dtype, bool wanted, const at::Tensor* given) {
    if (out != nullptr)
      return given->defined() && spec.produced ? call.output(name, spec, given) : *given;
    if (wanted && spec.produced) return call.output(name, spec, nullptr);
    return at::empty({0}, at::TensorOptions(grad_y.device()).dtype(torch_dtype(dtype)));
  };
  const at::Tensor grad_expanded_x =
      call.output("grad_expanded_x", plan.grad_expanded_x, out ? &out[0] : nullptr);
  const at::Tensor grad_scales = optional_output("grad_scales", plan.grad_scales, plan.scales_dtype,
                                                 compute_grad_scales, out ? &out[1] : nullptr);
  const at::Tensor grad_bias = optional_output("grad_bias", plan.grad_bias, plan.dtype,
                                               compute_grad_bias, out ? &out[2] : nullptr);
  const bool scales_wanted =
      out ? out[1].defined() : compute_grad_scales && plan.grad_scales.produced;
  const bool bias_wanted = out ? out[2].defined() : compute_grad_bias && plan.grad_bias.produced;
  if (out != nullptr) {
    Call::check_no_overlap({&grad_expanded_x, &grad_scales, &grad_bias},
                           {&grad_y, &expanded_row_idx, &or_absent(expanded_x), &or_absent(scales),
                            &or_absent(expert_idx), &or_absent(bias)});
  }
  moe_routing::MoeFinalizeRoutingGradOutputs outputs;
  outputs.grad_expanded_x = call.view("grad_expanded_x", grad_expanded_x);
  if (scales_wanted) outputs.grad_scales = call.view("grad_scales", grad_scales);
  if (bias_wanted) outputs.grad_bias = call.view("grad_bias", grad_bias);
  raise_if_error(moe_routing::moe_finalize_routing_grad(in, attrs, outputs, call.exec_config()));
  return {grad_expanded_x, grad_scales, grad_bias};
}

FinalizeGradOutputs moe_finalize_routing_grad(
    const at::Tensor& grad_y, const at::Tensor& expanded_row_idx,
    const std::optional<at::Tensor>& expanded_x, const std::optional<at::Tensor>& scales,
    const std::optional<at::Tensor>& expert_idx, const std::optional<at::Tensor>& bias,
    int64_t drop_pad_mode, int64_t active_num, int64_t expert_num, int64_t expert_capacity,
    c10::string_view numerics, bool compute_grad_scales, bool compute_grad_bias) {
  return moe_finalize_routing_grad_into(
      grad_y, expanded_row_idx, expanded_x, scales, expert_idx, bias, drop_pad_mode, active_num,
      expert_num, expert_capacity, numerics, compute_grad_scales, compute_grad_bias, nullptr);
}

void moe_finalize_routing_grad_out(const at::Tensor& grad_y, const at::Tensor& expanded_row_idx,
                                   const std::optional<at::Tensor>& expanded_x,
                                   const std::optional<at::Tensor>& scales,
                                   const std::optional<at::Tensor>& expert_idx,
                                   const std::optional<at::Tensor>& bias, int64_t drop_pad_mode,
                                   int64_t active_num, int64_t expert_num, int64_t expert_capacity,
                                   c10::string_view numerics, at::Tensor& grad_expanded_x,
                                   const std::optional<at::Tensor>& grad_scales,
                                   const std::optional<at::Tensor>& grad_bias) {
  const at::Tensor out[3] = {grad_expanded_x, or_absent(grad_scales), or_absent(grad_bias)};
  moe_finalize_routing_grad_into(grad_y, expanded_row_idx, expanded_x, scales, expert_idx, bias,
                                 drop_pad_mode, active_num, expert_num, expert_capacity, numerics,
                                 false, false, out);
}

/// Refuses a call with a forward-mode tangent on any tensor argument (torch.func.jvp, jacfwd,
/// torch.autograd.forward_ad; in grad mode or not) with a NotImplementedError naming the operator
/// and the argument: the operators have no forward derivative, and PyTorch's autograd kernel of
/// custom operators runs them on the primal alone, so the tangent was silently dropped (jvp
/// returned zeros, a dual output had none). `out` says whether the call is an out= overload (not
/// differentiable in any mode, as PyTorch's out= operators).
void refuse_forward_ad(const c10::OperatorHandle& op, const torch::jit::Stack& stack, bool out) {
  const std::vector<c10::Argument>& arguments = op.schema().arguments();
  const auto first = stack.end() - static_cast<std::ptrdiff_t>(arguments.size());
  for (size_t i = 0; i < arguments.size(); ++i) {
    const c10::IValue& arg = first[static_cast<std::ptrdiff_t>(i)];
    if (arg.isTensor() && arg.toTensor().defined() &&
        arg.toTensor()._fw_grad(/*level=*/0).defined()) {
      const std::string& name = op.schema().name();
      TORCH_CHECK_NOT_IMPLEMENTED(
          false, name.substr(name.find("::") + 2),
          ": forward-mode AD (torch.func.jvp, jacfwd, torch.autograd.forward_ad) is not "
          "supported",
          out ? " with out= (out= calls are not differentiable)" : "", ", got ",
          arguments[i].name(),
          " with a tangent; differentiate in reverse mode with torch.autograd (backward, "
          "torch.autograd.grad)",
          out ? ", without out=" : "");
    }
  }
}

/// ADInplaceOrView kernel of the functional operators: refuse_forward_ad, then the device
/// kernel. Their Autograd kernel is the Python one of torch.library.register_autograd
/// (_autograd.py), which hands a call with no input requiring grad - the case of a dual tensor -
/// on below the Autograd key with the tangents still attached; this key runs next, also under the
/// public functions' fast path (torch._C._AutoDispatchBelowAutograd excludes only the Autograd
/// keys) and under torch.func.jvp / jacfwd (the transform's wrappers carry the tangent at level
/// 0). Where an input requires grad in grad mode, register_autograd's autograd.Function runs the
/// call with forward grad mode off, which hides the tangents here: _autograd.py refuses that
/// path in setup_context. Inference mode skips this key, as it skips PyTorch's forward AD for its
/// own operators (torch.sin of a dual tensor there has no tangent either).
void functional_refuse_forward_ad(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                                  torch::jit::Stack* stack) {
  refuse_forward_ad(op, *stack, /*out=*/false);
  op.redispatchBoxed(keys & c10::after_ADInplaceOrView_keyset, stack);
}

/// Autograd kernel of the out= overloads: like PyTorch's own out= operators they are not
/// differentiable, so with grad mode on, any argument that requires grad (an input, or an out=
/// tensor such as a leaf parameter that would be overwritten behind autograd's back) is an error
/// with PyTorch's message. An argument with a forward-mode tangent is refused (refuse_forward_ad),
/// as PyTorch's out= operators do: without the check the tangent was dropped and jvp returned
/// zeros. Otherwise the call goes on to the device kernel.
void out_overload_autograd(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                           torch::jit::Stack* stack) {
  refuse_forward_ad(op, *stack, /*out=*/true);
  if (at::GradMode::is_enabled()) {
    const size_t num_args = op.schema().arguments().size();
    for (auto arg = stack->end() - num_args; arg != stack->end(); ++arg) {
      if (arg->isTensor() && arg->toTensor().requires_grad()) {
        const std::string& name = op.schema().name();
        TORCH_CHECK(false, name.substr(name.find("::") + 2),
                    "(): functions with out=... arguments don't support automatic "
                    "differentiation, but one of the arguments requires grad.");
      }
    }
  }
  op.redispatchBoxed(keys & c10::after_autograd_keyset, stack);
}

/// ADInplaceOrView kernel of the out= overloads: after the device kernel, bumps the version
/// counter of every out= tensor written, as PyTorch's out= operators do at this key (so also
/// under no_grad and, for normal tensors, in inference mode). A tensor autograd saved for a
/// backward (expanded_row_idx of a functional forward, say) and overwritten here then makes that
/// backward raise PyTorch's "modified by an inplace operation" error instead of silently
/// computing the gradient from the new contents.
void out_overload_bump_versions(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                                torch::jit::Stack* stack) {
  const std::vector<c10::Argument>& arguments = op.schema().arguments();
  const auto first = stack->end() - static_cast<std::ptrdiff_t>(arguments.size());
  std::vector<at::Tensor> written;
  for (size_t i = 0; i < arguments.size(); ++i) {
    const c10::IValue& arg = first[static_cast<std::ptrdiff_t>(i)];
    const c10::AliasInfo* alias = arguments[i].alias_info();
    // None for an optional out= not asked for.
    if (alias != nullptr && alias->isWrite() && arg.isTensor()) written.push_back(arg.toTensor());
  }
  op.redispatchBoxed(keys & c10::after_ADInplaceOrView_keyset, stack);
  for (const at::Tensor& t : written) t.unsafeGetTensorImpl()->bump_version();
}

/// Negative and Conjugate kernels of the out= overloads. PyTorch's fallback for a tensor whose
/// negation or conjugation is a lazy bit (t._neg_view(), c.conj().imag) runs the operator on
/// resolved copies and then expects it to return its out= tensors, which these overloads (they
/// return nothing) do not: an internal assert, and the process crashed on the next call. An out=
/// tensor with such a bit is refused, naming it; an input with one is resolved into a copy, as the
/// fallback does for the functional operators.
void out_overload_lazy_views(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                             torch::jit::Stack* stack) {
  const std::vector<c10::Argument>& arguments = op.schema().arguments();
  const auto first = stack->end() - static_cast<std::ptrdiff_t>(arguments.size());
  for (size_t i = 0; i < arguments.size(); ++i) {
    c10::IValue& arg = first[static_cast<std::ptrdiff_t>(i)];
    if (!arg.isTensor() || !arg.toTensor().defined()) continue;
    const at::Tensor t = arg.toTensor();
    if (!t.is_neg() && !t.is_conj()) continue;
    const c10::AliasInfo* alias = arguments[i].alias_info();
    if (alias == nullptr || !alias->isWrite()) {
      arg = t.resolve_conj().resolve_neg();
      continue;
    }
    const std::string& name = op.schema().name();
    const char* kind = t.is_neg() ? "negated" : "conjugated";
    TORCH_CHECK_VALUE(false, name.substr(name.find("::") + 2), ": ", arguments[i].name(),
                      " must not be a lazily ", kind, " view (its values are stored un", kind,
                      "; write into a plain tensor), got one");
  }
  op.redispatchBoxed(keys.remove(c10::DispatchKey::Negative).remove(c10::DispatchKey::Conjugate),
                     stack);
}

/// The device kernels, the same functions on every device.
void register_kernels(torch::Library& m) {
  m.impl("moe_init_routing_grad", TORCH_FN(moe_init_routing_grad));
  m.impl("moe_init_routing_v2", TORCH_FN(moe_init_routing_v2));
  m.impl("moe_init_routing", TORCH_FN(moe_init_routing));
  m.impl("moe_init_routing_grad.out", TORCH_FN(moe_init_routing_grad_out));
  m.impl("moe_init_routing.out", TORCH_FN(moe_init_routing_out));
  using Finalize = FunctionalAndOut<&moe_finalize_routing_into>;
  m.impl("moe_finalize_routing", TORCH_FN(Finalize::functional));
  m.impl("moe_finalize_routing.out", TORCH_FN(Finalize::out));
  m.impl("moe_finalize_routing_grad", TORCH_FN(moe_finalize_routing_grad));
  m.impl("moe_finalize_routing_grad.out", TORCH_FN(moe_finalize_routing_grad_out));
}

}  // namespace

// The positional arguments of moe_init_routing and moe_init_routing_grad are those of CANN's
// cann_ops_transformer functions, in CANN's order with CANN's defaults (active_num a SymInt, so
// that torch.compile keeps it symbolic; x_dtype an int as torch_npu's dtype codes are). What is
// ours comes after `*`: numerics, the backward's order override, the out= tensors.
TORCH_LIBRARY(moe_routing, m) {
  m.def(
      "moe_init_routing_grad(Tensor grad_expanded_x, Tensor expanded_row_idx, int top_k, "
      "int drop_pad_mode=0, SymInt active_num=0, *, str numerics=\"atlas_a2\", str? order=None) "
      "-> Tensor");
  m.def(
      "moe_init_routing_v2(Tensor x, Tensor expert_idx, SymInt active_num=0, int "
      "expert_capacity=0, "
      "int expert_num=0, int drop_pad_mode=0, int expert_tokens_count_or_cumsum_flag=0, "
      "bool expert_tokens_before_capacity_flag=False, *, str numerics=\"atlas_a2\") "
      "-> (Tensor, Tensor, Tensor, Tensor)");
  m.def(
      "moe_init_routing(Tensor x, Tensor expert_idx, Tensor? scale=None, Tensor? offset=None, "
      "Tensor? topk_weight=None, SymInt active_num=-1, int expert_capacity=-1, "
      "int expert_num=-1, int drop_pad_mode=0, int expert_tokens_num_type=0, "
      "bool expert_tokens_num_flag=False, int quant_mode=-1, int[]? active_expert_range=None, "
      "int row_idx_type=0, int? x_dtype=None, *, str numerics=\"atlas_a2\") "
      "-> (Tensor, Tensor, Tensor, Tensor, Tensor)");
  // out= overloads: write into caller-owned tensors of exactly the planned shapes (no allocation,
  // so no page faults of fresh memory on every call). They return nothing, as torch requires of
  // mutating custom operators.
  m.def(
      "moe_init_routing_grad.out(Tensor grad_expanded_x, Tensor expanded_row_idx, int top_k, "
      "int drop_pad_mode=0, SymInt active_num=0, *, str numerics=\"atlas_a2\", str? order=None, "
      "Tensor(a!) out) -> ()");
  m.def(
      "moe_init_routing.out(Tensor x, Tensor expert_idx, Tensor? scale=None, Tensor? offset=None, "
      "Tensor? topk_weight=None, SymInt active_num=-1, int expert_capacity=-1, "
      "int expert_num=-1, int drop_pad_mode=0, int expert_tokens_num_type=0, "
      "bool expert_tokens_num_flag=False, int quant_mode=-1, int[]? active_expert_range=None, "
      "int row_idx_type=0, int? x_dtype=None, *, str numerics=\"atlas_a2\", "
      "Tensor(a!) expanded_x, Tensor(b!) expanded_row_idx, "
      "Tensor(c!) expert_tokens_count_or_cumsum, Tensor(d!) expanded_scale, "
      "Tensor(e!) expanded_topk_weight) -> ()");
  // The combine: CANN's cann_ops_transformer.moe_finalize_routing arguments in CANN's order
  // (CANN's Tensor? arguments have no defaults in its schema; ours default to None, which accepts
  // the same calls), and aclnnMoeFinalizeRoutingV2Grad's. The grad also returns our grad_bias
  // (empty unless compute_grad_bias, for autograd); active_num, expert_num and expert_capacity are
  // SymInts so that autograd's backward, which passes expanded_x's extents, stays symbolic under
  // torch.compile.
  m.def(
      "moe_finalize_routing(Tensor expanded_x, Tensor expanded_row_idx, Tensor? x1=None, "
      "Tensor? x2=None, Tensor? bias=None, Tensor? scales=None, Tensor? expert_idx=None, "
      "Tensor? x=None, Tensor? alpha1=None, Tensor? alpha2=None, Tensor? v=None, "
      "int? drop_pad_mode=0, int[]? zero_expert_range=None, int[]? copy_expert_range=None, "
      "int[]? constant_expert_range=None, int? k=1, *, str numerics=\"atlas_a2\", "
      "str api=\"v2\") -> Tensor");
  m.def(
      "moe_finalize_routing.out(Tensor expanded_x, Tensor expanded_row_idx, Tensor? x1=None, "
      "Tensor? x2=None, Tensor? bias=None, Tensor? scales=None, Tensor? expert_idx=None, "
      "Tensor? x=None, Tensor? alpha1=None, Tensor? alpha2=None, Tensor? v=None, "
      "int? drop_pad_mode=0, int[]? zero_expert_range=None, int[]? copy_expert_range=None, "
      "int[]? constant_expert_range=None, int? k=1, *, str numerics=\"atlas_a2\", "
      "str api=\"v2\", Tensor(a!) out) -> ()");
  m.def(
      "moe_finalize_routing_grad(Tensor grad_y, Tensor expanded_row_idx, "
      "Tensor? expanded_x=None, Tensor? scales=None, Tensor? expert_idx=None, Tensor? bias=None, "
      "int drop_pad_mode=0, SymInt active_num=0, SymInt expert_num=0, "
      "SymInt expert_capacity=0, *, str numerics=\"atlas_a2\", bool compute_grad_scales=True, "
      "bool compute_grad_bias=False) -> (Tensor, Tensor, Tensor)");
  m.def(
      "moe_finalize_routing_grad.out(Tensor grad_y, Tensor expanded_row_idx, "
      "Tensor? expanded_x=None, Tensor? scales=None, Tensor? expert_idx=None, Tensor? bias=None, "
      "int drop_pad_mode=0, SymInt active_num=0, SymInt expert_num=0, "
      "SymInt expert_capacity=0, *, str numerics=\"atlas_a2\", Tensor(a!) grad_expanded_x, "
      "Tensor(b!)? grad_scales=None, Tensor(c!)? grad_bias=None) -> ()");
  // Internal: a check that the kernels' loops really run on several of PyTorch's threads.
  m.def("_parallel_loop_threads(int num_tasks) -> int", &parallel_loop_threads);
  m.def("_uses_torch_pool() -> bool", &uses_torch_pool);
  m.def("_output_cache_stats() -> int[]", &output_cache_stats);
  m.def("_set_output_cache_limit(int bytes) -> ()", &set_output_cache_limit);
  m.def("_empty_output_cache() -> ()", &empty_output_cache);
  m.def("_huge_pages_enabled() -> bool", &huge_pages_enabled);
  m.def("_set_huge_pages(bool enabled) -> ()", &set_huge_pages);
  // A factory: its kernel is CompositeExplicitAutograd (below), so that under fake tensors and
  // torch.compile the fake kernel of _fake.py answers instead of real memory being allocated.
  m.def("_empty_from_output_cache(int[] shape, ScalarType dtype) -> Tensor");
}

TORCH_LIBRARY_IMPL(moe_routing, CompositeExplicitAutograd, m) {
  m.impl("_empty_from_output_cache", &empty_from_output_cache);
}

TORCH_LIBRARY_IMPL(moe_routing, CPU, m) { register_kernels(m); }

#ifdef MOE_ROUTING_TORCH_CUDA
// Compiled where the torch built against has CUDA and the library its CUDA backend
// (python/CMakeLists.txt): the core runs CUDA TensorViews on the GPU, bitwise identical to the CPU.
TORCH_LIBRARY_IMPL(moe_routing, CUDA, m) { register_kernels(m); }
#endif

/// The out= overloads: not differentiable (Autograd), and they bump what they write
/// (ADInplaceOrView).
constexpr const char* kOutOverloads[] = {"moe_init_routing_grad.out", "moe_init_routing.out",
                                         "moe_finalize_routing.out",
                                         "moe_finalize_routing_grad.out"};

/// The functional operators, whose Autograd kernel is registered from Python (_autograd.py): their
/// refusal of forward-mode AD runs at ADInplaceOrView, below it.
constexpr const char* kFunctionalOps[] = {"moe_init_routing_grad", "moe_init_routing_v2",
                                          "moe_init_routing", "moe_finalize_routing",
                                          "moe_finalize_routing_grad"};

TORCH_LIBRARY_IMPL(moe_routing, ADInplaceOrView, m) {
  for (const char* op : kOutOverloads)
    m.impl(op, torch::CppFunction::makeFromBoxedFunction<&out_overload_bump_versions>());
  for (const char* op : kFunctionalOps)
    m.impl(op, torch::CppFunction::makeFromBoxedFunction<&functional_refuse_forward_ad>());
}

TORCH_LIBRARY_IMPL(moe_routing, Negative, m) {
  for (const char* op : kOutOverloads)
    m.impl(op, torch::CppFunction::makeFromBoxedFunction<&out_overload_lazy_views>());
}

TORCH_LIBRARY_IMPL(moe_routing, Conjugate, m) {
  for (const char* op : kOutOverloads)
    m.impl(op, torch::CppFunction::makeFromBoxedFunction<&out_overload_lazy_views>());
}

TORCH_LIBRARY_IMPL(moe_routing, Autograd, m) {
  for (const char* op : kOutOverloads)
    m.impl(op, torch::CppFunction::makeFromBoxedFunction<&out_overload_autograd>());
}
