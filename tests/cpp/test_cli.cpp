// The moe-routing binary run as a subprocess: `golden grad` on the spec's examples G1-G5 and on
// random cases (equal to the library's reference bit for bit), error behaviour (exit status 2,
// the message on stderr, no output file), help, version, info and a small demo.
#include <fcntl.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>

#include "grad_cases.h"
#include "npy.h"

extern char** environ;

namespace moe_routing {
namespace {

using testing::FloatBuffer;

struct CliResult {
  int exit_code = -1;
  std::string out, err;
};

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

bool exists(const std::string& path) {
  struct stat info;
  return ::stat(path.c_str(), &info) == 0;
}

/// A fresh directory for one test's files; removed (with every file in it) at the end.
class TempDir {
 public:
  TempDir() {
    std::string pattern = ::testing::TempDir() + "moe_routing_cli_XXXXXX";
    if (mkdtemp(pattern.data()) != nullptr) path_ = pattern;
  }
  ~TempDir() {
    if (!path_.empty()) std::system(("rm -rf '" + path_ + "'").c_str());
  }
  std::string file(const std::string& name) const { return path_ + "/" + name; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

/// Runs moe-routing with `args` (and extra NAME=VALUE environment entries); captures its output.
CliResult run_cli(const TempDir& dir, const std::vector<std::string>& args,
                  const std::vector<std::string>& extra_env = {}) {
  const std::string out_path = dir.file("stdout.txt"), err_path = dir.file("stderr.txt");
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                   0644);
  posix_spawn_file_actions_addopen(&actions, 2, err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                   0644);
  std::vector<std::string> argv_text = {MOE_ROUTING_CLI_PATH};
  argv_text.insert(argv_text.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : argv_text) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> env_text = extra_env;
  for (char** e = environ; *e != nullptr; ++e) env_text.push_back(*e);
  std::vector<char*> env;
  for (std::string& e : env_text) env.push_back(e.data());
  env.push_back(nullptr);

  CliResult result;
  pid_t pid = 0;
  const int spawned = posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), env.data());
  posix_spawn_file_actions_destroy(&actions);
  if (spawned != 0) {
    ADD_FAILURE() << "cannot start " << argv[0] << ": " << std::strerror(spawned);
    return result;
  }
  int status = 0;
  waitpid(pid, &status, 0);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  result.out = read_text(out_path);
  result.err = read_text(err_path);
  return result;
}

std::string describe(const std::vector<std::string>& args, const CliResult& r) {
  std::string text = "moe-routing";
  for (const std::string& a : args) text += " " + a;
  return text + "\nexit " + std::to_string(r.exit_code) + "\nstdout: " + r.out +
         "\nstderr: " + r.err;
}

npy::Array array_from(DType dtype, std::vector<int64_t> shape, const void* data) {
  npy::Array a(dtype, std::move(shape));
  if (!a.bytes.empty()) std::memcpy(a.bytes.data(), data, a.bytes.size());
  return a;
}

void write_or_fail(const std::string& path, const npy::Array& a) {
  Status s = npy::write(path, a);
  ASSERT_TRUE(s.is_ok()) << s.message();
}

/// `golden grad` reading dir/g.npy and dir/r.npy, writing `out`, followed by `extra` flags.
std::vector<std::string> golden_grad(const TempDir& dir, int64_t top_k, const std::string& out,
                                     const std::vector<std::string>& extra = {}) {
  std::vector<std::string> args = {
      "golden",          "grad",    "--grad-expanded-x",   dir.file("g.npy"), "--expanded-row-idx",
      dir.file("r.npy"), "--top-k", std::to_string(top_k), "--out",           out};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

/// Reads an output file as a FloatBuffer, checking dtype and shape.
FloatBuffer read_output(const std::string& path, DType dtype, std::vector<int64_t> shape) {
  npy::Array a;
  Status s = npy::read(path, &a);
  EXPECT_TRUE(s.is_ok()) << s.message();
  EXPECT_EQ(a.dtype, dtype);
  EXPECT_EQ(a.shape, shape);
  FloatBuffer b;
  b.dtype = a.dtype;
  b.bytes = a.bytes;
  return b;
}

// --- golden grad: the spec's examples ----------------------------------------------------------

struct Example {
  const char* name;
  DType dtype;
  std::vector<int64_t> grad_shape;
  std::vector<float> grad_values;
  std::vector<int32_t> expanded_row_idx;
  int64_t top_k, drop_pad_mode, active_num;
  std::vector<float> expected_tree, expected_sequential;
};

std::vector<Example> examples() {
  // Spec §1.10 (the same table as test_grad_examples.cpp).
  const float tiny30 = std::ldexp(1.0f, -30), tiny24 = std::ldexp(1.0f, -24);
  return {
      {"G1",
       DType::float32,
       {6, 2},
       {-1, 0.5f, 0.5f, 0.5f, tiny30, 0.25f, 0.125f, 2, 1, 3, 0.25f, -1},
       {4, 0, 2, 1, 5, 3},
       3,
       0,
       0,
       {0.0f, 3.75f, 0.875f, 1.5f},
       {tiny30, 3.75f, 0.875f, 1.5f}},
      {"G2",
       DType::bfloat16,
       {3, 2},
       {1.0f, 0.00390625f, -2.5f, 3.0f, 0.5f, 1.0f},
       {2, 0, 4, 3, 1, 5},
       2,
       0,
       3,
       {1.5f, 1.0f, 0, 0, -2.5f, 3.0f},
       {1.5f, 1.0f, 0, 0, -2.5f, 3.0f}},
      {"G3",
       DType::float16,
       {3, 2, 1},
       {1, 2, 4, 8, 16, 32},
       {0, 2, 1, 4, -1, 3, -1, -1},
       2,
       1,
       0,
       {5, 18, 8, 0},
       {5, 18, 8, 0}},
      {"G4", DType::float16, {3, 1}, {1.0f, -1.0f, tiny24}, {0, 1, 2}, 3, 0, 0, {0.0f}, {tiny24}},
      {"G5",
       DType::float32,
       {5, 1},
       {1, tiny24, -1, tiny24, tiny24},
       {0, 1, 2, 3, 4},
       5,
       0,
       0,
       {tiny24},
       {std::ldexp(1.0f, -23)}},
  };
}

TEST(CliGolden, SpecExamplesBitExactInBothOrders) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  for (const Example& ex : examples()) {
    SCOPED_TRACE(ex.name);
    const FloatBuffer grad = FloatBuffer::from_floats(ex.dtype, ex.grad_values);
    write_or_fail(dir.file("g.npy"), array_from(ex.dtype, ex.grad_shape, grad.data()));
    write_or_fail(dir.file("r.npy"), array_from(DType::int32, {int64_t(ex.expanded_row_idx.size())},
                                                ex.expanded_row_idx.data()));
    for (const char* order : {"tree", "sequential"}) {
      const std::string out = dir.file(std::string("out_") + ex.name + "_" + order + ".npy");
      const std::vector<std::string> args =
          golden_grad(dir, ex.top_k, out,
                      {"--drop-pad-mode", std::to_string(ex.drop_pad_mode), "--active-num",
                       std::to_string(ex.active_num), "--order", order});
      const CliResult r = run_cli(dir, args);
      ASSERT_EQ(r.exit_code, 0) << describe(args, r);
      EXPECT_TRUE(r.err.empty()) << describe(args, r);
      const int64_t n = int64_t(ex.expanded_row_idx.size()) / ex.top_k;
      const FloatBuffer got = read_output(out, ex.dtype, {n, ex.grad_shape.back()});
      const std::vector<float>& expected =
          std::string(order) == "tree" ? ex.expected_tree : ex.expected_sequential;
      EXPECT_TRUE(testing::bitwise_equal(FloatBuffer::from_floats(ex.dtype, expected), got))
          << order;
      EXPECT_FALSE(exists(out + ".tmp"));
    }
  }
}

// --- golden grad: random cases against the library's reference ---------------------------------

TEST(CliGolden, RandomCasesEqualTheReferenceBitForBit) {
  TempDir dir;
  testing::Random rng(424242);
  const testing::Runner reference{Backend::reference, CpuIsa::automatic, 1};
  int case_number = 0;
  for (DType dtype : {DType::float32, DType::float16, DType::bfloat16})
    for (GradScenario scenario :
         {GradScenario::dropless, GradScenario::active, GradScenario::drop_pad})
      for (AccumulationOrder order : {AccumulationOrder::tree, AccumulationOrder::sequential}) {
        const int64_t n = rng.integer(1, 12), k = rng.integer(1, 10), h = rng.integer(1, 70);
        testing::GradCase c = testing::make_grad_case(rng, scenario, dtype, n, k, h);
        c.attrs.order = order;
        SCOPED_TRACE(::testing::Message()
                     << dtype_name(dtype) << ' ' << grad_scenario_name(scenario) << ' '
                     << accumulation_order_name(order) << " N=" << n << " K=" << k << " H=" << h);
        const FloatBuffer expected = testing::run_grad_case(c, reference);
        write_or_fail(dir.file("g.npy"), array_from(dtype, c.grad_shape, c.grad.data()));
        write_or_fail(dir.file("r.npy"),
                      array_from(DType::int32, {int64_t(c.expanded_row_idx.size())},
                                 c.expanded_row_idx.data()));
        const std::string out = dir.file("out" + std::to_string(case_number) + ".npy");
        std::vector<std::string> args =
            golden_grad(dir, k, out, {"--order", accumulation_order_name(order)});
        // Flags only where they differ from the defaults, as a user would type them; alternate
        // the backends and thread counts.
        if (c.attrs.drop_pad_mode != 0) args.insert(args.end(), {"--drop-pad-mode", "1"});
        if (c.attrs.active_num != 0)
          args.insert(args.end(), {"--active-num=" + std::to_string(c.attrs.active_num)});
        const char* backends[] = {"automatic", "cpu", "reference"};
        args.insert(args.end(), {"--backend", backends[case_number % 3], "--threads",
                                 std::to_string(case_number % 4)});
        ++case_number;
        const CliResult r = run_cli(dir, args);
        ASSERT_EQ(r.exit_code, 0) << describe(args, r);
        EXPECT_NE(r.out.find(std::string("(") + grad_scenario_name(scenario) + ", order "),
                  std::string::npos)
            << r.out;
        EXPECT_TRUE(testing::bitwise_equal(expected, read_output(out, dtype, {n, h})));
      }
}

TEST(CliGolden, EmptyInputsGiveAnEmptyOutput) {
  TempDir dir;
  write_or_fail(dir.file("g.npy"), npy::Array(DType::bfloat16, {0, 4}));
  write_or_fail(dir.file("r.npy"), npy::Array(DType::int32, {0}));
  const std::vector<std::string> args = golden_grad(dir, 2, dir.file("out.npy"));
  const CliResult r = run_cli(dir, args);
  ASSERT_EQ(r.exit_code, 0) << describe(args, r);
  EXPECT_EQ(read_output(dir.file("out.npy"), DType::bfloat16, {0, 4}).bytes.size(), 0u);
}

// --- golden grad: errors -----------------------------------------------------------------------

TEST(CliGolden, ErrorsExitWith2AndWriteNothing) {
  TempDir dir;
  const std::vector<float> g(12, 1.0f);
  write_or_fail(dir.file("g.npy"), array_from(DType::float32, {6, 2}, g.data()));
  const std::vector<int32_t> r{0, 1, 2, 3, 4, 5}, r99{0, 1, 2, 3, 4, 99};
  const std::vector<int64_t> r64{0, 1, 2, 3, 4, 5};
  write_or_fail(dir.file("r.npy"), array_from(DType::int32, {6}, r.data()));
  write_or_fail(dir.file("r99.npy"), array_from(DType::int32, {6}, r99.data()));
  write_or_fail(dir.file("r64.npy"), array_from(DType::int64, {6}, r64.data()));
  {
    std::vector<uint8_t> bytes;
    ASSERT_TRUE(npy::encode(array_from(DType::int32, {6}, r.data()), "x", &bytes).is_ok());
    bytes.resize(bytes.size() - 3);
    std::ofstream(dir.file("short.npy"), std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
  }

  struct Case {
    const char* name;
    std::vector<std::string> args;  // "G", "R", "OUT", ... are replaced by paths below
    std::string message;            // substring of stderr
    bool exact = false;             // stderr must be exactly message + "\n"
  };
  // The usual file flags, then `extra`.
  auto with = [](std::vector<std::string> extra, const char* g = "G", const char* r = "R",
                 const char* out = "OUT") {
    std::vector<std::string> args = {"--grad-expanded-x", g, "--expanded-row-idx", r, "--out", out};
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  };
  const std::vector<Case> cases = {
      {"missing --top-k", with({}), "moe-routing: golden grad: missing required flags: --top-k K"},
      {"missing everything",
       {},
       "missing required flags: --grad-expanded-x FILE, --expanded-row-idx FILE, --top-k K, "
       "--out FILE"},
      {"unknown flag", with({"--top-k", "2", "--frobnicate", "1"}),
       "moe-routing: golden grad: unknown flag '--frobnicate'"},
      {"bad integer", with({"--top-k", "two"}),
       "moe-routing: golden grad: --top-k must be a 64-bit integer, got 'two'"},
      {"bad order", with({"--top-k", "2", "--order", "pairwise"}),
       "--order must be one of tree, sequential, got 'pairwise'"},
      {"threads out of range", with({"--top-k", "2", "--threads", "-1"}),
       "--threads must be in [0, 4096], got -1"},
      {"stray argument", with({"--top-k", "2", "extra"}), "unexpected argument 'extra'"},
      {"top_k 0 (library)", with({"--top-k", "0"}),
       "moe_init_routing_grad: top_k must be > 0, got 0", true},
      {"drop_pad_mode 2 (library)", with({"--top-k", "2", "--drop-pad-mode", "2"}),
       "moe_init_routing_grad: drop_pad_mode must be 0 (dropless/active) or 1 (drop-pad), got 2",
       true},
      {"2-D in drop-pad mode (library)", with({"--top-k", "2", "--drop-pad-mode", "1"}),
       "moe_init_routing_grad: grad_expanded_x must be 3-D [E, C, H] when drop_pad_mode=1, got "
       "2-D float32 [6, 2]",
       true},
      {"active rows (library)", with({"--top-k", "2", "--active-num", "4"}),
       "grad_expanded_x.size(0) must equal active_num (4) in the active scenario, got 6"},
      {"index out of range (library)", with({"--top-k", "2"}, "G", "R99"),
       "moe_init_routing_grad: expanded_row_idx[5] = 99 is outside [0, 6)", true},
      {"int64 indices (library)", with({"--top-k", "2"}, "G", "R64"),
       "moe_init_routing_grad: expanded_row_idx must be 1-D int32, got 1-D int64 [6]", true},
      {"missing input file", with({"--top-k", "2"}, "MISSING"),
       "missing.npy: file must be readable, got 'No such file or directory'"},
      {"truncated input", with({"--top-k", "2"}, "G", "SHORT"),
       "short.npy: data must be 24 bytes for int32 (6,), got 21 bytes (truncated file)"},
      {"unwritable output", with({"--top-k", "2"}, "G", "R", "NODIR"),
       "out.npy: output must be writable, got 'No such file or directory'"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string out = dir.file("out.npy"), nodir = dir.file("no/such/dir/out.npy");
    std::vector<std::string> args = {"golden", "grad"};
    const std::map<std::string, std::string> paths = {{"G", dir.file("g.npy")},
                                                      {"R", dir.file("r.npy")},
                                                      {"R99", dir.file("r99.npy")},
                                                      {"R64", dir.file("r64.npy")},
                                                      {"SHORT", dir.file("short.npy")},
                                                      {"MISSING", dir.file("missing.npy")},
                                                      {"OUT", out},
                                                      {"NODIR", nodir}};
    for (const std::string& a : c.args) args.push_back(paths.count(a) ? paths.at(a) : a);
    const CliResult r = run_cli(dir, args);
    EXPECT_EQ(r.exit_code, 2) << describe(args, r);
    if (c.exact)
      EXPECT_EQ(r.err, c.message + "\n") << describe(args, r);
    else
      EXPECT_NE(r.err.find(c.message), std::string::npos) << describe(args, r);
    EXPECT_TRUE(r.out.empty()) << describe(args, r);
    for (const std::string& path : {out, out + ".tmp", nodir, nodir + ".tmp"})
      EXPECT_FALSE(exists(path)) << path << " was written";
  }
}

TEST(CliGolden, AnExistingOutputSurvivesAnError) {
  TempDir dir;
  const std::vector<float> g(12, 1.0f);
  const std::vector<int32_t> r99{0, 1, 2, 3, 4, 99};
  write_or_fail(dir.file("g.npy"), array_from(DType::float32, {6, 2}, g.data()));
  write_or_fail(dir.file("r.npy"), array_from(DType::int32, {6}, r99.data()));
  std::ofstream(dir.file("out.npy")) << "previous result";
  const std::vector<std::string> args = golden_grad(dir, 2, dir.file("out.npy"));
  const CliResult r = run_cli(dir, args);
  EXPECT_EQ(r.exit_code, 2) << describe(args, r);
  EXPECT_EQ(read_text(dir.file("out.npy")), "previous result");
  EXPECT_FALSE(exists(dir.file("out.npy.tmp")));
}

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
        "--active-num A", "--order tree|sequential", "--backend automatic|reference|cpu",
        "--threads T", "--out FILE", "--help",
        "Examples:", "moe-routing golden grad --grad-expanded-x"}},
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
    for (const char* text : {"Usage: moe-routing <command>", "golden grad", "demo", "info",
                             "--version", "Exit status", "Examples:"})
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
  EXPECT_NE(unknown.err.find("moe-routing: command must be one of golden grad, demo, bench, info, help, "
                             "--help, --version, got 'frobnicate'"),
            std::string::npos)
      << unknown.err;

  const CliResult group = run_cli(dir, {"golden"});
  EXPECT_EQ(group.exit_code, 2);
  EXPECT_NE(group.err.find("moe-routing: golden: subcommand must be one of golden grad, got none"),
            std::string::npos)
      << group.err;
  const CliResult group_help = run_cli(dir, {"help", "golden"});
  EXPECT_EQ(group_help.exit_code, 0);
  EXPECT_NE(group_help.out.find("golden grad"), std::string::npos) << group_help.out;
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
  const CliResult three = run_cli(dir, {"info"}, {"MOE_ROUTING_NUM_THREADS=3"});
  EXPECT_NE(three.out.find("default threads: 3 (MOE_ROUTING_NUM_THREADS=3)"), std::string::npos)
      << three.out;
  EXPECT_EQ(run_cli(dir, {"info", "--bogus"}).exit_code, 2);
}

// --- demo --------------------------------------------------------------------------------------

TEST(CliDemo, SmallBatchesVerifyInEveryScenario) {
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
    EXPECT_NE(r.err.find("[demo] drop_pad: verifying against the reference backend"),
              std::string::npos)
        << r.err;
    int rows = 0;
    std::istringstream lines(r.out);
    std::string line;
    while (std::getline(lines, line)) {
      for (const char* scenario : {"dropless ", "active ", "drop_pad "})
        if (line.rfind(scenario, 0) == 0) {
          ++rows;
          EXPECT_NE(line.find(" yes"), std::string::npos) << line;
        }
    }
    EXPECT_EQ(rows, 3) << r.out;
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

TEST(CliBench, SmallSweepPrintsEveryRowAndWritesCsv) {
  TempDir dir;
  const std::string csv = dir.file("bench.csv");
  const CliResult r = run_cli(dir, {"bench", "--shape", "mixtral", "--tokens", "3,17", "--runs", "1", "--threads", "2",
                               "--dtype", "fp16", "--csv", csv});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("copy bandwidth"), std::string::npos);
  // 2 token counts x (3 backward + 2 forward scenarios), each a row naming its scenario.
  for (const char* scenario : {"dropless", "active", "drop_pad"})
    EXPECT_NE(r.out.find(scenario), std::string::npos) << r.out;
  std::ifstream in(csv);
  std::string line;
  int lines = 0;
  while (std::getline(in, line)) ++lines;
  EXPECT_EQ(lines, 1 + 2 * 5);
  EXPECT_NE(r.err.find("[bench 10/10]"), std::string::npos) << r.err;
}

TEST(CliBench, RejectsABadTokenList) {
  TempDir dir;
  const CliResult r = run_cli(dir, {"bench", "--tokens", "4,x"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--tokens"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace moe_routing
