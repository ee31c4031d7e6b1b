// A small persistent thread pool for the CPU kernels.
//
// Determinism does not depend on it: every kernel makes each output element a function of its own
// inputs in a fixed order, so how tasks are split among threads never changes a bit.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

#include "moe_routing/status.h"

namespace moe_routing::detail {

/// The thread count a call runs with: `requested` if > 0, else the library default.
int resolve_num_threads(int requested);

/// invalid_argument unless 0 <= num_threads <= kMaxNumThreads. `function` prefixes the message,
/// `zero` says what 0 means to the caller ("restores the default", "uses the library default").
Status check_num_threads(const char* function, int64_t num_threads, const char* zero);

/// What a MOE_ROUTING_NUM_THREADS value means, read as core/environment.h reads every variable
/// (surrounding blanks allowed), with nothing written: the one reading that the library's default
/// (num_threads_from_env) and `moe-routing info`'s description of it share.
struct NumThreadsSetting {
  enum class Kind {
    unset,       // null: every core
    invalid,     // not a whole number >= 0: ignored, every core
    every_core,  // 0
    capped,      // more than kMaxNumThreads: kMaxNumThreads
    set,         // 1 .. kMaxNumThreads
  };
  Kind kind = Kind::unset;
  int threads = 0;  // capped and set: the thread count it gives; else 0
};
NumThreadsSetting read_num_threads_setting(const char* text);

/// The library default a MOE_ROUTING_NUM_THREADS value gives: its threads where capped or set,
/// else `fallback`; an invalid value also writes a warning on stderr that names the variable and
/// the value.
int num_threads_from_env(const char* text, int fallback);

/// Thrown by reserve_threads when the system refuses to start a worker thread (std::thread's
/// std::system_error: EAGAIN under a limit on processes, say). The workers started before stay.
class ThreadStartError : public std::runtime_error {
 public:
  ThreadStartError(int num_threads_, int workers_, const std::string& reason)
      : std::runtime_error(reason), num_threads(num_threads_), workers(workers_) {}
  int num_threads;  // the thread count the call asked for (num_threads - 1 workers)
  int workers;      // the workers the pool had when the system refused the next one
};

/// Work smaller than this per thread is not worth waking one of the built-in pool's threads for.
/// Measured on a 2-vCPU VM, where handing half of a job to a sleeping vCPU (wake-up, and the data
/// moving to the other core's caches) costs 30-40 us - about as long as moving 1-2 MB; below
/// ~4 MB per call one thread was faster than two for both operators. A host pool
/// (set_parallel_backend) brings its own threshold.
constexpr int64_t kMinBytesPerThread = int64_t(2) << 20;

/// The threads worth using for a job that moves `bytes`: at most `threads`, at least 1, one per
/// kMinBytesPerThread (or the host pool's threshold).
int threads_for_bytes(int threads, int64_t bytes);

/// a * b and a + b of non-negative counts, or INT64_MAX where the result does not fit. The CPU
/// backend builds the byte estimates it passes to threads_for_bytes with these: with no rows,
/// hidden and top_k may be anything (x of shape [0, 2^63 - 1] is valid), so plain arithmetic
/// could overflow. A formula nested from them gives its exact value where that fits and INT64_MAX
/// where it does not, whichever intermediate result overflowed (a saturated one times 0 is 0).
int64_t saturating_mul(int64_t a, int64_t b);
int64_t saturating_add(int64_t a, int64_t b);

/// A non-owning reference to a callable taking (begin, end): unlike std::function it never
/// allocates, so a kernel's parallel loops allocate nothing (the C ABI's phase two promises that).
/// The callable must outlive the call it is passed to, which every use here satisfies.
class RangeFn {
 public:
  template <class Fn, class = std::enable_if_t<!std::is_same_v<std::decay_t<Fn>, RangeFn>>>
  RangeFn(const Fn& fn)  // NOLINT: implicit, like std::function
      : object_(static_cast<const void*>(&fn)), call_(&invoke<Fn>) {}
  void operator()(int64_t begin, int64_t end) const { call_(object_, begin, end); }

 private:
  template <class Fn>
  static void invoke(const void* object, int64_t begin, int64_t end) {
    (*static_cast<const Fn*>(object))(begin, end);
  }
  const void* object_;
  void (*call_)(const void*, int64_t, int64_t);
};

/// Starts the pool's worker threads for calls with up to `num_threads` threads (num_threads - 1
/// workers; the caller is the other), unless they run already, so that the call creates none
/// while it writes its outputs (thread creation allocates, and may fail). Every CPU backend call
/// reserves the threads its work can use before it writes anything, and the C ABI's phase one
/// reserves those of its call (so that phase two creates none). Nothing to do while a host loop
/// is installed (set_parallel_backend). Throws ThreadStartError when the system refuses a thread,
/// std::bad_alloc when memory runs out; never blocks on a running job.
void reserve_threads(int num_threads);

/// Calls fn(begin, end) on contiguous pieces covering [0, num_tasks), using up to `num_threads`
/// threads (the caller's included). Returns when every piece is done. When the pool is busy with
/// another call (concurrent or nested use) the work runs inline on the calling thread. With a
/// host loop installed (set_parallel_backend) every multi-threaded call goes to the host instead.
/// Never fails for want of threads: if the system refuses one, the pieces run on those there are
/// (results do not depend on the split).
void parallel_for(int64_t num_tasks, int num_threads, RangeFn fn);

/// Test hooks: the pool's worker count, and a switch that makes the pool treat every thread start
/// as refused by the system (as std::thread reports EAGAIN).
int pool_workers_for_testing();
void refuse_thread_starts_for_testing(bool refuse);

}  // namespace moe_routing::detail
