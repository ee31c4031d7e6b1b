#include "core/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

#include "moe_routing/tensor.h"

namespace moe_routing {
namespace {

int initial_default_threads() {
  if (const char* env = std::getenv("MOE_ROUTING_NUM_THREADS")) {
    int value = std::atoi(env);
    if (value > 0) return value;
  }
  unsigned hw = std::thread::hardware_concurrency();
  return hw == 0 ? 1 : int(hw);
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
    ensure_workers(int(pieces) - 1);
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
    std::lock_guard<std::mutex> busy(dispatch_mutex_);
    ensure_workers(num_threads - 1);
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

  void ensure_workers(int count) {
    while (int(workers_.size()) < count) workers_.emplace_back([this] { worker_loop(); });
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

void set_num_threads(int num_threads) {
  default_threads().store(num_threads > 0 ? num_threads : initial_default_threads());
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

int threads_for_bytes(int threads, int64_t bytes) {
  const int64_t useful = bytes / backend_min_bytes_per_thread().load(std::memory_order_relaxed);
  if (useful < 1) return 1;
  return useful < threads ? int(useful) : threads;
}

void reserve_threads(int num_threads) { ThreadPool::instance().reserve(num_threads); }

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
