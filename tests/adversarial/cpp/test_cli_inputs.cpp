// How the moe-routing tool reads its inputs and sizes its arrays, tried as an adversary would
// (issue 17, items 7 and 13): an .npy header is checked, with the size it promises, before any
// data is read (/dev/zero, an endless stream, fails at once; a header promising more than memory
// holds is refused before the allocation); a stream shorter or longer than its header promises is
// an error; outputs larger than memory are refused before they are allocated; neither an input
// nor an output is held twice in memory; every message about a file's content names its flag.
// Each run is limited in time and memory, so a regression fails its test, not the machine.
// docs/reliability.md cites these tests.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "cli_test_util.h"
#include "file_io.h"

namespace moe_routing {
namespace {

using namespace testing;  // moe_routing::testing: the helpers of cli_test_util.h

constexpr int kMemoryLimitMib = 2048;

CliOptions limited() {
  CliOptions options;
  options.timeout_s = 120;
  options.memory_limit_mib = kMemoryLimitMib;
  return options;
}

/// The preamble and header of an .npy file for `dtype` and `shape`, without the data.
std::string npy_header(DType dtype, const std::vector<int64_t>& shape) {
  std::string header;
  const Status s = npy::encode_header(dtype, shape, "header", &header);
  EXPECT_TRUE(s.is_ok()) << s.message();
  return header;
}

/// Feeds `bytes` into the FIFO `path` from a thread once a reader has opened it (and gives up
/// quietly after a minute without one, or when the reader goes away).
class FifoFeeder {
 public:
  FifoFeeder(std::string path, std::string bytes)
      : thread_([path = std::move(path), bytes = std::move(bytes)] {
          const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
          int fd;
          while ((fd = ::open(path.c_str(), O_WRONLY | O_NONBLOCK)) < 0) {
            if (errno != ENXIO || std::chrono::steady_clock::now() > deadline) return;
            std::this_thread::sleep_for(std::chrono::milliseconds(2));
          }
          ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
          size_t done = 0;
          while (done < bytes.size()) {
            const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
            if (n <= 0) break;  // EPIPE: the reader stopped reading (SIGPIPE is ignored)
            done += size_t(n);
          }
          ::close(fd);
        }) {}
  ~FifoFeeder() { thread_.join(); }

 private:
  std::thread thread_;
};

class AdversarialCliInputs : public ::testing::Test {
 protected:
  void SetUp() override { ::signal(SIGPIPE, SIG_IGN); }
};

// --- item 7: the header and the size it promises come before the data ------------------------

TEST_F(AdversarialCliInputs, DevZeroFailsAtOnceNamingItsFlag) {
  TempDir dir;
  write_or_fail(dir.file("g.npy"), f32({2, 1}, {1, 2}));
  write_or_fail(dir.file("r.npy"), i32({2}, {0, 1}));
  const std::string zeros = "\\x00\\x00\\x00\\x00\\x00\\x00";
  for (const char* flag : {"--grad-expanded-x", "--expanded-row-idx"}) {
    std::vector<std::string> args = golden_grad(dir, 1, dir.file("out.npy"));
    *(std::find(args.begin(), args.end(), flag) + 1) = "/dev/zero";
    const CliResult r = run_cli(dir, args, limited());
    EXPECT_FALSE(r.timed_out) << describe(args, r);
    EXPECT_EQ(r.exit_code, 2) << describe(args, r);
    EXPECT_EQ(r.err, std::string("moe-routing: ") + flag +
                         " /dev/zero: file must start with the .npy magic string \\x93NUMPY, got " +
                         zeros + " (not an .npy file)\n")
        << describe(args, r);
    EXPECT_FALSE(exists(dir.file("out.npy")));
  }
}

TEST_F(AdversarialCliInputs, AHeaderPromisingMoreThanMemoryIsRefusedBeforeTheData) {
  TempDir dir;
  write_or_fail(dir.file("r.npy"), i32({2}, {0, 1}));
  const int64_t elements = int64_t(1) << 41;  // 8 TiB of float32
  const std::string header = npy_header(DType::float32, {elements});
  const std::string expected_message =
      "moe-routing: --grad-expanded-x " + dir.file("g.npy") +
      ": data float32 (2199023255552,) (8796093022208 bytes (8192.0 GiB)) must fit in the "
      "memory available, got ";
  // A sparse regular file as large as its header promises (its size matches, so only the memory
  // check stands between the tool and an 8 TiB allocation).
  {
    const int fd = ::open(dir.file("g.npy").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::write(fd, header.data(), header.size()), ssize_t(header.size()));
    ASSERT_EQ(::ftruncate(fd, off_t(header.size()) + elements * 4), 0) << std::strerror(errno);
    ::close(fd);
  }
  std::vector<std::string> args = golden_grad(dir, 1, dir.file("out.npy"));
  CliResult r = run_cli(dir, args, limited());
  EXPECT_FALSE(r.timed_out) << describe(args, r);
  EXPECT_EQ(r.exit_code, 2) << describe(args, r);
  EXPECT_EQ(r.err.rfind(expected_message, 0), 0u) << describe(args, r);

  // The same header through a FIFO, with no data after it: refused before reading on.
  ASSERT_EQ(::unlink(dir.file("g.npy").c_str()), 0);
  ASSERT_EQ(::mkfifo(dir.file("g.npy").c_str(), 0644), 0);
  {
    FifoFeeder feeder(dir.file("g.npy"), header);
    r = run_cli(dir, args, limited());
  }
  EXPECT_EQ(r.exit_code, 2) << describe(args, r);
  EXPECT_EQ(r.err.rfind(expected_message, 0), 0u) << describe(args, r);
}

TEST_F(AdversarialCliInputs, StreamsMustHoldExactlyWhatTheirHeaderPromises) {
  TempDir dir;
  write_or_fail(dir.file("r.npy"), i32({2}, {0, 1}));
  const std::string header = npy_header(DType::float32, {2, 3});
  const std::string data(24, '\0');
  struct Case {
    const char* name;
    std::string bytes;
    int exit_code;
    std::string message;
  };
  const std::string prefix = "moe-routing: --grad-expanded-x " + dir.file("g.npy") + ": ";
  const std::vector<Case> cases = {
      {"exact", header + data, 0, ""},
      {"short data", header + data.substr(0, 20), 2,
       prefix + "data must be 24 bytes for float32 (2, 3), got 20 bytes (truncated file)\n"},
      {"trailing bytes", header + data + "x", 2,
       prefix + "data must be 24 bytes for float32 (2, 3), got 25 or more bytes (trailing "
                "bytes)\n"},
      {"short header", header.substr(0, 40), 2,
       prefix + "header must fit in the file (118 bytes declared), got a file of 40 bytes "
                "(truncated file)\n"},
  };
  ASSERT_EQ(::mkfifo(dir.file("g.npy").c_str(), 0644), 0);
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::vector<std::string> args = golden_grad(dir, 1, dir.file("out.npy"));
    CliResult r;
    {
      FifoFeeder feeder(dir.file("g.npy"), c.bytes);
      r = run_cli(dir, args, limited());
    }
    EXPECT_EQ(r.exit_code, c.exit_code) << describe(args, r);
    EXPECT_EQ(r.err, c.message) << describe(args, r);
    EXPECT_EQ(exists(dir.file("out.npy")), c.exit_code == 0);
    ::unlink(dir.file("out.npy").c_str());
  }
}

// --- item 7: arrays larger than memory are refused, none is held twice -----------------------

/// Writes a 1 MiB x [4, 65536] (float32) and its routing to four experts, and returns the
/// arguments of a drop-pad `golden init-routing-v2` over `experts` experts of capacity 4: its
/// expanded_x [experts, 4, 65536] holds experts MiB.
std::vector<std::string> drop_pad_run(const TempDir& dir, int64_t experts) {
  write_or_fail(dir.file("x.npy"), npy::Array(DType::float32, {4, 65536}));
  write_or_fail(dir.file("idx.npy"), i32({4, 1}, {0, 1, 2, 3}));
  return {"golden",
          "init-routing-v2",
          "--x",
          dir.file("x.npy"),
          "--expert-idx",
          dir.file("idx.npy"),
          "--drop-pad-mode",
          "1",
          "--expert-num",
          std::to_string(experts),
          "--expert-capacity",
          "4",
          "--threads",
          "1",
          "--out-dir",
          dir.file("out")};
}

TEST_F(AdversarialCliInputs, OutputsLargerThanMemoryAreRefusedBeforeTheirAllocation) {
  // 2^24 experts ask for a 16 TiB expanded_x.
  TempDir dir;
  const std::vector<std::string> args = drop_pad_run(dir, 16777216);
  const CliResult r = run_cli(dir, args, limited());
  EXPECT_FALSE(r.timed_out) << describe(args, r);
  EXPECT_EQ(r.exit_code, 2) << describe(args, r);
  EXPECT_EQ(r.err.rfind("moe-routing: golden init-routing-v2: the outputs (expanded_x float32 "
                        "[16777216, 4, 65536], expanded_row_idx int32 [4]) and the operator's "
                        "scratch memory (",
                        0),
            0u)
      << describe(args, r);
  EXPECT_NE(r.err.find(" must fit in the memory available, got "), std::string::npos)
      << describe(args, r);
  EXPECT_FALSE(exists(dir.file("out")));
}

TEST_F(AdversarialCliInputs, ScratchLargerThanMemoryIsRefusedBeforeTheOperatorRuns) {
  // The command: 2^31 - 1 experts with counts on a 4 x 8 input need an 8 GiB output and
  // 16 GiB of the operator's scratch memory (counting sort over every expert id).
  TempDir dir;
  const npy::Array x(DType::float32, {4, 8});
  const npy::Array idx = i32({4, 2}, {0, 1, 2, 3, 4, 5, 6, 7});
  write_or_fail(dir.file("x.npy"), x);
  write_or_fail(dir.file("idx.npy"), idx);
  MoeInitRoutingV2Attrs attrs;
  attrs.expert_num = 2147483647;
  attrs.expert_tokens_count_or_cumsum_flag = 2;
  MoeInitRoutingV2Plan plan;
  ASSERT_TRUE(infer_moe_init_routing_v2(x.view(), idx.view(), attrs, &plan).is_ok());
  const uint64_t needed = moe_init_routing_v2_workspace_size(plan, 1) + uint64_t(2147483647) * 4;
#if defined(MOE_ROUTING_TEST_ASAN)
  // Without an address-space limit (AddressSanitizer's shadow needs the address space) the tool
  // sees the machine's whole memory: the request is only refused where it does not fit.
  if (file_io::available_memory() < 0 || uint64_t(file_io::available_memory()) > needed)
    GTEST_SKIP() << "this machine has room for " << needed << " bytes";
#endif
  const std::vector<std::string> args = {"golden",
                                         "init-routing-v2",
                                         "--x",
                                         dir.file("x.npy"),
                                         "--expert-idx",
                                         dir.file("idx.npy"),
                                         "--expert-num",
                                         "2147483647",
                                         "--expert-tokens-count-or-cumsum-flag",
                                         "2",
                                         "--threads",
                                         "1",
                                         "--out-dir",
                                         dir.file("out")};
  const CliResult r = run_cli(dir, args, limited());
  EXPECT_FALSE(r.timed_out) << describe(args, r);
  EXPECT_EQ(r.exit_code, 2) << describe(args, r);
  EXPECT_EQ(r.err.rfind("moe-routing: golden init-routing-v2: the outputs (expanded_x float32 [8, "
                        "8], expanded_row_idx int32 [8], expert_tokens_count_or_cumsum int32 "
                        "[2147483647]) and the operator's scratch memory (" +
                            std::to_string(needed - uint64_t(2147483647) * 4) + " bytes) (",
                        0),
            0u)
      << describe(args, r);
  EXPECT_FALSE(exists(dir.file("out")));
}

/// Peak resident memory a run may reach holding `arrays_bytes` of arrays once: half again for the
/// process itself, its libraries and (under AddressSanitizer) the shadow of what it touched.
long peak_allowed_kib(uint64_t arrays_bytes) {
  return long((arrays_bytes + arrays_bytes / 2) / 1024) + 64 * 1024;
}

TEST_F(AdversarialCliInputs, AnOutputIsWrittenWithoutASecondCopy) {
  // 256 experts: a 256 MiB expanded_x from a 1 MiB x.
  TempDir dir;
  const std::vector<std::string> args = drop_pad_run(dir, 256);
  const CliResult r = run_cli(dir, args, limited());
  ASSERT_EQ(r.exit_code, 0) << describe(args, r);
  const uint64_t output = uint64_t(256) * 4 * 65536 * 4;
  EXPECT_LT(r.max_rss_kib, peak_allowed_kib(output + (1 << 20)))
      << "a 256 MiB output was held twice";
  struct stat info;
  ASSERT_EQ(::stat(dir.file("out/expanded_x.npy").c_str(), &info), 0);
  EXPECT_EQ(uint64_t(info.st_size), output + 128);
}

TEST_F(AdversarialCliInputs, AnInputIsReadWithoutASecondCopy) {
  // grad_expanded_x [65536, 1024] float32 (256 MiB) with top_k 64: grad_x is 4 MiB.
  TempDir dir;
  const int64_t rows = 65536, hidden = 1024, top_k = 64;
  {
    npy::Array g(DType::float32, {rows, hidden});
    write_or_fail(dir.file("g.npy"), g);
  }
  std::vector<int32_t> identity(static_cast<size_t>(rows));
  for (int64_t i = 0; i < rows; ++i) identity[size_t(i)] = int32_t(i);
  write_or_fail(dir.file("r.npy"), i32({rows}, identity));
  const std::vector<std::string> args =
      golden_grad(dir, top_k, dir.file("out.npy"), {"--threads", "1"});
  const CliResult r = run_cli(dir, args, limited());
  ASSERT_EQ(r.exit_code, 0) << describe(args, r);
  const uint64_t arrays =
      uint64_t(rows) * hidden * 4 + uint64_t(rows) * 4 + uint64_t(rows / top_k) * hidden * 4;
  EXPECT_LT(r.max_rss_kib, peak_allowed_kib(arrays)) << "a 256 MiB input was held twice";
}

// --- item 13: messages about a file name its flag -------------------------------------------

TEST_F(AdversarialCliInputs, EveryInputsMessagesNameItsFlag) {
  TempDir dir;
  std::ofstream(dir.file("text.npy")) << "not an array";
  const std::string missing = dir.file("missing.npy");
  struct Command {
    std::vector<std::string> args;        // valid
    std::vector<std::string> file_flags;  // each replaced in turn by a bad file
  };
  write_or_fail(dir.file("g.npy"), f32({2, 1}, {1, 2}));
  write_or_fail(dir.file("r.npy"), i32({2}, {0, 1}));
  write_or_fail(dir.file("x.npy"), f32({2, 1}, {1, 2}));
  write_or_fail(dir.file("idx.npy"), i32({2, 1}, {0, 1}));
  write_or_fail(dir.file("scale.npy"), f32({2}, {1, 1}));
  write_or_fail(dir.file("offset.npy"), f32({1}, {0}));
  write_or_fail(dir.file("w.npy"), f32({2, 1}, {1, 1}));
  write_or_fail(dir.file("bias.npy"), f32({2, 1}, {0, 0}));
  write_or_fail(dir.file("idx0.npy"), i32({2, 1}, {0, 0}));
  const std::vector<Command> commands = {
      {golden_grad(dir, 1, dir.file("out.npy")), {"--grad-expanded-x", "--expanded-row-idx"}},
      {{"golden", "init-routing-v2", "--x", dir.file("x.npy"), "--expert-idx", dir.file("idx.npy"),
        "--out-dir", dir.file("out")},
       {"--x", "--expert-idx"}},
      {{"golden", "init-routing", "--x", dir.file("x.npy"), "--expert-idx", dir.file("idx.npy"),
        "--expert-num", "2", "--scale", dir.file("scale.npy"), "--topk-weight", dir.file("w.npy"),
        "--out-dir", dir.file("out")},
       {"--x", "--expert-idx", "--scale", "--topk-weight"}},
      {{"golden", "init-routing", "--x", dir.file("x.npy"), "--expert-idx", dir.file("idx.npy"),
        "--expert-num", "2", "--quant-mode", "0", "--scale", dir.file("offset.npy"), "--offset",
        dir.file("offset.npy"), "--out-dir", dir.file("out")},
       {"--offset"}},
      // The combine: [N, H] = [2, 1], K = 1, one expert.
      {{"golden", "finalize-routing", "--expanded-x", dir.file("x.npy"), "--expanded-row-idx",
        dir.file("r.npy"), "--x1", dir.file("g.npy"), "--x2", dir.file("g.npy"), "--bias",
        dir.file("bias.npy"), "--scales", dir.file("w.npy"), "--expert-idx", dir.file("idx.npy"),
        "--out", dir.file("out.npy")},
       {"--expanded-x", "--expanded-row-idx", "--x1", "--x2", "--bias", "--scales",
        "--expert-idx"}},
      {{"golden", "finalize-routing-grad", "--grad-y", dir.file("g.npy"), "--expanded-row-idx",
        dir.file("r.npy"), "--expanded-x", dir.file("x.npy"), "--scales", dir.file("w.npy"),
        "--expert-idx", dir.file("idx0.npy"), "--bias", dir.file("bias.npy"), "--out-dir",
        dir.file("out")},
       {"--grad-y", "--expanded-row-idx", "--expanded-x", "--scales", "--expert-idx", "--bias"}},
  };
  for (const Command& command : commands) {
    const CliResult valid = run_cli(dir, command.args, limited());
    ASSERT_EQ(valid.exit_code, 0) << describe(command.args, valid);
    for (const std::string& flag : command.file_flags) {
      for (const std::string& bad : {dir.file("text.npy"), missing}) {
        std::vector<std::string> args = command.args;
        *(std::find(args.begin(), args.end(), flag) + 1) = bad;
        const CliResult r = run_cli(dir, args, limited());
        EXPECT_EQ(r.exit_code, 2) << describe(args, r);
        const std::string what = bad == missing
                                     ? "file must be readable, got 'No such file or directory'"
                                     : "file must start with the .npy magic string";
        EXPECT_EQ(r.err.rfind("moe-routing: " + flag + " " + bad + ": " + what, 0), 0u)
            << describe(args, r);
      }
    }
  }
}

}  // namespace
}  // namespace moe_routing
