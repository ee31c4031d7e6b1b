// The moe-routing binary run as a subprocess: help, version, info, a small demo and a small bench.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "cli_test_util.h"
#include "file_io.h"
#include "npy.h"

namespace moe_routing {
namespace {

using namespace testing;  // moe_routing::testing: the helpers of cli_test_util.h

// --- help, version, info -----------------------------------------------------------------------

TEST(CliHelp, EveryCommandDocumentsEveryFlag) {
  TempDir dir;
  struct Case {
    std::vector<std::string> command;
    std::vector<std::string> mentions;
  };
  const std::vector<Case> cases = {
      {{"golden", "grad"},
       {"--grad-expanded-x FILE", "--expanded-row-idx FILE", "--top-k K", "--drop-pad-mode 0|1",
        "--active-num A", "--numerics atlas_a2|ascend_950", "(default: atlas_a2)",
        "--order tree|sequential", "--backend automatic|reference|cpu", "--threads T", "--out FILE",
        "--help", "Examples:", "moe-routing golden grad --grad-expanded-x"}},
      {{"golden", "init-routing-v2"},
       {"--x FILE",
        "--expert-idx FILE",
        "--active-num A",
        "(default: 0)",
        "--expert-capacity C",
        "--expert-num E",
        "--drop-pad-mode 0|1",
        "--expert-tokens-count-or-cumsum-flag 0|1|2",
        "--expert-tokens-before-capacity-flag 0|1",
        "--numerics atlas_a2|ascend_950",
        "--backend automatic|reference|cpu",
        "--threads T",
        "--out-dir DIR",
        "--help",
        "expanded_x.npy",
        "expanded_row_idx.npy",
        "expert_tokens_count_or_cumsum.npy",
        "expert_tokens_before_capacity.npy",
        "Examples:",
        "moe-routing golden init-routing-v2 --x"}},
      {{"golden", "init-routing"},
       {"--x FILE",
        "--expert-idx FILE",
        "--scale FILE",
        "--offset FILE",
        "--topk-weight FILE",
        "--active-num A",
        "(default: -1)",
        "--expert-capacity C",
        "--expert-num E",
        "--drop-pad-mode 0|1",
        "--expert-tokens-num-type 0|1|2",
        "--expert-tokens-num-flag 0|1",
        "--quant-mode -1|0|1",
        "--active-expert-range START,END",
        "(default: 0,expert_num)",
        "--row-idx-type 0|1",
        "--numerics atlas_a2|ascend_950",
        "(default: atlas_a2)",
        "--backend automatic|reference|cpu",
        "--threads T",
        "--out-dir DIR",
        "--help",
        "expanded_x.npy",
        "expanded_row_idx.npy",
        "expert_tokens_count_or_cumsum.npy",
        "expanded_scale.npy",
        "expanded_topk_weight.npy",
        "Examples:",
        "moe-routing golden init-routing --x"}},
      {{"demo"},
       {"--tokens N", "(default: 4096)", "--hidden H", "--experts E", "(default: 64)", "--top-k K",
        "(default: 8)", "--dtype bf16|fp16|fp32", "(default: bf16)", "--order tree|sequential",
        "--threads T", "--seed S", "--runs R", "--help", "Examples:", "moe-routing demo"}},
      {{"info"}, {"--help", "MOE_ROUTING_NUM_THREADS", "Examples:", "moe-routing info"}},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = c.command;
    args.push_back("--help");
    const CliResult help = run_cli(dir, args);
    EXPECT_EQ(help.exit_code, 0) << describe(args, help);
    EXPECT_TRUE(help.err.empty()) << describe(args, help);
    for (const std::string& text : c.mentions)
      EXPECT_NE(help.out.find(text), std::string::npos) << "'" << text << "' missing from\n"
                                                        << help.out;
    std::vector<std::string> help_form = {"help"};
    help_form.insert(help_form.end(), c.command.begin(), c.command.end());
    const CliResult same = run_cli(dir, help_form);
    EXPECT_EQ(same.exit_code, 0) << describe(help_form, same);
    EXPECT_EQ(same.out, help.out);
    args.back() = "-h";
    EXPECT_EQ(run_cli(dir, args).out, help.out);
  }
}

TEST(CliHelp, TopLevelHelpVersionAndUnknownCommands) {
  TempDir dir;
  for (const char* flag : {"--help", "-h", "help"}) {
    const CliResult r = run_cli(dir, {flag});
    EXPECT_EQ(r.exit_code, 0) << flag;
    for (const char* text :
         {"Usage: moe-routing <command>", "golden init-routing-v2", "golden init-routing ",
          "golden grad", "demo", "info", "--version", "Exit status", "Examples:"})
      EXPECT_NE(r.out.find(text), std::string::npos) << text << " missing from\n" << r.out;
  }
  const CliResult version = run_cli(dir, {"--version"});
  EXPECT_EQ(version.exit_code, 0);
  EXPECT_EQ(version.out, std::string("moe-routing ") + MOE_ROUTING_VERSION_TEXT + "\n");

  const CliResult none = run_cli(dir, {});
  EXPECT_EQ(none.exit_code, 2);
  EXPECT_NE(none.err.find("Usage: moe-routing <command>"), std::string::npos) << none.err;

  const CliResult unknown = run_cli(dir, {"frobnicate"});
  EXPECT_EQ(unknown.exit_code, 2);
  EXPECT_NE(unknown.err.find("moe-routing: command must be one of golden init-routing-v2, golden "
                             "init-routing, golden grad, golden finalize-routing, golden "
                             "finalize-routing-grad, demo, bench, info, help, --help, "
                             "--version, got 'frobnicate'"),
            std::string::npos)
      << unknown.err;

  const CliResult group = run_cli(dir, {"golden"});
  EXPECT_EQ(group.exit_code, 2);
  EXPECT_NE(group.err.find("moe-routing: golden: subcommand must be one of golden "
                           "init-routing-v2, golden init-routing, golden grad, golden "
                           "finalize-routing, golden finalize-routing-grad, got none"),
            std::string::npos)
      << group.err;
  const CliResult group_help = run_cli(dir, {"help", "golden"});
  EXPECT_EQ(group_help.exit_code, 0);
  for (const char* name : {"golden init-routing-v2", "golden init-routing,", "golden grad"})
    EXPECT_NE(group_help.out.find(name), std::string::npos) << group_help.out;
  const CliResult wrong_sub = run_cli(dir, {"golden", "forward"});
  EXPECT_EQ(wrong_sub.exit_code, 2);
  EXPECT_NE(wrong_sub.err.find("got 'forward'"), std::string::npos) << wrong_sub.err;
}

TEST(CliInfo, ReportsVersionIsaAndThreads) {
  TempDir dir;
  const CliResult r = run_cli(dir, {"info"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find(std::string("moe-routing ") + MOE_ROUTING_VERSION_TEXT), std::string::npos);
  EXPECT_NE(r.out.find(std::string("cpu isa:         ") + cpu_isa_name(best_cpu_isa())),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("available isas:  baseline"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("streaming stores: outputs of "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("the threshold is its size within 8-32 MiB)\n"), std::string::npos) << r.out;
  const CliResult three = run_cli(dir, {"info"}, CliOptions{{"MOE_ROUTING_NUM_THREADS=3"}});
  EXPECT_NE(three.out.find("default threads: 3 (MOE_ROUTING_NUM_THREADS=3)"), std::string::npos)
      << three.out;
  EXPECT_EQ(run_cli(dir, {"info", "--bogus"}).exit_code, 2);
}

// The variable as the library read it: an invalid value is ignored (the label must not suggest
// it set the count), a too large one capped.
TEST(CliInfo, SaysWhenTheThreadVariableIsIgnoredOrCapped) {
  TempDir dir;
  for (const char* value : {"abc", "-3", "2x", ""}) {
    const CliResult r =
        run_cli(dir, {"info"}, CliOptions{{std::string("MOE_ROUTING_NUM_THREADS=") + value}});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find(std::string("(every core; MOE_ROUTING_NUM_THREADS=") + value +
                         " ignored: not a whole number >= 0)"),
              std::string::npos)
        << r.out;
  }
  // 0 is the library's documented "every core" (core/thread_pool.h), read without a warning: info
  // says so rather than calling it ignored.
  const CliResult zero = run_cli(dir, {"info"}, CliOptions{{"MOE_ROUTING_NUM_THREADS=0"}});
  ASSERT_EQ(zero.exit_code, 0) << zero.err;
  EXPECT_NE(zero.out.find("(every core: MOE_ROUTING_NUM_THREADS=0)\n"), std::string::npos)
      << zero.out;
  EXPECT_EQ(zero.err.find("MOE_ROUTING_NUM_THREADS"), std::string::npos) << zero.err;
  const CliResult big = run_cli(dir, {"info"}, CliOptions{{"MOE_ROUTING_NUM_THREADS=99999"}});
  EXPECT_NE(big.out.find("default threads: 1024 (MOE_ROUTING_NUM_THREADS=99999 capped at 1024)"),
            std::string::npos)
      << big.out;
  const CliResult max = run_cli(dir, {"info"}, CliOptions{{"MOE_ROUTING_NUM_THREADS=1024"}});
  EXPECT_NE(max.out.find("default threads: 1024 (MOE_ROUTING_NUM_THREADS=1024)\n"),
            std::string::npos)
      << max.out;
}

// --- demo --------------------------------------------------------------------------------------

TEST(CliDemo, SmallBatchesVerifyBothOperatorsInEveryScenario) {
  TempDir dir;
  const std::vector<std::vector<std::string>> runs = {
      {"demo", "--tokens", "67", "--hidden", "45", "--experts", "6", "--top-k", "4", "--runs", "2"},
      {"demo", "--tokens", "33", "--hidden", "130", "--experts", "5", "--top-k", "5", "--dtype",
       "fp16", "--order", "sequential", "--threads", "3", "--runs", "1", "--seed", "9"},
      {"demo", "--tokens", "40", "--hidden", "7", "--experts", "16", "--top-k", "1", "--dtype",
       "fp32", "--runs", "1"},
  };
  for (const auto& args : runs) {
    const CliResult r = run_cli(dir, args);
    ASSERT_EQ(r.exit_code, 0) << describe(args, r);
    for (const char* scenario : {"dropless", "active", "drop_pad"})
      for (const char* op : {"moe_init_routing_v2", "moe_init_routing_grad"}) {
        const std::string progress =
            std::string("[demo] ") + scenario + ": " + op + ": bitwise identical";
        EXPECT_NE(r.err.find(progress), std::string::npos) << progress << " missing from\n"
                                                           << r.err;
      }
    // One row per (operator, scenario), each verified; the order column only for the backward.
    const bool sequential = std::find(args.begin(), args.end(), "sequential") != args.end();
    std::vector<std::string> rows;
    std::istringstream lines(r.out);
    std::string line;
    while (std::getline(lines, line)) {
      std::istringstream words(line);
      std::string op, scenario, dtype, order;
      words >> op >> scenario >> dtype >> order;
      if (op != "moe_init_routing_v2" && op != "moe_init_routing_grad") continue;
      if (scenario != "dropless" && scenario != "active" && scenario != "drop_pad") continue;
      rows.push_back(op + " " + scenario);
      const std::string grad_order = sequential ? "sequential" : "tree";
      EXPECT_EQ(order, op == "moe_init_routing_v2" ? "-" : grad_order) << line;
      EXPECT_NE(line.find(" yes"), std::string::npos) << line;
    }
    EXPECT_EQ(rows, (std::vector<std::string>{
                        "moe_init_routing_v2 dropless", "moe_init_routing_grad dropless",
                        "moe_init_routing_v2 active", "moe_init_routing_grad active",
                        "moe_init_routing_v2 drop_pad", "moe_init_routing_grad drop_pad"}))
        << r.out;
  }
}

TEST(CliDemo, RejectsImpossibleSizes) {
  TempDir dir;
  const CliResult r = run_cli(dir, {"demo", "--experts", "4", "--top-k", "5"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err, "moe-routing: demo: --top-k must be at most --experts (4), got 5\n");
  const CliResult big = run_cli(dir, {"demo", "--tokens", "1000000000", "--top-k", "8"});
  EXPECT_EQ(big.exit_code, 2);
  EXPECT_NE(
      big.err.find("--tokens * --top-k must be at most 2147483647 (int32 indices), got 8000000000"),
      std::string::npos)
      << big.err;
  const CliResult zero = run_cli(dir, {"demo", "--tokens", "0"});
  EXPECT_EQ(zero.exit_code, 2);
  EXPECT_NE(zero.err.find("--tokens must be in [1, 2147483647], got 0"), std::string::npos)
      << zero.err;
}

TEST(CliDemo, AsManyExpertsPerTokenAsExpertsRoutesInSeconds) {
  // Routing drew each expert with a scan over all E of them (K * E steps per token): with
  // --top-k = --experts = 2^20 the demo spent many minutes before its first operator.
  TempDir dir;
  CliOptions options;
  options.timeout_s = 120;
  const CliResult r = run_cli(dir,
                              {"demo", "--tokens", "1", "--hidden", "1", "--experts", "1048576",
                               "--top-k", "1048576", "--runs", "1"},
                              options);
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

TEST(CliBench, SmallSweepPrintsEveryRowAndWritesCsv) {
  TempDir dir;
  const std::string csv = dir.file("bench.csv");
  const CliResult r = run_cli(dir, {"bench", "--shape", "mixtral", "--tokens", "3,17", "--runs",
                                    "1", "--threads", "2", "--dtype", "fp16", "--csv", csv});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("copy GB/s"), std::string::npos) << r.out;
  // 2 token counts x (3 backward + 2 forward scenarios + the combine and its backward), each a
  // row naming its scenario.
  for (const char* scenario : {"dropless", "active", "drop_pad", "finalize-grad"})
    EXPECT_NE(r.out.find(scenario), std::string::npos) << r.out;
  std::ifstream in(csv);
  std::string line;
  int lines = 0;
  while (std::getline(in, line)) ++lines;
  EXPECT_EQ(lines, 1 + 2 * 7);
  EXPECT_NE(r.err.find("[bench 14/14]"), std::string::npos) << r.err;
  // Every row carries the copy bandwidth measured next to it (a positive number in the CSV).
  std::ifstream again(csv);
  std::getline(again, line);
  EXPECT_NE(line.find("copy_gbps"), std::string::npos) << line;
  EXPECT_NE(line.find(",ceiling_fraction_of_copy"), std::string::npos) << line;
  // The functional calls' columns: into outputs allocated per call, with and without huge pages.
  std::vector<std::string> header;
  {
    std::stringstream names(line);
    std::string name;
    while (std::getline(names, name, ',')) header.push_back(name);
  }
  const std::vector<std::string> fresh_columns = {"fresh_ms", "fresh_over_out", "fresh_4k_ms",
                                                  "fresh_4k_over_out", "fresh_fraction_of_limit"};
  std::vector<size_t> fresh_at;
  for (const std::string& name : fresh_columns) {
    fresh_at.push_back(size_t(std::find(header.begin(), header.end(), name) - header.begin()));
    ASSERT_LT(fresh_at.back(), header.size()) << name << " missing: " << line;
  }
  EXPECT_NE(r.out.find("fresh ms"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("fresh%lim"), std::string::npos) << r.out;
  while (std::getline(again, line)) {
    std::vector<std::string> values;
    {
      std::stringstream cells(line);
      std::string cell;
      while (std::getline(cells, cell, ',')) values.push_back(cell);
    }
    ASSERT_EQ(values.size(), header.size()) << line;
    for (size_t at : fresh_at) EXPECT_GT(std::stod(values[at]), 0.0) << header[at] << ": " << line;
    // The fresh-output call's fraction of the shortest time: limit ms / fresh ms.
    auto value_of = [&](const char* name) {
      const size_t at = size_t(std::find(header.begin(), header.end(), name) - header.begin());
      EXPECT_LT(at, header.size()) << name;
      return at < values.size() ? std::stod(values[at]) : 0.0;
    };
    EXPECT_NEAR(value_of("fresh_fraction_of_limit"), value_of("limit_ms") / value_of("fresh_ms"),
                1e-4 * value_of("fresh_fraction_of_limit"))
        << line;
    std::stringstream fields(line);
    std::string field;
    for (int f = 0; f <= 12; ++f) std::getline(fields, field, ',');  // the 13th: copy_gbps
    EXPECT_GT(std::stod(field), 0.0) << line;
    // The last: the highest fraction of copy the measured bandwidths allow, in (0, 1].
    const double ceiling = std::stod(line.substr(line.rfind(',') + 1));
    EXPECT_GT(ceiling, 0.0) << line;
    EXPECT_LE(ceiling, 1.0) << line;
  }
}

TEST(CliBench, MachineModeReportsBandwidthsAndTheCeilingsTheySet) {
  TempDir dir;
  const CliResult r = run_cli(dir, {"bench", "--machine", "--runs", "1", "--threads", "2"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* line :
       {"copy (memcpy", "read alone", "write alone (memset)", "write alone (non-temporal stores)",
        "zero lines (CLZERO", "First touch of fresh memory", "4 KiB pages: ms per MiB",
        "4 KiB pages: us per page fault", "zeroing by a program (memset"})
    EXPECT_NE(r.out.find(line), std::string::npos) << line << "\n" << r.out;
  // The first-touch costs: positive numbers, 2 MiB pages where the kernel has THP in a mode that
  // gives them to advised memory.
  std::ifstream thp_file("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string thp;
  std::getline(thp_file, thp);
  const bool huge =
      thp.find("[always]") != std::string::npos || thp.find("[madvise]") != std::string::npos;
  for (const char* key : {"4 KiB pages: ms per MiB", "2 MiB pages (MADV_HUGEPAGE): ms per MiB",
                          "zeroing by the OS (2 MiB first touch), GB/s"}) {
    const size_t at = r.out.find(key);
    if (!huge && std::string(key).find("2 MiB") != std::string::npos) {
      EXPECT_EQ(at, std::string::npos) << r.out;
      continue;
    }
    ASSERT_NE(at, std::string::npos) << key << "\n" << r.out;
    std::stringstream line(r.out.substr(at + std::strlen(key)));
    double one = 0, two = 0;
    ASSERT_TRUE(line >> one >> two) << r.out;
    EXPECT_GT(one, 0.0) << key;
    EXPECT_GT(two, 0.0) << key;
  }
  EXPECT_NE(r.out.find("2 threads"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("[bench --machine 1/1]"), std::string::npos) << r.err;
  // One ceiling per operator and top_k, each a percentage in (0, 100].
  for (const char* key : {"top_k 2: forward", "top_k 8: forward"}) {
    const size_t at = r.out.find(key);
    ASSERT_NE(at, std::string::npos) << key << "\n" << r.out;
    std::stringstream line(r.out.substr(at, r.out.find('\n', at) - at));
    std::string word;
    int percentages = 0;
    while (line >> word)
      if (word.find('%') != std::string::npos) {  // "69.5%," or "84.2%"
        const double value = std::stod(word.substr(0, word.find('%')));
        EXPECT_GT(value, 0.0) << word;
        EXPECT_LE(value, 100.0) << word;
        ++percentages;
      }
    EXPECT_EQ(percentages, 2) << key << "\n" << r.out;
  }
}

TEST(CliBench, MachineModeRefusesTheSweepsFlags) {
  TempDir dir;
  const CliResult r = run_cli(dir, {"bench", "--machine", "--csv", dir.file("m.csv")});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--csv cannot be combined with --machine"), std::string::npos) << r.err;
  EXPECT_EQ(r.out.find("copy (memcpy"), std::string::npos) << r.out;  // measured nothing
}

TEST(CliBench, IsaPicksTheKernelsLevelAndRefusesOneThisMachineLacks) {
  TempDir dir;
  for (CpuIsa isa : kCpuIsas) {
    const CliResult r =
        run_cli(dir, {"bench", "--op", "finalize-grad", "--shape", "qwen3-30b", "--tokens", "5",
                      "--runs", "1", "--verify", "--isa", cpu_isa_name(isa)});
    if (cpu_isa_available(isa)) {
      ASSERT_EQ(r.exit_code, 0) << cpu_isa_name(isa) << ": " << r.err;
      EXPECT_NE(r.out.find(std::string("CPU kernels (") + cpu_isa_name(isa) + ")"),
                std::string::npos)
          << r.out;
      EXPECT_NE(r.out.find("1 of 1 rows bitwise equal to the reference backend"), std::string::npos)
          << r.out;
    } else {
      EXPECT_EQ(r.exit_code, 2) << cpu_isa_name(isa);
      EXPECT_NE(r.err.find(std::string("--isa must be one this CPU and build run (best: ") +
                           cpu_isa_name(best_cpu_isa()) + "), got " + cpu_isa_name(isa)),
                std::string::npos)
          << r.err;
    }
  }
  const CliResult machine = run_cli(dir, {"bench", "--machine", "--isa", "avx2"});
  EXPECT_EQ(machine.exit_code, 2);
  EXPECT_NE(machine.err.find("--isa cannot be combined with --machine"), std::string::npos)
      << machine.err;
}

TEST(CliBench, RejectsABadTokenList) {
  TempDir dir;
  const CliResult r = run_cli(dir, {"bench", "--tokens", "4,x"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--tokens"), std::string::npos) << r.err;
  // An empty item is an error wherever it is, a trailing one too (it was dropped silently).
  for (const char* list : {"4,", ",4", "4,,5", "4,5,"}) {
    const CliResult empty = run_cli(
        dir, {"bench", "--op", "finalize", "--shape", "mixtral", "--runs", "1", "--tokens", list});
    EXPECT_EQ(empty.exit_code, 2) << list;
    EXPECT_EQ(empty.err,
              "moe-routing: bench: --tokens must be an integer in [1, 16777216], got ''\n")
        << list;
    EXPECT_EQ(empty.out, "") << list;
  }
}

TEST(CliBench, ASweepWhoseLargestRowCannotFitIsRefusedBeforeAnyRow) {
  // 2^24 tokens of DeepSeek-V3's backward hold terabytes: refused with the sizes, before the
  // bandwidth meter or any row allocates (it used to allocate until it failed or was killed).
  // Where the memory available is unknown (no /proc/meminfo) or larger still, nothing is refused.
  const int64_t available = file_io::available_memory();
  if (available < 0 || available > (int64_t(1) << 43))
    GTEST_SKIP() << "this machine's memory available: " << available << " bytes";
  TempDir dir;
  const CliResult r =
      run_cli(dir, {"bench", "--op", "finalize-grad", "--shape", "deepseek-v3", "--tokens",
                    "16,16777216", "--runs", "1", "--csv", dir.file("b.csv")});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err.rfind("moe-routing: bench: the arrays of its largest row (--shape deepseek-v3 "
                        "--tokens 16777216) and the bandwidth meter's buffers (",
                        0),
            0u)
      << r.err;
  EXPECT_NE(r.err.find(" GiB)) must fit in the memory available, got "), std::string::npos)
      << r.err;
  EXPECT_EQ(r.err.find("[bench"), std::string::npos) << r.err;  // no row was started
  EXPECT_EQ(r.out, "");
  EXPECT_TRUE(files_in(dir.path()).empty());
}

TEST(CliBench, ACsvThatCannotBeWrittenFailsBeforeTheSweepAndLeavesNothing) {
  TempDir dir;
  const std::vector<std::string> sweep = {"bench",    "--op", "finalize", "--shape", "mixtral",
                                          "--tokens", "2",    "--runs",   "1"};
  auto with_csv = [&](const std::string& path) {
    std::vector<std::string> args = sweep;
    args.push_back("--csv");
    args.push_back(path);
    return args;
  };
  // A directory, and a file in a directory that does not exist: refused before any row is timed.
  const std::pair<std::string, std::string> unwritable[] = {
      {dir.path(), "Is a directory"}, {dir.file("missing/b.csv"), "No such file or directory"}};
  for (const auto& [path, why] : unwritable) {
    const CliResult r = run_cli(dir, with_csv(path));
    EXPECT_EQ(r.exit_code, 2) << path;
    EXPECT_EQ(r.err,
              "moe-routing: --csv " + path + ": output must be writable, got '" + why + "'\n")
        << r.err;
    EXPECT_EQ(r.out, "") << path;
  }
  EXPECT_FALSE(exists(dir.file("missing")));
  // A write the device refuses is an error (it was reported as written), and a regular file is
  // written whole through a temporary that does not remain.
  if (exists("/dev/full") && ::access("/dev/full", W_OK) == 0) {
    const CliResult full = run_cli(dir, with_csv("/dev/full"));
    EXPECT_EQ(full.exit_code, 2);
    EXPECT_NE(full.err.find("moe-routing: --csv /dev/full: output must be writable, got 'No space "
                            "left on device'"),
              std::string::npos)
        << full.err;
    EXPECT_EQ(full.err.find("wrote"), std::string::npos) << full.err;
  }
  const CliResult ok = run_cli(dir, with_csv(dir.file("b.csv")));
  ASSERT_EQ(ok.exit_code, 0) << ok.err;
  const std::string csv = read_text(dir.file("b.csv"));
  EXPECT_EQ(csv.rfind("op,scenario,shape,tokens,", 0), 0u) << csv;
  EXPECT_NE(csv.find("\nfinalize,dropless,mixtral,2,"), std::string::npos) << csv;
  EXPECT_EQ(files_in(dir.path()), std::set<std::string>{"b.csv"});
}

}  // namespace
}  // namespace moe_routing
