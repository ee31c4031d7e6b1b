// The limits of the core reach the command-line tool unchanged (issue 17, items 1 and 4): a
// drop-pad call whose slot numbers would overflow int32 and a thread count above the library's
// bound are exit status 2 with the core's words, and nothing is written. The tool adds no check
// of its own for either (its --threads range is the library's kMaxNumThreads).
// docs/reliability.md cites these tests.
#include "cli_test_util.h"

namespace moe_routing {
namespace {

using namespace testing;  // moe_routing::testing: the helpers of cli_test_util.h

CliOptions limited() {
  CliOptions options;
  options.timeout_s = 120;
  options.memory_limit_mib = 2048;
  return options;
}

TEST(AdversarialCliLimits, DropPadSlotsBeyondInt32AreRefused) {
  TempDir dir;
  write_or_fail(dir.file("x.npy"), f32({32768, 0}, {}));
  write_or_fail(dir.file("idx.npy"), i32({32768, 1}, std::vector<int32_t>(32768, 65536)));
  for (const char* command : {"init-routing-v2", "init-routing"}) {
    const std::vector<std::string> args = {"golden",
                                           command,
                                           "--x",
                                           dir.file("x.npy"),
                                           "--expert-idx",
                                           dir.file("idx.npy"),
                                           "--drop-pad-mode",
                                           "1",
                                           "--expert-num",
                                           "65537",
                                           "--expert-capacity",
                                           "32768",
                                           "--out-dir",
                                           dir.file("out")};
    const CliResult r = run_cli(dir, args, limited());
    EXPECT_EQ(r.exit_code, 2) << describe(args, r);
    const std::string op =
        std::string(command) == "init-routing" ? "moe_init_routing" : "moe_init_routing_v2";
    EXPECT_EQ(r.err, op + ": expert_num * expert_capacity must be at most 2147483647 (drop-pad "
                          "slots e*C + c are int32 expanded_row_idx values), got 65537 * 32768 = "
                          "2147516416\n")
        << describe(args, r);
    EXPECT_FALSE(exists(dir.file("out"))) << describe(args, r);
  }
}

TEST(AdversarialCliLimits, ThreadCountsAboveTheLibrarysBoundAreRefused) {
  TempDir dir;
  write_or_fail(dir.file("x.npy"), f32({2, 2}, {1, 2, 3, 4}));
  write_or_fail(dir.file("idx.npy"), i32({2, 1}, {0, 1}));
  write_or_fail(dir.file("g.npy"), f32({2, 2}, {1, 2, 3, 4}));
  write_or_fail(dir.file("r.npy"), i32({2}, {0, 1}));
  const std::vector<std::vector<std::string>> commands = {
      {"golden", "init-routing-v2", "--x", dir.file("x.npy"), "--expert-idx", dir.file("idx.npy"),
       "--out-dir", dir.file("out")},
      {"golden", "init-routing", "--x", dir.file("x.npy"), "--expert-idx", dir.file("idx.npy"),
       "--expert-num", "2", "--out-dir", dir.file("out")},
      {"golden", "grad", "--grad-expanded-x", dir.file("g.npy"), "--expanded-row-idx",
       dir.file("r.npy"), "--top-k", "1", "--out", dir.file("out.npy")}};
  for (std::vector<std::string> args : commands) {
    const std::string command = args[1];
    args.insert(args.end(), {"--threads", "4096"});
    const CliResult r = run_cli(dir, args, limited());
    EXPECT_EQ(r.exit_code, 2) << describe(args, r);
    EXPECT_EQ(r.err,
              "moe-routing: golden " + command + ": --threads must be in [0, 1024], got 4096\n")
        << describe(args, r);
    EXPECT_FALSE(exists(dir.file("out")) || exists(dir.file("out.npy"))) << describe(args, r);
  }
}

}  // namespace
}  // namespace moe_routing
