// The thread pool under back-to-back jobs of different sizes: every piece runs exactly once per
// job. (A worker that lingered in one job's piece loop once took a piece of the next job, ran it
// twice and unbalanced the completion count.)
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "environment_variable.h"
#include "grad_cases.h"
#include "ops/guard.h"
#include "routing_cases.h"

namespace moe_routing {
namespace {

TEST(ThreadPool, BackToBackJobsRunEveryPieceOnce) {
  std::vector<std::atomic<int>> hits(64);
  for (int iteration = 0; iteration < 20000; ++iteration) {
    const int pieces = iteration % 3 == 0 ? 8 : (iteration % 3 == 1 ? 2 : 5);
    for (int p = 0; p < pieces; ++p) hits[p].store(0);
    detail::parallel_for(pieces, pieces, [&](int64_t begin, int64_t end) {
      for (int64_t p = begin; p < end; ++p) hits[p].fetch_add(1);
    });
    for (int p = 0; p < pieces; ++p)
      ASSERT_EQ(hits[p].load(), 1) << "iteration " << iteration << " piece " << p;
  }
}

TEST(ThreadPool, NestedCallsRunInline) {
  std::atomic<int64_t> total{0};
  detail::parallel_for(4, 4, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i)
      detail::parallel_for(10, 4, [&](int64_t b, int64_t e) { total += e - b; });
  });
  EXPECT_EQ(total.load(), 40);
}

// A host parallel loop (set_parallel_backend): the kernels' loops run through it, results stay
// bitwise those of the built-in pool, and null restores the pool.
std::atomic<int64_t> host_calls{0};

/// A deliberately odd host loop: max_pieces pieces, run in reverse order on the calling thread.
void reverse_serial_parallel_for(int64_t num_tasks, int max_pieces,
                                 void (*task)(void*, int64_t, int64_t), void* context) {
  host_calls.fetch_add(1);
  for (int64_t piece = max_pieces - 1; piece >= 0; --piece)
    task(context, num_tasks * piece / max_pieces, num_tasks * (piece + 1) / max_pieces);
}

TEST(ThreadPool, HostParallelBackendRunsTheKernelsLoops) {
  testing::Random rng(77);
  testing::GradCase grad =
      testing::make_grad_case(rng, GradScenario::dropless, DType::bfloat16, 900, 8, 1000);
  testing::ForwardCase forward;
  const int64_t N = 900, K = 8, H = 1000;
  std::vector<int32_t> ids(size_t(N * K));
  for (int32_t& id : ids) id = int32_t(rng.integer(-1, 40));
  forward.x =
      testing::Tensor::floats(DType::bfloat16, {N, H}, std::vector<float>(size_t(N * H), 1.5f));
  forward.expert_idx = testing::Tensor::int32s({N, K}, ids);
  forward.attrs.expert_num = 40;
  forward.attrs.expert_tokens_num_flag = true;
  const testing::Runner four{Backend::cpu, CpuIsa::automatic, 4};
  const testing::FloatBuffer grad_pool = testing::run_grad_case(grad, four);
  const testing::ForwardResult forward_pool = testing::run_forward(forward, four);
  ASSERT_TRUE(forward_pool.status.is_ok()) << forward_pool.status.message();

  set_parallel_backend(&reverse_serial_parallel_for);
  host_calls.store(0);
  const testing::FloatBuffer grad_host = testing::run_grad_case(grad, four);
  const int64_t grad_calls = host_calls.load();
  const testing::ForwardResult forward_host = testing::run_forward(forward, four);
  const int64_t forward_calls = host_calls.load() - grad_calls;
  set_parallel_backend(nullptr);

  EXPECT_GE(grad_calls, 1);
  EXPECT_GE(forward_calls, 1);
  EXPECT_TRUE(testing::bitwise_equal(grad_pool, grad_host));
  EXPECT_TRUE(testing::same_result(forward_pool, forward_host));
  host_calls.store(0);
  (void)testing::run_grad_case(grad, four);
  EXPECT_EQ(host_calls.load(), 0) << "null restores the built-in pool";
}

// How many threads a job of a given size gets: one per 2 MiB with the built-in pool (its workers
// sleep), one per the host's threshold (256 KiB by default) with a host pool; null restores 2 MiB.
TEST(ThreadPool, ThreadsForBytesFollowTheInstalledPool) {
  constexpr int64_t KiB = 1024, MiB = 1024 * 1024;
  EXPECT_EQ(detail::threads_for_bytes(4, 3 * MiB), 1);
  EXPECT_EQ(detail::threads_for_bytes(4, 5 * MiB), 2);
  EXPECT_EQ(detail::threads_for_bytes(4, 100 * MiB), 4);
  EXPECT_EQ(detail::threads_for_bytes(4, 0), 1);
  set_parallel_backend(&reverse_serial_parallel_for);
  EXPECT_EQ(detail::threads_for_bytes(4, 300 * KiB), 1);
  EXPECT_EQ(detail::threads_for_bytes(4, 600 * KiB), 2);
  EXPECT_EQ(detail::threads_for_bytes(4, 3 * MiB), 4);
  set_parallel_backend(&reverse_serial_parallel_for, 64 * KiB);
  EXPECT_EQ(detail::threads_for_bytes(4, 130 * KiB), 2);
  set_parallel_backend(nullptr);
  EXPECT_EQ(detail::threads_for_bytes(4, 3 * MiB), 1);
  EXPECT_EQ(detail::threads_for_bytes(4, 5 * MiB), 2);
}

// set_num_threads(0) restores the default read from MOE_ROUTING_NUM_THREADS at the first use. It
// read the variable again: a getenv that can race another thread's setenv (the torch binding's
// calls run without the GIL), and a default that moved with the environment.
TEST(ThreadPool, RestoringTheDefaultDoesNotReadTheEnvironmentAgain) {
  const int before = get_num_threads();  // the first use, at the latest
  ASSERT_TRUE(set_num_threads(0).is_ok());
  const int initial = get_num_threads();
  {
    const EnvironmentVariable variable("MOE_ROUTING_NUM_THREADS", initial == 3 ? "5" : "3");
    ASSERT_TRUE(set_num_threads(7).is_ok());
    ASSERT_TRUE(set_num_threads(0).is_ok());
    EXPECT_EQ(get_num_threads(), initial);
  }
  ASSERT_TRUE(set_num_threads(before).is_ok());
}

// A MOE_ROUTING_NUM_THREADS that is not a whole number >= 0 is ignored, as before, but no longer
// silently ("4x" gave every core with nothing said, while MOE_ROUTING_OUTPUT_CACHE_MB warned): the
// warning names the variable and the value.
TEST(ThreadPool, AnIgnoredThreadVariableWarns) {
  for (const char* bad :
       {"4x", "", " ", "eight", "-5", "0x10", "1.5", "3 4", "-99999999999999999999"}) {
    ::testing::internal::CaptureStderr();
    EXPECT_EQ(detail::num_threads_from_env(bad, 7), 7) << "'" << bad << "'";
    EXPECT_EQ(::testing::internal::GetCapturedStderr(),
              std::string("moe_routing: MOE_ROUTING_NUM_THREADS must be a whole number >= 0 (0: "
                          "every core), got \"") +
                  bad + "\"; using the default (every core: 7)\n")
        << "'" << bad << "'";
  }
  struct Case {
    const char* text;
    int expected;
  };
  for (const Case& c :
       {Case{"3", 3}, Case{" 3\t", 3}, Case{"+04", 4}, Case{"0", 7}, Case{"1025", kMaxNumThreads},
        Case{"99999999999999999999", kMaxNumThreads}}) {
    ::testing::internal::CaptureStderr();
    EXPECT_EQ(detail::num_threads_from_env(c.text, 7), c.expected) << "'" << c.text << "'";
    EXPECT_EQ(::testing::internal::GetCapturedStderr(), "") << "'" << c.text << "'";
  }
}

// The one reading of the variable that the default and `moe-routing info` share: what each value
// means, with nothing written (an invalid value's warning is num_threads_from_env's).
TEST(ThreadPool, TheThreadVariablesReadingSaysWhatEachValueMeans) {
  using Kind = detail::NumThreadsSetting::Kind;
  struct Case {
    const char* text;
    Kind kind;
    int threads;
  };
  const std::string most = std::to_string(kMaxNumThreads);
  const std::string past = std::to_string(kMaxNumThreads + 1);
  for (const Case& c :
       {Case{nullptr, Kind::unset, 0}, Case{"4x", Kind::invalid, 0}, Case{"", Kind::invalid, 0},
        Case{"-1", Kind::invalid, 0}, Case{"0", Kind::every_core, 0},
        Case{" 0 ", Kind::every_core, 0}, Case{"1", Kind::set, 1}, Case{"+04", Kind::set, 4},
        Case{most.c_str(), Kind::set, kMaxNumThreads},
        Case{past.c_str(), Kind::capped, kMaxNumThreads},
        Case{"99999999999999999999", Kind::capped, kMaxNumThreads}}) {
    const char* shown = c.text != nullptr ? c.text : "(unset)";
    ::testing::internal::CaptureStderr();
    const detail::NumThreadsSetting setting = detail::read_num_threads_setting(c.text);
    EXPECT_EQ(::testing::internal::GetCapturedStderr(), "") << shown;
    EXPECT_EQ(setting.kind, c.kind) << shown;
    EXPECT_EQ(setting.threads, c.threads) << shown;
  }
}

// The byte estimates' arithmetic: exact up to INT64_MAX inclusive, INT64_MAX beyond it (a fuzz
// input, finalize with no rows and top_k near 2^63, once overflowed a plain product).
TEST(ThreadPool, SaturatingArithmeticStopsAtInt64Max) {
  constexpr int64_t kMax = INT64_MAX;
  EXPECT_EQ(detail::saturating_mul(0, 0), 0);
  EXPECT_EQ(detail::saturating_mul(0, kMax), 0);
  EXPECT_EQ(detail::saturating_mul(kMax, 0), 0);
  EXPECT_EQ(detail::saturating_mul(1, 1), 1);
  EXPECT_EQ(detail::saturating_mul(4096, 7168), int64_t(4096) * 7168);
  EXPECT_EQ(detail::saturating_mul(kMax, 1), kMax);
  EXPECT_EQ(detail::saturating_mul(1, kMax), kMax);
  // 2^63 - 1 = 7 * 7 * 73 * 127 * 337 * 92737 * 649657: exact products landing on INT64_MAX.
  EXPECT_EQ(detail::saturating_mul(7, kMax / 7), kMax);
  EXPECT_EQ(detail::saturating_mul(kMax / 49, 49), kMax);
  EXPECT_EQ(detail::saturating_mul(int64_t(7) * 7 * 73 * 127 * 337, int64_t(92737) * 649657), kMax);
  EXPECT_EQ(detail::saturating_mul(int64_t(3037000499), int64_t(3037000499)),
            int64_t(3037000499) * 3037000499);  // the largest square that fits
  // Just past INT64_MAX.
  EXPECT_EQ(detail::saturating_mul(7, kMax / 7 + 1), kMax);
  EXPECT_EQ(detail::saturating_mul(int64_t(3037000500), int64_t(3037000500)), kMax);
  EXPECT_EQ(detail::saturating_mul(int64_t(1) << 32, int64_t(1) << 31), kMax);  // 2^63
  EXPECT_EQ(detail::saturating_mul(2, kMax / 2 + 1), kMax);
  EXPECT_EQ(detail::saturating_mul(kMax, 2), kMax);
  EXPECT_EQ(detail::saturating_mul(kMax, kMax), kMax);

  EXPECT_EQ(detail::saturating_add(0, 0), 0);
  EXPECT_EQ(detail::saturating_add(0, kMax), kMax);
  EXPECT_EQ(detail::saturating_add(kMax, 0), kMax);
  EXPECT_EQ(detail::saturating_add(3, 4), 7);
  EXPECT_EQ(detail::saturating_add(kMax - 4, 4), kMax);
  EXPECT_EQ(detail::saturating_add(4, kMax - 4), kMax);
  EXPECT_EQ(detail::saturating_add(kMax - 4, 3), kMax - 1);
  EXPECT_EQ(detail::saturating_add(kMax - 4, 5), kMax);
  EXPECT_EQ(detail::saturating_add(kMax / 2 + 1, kMax / 2 + 1), kMax);
  EXPECT_EQ(detail::saturating_add(1, kMax), kMax);
  EXPECT_EQ(detail::saturating_add(kMax, kMax), kMax);

  // Nested, as the estimates are: a saturated intermediate stays saturated, unless times 0.
  EXPECT_EQ(detail::saturating_add(detail::saturating_mul(kMax, 2), 4), kMax);
  EXPECT_EQ(detail::saturating_mul(detail::saturating_add(kMax, 2), 0), 0);
  EXPECT_EQ(detail::threads_for_bytes(4, detail::saturating_mul(kMax, kMax)), 4);
}

// The entry points' exception barrier (ops/guard.h) maps every standard exception to a runtime
// error: a std::length_error from a container once went through a noexcept entry point
// (std::terminate; moe_finalize_routing_grad with a bias of 2^62 - 1 empty rows).
TEST(EntryPointGuard, AnyStandardExceptionBecomesARuntimeError) {
  const Status length = detail::run_guarded("some_op: ", []() -> Status {
    throw std::length_error("cannot create std::vector larger than max_size()");
  });
  EXPECT_EQ(length.code(), StatusCode::runtime);
  EXPECT_EQ(length.message(),
            "some_op: the call must complete, got an internal error: cannot create std::vector "
            "larger than max_size()");
  const Status memory =
      detail::run_guarded("some_op: ", []() -> Status { throw std::bad_alloc(); });
  EXPECT_EQ(memory.code(), StatusCode::runtime);
  EXPECT_EQ(memory.message(), "some_op: memory must be allocatable, got an allocation failure");
}

}  // namespace
}  // namespace moe_routing
