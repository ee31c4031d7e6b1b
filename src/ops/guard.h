// The exception barrier of the C++ entry points: the library's own code reports errors as Status,
// but memory and threads fail by exception (std::bad_alloc from an allocation, ThreadStartError
// from core/thread_pool.h). Every entry point runs its work through run_guarded, so that the C++
// API never throws and every front end gets a runtime error with the operator's name.
#pragma once

#include <exception>
#include <new>
#include <string>

#include "core/thread_pool.h"
#include "moe_routing/status.h"

namespace moe_routing::detail {

/// The runtime error for a thread the system refused to start.
inline Status thread_start_error(const char* op, const ThreadStartError& error) {
  return runtime_error(op, "num_threads ", error.num_threads, " needs ", error.num_threads - 1,
                       " worker threads besides the calling one, which the system must start, "
                       "got a refusal for worker ",
                       error.workers + 1, " (", error.what(),
                       "); lower num_threads or raise the limit on processes (ulimit -u)");
}

/// The runtime error for an allocation failure; if memory is too short even for its message, the
/// status comes without one (an empty string allocates nothing).
inline Status out_of_memory(const char* op) noexcept {
  try {
    return runtime_error(op, "memory must be allocatable, got an allocation failure");
  } catch (...) {
    return Status(StatusCode::runtime, std::string());
  }
}

/// Runs body() (returning Status) and maps the exceptions above to runtime errors, and any other
/// standard exception (a container's length_error, say, which no check should let through) to a
/// runtime error with its text: never std::terminate through a noexcept entry point. A backend
/// makes its allocations and starts its threads before writing any output, so an error here
/// leaves the outputs untouched.
template <typename Body>
Status run_guarded(const char* op, Body&& body) noexcept {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    return out_of_memory(op);
  } catch (const ThreadStartError& error) {
    try {
      return thread_start_error(op, error);
    } catch (...) {
      return out_of_memory(op);
    }
  } catch (const std::exception& error) {
    try {
      return runtime_error(op, "the call must complete, got an internal error: ", error.what());
    } catch (...) {
      return out_of_memory(op);
    }
  }
}

/// Starts the pool's threads for a call that runs on `num_threads` (reserve_threads), as a Status.
inline Status start_threads(const char* op, int num_threads) {
  return run_guarded(op, [&] {
    reserve_threads(num_threads);
    return Status::ok();
  });
}

}  // namespace moe_routing::detail
