// Thread counts and threads the system refuses (issue 17, item 4). A count above kMaxNumThreads
// (1024) is refused by mrSetNumThreads, set_num_threads and ExecConfig::num_threads, and
// MOE_ROUTING_NUM_THREADS is bounded; a call starts only the threads its work can use, when it
// needs them; a thread the system refuses to start is a runtime error naming the count (it was an
// abort through std::system_error in C++, and "internal error ... please report this as a bug"
// from the C ABI), found before any output is written. The refusal is provoked two ways: by the
// pool's test switch (in this process), and by the system itself, running
// moe_routing_thread_probe under a limit of one process per user (RLIMIT_NPROC, as `prlimit
// --nproc` sets it). docs/reliability.md cites these tests.
#include <grp.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "c_api_handles.h"
#include "core/thread_pool.h"
#include "moe_routing/moe_routing.hpp"

extern char** environ;

namespace moe_routing::testing {
namespace {

constexpr const char* kRefusal = "Resource temporarily unavailable";

std::string refusal_message(const std::string& op, int threads, int workers) {
  return op + "num_threads " + std::to_string(threads) + " needs " + std::to_string(threads - 1) +
         " worker threads besides the calling one, which the system must start, got a refusal "
         "for worker " +
         std::to_string(workers + 1) + " (" + kRefusal +
         "); lower num_threads or raise the limit on processes (ulimit -u)";
}

/// The pool's test switch for one scope: every thread start is refused.
class RefuseThreadStarts {
 public:
  RefuseThreadStarts() { detail::refuse_thread_starts_for_testing(true); }
  ~RefuseThreadStarts() { detail::refuse_thread_starts_for_testing(false); }
};

/// A moe_init_routing_v2 call whose rows give `threads` threads work (2 MiB of rows each, the
/// pool's threshold): x [rows, 512] float32, every token to expert 0.
struct BigV2Call {
  int64_t rows;
  std::vector<float> x, expanded_x;
  std::vector<int32_t> ids, row_idx;
  explicit BigV2Call(int threads)
      : rows(int64_t(threads) * 1024 + 1),
        x(size_t(rows * 512), 1.0f),
        expanded_x(x.size(), -1.0f),
        ids(size_t(rows), 0),
        row_idx(size_t(rows), -7) {}
  Status run(int num_threads) {
    ExecConfig config;
    config.num_threads = num_threads;
    return moe_init_routing_v2(
        TensorView(x.data(), DType::float32, {rows, 512}),
        TensorView(ids.data(), DType::int32, {rows, 1}), MoeInitRoutingV2Attrs(),
        TensorView(expanded_x.data(), DType::float32, {rows, 512}),
        TensorView(row_idx.data(), DType::int32, {rows}), TensorView(), TensorView(), config);
  }
  bool untouched() const {
    for (float v : expanded_x)
      if (v != -1.0f) return false;
    for (int32_t v : row_idx)
      if (v != -7) return false;
    return true;
  }
  mrStatus phase_one() {
    TensorHandle x_t = tensor_handle(x.data(), MR_FLOAT32, {rows, 512});
    TensorHandle ids_t = tensor_handle(ids.data(), MR_INT32, {rows, 1});
    TensorHandle out_t = tensor_handle(expanded_x.data(), MR_FLOAT32, {rows, 512});
    TensorHandle row_t = tensor_handle(row_idx.data(), MR_INT32, {rows});
    uint64_t workspace_size = 0;
    mrExecutor* executor = nullptr;
    const mrStatus status = mrMoeInitRoutingV2GetWorkspaceSize(
        x_t.get(), ids_t.get(), 0, 0, 0, 0, 0, false, out_t.get(), row_t.get(), nullptr, nullptr,
        &workspace_size, &executor);
    if (status == MR_SUCCESS) {
      std::vector<unsigned char> workspace(static_cast<size_t>(workspace_size));
      EXPECT_EQ(mrMoeInitRoutingV2(workspace.data(), workspace_size, executor, nullptr),
                MR_SUCCESS);
    } else {
      EXPECT_EQ(executor, nullptr);
    }
    return status;
  }
};

// --- the bound ----------------------------------------------------------------------------------

TEST(AdversarialThreads, CountsAboveTheBoundAreRefused) {
  const int before = mrGetNumThreads();
  EXPECT_EQ(mrSetNumThreads(2147483647), MR_ERROR_INVALID_ARGUMENT);
  EXPECT_STREQ(mrGetLastErrorMessage(),
               "mrSetNumThreads: num_threads must be at most 1024 (the library's bound on threads "
               "per call), got 2147483647");
  EXPECT_EQ(mrSetNumThreads(MR_MAX_NUM_THREADS + 1), MR_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(mrGetNumThreads(), before);
  EXPECT_EQ(mrSetNumThreads(MR_MAX_NUM_THREADS), MR_SUCCESS);  // no thread starts here
  EXPECT_EQ(mrGetNumThreads(), MR_MAX_NUM_THREADS);
  EXPECT_EQ(mrSetNumThreads(0), MR_SUCCESS);

  Status s = set_num_threads(kMaxNumThreads + 1);
  EXPECT_EQ(s.code(), StatusCode::invalid_argument);
  EXPECT_EQ(s.message(),
            "set_num_threads: num_threads must be at most 1024 (the library's bound on threads "
            "per call), got 1025");
  s = set_num_threads(-1);
  EXPECT_EQ(s.message(),
            "set_num_threads: num_threads must be >= 0 (0 restores the default), got -1");
  EXPECT_EQ(get_num_threads(), before);

  // ExecConfig::num_threads, in the validation every operator runs: nothing is written.
  BigV2Call call(1);
  s = call.run(kMaxNumThreads + 1);
  EXPECT_EQ(s.code(), StatusCode::invalid_argument);
  EXPECT_EQ(s.message(),
            "moe_init_routing_v2: num_threads must be at most 1024 (the library's bound on "
            "threads per call), got 1025");
  s = call.run(-1);
  EXPECT_EQ(s.message(),
            "moe_init_routing_v2: num_threads must be >= 0 (0 uses the library default), got -1");
  EXPECT_TRUE(call.untouched());
  std::vector<float> g(4), grad_x(4);
  std::vector<int32_t> idx = {0, 1};
  MoeInitRoutingGradAttrs attrs;
  attrs.top_k = 1;
  ExecConfig config;
  config.num_threads = 2147483647;
  s = moe_init_routing_grad(TensorView(g.data(), DType::float32, {2, 2}),
                            TensorView(idx.data(), DType::int32, {2}), attrs,
                            TensorView(grad_x.data(), DType::float32, {2, 2}), config);
  EXPECT_EQ(s.message(),
            "moe_init_routing_grad: num_threads must be at most 1024 (the library's bound on "
            "threads per call), got 2147483647");
}

// --- only the threads the work can use ----------------------------------------------------------

TEST(AdversarialThreads, OnlyTheThreadsTheWorkCanUseAreStarted) {
  const int workers = detail::pool_workers_for_testing();
  ASSERT_LT(workers, 63) << "an earlier test of this process started more threads than this "
                            "test can observe";
  // A tiny call with 64 threads allowed: phase one of the C ABI and the C++ API start none.
  ASSERT_EQ(mrSetNumThreads(64), MR_SUCCESS);
  BigV2Call tiny(0);  // 1 row: one thread's work
  EXPECT_EQ(tiny.phase_one(), MR_SUCCESS) << mrGetLastErrorMessage();
  EXPECT_EQ(detail::pool_workers_for_testing(), workers);
  EXPECT_TRUE(tiny.run(64).is_ok());
  EXPECT_EQ(detail::pool_workers_for_testing(), workers);
  // Work for two threads starts at most one worker.
  BigV2Call two(2);
  EXPECT_EQ(two.phase_one(), MR_SUCCESS) << mrGetLastErrorMessage();
  EXPECT_EQ(detail::pool_workers_for_testing(), std::max(workers, 1));
  EXPECT_EQ(mrSetNumThreads(0), MR_SUCCESS);
}

// --- a refused thread ---------------------------------------------------------------------------

TEST(AdversarialThreads, ARefusedThreadIsARuntimeErrorNamingTheCount) {
  const int workers = detail::pool_workers_for_testing();
  const int threads = workers + 2;  // one worker more than the pool has
  ASSERT_LE(threads, kMaxNumThreads);
  BigV2Call call(threads);
  {
    RefuseThreadStarts refuse;
    // The C++ API: found before anything is written.
    const Status s = call.run(threads);
    EXPECT_EQ(s.code(), StatusCode::runtime);
    EXPECT_EQ(s.message(), refusal_message("moe_init_routing_v2: ", threads, workers));
    EXPECT_TRUE(call.untouched());
    // The C ABI: phase one starts the threads, and reports the refusal.
    ASSERT_EQ(mrSetNumThreads(threads), MR_SUCCESS);
    EXPECT_EQ(call.phase_one(), MR_ERROR_RUNTIME);
    EXPECT_EQ(mrGetLastErrorMessage(), refusal_message("moe_init_routing_v2: ", threads, workers));
    EXPECT_TRUE(call.untouched());
    // The backward: grad_x [rows, 512] float32 from as many rows.
    std::vector<int32_t> idx(size_t(call.rows));
    for (size_t i = 0; i < idx.size(); ++i) idx[i] = int32_t(i);
    std::vector<float> grad_x(call.x.size(), -1.0f);
    MoeInitRoutingGradAttrs attrs;
    attrs.top_k = 1;
    ExecConfig config;
    config.num_threads = threads;
    const Status grad =
        moe_init_routing_grad(TensorView(call.x.data(), DType::float32, {call.rows, 512}),
                              TensorView(idx.data(), DType::int32, {call.rows}), attrs,
                              TensorView(grad_x.data(), DType::float32, {call.rows, 512}), config);
    EXPECT_EQ(grad.code(), StatusCode::runtime);
    EXPECT_EQ(grad.message(), refusal_message("moe_init_routing_grad: ", threads, workers));
    EXPECT_EQ(grad_x, std::vector<float>(call.x.size(), -1.0f));
  }
  // Once the system starts threads again, the same calls run.
  EXPECT_TRUE(call.run(threads).is_ok());
  EXPECT_EQ(call.expanded_x, call.x);
  EXPECT_EQ(detail::pool_workers_for_testing(), threads - 1);
  EXPECT_EQ(mrSetNumThreads(0), MR_SUCCESS);
}

// --- the real thing: a process under a limit, an environment ------------------------------------

struct ProbeRun {
  int exit_code = -1;
  std::string out;
};

/// Runs moe_routing_thread_probe with `args` and extra environment entries; with `one_process`,
/// under RLIMIT_NPROC 1, as an unprivileged user when this test runs as root (root is exempt from
/// the limit). Empty `skip` unless the process could not be set up so.
ProbeRun run_probe(const std::vector<std::string>& args, const std::vector<std::string>& env_extra,
                   bool one_process, std::string* skip) {
  std::vector<std::string> argv_text = {MOE_ROUTING_THREAD_PROBE_PATH};
  argv_text.insert(argv_text.end(), args.begin(), args.end());
  std::vector<std::string> env_text = env_extra;
  // LeakSanitizer needs a thread of its own at exit, which the limit refuses.
  env_text.push_back("ASAN_OPTIONS=detect_leaks=0");
  for (char** e = environ; *e != nullptr; ++e)
    if (std::strncmp(*e, "ASAN_OPTIONS=", 13) != 0 &&
        std::strncmp(*e, "MOE_ROUTING_NUM_THREADS=", 24) != 0)
      env_text.push_back(*e);
  std::vector<char*> argv, env;
  for (std::string& a : argv_text) argv.push_back(a.data());
  argv.push_back(nullptr);
  for (std::string& e : env_text) env.push_back(e.data());
  env.push_back(nullptr);
  const bool root = ::geteuid() == 0;
  int pipe_fds[2];
  if (::pipe(pipe_fds) != 0) {
    ADD_FAILURE() << "pipe: " << std::strerror(errno);
    return {};
  }
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(pipe_fds[0]);
    if (::dup2(pipe_fds[1], 1) < 0) ::_exit(120);
    if (one_process) {
      const struct rlimit limit = {1, 1};
      if (::setrlimit(RLIMIT_NPROC, &limit) != 0) ::_exit(121);
      if (root && (::setgroups(0, nullptr) != 0 || ::setgid(65534) != 0 || ::setuid(65534) != 0))
        ::_exit(122);
    }
    ::execve(argv[0], argv.data(), env.data());
    ::_exit(123);
  }
  ::close(pipe_fds[1]);
  ProbeRun run;
  char buffer[4096];
  ssize_t n;
  while ((n = ::read(pipe_fds[0], buffer, sizeof buffer)) > 0) run.out.append(buffer, size_t(n));
  ::close(pipe_fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  if (run.exit_code == 122)
    *skip =
        "cannot switch to an unprivileged user (uid 65534), which the process limit needs "
        "(root is exempt from it)";
  if (run.exit_code == 123)
    *skip = "uid 65534 cannot execute " + std::string(MOE_ROUTING_THREAD_PROBE_PATH);
  return run;
}

TEST(AdversarialThreads, UnderAProcessLimitACallFailsWithARuntimeError) {
  std::string skip;
  const ProbeRun run = run_probe({"call", "4"}, {}, true, &skip);
  if (!skip.empty()) GTEST_SKIP() << skip;
  EXPECT_EQ(run.exit_code, 0);
  EXPECT_EQ(run.out, "5 " + refusal_message("moe_init_routing_v2: ", 4, 0) + "\n");
  // Without the limit the same call runs.
  const ProbeRun free = run_probe({"call", "4"}, {}, false, &skip);
  EXPECT_EQ(free.exit_code, 0);
  EXPECT_EQ(free.out, "0 ok\n");
}

TEST(AdversarialThreads, TheEnvironmentVariableIsBounded) {
  std::string skip;
  struct Case {
    const char* value;
    std::string expected;  // the default it gives
  };
  const std::string cores = run_probe({"default"}, {}, false, &skip).out;
  for (const Case& c :
       {Case{"100000", "1024\n"}, Case{"99999999999999999999", "1024\n"}, Case{"1024", "1024\n"},
        Case{"7", "7\n"}, Case{" 3 ", "3\n"}, Case{"0", cores}, Case{"-5", cores},
        Case{"eight", cores}, Case{"8x", cores}, Case{"", cores}}) {
    const ProbeRun run =
        run_probe({"default"}, {std::string("MOE_ROUTING_NUM_THREADS=") + c.value}, false, &skip);
    EXPECT_EQ(run.out, c.expected) << "MOE_ROUTING_NUM_THREADS='" << c.value << "'";
  }
  EXPECT_LE(std::stoi(cores), kMaxNumThreads);
}

}  // namespace
}  // namespace moe_routing::testing
