// The parts of the C ABI every operator shares: errors, tensors, executors, threads.
#include <atomic>
#include <cstdio>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <unordered_map>

#include "c_api/c_api_internal.h"
#include "core/thread_pool.h"
#include "ops/guard.h"
#include "ops/validation.h"

namespace moe_routing::c_api {
namespace {

// Messages are copied into a fixed buffer so that recording one can never throw or allocate
// (it runs inside the exception barrier's catch blocks too).
constexpr size_t kMessageCapacity = 4096;
thread_local char last_message[kMessageCapacity] = "";
thread_local InjectedFailure injected_failure = InjectedFailure::none;
std::atomic<int64_t> tensor_count{0};
std::atomic<int64_t> executor_count{0};

void store_message(const char* prefix, const char* text) noexcept {
  std::snprintf(last_message, kMessageCapacity, "%s%s", prefix, text);
}

static_assert(MR_SUCCESS == int(StatusCode::ok), "mrStatus follows StatusCode");
static_assert(MR_ERROR_INVALID_ARGUMENT == int(StatusCode::invalid_argument), "");
static_assert(MR_ERROR_INDEX_OUT_OF_RANGE == int(StatusCode::index_out_of_range), "");
static_assert(MR_ERROR_NOT_SUPPORTED == int(StatusCode::not_supported), "");
static_assert(MR_ERROR_INTERNAL == int(StatusCode::internal), "");
static_assert(MR_ERROR_RUNTIME == int(StatusCode::runtime), "");
static_assert(MR_FLOAT32 == int(DType::float32) && MR_FLOAT16 == int(DType::float16) &&
                  MR_BFLOAT16 == int(DType::bfloat16) && MR_INT8 == int(DType::int8) &&
                  MR_INT32 == int(DType::int32) && MR_INT64 == int(DType::int64),
              "mrDataType follows DType");
static_assert(MR_DEVICE_CPU == int(Device::cpu) && MR_DEVICE_CUDA == int(Device::cuda),
              "mrDevice follows Device");
static_assert(MR_MAX_DIMS == kMaxDims, "MR_MAX_DIMS follows kMaxDims");
static_assert(MR_MAX_NUM_THREADS == kMaxNumThreads, "MR_MAX_NUM_THREADS follows kMaxNumThreads");
static_assert(MR_NUMERICS_ATLAS_A2 == int(Numerics::atlas_a2) &&
                  MR_NUMERICS_ASCEND_950 == int(Numerics::ascend_950),
              "mrNumerics follows Numerics");
static_assert(MR_ACCUMULATION_TREE == int(AccumulationOrder::tree) &&
                  MR_ACCUMULATION_SEQUENTIAL == int(AccumulationOrder::sequential),
              "mrAccumulationOrder follows AccumulationOrder");

constexpr const char* kCreateTensor = "mrCreateTensor: ";

/// The checks of mrCreateTensor; on success `view` describes the tensor.
Status make_view(const int64_t* shape, uint64_t ndim, mrDataType dtype, mrDevice device, void* data,
                 TensorView* view) {
  if (ndim > uint64_t(kMaxDims))
    return invalid_argument(kCreateTensor, "ndim must be at most ", kMaxDims, ", got ", ndim);
  if (ndim > 0 && shape == nullptr)
    return invalid_argument(kCreateTensor,
                            "shape must not be NULL when ndim > 0, got NULL with "
                            "ndim ",
                            ndim);
  if (!is_valid_dtype(dtype))
    return invalid_argument(kCreateTensor,
                            "dtype must be one of MR_FLOAT32 (0), MR_FLOAT16 (1), "
                            "MR_BFLOAT16 (2), MR_INT8 (3), MR_INT32 (4), MR_INT64 (5), got ",
                            dtype);
  if (device != MR_DEVICE_CPU && device != MR_DEVICE_CUDA)
    return invalid_argument(kCreateTensor,
                            "device must be MR_DEVICE_CPU (0) or MR_DEVICE_CUDA "
                            "(1), got ",
                            device);
  TensorView result(data, DType(dtype), int(ndim), shape, Device(device));
  for (int d = 0; d < result.ndim; ++d)
    if (result.shape[d] < 0)
      return invalid_argument(kCreateTensor, "shape[", d, "] must be >= 0, got ",
                              shape_string(result));
  // Byte sizes must fit int64 so that no later size computation can overflow.
  const int64_t limit = std::numeric_limits<int64_t>::max() / int64_t(dtype_size(result.dtype));
  int64_t elements = 1;
  bool fits = true;
  for (int d = 0; d < result.ndim; ++d) {
    if (result.shape[d] == 0) {
      elements = 0;
      break;
    }
    if (elements > limit / result.shape[d])
      fits = false;
    else
      elements *= result.shape[d];
  }
  if (elements != 0 && !fits)
    return invalid_argument(kCreateTensor, "the tensor's size in bytes must fit int64, got ",
                            describe(result));
  *view = result;
  return Status::ok();
}

/// The live executors by handle. A handle is a serial number (shifted, so that a caller who
/// dereferences one faults at once instead of reading an Executor); 2^60 serials are never
/// exhausted, so no handle is ever reused in a process. Never destroyed: a static destructor at
/// exit would race with executors still in use on other threads.
class ExecutorRegistry {
 public:
  static ExecutorRegistry& instance() {
    static ExecutorRegistry* registry = new ExecutorRegistry();
    return *registry;
  }

  mrExecutor* add(std::unique_ptr<Executor> executor) {
    std::lock_guard<std::mutex> lock(mutex_);
    const mrExecutor* handle = reinterpret_cast<const mrExecutor*>(uintptr_t(++serial_) << 4);
    live_.emplace(handle, std::move(executor));
    return const_cast<mrExecutor*>(handle);
  }

  std::unique_ptr<Executor> take(const mrExecutor* handle) noexcept {
    if (handle == nullptr) return nullptr;
    std::lock_guard<std::mutex> lock(mutex_);
    const auto found = live_.find(handle);
    if (found == live_.end()) return nullptr;
    std::unique_ptr<Executor> executor = std::move(found->second);
    live_.erase(found);
    return executor;
  }

  LockedExecutor find(const mrExecutor* handle) {
    LockedExecutor result{std::unique_lock<std::mutex>(mutex_)};
    const auto found = live_.find(handle);
    if (found != live_.end()) result.executor = found->second.get();
    return result;
  }

 private:
  std::mutex mutex_;
  uint64_t serial_ = 0;
  std::unordered_map<const mrExecutor*, std::unique_ptr<Executor>> live_;
};

}  // namespace

mrStatus record(const Status& status) noexcept {
  if (!status.is_ok()) store_message("", status.message().c_str());
  return mrStatus(status.code());
}

mrStatus record_text(mrStatus code, const char* function, const char* text) noexcept {
  store_message(function, text);
  return code;
}

void inject_failure_in_next_call(InjectedFailure failure) { injected_failure = failure; }

void throw_injected_failure() {
  const InjectedFailure failure = injected_failure;
  injected_failure = InjectedFailure::none;
  if (failure == InjectedFailure::logic_error) throw std::logic_error("injected failure");
  if (failure == InjectedFailure::bad_alloc) throw std::bad_alloc();
}

Status require_non_null(const char* op, const char* name, const void* p) {
  if (p == nullptr) return invalid_argument(op, name, " must not be NULL, got NULL");
  return Status::ok();
}

TensorView view_of(const mrTensor* tensor) {
  return tensor == nullptr ? TensorView() : tensor->view;
}

Status optional_view(const char* op, const char* name, const mrTensor* tensor, TensorView* view) {
  *view = view_of(tensor);
  if (tensor != nullptr && detail::is_absent(*view))
    return invalid_argument(op, name,
                            " data must not be null for a non-empty tensor, got null for a 0-d "
                            "tensor (one element; an absent argument is a NULL handle)");
  return Status::ok();
}

Status require_produced_outputs(const char* op, std::initializer_list<OutputHandle> outputs) {
  for (const OutputHandle& output : outputs)
    if (output.spec.produced)
      MOE_ROUTING_RETURN_IF_ERROR(require_non_null(op, output.name, output.handle));
  return Status::ok();
}

void describe_output(const OutputSpec& spec, mrTensorDesc* desc) {
  *desc = mrTensorDesc();
  desc->produced = spec.produced;
  desc->dtype = mrDataType(spec.dtype);
  desc->ndim = uint64_t(spec.ndim);
  for (int d = 0; d < spec.ndim; ++d) desc->shape[d] = spec.shape[d];
}

void reset_phase_one_outputs(uint64_t* workspace_size, mrExecutor** executor) noexcept {
  if (workspace_size != nullptr) *workspace_size = 0;
  if (executor != nullptr) *executor = nullptr;
}

Status begin_phase_one(const char* op, uint64_t* workspace_size, mrExecutor** executor) {
  MOE_ROUTING_RETURN_IF_ERROR(require_non_null(op, "workspace_size", workspace_size));
  return require_non_null(op, "executor", executor);
}

std::unique_ptr<Executor> new_executor(Executor::Operator op) {
  auto planned = std::make_unique<Executor>();
  planned->op = op;
  planned->num_threads = detail::resolve_num_threads(0);
  return planned;
}

Status finish_phase_one(const char* op, std::unique_ptr<Executor> planned, uint64_t needed,
                        int threads, uint64_t* workspace_size, mrExecutor** executor) {
  MOE_ROUTING_RETURN_IF_ERROR(detail::start_threads(op, threads));
  planned->workspace_size = needed;
  *executor = ExecutorRegistry::instance().add(std::move(planned));
  *workspace_size = needed;
  return Status::ok();
}

std::unique_ptr<Executor> take_executor(const mrExecutor* handle) noexcept {
  return ExecutorRegistry::instance().take(handle);
}

LockedExecutor find_executor(const mrExecutor* handle) {
  return ExecutorRegistry::instance().find(handle);
}

Status require_live_executor(const char* function, const mrExecutor* handle,
                             const Executor* found) {
  MOE_ROUTING_RETURN_IF_ERROR(require_non_null(function, "executor", handle));
  if (found == nullptr)
    return invalid_argument(function,
                            "executor must be live (made by a phase one, and neither run by a "
                            "phase two nor destroyed since), got one that is not (already run, "
                            "destroyed, or never made)");
  return Status::ok();
}

Status begin_phase_two(const char* op, Executor::Operator op_kind, const mrExecutor* handle,
                       const Executor* executor, const void* workspace, uint64_t workspace_size) {
  static const char* const kMadeBy[] = {
      "mrMoeInitRoutingV2GradGetWorkspaceSize", "mrMoeInitRoutingV2GetWorkspaceSize",
      "mrMoeInitRoutingGetWorkspaceSize",       "mrMoeFinalizeRoutingGetWorkspaceSize",
      "mrMoeFinalizeRoutingV2GetWorkspaceSize", "mrMoeFinalizeRoutingV2GradGetWorkspaceSize"};
  MOE_ROUTING_RETURN_IF_ERROR(require_live_executor(op, handle, executor));
  if (executor->op != op_kind)
    return invalid_argument(op, "executor must come from ", kMadeBy[int(op_kind)],
                            ", got one from ", kMadeBy[int(executor->op)]);
  if (workspace == nullptr && workspace_size > 0)
    return invalid_argument(op,
                            "workspace must not be NULL when workspace_size > 0, got NULL "
                            "with workspace_size ",
                            workspace_size);
  if (workspace_size < executor->workspace_size)
    return invalid_argument(op, "workspace_size must be at least ", executor->workspace_size,
                            " (the size phase one reported), got ", workspace_size);
  return Status::ok();
}

int64_t live_tensors() { return tensor_count.load(); }
int64_t live_executors() { return executor_count.load(); }

}  // namespace moe_routing::c_api

mrTensor::mrTensor(const moe_routing::TensorView& view_) : view(view_) {
  moe_routing::c_api::tensor_count.fetch_add(1);
}
mrTensor::~mrTensor() { moe_routing::c_api::tensor_count.fetch_sub(1); }

namespace moe_routing::c_api {

Executor::Executor() { executor_count.fetch_add(1); }
Executor::~Executor() { executor_count.fetch_sub(1); }

moe_routing::ExecConfig Executor::config(void* workspace, uint64_t workspace_bytes,
                                         mrStream stream) const {
  moe_routing::ExecConfig config;
  config.num_threads = num_threads;
  config.workspace = workspace;
  config.workspace_bytes = workspace_bytes;
  config.stream = stream;
  return config;
}

}  // namespace moe_routing::c_api

using moe_routing::Status;
using moe_routing::c_api::Executor;
using moe_routing::c_api::guard;
using moe_routing::c_api::require_non_null;

extern "C" {

const char* mrGetLastErrorMessage(void) noexcept { return moe_routing::c_api::last_message; }

const char* mrGetStatusName(mrStatus status) noexcept {
  if (status < MR_SUCCESS || status > MR_ERROR_RUNTIME) return "unknown status";
  return moe_routing::status_code_name(moe_routing::StatusCode(status));
}

mrStatus mrCreateTensor(const int64_t* shape, uint64_t ndim, mrDataType dtype, mrDevice device,
                        void* data, mrTensor** tensor) noexcept {
  if (tensor != nullptr) *tensor = nullptr;
  return guard(moe_routing::c_api::kCreateTensor, [&]() -> Status {
    MOE_ROUTING_RETURN_IF_ERROR(
        require_non_null(moe_routing::c_api::kCreateTensor, "tensor", tensor));
    moe_routing::TensorView view;
    MOE_ROUTING_RETURN_IF_ERROR(
        moe_routing::c_api::make_view(shape, ndim, dtype, device, data, &view));
    *tensor = new mrTensor(view);
    return Status::ok();
  });
}

mrStatus mrDestroyTensor(mrTensor* tensor) noexcept {
  return guard("mrDestroyTensor: ", [&]() -> Status {
    delete tensor;
    return Status::ok();
  });
}

mrStatus mrDestroyExecutor(mrExecutor* executor) noexcept {
  constexpr const char* kFunction = "mrDestroyExecutor: ";
  std::unique_ptr<Executor> owned = moe_routing::c_api::take_executor(executor);
  return guard(kFunction, [&]() -> Status {
    if (executor == nullptr) return Status::ok();
    return moe_routing::c_api::require_live_executor(kFunction, executor, owned.get());
  });
}

mrStatus mrSetAccumulationOrder(mrExecutor* executor, mrAccumulationOrder order) noexcept {
  constexpr const char* kFunction = "mrSetAccumulationOrder: ";
  return guard(kFunction, [&]() -> Status {
    const moe_routing::c_api::LockedExecutor found = moe_routing::c_api::find_executor(executor);
    MOE_ROUTING_RETURN_IF_ERROR(
        moe_routing::c_api::require_live_executor(kFunction, executor, found.executor));
    if (found.executor->op != Executor::Operator::moe_init_routing_grad)
      return moe_routing::invalid_argument(
          kFunction,
          "executor must come from mrMoeInitRoutingV2GradGetWorkspaceSize (the order "
          "only applies to the backward), got an executor of another operator");
    if (order != MR_ACCUMULATION_TREE && order != MR_ACCUMULATION_SEQUENTIAL)
      return moe_routing::invalid_argument(kFunction,
                                           "order must be MR_ACCUMULATION_TREE (0) or "
                                           "MR_ACCUMULATION_SEQUENTIAL (1), got ",
                                           order);
    found.executor->grad.attrs.order = moe_routing::AccumulationOrder(order);
    return Status::ok();
  });
}

mrStatus mrSetNumerics(mrExecutor* executor, mrNumerics numerics) noexcept {
  constexpr const char* kFunction = "mrSetNumerics: ";
  return guard(kFunction, [&]() -> Status {
    const moe_routing::c_api::LockedExecutor found = moe_routing::c_api::find_executor(executor);
    MOE_ROUTING_RETURN_IF_ERROR(
        moe_routing::c_api::require_live_executor(kFunction, executor, found.executor));
    if (!moe_routing::is_valid_numerics(numerics))
      return moe_routing::invalid_argument(kFunction,
                                           "numerics must be MR_NUMERICS_ATLAS_A2 (0) or "
                                           "MR_NUMERICS_ASCEND_950 (1), got ",
                                           numerics);
    const moe_routing::Numerics chosen = moe_routing::Numerics(numerics);
    switch (found.executor->op) {
      case Executor::Operator::moe_init_routing_grad:
        found.executor->grad.attrs.numerics = chosen;
        break;
      case Executor::Operator::moe_init_routing:
        found.executor->routing.attrs.numerics = chosen;
        break;
      case Executor::Operator::moe_init_routing_v2: break;  // no numerics-dependent arithmetic
      case Executor::Operator::moe_finalize_routing:
      case Executor::Operator::moe_finalize_routing_v2:
        found.executor->finalize.attrs.numerics = chosen;
        break;
      case Executor::Operator::moe_finalize_routing_v2_grad:
        found.executor->finalize_grad.attrs.numerics = chosen;
        break;
    }
    return Status::ok();
  });
}

mrStatus mrSetNumThreads(int32_t numThreads) noexcept {
  constexpr const char* kFunction = "mrSetNumThreads: ";
  return guard(kFunction, [&]() -> Status {
    MOE_ROUTING_RETURN_IF_ERROR(
        moe_routing::detail::check_num_threads(kFunction, numThreads, "restores the default"));
    return moe_routing::set_num_threads(numThreads);
  });
}

int32_t mrGetNumThreads(void) noexcept { return moe_routing::get_num_threads(); }

}  // extern "C"
