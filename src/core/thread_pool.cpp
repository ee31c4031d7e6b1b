#include "core/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <limits>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "core/environment.h"
#include "moe_routing/tensor.h"

namespace moe_routing {
namespace {

std::atomic<bool> refuse_thread_starts{false};

/// MOE_ROUTING_NUM_THREADS, else every core: read once, at the first use (set_num_threads(0) read
/// the variable again, a getenv that can race another thread's setenv and a default that moved
/// with the environment).
int initial_default_threads() {
  static const int value = [] {
    const unsigned hw = std::thread::hardware_concurrency();
    const int cores = hw == 0 ? 1 : int(std::min<unsigned>(hw, unsigned(kMaxNumThreads)));
    return detail::num_threads_from_env(std::getenv("MOE_ROUTING_NUM_THREADS"), cores);
  }();
  return value;
}

std::atomic<ParallelForFn>& parallel_backend() {
  static std::atomic<ParallelForFn> backend{nullptr};
  return backend;
}

std::atomic<int64_t>& backend_min_bytes_per_thread() {
  static std::atomic<int64_t> bytes{detail::kMinBytesPerThread};
  return bytes;
}

std::atomic<int>& default_threads() {
  static std::atomic<int> value{initial_default_threads()};
  return value;
}

class ThreadPool {
 public:
  static ThreadPool& instance() {
    // Leaked on purpose: joining threads from a static destructor at exit is fragile.
    static ThreadPool* pool = new ThreadPool();
    return *pool;
  }

  void run(int64_t num_tasks, int num_threads, detail::RangeFn fn) {
    int64_t pieces = std::min<int64_t>(num_threads, num_tasks);
    if (pieces <= 1) {
      if (num_tasks > 0) fn(0, num_tasks);
      return;
    }
    std::unique_lock<std::mutex> busy(dispatch_mutex_, std::try_to_lock);
    if (!busy.owns_lock()) {  // nested or concurrent use: run inline, same results
      fn(0, num_tasks);
      return;
    }
    // The backends reserved their threads before writing; should the system refuse one anyway,
    // the pieces are shared among the threads there are.
    pieces = std::min<int64_t>(pieces, int64_t(start_workers(int(pieces) - 1, nullptr)) + 1);
    if (pieces <= 1) {
      fn(0, num_tasks);
      return;
    }
    {
      // A worker still inside the previous job's piece loop would take its next piece from the
      // counters reset below (running a piece twice and unbalancing pending_); wait until every
      // worker has left that loop.
      std::unique_lock<std::mutex> lock(mutex_);
      done_.wait(lock, [&] { return active_ == 0; });
      job_ = &fn;
      job_tasks_ = num_tasks;
      job_pieces_ = pieces;
      next_piece_.store(1);  // piece 0 is the caller's
      pending_ = pieces - 1;
      ++generation_;
    }
    wake_.notify_all();
    run_piece(0);
    while (true) {
      int64_t piece = next_piece_.fetch_add(1);
      if (piece >= job_pieces_) break;
      run_piece(piece);
      finish_piece();
    }
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [&] { return pending_ == 0; });
    job_ = nullptr;
  }

  void reserve(int num_threads) {
    std::string refusal;
    const int workers = start_workers(num_threads - 1, &refusal);
    if (workers < num_threads - 1) throw detail::ThreadStartError(num_threads, workers, refusal);
  }

  int workers() {
    std::lock_guard<std::mutex> lock(workers_mutex_);
    return int(workers_.size());
  }

 private:
  void run_piece(int64_t piece) {
    int64_t begin = job_tasks_ * piece / job_pieces_;
    int64_t end = job_tasks_ * (piece + 1) / job_pieces_;
    if (begin < end) (*job_)(begin, end);
  }

  void finish_piece() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (--pending_ == 0) done_.notify_all();
  }

  /// Starts workers until there are `count`; returns how many there are, fewer only when the
  /// system refused one (then *refusal, if given, says why). A worker started while a job runs
  /// joins from the next job on (worker_loop), so this need not wait for the job.
  int start_workers(int count, std::string* refusal) {
    std::lock_guard<std::mutex> lock(workers_mutex_);
    while (int(workers_.size()) < count) {
      try {
        if (refuse_thread_starts.load()) throw std::system_error(EAGAIN, std::generic_category());
        workers_.emplace_back([this] { worker_loop(); });
      } catch (const std::system_error& error) {
        if (refusal != nullptr) *refusal = error.what();
        break;
      }
    }
    return int(workers_.size());
  }

  void worker_loop() {
    uint64_t seen = 0;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      seen = generation_;
    }
    while (true) {
      {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [&] { return generation_ != seen; });
        seen = generation_;
        ++active_;
      }
      while (true) {
        int64_t piece = next_piece_.fetch_add(1);
        if (piece >= job_pieces_) break;
        run_piece(piece);
        finish_piece();
      }
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (--active_ == 0) done_.notify_all();
      }
    }
  }

  std::mutex dispatch_mutex_;
  std::mutex workers_mutex_;  // guards workers_
  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable done_;
  std::vector<std::thread> workers_;
  const detail::RangeFn* job_ = nullptr;
  int64_t job_tasks_ = 0;
  std::atomic<int64_t> job_pieces_{0};
  std::atomic<int64_t> next_piece_{0};
  int64_t pending_ = 0;
  int64_t active_ = 0;  // workers inside a job's piece loop (guarded by mutex_)
  uint64_t generation_ = 0;
};

}  // namespace

Status set_num_threads(int num_threads) {
  MOE_ROUTING_RETURN_IF_ERROR(
      detail::check_num_threads("set_num_threads: ", num_threads, "restores the default"));
  default_threads().store(num_threads > 0 ? num_threads : initial_default_threads());
  return Status::ok();
}

int get_num_threads() { return default_threads().load(); }

void set_parallel_backend(ParallelForFn parallel_for, int64_t min_bytes_per_thread) {
  backend_min_bytes_per_thread().store(parallel_for == nullptr
                                           ? detail::kMinBytesPerThread
                                           : std::max<int64_t>(1, min_bytes_per_thread));
  parallel_backend().store(parallel_for);
}

namespace detail {

int resolve_num_threads(int requested) { return requested > 0 ? requested : get_num_threads(); }

Status check_num_threads(const char* function, int64_t num_threads, const char* zero) {
  if (num_threads < 0)
    return invalid_argument(function, "num_threads must be >= 0 (0 ", zero, "), got ", num_threads);
  if (num_threads > kMaxNumThreads)
    return invalid_argument(function, "num_threads must be at most ", kMaxNumThreads,
                            " (the library's bound on threads per call), got ", num_threads);
  return Status::ok();
}

NumThreadsSetting read_num_threads_setting(const char* text) {
  using Kind = NumThreadsSetting::Kind;
  if (text == nullptr) return {Kind::unset, 0};
  const EnvNumber number = parse_env_number(text);
  if (!number.valid || number.value < 0) return {Kind::invalid, 0};
  if (number.value == 0) return {Kind::every_core, 0};
  if (number.value > kMaxNumThreads) return {Kind::capped, kMaxNumThreads};
  return {Kind::set, int(number.value)};
}

int num_threads_from_env(const char* text, int fallback) {
  const NumThreadsSetting setting = read_num_threads_setting(text);
  if (setting.kind == NumThreadsSetting::Kind::invalid) {
    const std::string instead = "the default (every core: " + std::to_string(fallback) + ")";
    warn_env_ignored("MOE_ROUTING_NUM_THREADS", "a whole number >= 0 (0: every core)", text,
                     instead.c_str());
  }
  return setting.threads > 0 ? setting.threads : fallback;
}

int threads_for_bytes(int threads, int64_t bytes) {
  const int64_t useful = bytes / backend_min_bytes_per_thread().load(std::memory_order_relaxed);
  if (useful < 1) return 1;
  return useful < threads ? int(useful) : threads;
}

int64_t saturating_mul(int64_t a, int64_t b) {
  if (a == 0 || b == 0) return 0;
  return a > std::numeric_limits<int64_t>::max() / b ? std::numeric_limits<int64_t>::max() : a * b;
}

int64_t saturating_add(int64_t a, int64_t b) {
  return a > std::numeric_limits<int64_t>::max() - b ? std::numeric_limits<int64_t>::max() : a + b;
}

void reserve_threads(int num_threads) {
  if (num_threads <= 1 || parallel_backend().load(std::memory_order_relaxed) != nullptr) return;
  ThreadPool::instance().reserve(num_threads);
}

int pool_workers_for_testing() { return ThreadPool::instance().workers(); }

void refuse_thread_starts_for_testing(bool refuse) { refuse_thread_starts.store(refuse); }

void parallel_for(int64_t num_tasks, int num_threads, RangeFn fn) {
  if (num_threads > 1 && num_tasks > 1) {
    if (const ParallelForFn host = parallel_backend().load(std::memory_order_relaxed)) {
      host(
          num_tasks, num_threads,
          [](void* context, int64_t begin, int64_t end) {
            (*static_cast<const RangeFn*>(context))(begin, end);
          },
          &fn);
      return;
    }
  }
  ThreadPool::instance().run(num_tasks, std::max(1, num_threads), fn);
}

}  // namespace detail
}  // namespace moe_routing
