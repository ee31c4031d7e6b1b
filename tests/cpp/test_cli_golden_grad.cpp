// The moe-routing binary run as a subprocess, `golden grad`: the spec's examples G1-G5 in both
// orders, random cases (equal to the library's reference bit for bit), error behaviour (exit
// status 2, the message on stderr, no output file). The tool under hostile conditions (FIFOs and
// links as outputs, concurrent runs, endless inputs, sizes beyond memory) is tested in
// tests/adversarial/cpp/.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "cli_test_util.h"
#include "grad_cases.h"
#include "grad_spec_examples.h"
#include "npy.h"
#include "routing_cases.h"

namespace moe_routing {
namespace {

using namespace testing;  // moe_routing::testing: the helpers of cli_test_util.h

// --- golden grad: the spec's examples ----------------------------------------------------------

using Example = testing::GradSpecExample;

std::vector<Example> examples() { return testing::grad_spec_examples(); }

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

// --numerics chooses the order (atlas_a2: tree, ascend_950: sequential); --order overrides it.
TEST(CliGolden, NumericsChooseTheOrderUnlessOrderIsGiven) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  struct Flags {
    std::vector<std::string> flags;
    bool sequential;
  };
  const Flags cases[] = {{{}, false},
                         {{"--numerics", "atlas_a2"}, false},
                         {{"--numerics", "ascend_950"}, true},
                         {{"--numerics", "ascend_950", "--order", "tree"}, false},
                         {{"--numerics", "atlas_a2", "--order", "sequential"}, true}};
  for (const Example& ex : examples()) {
    SCOPED_TRACE(ex.name);
    const FloatBuffer grad = FloatBuffer::from_floats(ex.dtype, ex.grad_values);
    write_or_fail(dir.file("g.npy"), array_from(ex.dtype, ex.grad_shape, grad.data()));
    write_or_fail(dir.file("r.npy"), array_from(DType::int32, {int64_t(ex.expanded_row_idx.size())},
                                                ex.expanded_row_idx.data()));
    int case_number = 0;
    for (const Flags& c : cases) {
      const std::string out = dir.file(std::string("out_") + ex.name + "_numerics" +
                                       std::to_string(case_number++) + ".npy");
      std::vector<std::string> extra = {"--drop-pad-mode", std::to_string(ex.drop_pad_mode),
                                        "--active-num", std::to_string(ex.active_num)};
      extra.insert(extra.end(), c.flags.begin(), c.flags.end());
      const std::vector<std::string> args = golden_grad(dir, ex.top_k, out, extra);
      const CliResult r = run_cli(dir, args);
      ASSERT_EQ(r.exit_code, 0) << describe(args, r);
      EXPECT_NE(r.out.find(c.sequential ? "order sequential)" : "order tree)"), std::string::npos)
          << r.out;
      const int64_t n = int64_t(ex.expanded_row_idx.size()) / ex.top_k;
      const FloatBuffer got = read_output(out, ex.dtype, {n, ex.grad_shape.back()});
      const std::vector<float>& expected = c.sequential ? ex.expected_sequential : ex.expected_tree;
      EXPECT_TRUE(testing::bitwise_equal(FloatBuffer::from_floats(ex.dtype, expected), got))
          << describe(args, r);
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
      {"bad numerics", with({"--top-k", "2", "--numerics", "a3"}),
       "moe-routing: golden grad: --numerics must be one of atlas_a2, ascend_950, got 'a3'"},
      {"threads out of range", with({"--top-k", "2", "--threads", "-1"}),
       "--threads must be in [0, 1024], got -1"},
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
       "moe_init_routing_grad: expanded_row_idx[5] must be in [0, 6), got 99", true},
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

}  // namespace
}  // namespace moe_routing
