// What the C ABI's translation units share: the handle types, the exception barrier every entry
// point runs inside, the last-error store, and the steps every phase one and phase two take.
// Phase one validates a call with the operator's own validation function (ops/<operator>/meta.h),
// the one the C++ entry point runs, so both accept and reject the same calls with the same words.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <new>

#include "moe_routing/moe_finalize_routing.h"
#include "moe_routing/moe_init_routing.h"
#include "moe_routing/moe_init_routing_grad.h"
#include "moe_routing/moe_routing.h"
#include "moe_routing/status.h"
#include "moe_routing/tensor.h"

/// A tensor handle: the caller's buffer, never owned.
struct mrTensor {
  explicit mrTensor(const moe_routing::TensorView& view_);
  ~mrTensor();
  mrTensor(const mrTensor&) = delete;
  mrTensor& operator=(const mrTensor&) = delete;

  moe_routing::TensorView view;
};

namespace moe_routing::c_api {

/// A planned call: copies of the tensor views (not the handles) and the attributes, so the
/// handles may be destroyed between the phases. One struct for every operator; `op` says
/// which members are in use. The caller never sees its address: an mrExecutor* is a serial
/// number the registry (c_api_common.cpp) maps to the Executor while it is live.
struct Executor {
  Executor();
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  enum class Operator : int32_t {
    moe_init_routing_grad,
    moe_init_routing_v2,
    moe_init_routing,
    moe_finalize_routing,  // V1 (api v1)
    moe_finalize_routing_v2,
    moe_finalize_routing_v2_grad,
  };
  Operator op = Operator::moe_init_routing_grad;
  /// Fixed in phase one (the library default then), so that the workspace size reported there
  /// is the one phase two needs even if the default changes in between.
  int num_threads = 1;
  /// What phase one reported; phase two requires at least this much.
  uint64_t workspace_size = 0;

  /// The execution settings of a phase: the planned thread count and, in phase two, the caller's
  /// workspace and stream (phase one passes none).
  moe_routing::ExecConfig config(void* workspace = nullptr, uint64_t workspace_bytes = 0,
                                 mrStream stream = nullptr) const;

  struct Grad {
    moe_routing::TensorView grad_expanded_x, expanded_row_idx, grad_x;
    moe_routing::MoeInitRoutingGradAttrs attrs;
  } grad;
  struct RoutingV2 {
    moe_routing::TensorView x, expert_idx;
    moe_routing::TensorView expanded_x, expanded_row_idx, expert_tokens_count_or_cumsum,
        expert_tokens_before_capacity;
    moe_routing::MoeInitRoutingV2Attrs attrs;
  } v2;
  struct Routing {
    moe_routing::TensorView x, expert_idx, scale, offset, topk_weight;
    moe_routing::TensorView expanded_x, expanded_row_idx, expert_tokens_count_or_cumsum,
        expanded_scale, expanded_topk_weight;
    moe_routing::MoeInitRoutingAttrs attrs;
  } routing;
  struct Finalize {  // V1 and V2 (attrs.api tells)
    moe_routing::MoeFinalizeRoutingInputs in;
    moe_routing::TensorView out;
    moe_routing::MoeFinalizeRoutingAttrs attrs;
  } finalize;
  struct FinalizeGrad {
    moe_routing::MoeFinalizeRoutingGradInputs in;
    moe_routing::MoeFinalizeRoutingGradOutputs out;
    moe_routing::MoeFinalizeRoutingGradAttrs attrs;
  } finalize_grad;
};

/// Stores a failure's text as this thread's last error (a success leaves it) and returns the code.
/// Never throws: the text is copied into a fixed thread-local buffer.
mrStatus record(const Status& status) noexcept;
/// The same for a failure whose text is assembled without allocating (exception paths).
mrStatus record_text(mrStatus code, const char* function, const char* text) noexcept;

/// How many tensor handles / executors exist in this process (tests check that every executor
/// is consumed or destroyed exactly once).
int64_t live_tensors();
int64_t live_executors();

/// Test hook: makes the next guarded call on this thread throw inside the barrier, to reach the
/// MR_ERROR_INTERNAL and MR_ERROR_RUNTIME paths. Not part of the public ABI.
enum class InjectedFailure : int32_t { none = 0, logic_error = 1, bad_alloc = 2 };
void inject_failure_in_next_call(InjectedFailure failure);
/// Throws the injected failure, if any, and clears it.
void throw_injected_failure();

/// The exception barrier around every entry point: runs fn (returning Status) and records the
/// outcome. std::bad_alloc becomes MR_ERROR_RUNTIME, any other exception MR_ERROR_INTERNAL.
/// `function` names the operator or C function in the message.
template <typename Fn>
mrStatus guard(const char* function, Fn&& fn) noexcept {
  try {
    throw_injected_failure();
    return record(fn());
  } catch (const std::bad_alloc&) {
    return record_text(MR_ERROR_RUNTIME, function,
                       "memory must be allocatable, got an allocation failure");
  } catch (...) {
    return record_text(MR_ERROR_INTERNAL, function,
                       "internal error: an unexpected C++ exception reached the C ABI (please "
                       "report this as a bug)");
  }
}

/// invalid_argument "<op><name> must not be NULL, got NULL" unless p is set.
Status require_non_null(const char* op, const char* name, const void* p);

/// The view of a handle; a NULL handle is the absent (default-constructed) view.
TensorView view_of(const mrTensor* tensor);

/// The view of an optional argument's handle into *view; NULL is absent. A handle is always
/// present, so one that looks like the C++ API's absent view (0-d with data NULL: one element
/// without a buffer) is refused, "<op><name> data must not be null for a non-empty tensor, got
/// null", instead of being taken for an absent argument.
Status optional_view(const char* op, const char* name, const mrTensor* tensor, TensorView* view);

/// An output argument of phase one: its name, handle and planned spec.
struct OutputHandle {
  const char* name;
  const mrTensor* handle;
  const OutputSpec& spec;
};

/// The C-only check of phase one's outputs, made between shape inference and the operator's
/// validation (ops/<operator>/meta.h): every produced output's handle must be given (one not
/// produced may be NULL, the C form of an absent tensor).
Status require_produced_outputs(const char* op, std::initializer_list<OutputHandle> outputs);

/// Fills a public description from a planned spec.
void describe_output(const OutputSpec& spec, mrTensorDesc* desc);

/// Common start of every GetWorkspaceSize, before the exception barrier (so that no failure
/// path leaves stale values): sets the out-parameters that are given to 0 / NULL.
void reset_phase_one_outputs(uint64_t* workspace_size, mrExecutor** executor) noexcept;
/// Inside the barrier: the out-parameters must be given.
Status begin_phase_one(const char* op, uint64_t* workspace_size, mrExecutor** executor);
/// A new executor for `op`, its thread count fixed to the library default now.
std::unique_ptr<Executor> new_executor(Executor::Operator op);
/// Common end: starts the pool threads the call will use (`threads`, from the operator's
/// cpu_threads; 0 for CUDA tensors), so that phase two creates none and a refusal is reported
/// here, then records and reports the workspace size (`needed` bytes) and registers the
/// executor, handing its handle to the caller.
Status finish_phase_one(const char* op, std::unique_ptr<Executor> planned, uint64_t needed,
                        int threads, uint64_t* workspace_size, mrExecutor** executor);

// Executor handles. A phase two, or mrDestroyExecutor, takes the executor out of the registry
// before anything else (so it is consumed whatever happens next); a handle that names no live
// executor - run or destroyed already, or never made - is then found out and reported instead of
// freeing or reading freed memory (issue 17, item 3). Handles are never reused in a process, so a
// stale one cannot reach a newer executor.

/// Removes the executor of `handle` from the registry and returns it; null when `handle` is NULL
/// or names no live executor.
std::unique_ptr<Executor> take_executor(const mrExecutor* handle) noexcept;

/// A live executor, locked against every other registry operation while this object exists (the
/// setters modify it so); `executor` is null when the handle names none.
struct LockedExecutor {
  std::unique_lock<std::mutex> lock;
  Executor* executor = nullptr;
};
LockedExecutor find_executor(const mrExecutor* handle);

/// invalid_argument: `function`'s executor is NULL or names no live executor (`found` null).
Status require_live_executor(const char* function, const mrExecutor* handle, const Executor* found);

/// Common checks of every phase two: a live executor (taken by the caller with take_executor
/// before its exception barrier) made for `op_kind`, and a workspace of at least the size phase
/// one reported.
Status begin_phase_two(const char* op, Executor::Operator op_kind, const mrExecutor* handle,
                       const Executor* executor, const void* workspace, uint64_t workspace_size);

}  // namespace moe_routing::c_api
