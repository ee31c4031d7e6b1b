// The moe-routing binary run as a subprocess: `golden grad` on the spec's examples G1-G5 and on
// random cases (equal to the library's reference bit for bit), error behaviour (exit status 2,
// the message on stderr, no output file); the forward commands `golden init-routing-v2` and
// `golden init-routing` on the spec's examples F1-F3, Q1, Q2 and the static-quant numerics, on
// random cases (every output equal to the library's reference byte for byte) and on errors
// (exit status 2, no file in --out-dir); help, version, info and a small demo. The tool under
// hostile conditions (FIFOs and links as outputs, concurrent runs, endless inputs, sizes beyond
// memory) is tested in tests/adversarial/cpp/.
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

const DType kForwardFloatDtypes[] = {DType::float32, DType::float16, DType::bfloat16};

// --- golden init-routing-v2 / init-routing: the spec's examples --------------------------------

TEST(CliGoldenForward, F1ThroughV2InEveryDtypeAndCountFlag) {
  // Spec §2.6 F1: x [[1,1.5],[2,2.5],[3,3.5]], expert_idx [[1,0],[2,1],[0,2]], E = 3.
  TempDir dir;
  int run_number = 0;
  for (DType dtype : kForwardFloatDtypes) {
    SCOPED_TRACE(dtype_name(dtype));
    const std::vector<std::pair<std::string, npy::Array>> inputs = {
        {"--x", floats(dtype, {3, 2}, {1, 1.5f, 2, 2.5f, 3, 3.5f})},
        {"--expert-idx", i32({3, 2}, {1, 0, 2, 1, 0, 2})}};
    const npy::Array row_idx = i32({6}, {2, 0, 4, 3, 1, 5});
    const std::string out = "out" + std::to_string(run_number++);
    // active_num 3, cumsum.
    expect_outputs(run_forward_cli(dir, "init-routing-v2", inputs,
                                   {"--active-num", "3", "--expert-num", "3",
                                    "--expert-tokens-count-or-cumsum-flag", "1"},
                                   out + "a"),
                   {{"expanded_x", floats(dtype, {3, 2}, {1, 1.5f, 3, 3.5f, 1, 1.5f})},
                    {"expanded_row_idx", row_idx},
                    {"expert_tokens_count_or_cumsum", i32({3}, {2, 4, 6})}});
    // Dropless, count.
    expect_outputs(
        run_forward_cli(dir, "init-routing-v2", inputs,
                        {"--expert-num", "3", "--expert-tokens-count-or-cumsum-flag", "2"},
                        out + "b"),
        {{"expanded_x",
          floats(dtype, {6, 2}, {1, 1.5f, 3, 3.5f, 1, 1.5f, 2, 2.5f, 2, 2.5f, 3, 3.5f})},
         {"expanded_row_idx", row_idx},
         {"expert_tokens_count_or_cumsum", i32({3}, {2, 2, 2})}});
    // Every default: no count file; the before-capacity flag is ignored in drop_pad_mode 0.
    expect_outputs(run_forward_cli(dir, "init-routing-v2", inputs,
                                   {"--expert-tokens-before-capacity-flag", "1"}, out + "c"),
                   {{"expanded_x",
                     floats(dtype, {6, 2}, {1, 1.5f, 3, 3.5f, 1, 1.5f, 2, 2.5f, 2, 2.5f, 3, 3.5f})},
                    {"expanded_row_idx", row_idx}});
  }
}

TEST(CliGoldenForward, FilesUseTheNpyConventions) {
  // bf16 travels as uint16 bit patterns ('<u2'), int8 as '|i1', int64 counts as '<i8'.
  TempDir dir;
  const ForwardRun bf16 =
      run_forward_cli(dir, "init-routing-v2",
                      {{"--x", floats(DType::bfloat16, {3, 2}, {1, 1.5f, 2, 2.5f, 3, 3.5f})},
                       {"--expert-idx", i32({3, 2}, {1, 0, 2, 1, 0, 2})}},
                      {"--expert-num", "3", "--expert-tokens-count-or-cumsum-flag", "2"}, "bf16");
  ASSERT_EQ(bf16.result.exit_code, 0) << describe(bf16);
  EXPECT_NE(read_text(dir.file("bf16/expanded_x.npy")).find("'descr': '<u2'"), std::string::npos);
  EXPECT_NE(read_text(dir.file("bf16/expanded_row_idx.npy")).find("'descr': '<i4'"),
            std::string::npos);
  EXPECT_NE(read_text(dir.file("bf16/expert_tokens_count_or_cumsum.npy")).find("'descr': '<i4'"),
            std::string::npos);
  const ForwardRun q = run_forward_cli(
      dir, "init-routing",
      {{"--x", f32({1, 2}, {1, -1})},
       {"--expert-idx", i32({1, 1}, {0})},
       {"--scale", f32({1}, {1})}},
      {"--expert-num", "1", "--quant-mode", "0", "--expert-tokens-num-flag", "1"}, "int8");
  ASSERT_EQ(q.result.exit_code, 0) << describe(q);
  EXPECT_NE(read_text(dir.file("int8/expanded_x.npy")).find("'descr': '|i1'"), std::string::npos);
  EXPECT_NE(read_text(dir.file("int8/expert_tokens_count_or_cumsum.npy")).find("'descr': '<i8'"),
            std::string::npos);
  // No temporaries are left behind.
  for (const std::string& name : files_in(dir.file("int8")))
    EXPECT_EQ(name.find(".tmp"), std::string::npos) << name;
}

TEST(CliGoldenForward, F1ThroughTheTorchApiKeepsTheShapeAndZeroesTheTail) {
  TempDir dir;
  expect_outputs(
      run_forward_cli(dir, "init-routing",
                      {{"--x", f32({3, 2}, {1, 1.5f, 2, 2.5f, 3, 3.5f})},
                       {"--expert-idx", i32({3, 2}, {1, 0, 2, 1, 0, 2})}},
                      {"--active-num", "3", "--expert-num", "3", "--expert-tokens-num-flag", "1"},
                      "out"),
      {{"expanded_x", f32({6, 2}, {1, 1.5f, 3, 3.5f, 1, 1.5f, 0, 0, 0, 0, 0, 0})},
       {"expanded_row_idx", i32({6}, {2, 0, 4, 3, 1, 5})},
       {"expert_tokens_count_or_cumsum", i64({3}, {2, 4, 6})}});
}

TEST(CliGoldenForward, F2DropPadThroughV2InEveryDtype) {
  // Spec §2.6 F2: x [[10],[20],[30],[40]], expert_idx [[0,1],[0,2],[0,1],[1,0]], E = 3, C = 2.
  TempDir dir;
  for (DType dtype : kForwardFloatDtypes) {
    SCOPED_TRACE(dtype_name(dtype));
    const std::vector<std::pair<std::string, npy::Array>> inputs = {
        {"--x", floats(dtype, {4, 1}, {10, 20, 30, 40})},
        {"--expert-idx", i32({4, 2}, {0, 1, 0, 2, 0, 1, 1, 0})}};
    const std::map<std::string, npy::Array> routed = {
        {"expanded_x", floats(dtype, {3, 2, 1}, {10, 20, 10, 30, 20, 0})},
        {"expanded_row_idx", i32({8}, {0, 2, 1, 4, -1, 3, -1, -1})}};
    std::map<std::string, npy::Array> with_counts = routed;
    with_counts["expert_tokens_before_capacity"] = i32({3}, {4, 3, 1});
    // The count flag is ignored in drop_pad_mode 1.
    expect_outputs(
        run_forward_cli(dir, "init-routing-v2", inputs,
                        {"--drop-pad-mode", "1", "--expert-num", "3", "--expert-capacity", "2",
                         "--expert-tokens-before-capacity-flag", "1",
                         "--expert-tokens-count-or-cumsum-flag", "1"},
                        std::string("with_") + dtype_name(dtype)),
        with_counts);
    expect_outputs(
        run_forward_cli(dir, "init-routing-v2", inputs,
                        {"--drop-pad-mode", "1", "--expert-num", "3", "--expert-capacity", "2"},
                        std::string("without_") + dtype_name(dtype)),
        routed);
  }
}

TEST(CliGoldenForward, F2DropPadThroughTheTorchApi) {
  // Pre-drop counts over the range; the per-token scale and the topk weights follow the slots.
  TempDir dir;
  expect_outputs(
      run_forward_cli(dir, "init-routing",
                      {{"--x", f32({4, 1}, {10, 20, 30, 40})},
                       {"--expert-idx", i32({4, 2}, {0, 1, 0, 2, 0, 1, 1, 0})},
                       {"--scale", f32({4}, {0.5f, 1.5f, 2.5f, 3.5f})},
                       {"--topk-weight", f32({4, 2}, {1, 2, 3, 4, 5, 6, 7, 8})}},
                      {"--drop-pad-mode", "1", "--expert-num", "3", "--expert-capacity", "2",
                       "--expert-tokens-num-flag", "1", "--expert-tokens-num-type", "1"},
                      "out"),
      {{"expanded_x", f32({3, 2, 1}, {10, 20, 10, 30, 20, 0})},
       {"expanded_row_idx", i32({8}, {0, 2, 1, 4, -1, 3, -1, -1})},
       {"expert_tokens_count_or_cumsum", i64({3}, {4, 3, 1})},
       {"expanded_scale", f32({6}, {0.5f, 1.5f, 0.5f, 2.5f, 1.5f, 0})},
       {"expanded_topk_weight", f32({6, 1}, {1, 3, 2, 6, 4, 0})}});
}

TEST(CliGoldenForward, F3BothRowIdxTypesAndEveryCountType) {
  // Spec §3.7 F3: x [[1,2],[3,4],[5,6]], expert_idx [[1,3],[0,2],[2,1]], E = 4, range [1, 3).
  TempDir dir;
  const std::vector<npy::Array> counts = {i64({2}, {2, 4}), i64({2}, {2, 2}),
                                          i64({4, 2}, {1, 2, 2, 2, 0, 0, 0, 0})};
  const std::vector<npy::Array> row_idx = {i32({6}, {0, -1, -1, 2, 3, 1}),
                                           i32({6}, {0, 5, 3, 4, 1, 2})};
  for (int row_idx_type : {0, 1})
    for (int count_type : {0, 1, 2}) {
      SCOPED_TRACE(::testing::Message()
                   << "row_idx_type " << row_idx_type << " count type " << count_type);
      expect_outputs(
          run_forward_cli(dir, "init-routing",
                          {{"--x", f32({3, 2}, {1, 2, 3, 4, 5, 6})},
                           {"--expert-idx", i32({3, 2}, {1, 3, 0, 2, 2, 1})},
                           {"--topk-weight", f32({3, 2}, {0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f})}},
                          {"--expert-num", "4", "--active-expert-range", "1,3", "--row-idx-type",
                           std::to_string(row_idx_type), "--expert-tokens-num-type",
                           std::to_string(count_type), "--expert-tokens-num-flag", "1"},
                          "out" + std::to_string(row_idx_type) + std::to_string(count_type)),
          {{"expanded_x", f32({6, 2}, {1, 2, 5, 6, 3, 4, 5, 6, 0, 0, 0, 0})},
           {"expanded_row_idx", row_idx[size_t(row_idx_type)]},
           {"expert_tokens_count_or_cumsum", counts[size_t(count_type)]},
           {"expanded_topk_weight", f32({6, 1}, {0.1f, 0.6f, 0.4f, 0.5f, 0, 0})}});
    }
}

TEST(CliGoldenForward, Q1DynamicInt8InBothNumerics) {
  // Spec §3.7 Q1: round half away from zero; the smooth scale row of the pair's expert.
  TempDir dir;
  int run_number = 0;
  for (const char* numerics : {"atlas_a2", "ascend_950"}) {
    SCOPED_TRACE(numerics);
    const std::vector<std::string> flags = {"--expert-num", "1",     "--quant-mode", "1",
                                            "--numerics",   numerics};
    expect_outputs(run_forward_cli(dir, "init-routing",
                                   {{"--x", f32({1, 5}, {127.0f, 2.5f, -2.5f, 0.5f, -126.4f})},
                                    {"--expert-idx", i32({1, 1}, {0})}},
                                   flags, "out" + std::to_string(run_number++)),
                   {{"expanded_x", i8({1, 5}, {127, 3, -3, 1, -126})},
                    {"expanded_row_idx", i32({1}, {0})},
                    {"expanded_scale", f32({1}, {1.0f})}});
    expect_outputs(run_forward_cli(dir, "init-routing",
                                   {{"--x", f32({1, 4}, {1.0f, -0.5f, 0.25f, 0.0f})},
                                    {"--expert-idx", i32({1, 1}, {0})}},
                                   flags, "out" + std::to_string(run_number++)),
                   {{"expanded_x", i8({1, 4}, {127, -64, 32, 0})},
                    {"expanded_row_idx", i32({1}, {0})},
                    {"expanded_scale", f32({1}, {0.007874015718698502f})}});
    expect_outputs(run_forward_cli(dir, "init-routing",
                                   {{"--x", f32({1, 4}, {1.0f, -0.5f, 0.25f, 0.0f})},
                                    {"--expert-idx", i32({1, 1}, {1})},
                                    {"--scale", f32({1, 4}, {2, 1, -4, 1})}},
                                   {"--expert-num", "2", "--active-expert-range", "1,2",
                                    "--quant-mode", "1", "--numerics", numerics},
                                   "out" + std::to_string(run_number++)),
                   {{"expanded_x", i8({1, 4}, {127, -32, -64, 0})},
                    {"expanded_row_idx", i32({1}, {0})},
                    {"expanded_scale", f32({1}, {0.015748031437397003f})}});
  }
}

TEST(CliGoldenForward, Q2StaticInt8InBothNumerics) {
  // Spec §3.7 Q2: half to even (2.5 -> 2), saturation (200.5 -> 127); no expanded_scale.
  TempDir dir;
  for (const char* numerics : {"atlas_a2", "ascend_950"})
    expect_outputs(
        run_forward_cli(dir, "init-routing",
                        {{"--x", f32({1, 5}, {1.0f, -0.75f, 0.25f, 100.0f, -1.25f})},
                         {"--expert-idx", i32({1, 1}, {0})},
                         {"--scale", f32({1}, {2.0f})},
                         {"--offset", f32({1}, {0.5f})}},
                        {"--expert-num", "1", "--quant-mode", "0", "--numerics", numerics},
                        std::string("out_") + numerics),
        {{"expanded_x", i8({1, 5}, {2, -1, 1, 127, -2})}, {"expanded_row_idx", i32({1}, {0})}});
}

TEST(CliGoldenForward, StaticQuantNumericsDiffer) {
  // Spec §3.3: x = 3.824000835418701, scale 1.7, no offset: float32 path 6.5008 -> 7 (atlas_a2,
  // the default), float16 path 6.5 -> 6 (ascend_950).
  TempDir dir;
  const std::vector<std::pair<std::string, npy::Array>> inputs = {
      {"--x", f32({1, 1}, {3.824000835418701f})},
      {"--expert-idx", i32({1, 1}, {0})},
      {"--scale", f32({1}, {1.7f})}};
  const std::vector<std::pair<std::vector<std::string>, int8_t>> cases = {
      {{}, 7}, {{"--numerics", "atlas_a2"}, 7}, {{"--numerics", "ascend_950"}, 6}};
  int run_number = 0;
  for (const auto& [numerics, expected] : cases) {
    std::vector<std::string> flags = {"--expert-num", "1", "--quant-mode", "0"};
    flags.insert(flags.end(), numerics.begin(), numerics.end());
    expect_outputs(
        run_forward_cli(dir, "init-routing", inputs, flags, "out" + std::to_string(run_number++)),
        {{"expanded_x", i8({1, 1}, {expected})}, {"expanded_row_idx", i32({1}, {0})}});
  }
}

TEST(CliGoldenForward, EmptyInputsGiveEmptyOutputsAndZeroCounts) {
  TempDir dir;
  const std::vector<std::pair<std::string, npy::Array>> inputs = {
      {"--x", npy::Array(DType::float16, {0, 4})},
      {"--expert-idx", npy::Array(DType::int32, {0, 2})}};
  expect_outputs(
      run_forward_cli(dir, "init-routing-v2", inputs,
                      {"--expert-num", "3", "--expert-tokens-count-or-cumsum-flag", "2"}, "v2"),
      {{"expanded_x", npy::Array(DType::float16, {0, 4})},
       {"expanded_row_idx", npy::Array(DType::int32, {0})},
       {"expert_tokens_count_or_cumsum", i32({3}, {0, 0, 0})}});
  expect_outputs(run_forward_cli(dir, "init-routing", inputs,
                                 {"--expert-num", "3", "--expert-tokens-num-flag", "1"}, "v4"),
                 {{"expanded_x", npy::Array(DType::float16, {0, 4})},
                  {"expanded_row_idx", npy::Array(DType::int32, {0})},
                  {"expert_tokens_count_or_cumsum", i64({3}, {0, 0, 0})}});
}

TEST(CliGoldenForward, CreatesMissingDirectoriesAndReplacesOldFiles) {
  TempDir dir;
  const std::vector<std::pair<std::string, npy::Array>> inputs = {
      {"--x", f32({1, 1}, {5})}, {"--expert-idx", i32({1, 1}, {0})}};
  const std::map<std::string, npy::Array> expected = {{"expanded_x", f32({1, 1}, {5})},
                                                      {"expanded_row_idx", i32({1}, {0})}};
  expect_outputs(run_forward_cli(dir, "init-routing-v2", inputs, {}, "a/b/c"), expected);
  std::ofstream(dir.file("a/b/c/expanded_x.npy")) << "stale";
  expect_outputs(run_forward_cli(dir, "init-routing-v2", inputs, {}, "a/b/c"), expected);
}

// --- golden init-routing-v2 / init-routing: random cases against the library's reference ------

TEST(CliGoldenForward, RandomV2CasesEqualTheReferenceByteForByte) {
  TempDir dir;
  testing::Random rng(97531);
  const testing::Runner reference{Backend::reference, CpuIsa::automatic, 1};
  const char* backends[] = {"automatic", "cpu", "reference"};
  int case_number = 0;
  for (DType dtype : kForwardFloatDtypes)
    for (int scenario = 0; scenario < 3; ++scenario)  // dropless, active, drop-pad
      for (int flag = 0; flag < 3; ++flag) {
        const int64_t n = rng.integer(1, 14), k = rng.integer(1, 5), h = rng.integer(1, 9),
                      e = rng.integer(1, 9);
        testing::V2Case c;
        std::vector<float> x(size_t(n * h));
        for (float& v : x) v = rng.uniform(int(rng.integer(-6, 6)));
        c.x = Tensor::floats(dtype, {n, h}, x);
        std::vector<int32_t> ids(size_t(n * k));
        for (int32_t& id : ids) id = int32_t(rng.integer(0, e - 1));
        c.expert_idx = Tensor::int32s({n, k}, ids);
        c.attrs.expert_num = e;
        c.attrs.expert_tokens_count_or_cumsum_flag = flag;
        c.attrs.expert_tokens_before_capacity_flag = flag != 0;
        if (scenario == 1) c.attrs.active_num = rng.integer(1, n * k + 2);
        if (scenario == 2) {
          c.attrs.drop_pad_mode = 1;
          c.attrs.expert_capacity = rng.integer(1, n);
        }
        SCOPED_TRACE(::testing::Message()
                     << dtype_name(dtype) << " scenario " << scenario << " flag " << flag
                     << " N=" << n << " K=" << k << " H=" << h << " E=" << e);
        const testing::V2Result expected = testing::run_v2(c, reference);
        ASSERT_TRUE(expected.status.is_ok()) << expected.status.message();

        // Flags only where they differ from the defaults, as a user would type them.
        const MoeInitRoutingV2Attrs& a = c.attrs;
        std::vector<std::string> flags = {"--expert-num", std::to_string(e)};
        if (a.active_num != 0)
          flags.insert(flags.end(), {"--active-num", std::to_string(a.active_num)});
        if (a.drop_pad_mode != 0)
          flags.insert(flags.end(), {"--drop-pad-mode=1", "--expert-capacity",
                                     std::to_string(a.expert_capacity)});
        if (flag != 0)
          flags.insert(flags.end(), {"--expert-tokens-count-or-cumsum-flag", std::to_string(flag),
                                     "--expert-tokens-before-capacity-flag", "1"});
        flags.insert(flags.end(), {"--backend", backends[case_number % 3], "--threads",
                                   std::to_string(case_number % 4)});

        std::map<std::string, npy::Array> outputs = {
            {"expanded_x", to_array(expected.expanded_x)},
            {"expanded_row_idx", to_array(expected.expanded_row_idx)}};
        if (expected.plan.expert_tokens_count_or_cumsum.produced)
          outputs["expert_tokens_count_or_cumsum"] = to_array(expected.counts);
        if (expected.plan.expert_tokens_before_capacity.produced)
          outputs["expert_tokens_before_capacity"] = to_array(expected.before_capacity);
        expect_outputs(
            run_forward_cli(dir, "init-routing-v2",
                            {{"--x", to_array(c.x)}, {"--expert-idx", to_array(c.expert_idx)}},
                            flags, "out" + std::to_string(case_number)),
            outputs);
        ++case_number;
      }
}

TEST(CliGoldenForward, RandomTorchApiCasesEqualTheReferenceByteForByte) {
  TempDir dir;
  testing::Random rng(86420);
  const testing::Runner reference{Backend::reference, CpuIsa::automatic, 1};
  const char* backends[] = {"automatic", "cpu", "reference"};
  int case_number = 0;
  for (DType dtype : {DType::float32, DType::float16, DType::bfloat16, DType::int8})
    for (int scenario = 0; scenario < 4; ++scenario)  // dropless, partial range, active, drop-pad
      for (int64_t quant : {-1, 0, 1})
        for (int64_t row_idx_type : {0, 1}) {
          if (dtype == DType::int8 && quant != -1) continue;  // int8 x cannot be quantised
          if (scenario == 3 && (quant != -1 || row_idx_type != 0)) continue;
          const int64_t n = rng.integer(1, 12), k = rng.integer(1, 4), h = rng.integer(1, 9),
                        e = rng.integer(1, 8);
          testing::ForwardCase c;
          if (dtype == DType::int8) {
            c.x = Tensor(DType::int8, {n, h});
            for (uint8_t& b : c.x.bytes) b = uint8_t(rng.next());
          } else {
            std::vector<float> x(size_t(n * h));
            for (float& v : x) v = rng.uniform(int(rng.integer(-4, 7)));
            c.x = Tensor::floats(dtype, {n, h}, x);
          }
          std::vector<int32_t> ids(size_t(n * k));
          for (int32_t& id : ids) id = int32_t(rng.integer(-1, e));  // -1 and E are not routed
          c.expert_idx = Tensor::int32s({n, k}, ids);
          MoeInitRoutingAttrs& a = c.attrs;
          a.expert_num = e;
          a.quant_mode = quant;
          a.row_idx_type = row_idx_type;
          a.numerics = rng.integer(0, 1) ? Numerics::ascend_950 : Numerics::atlas_a2;
          a.expert_tokens_num_flag = rng.integer(0, 3) != 0;
          a.expert_tokens_num_type = rng.integer(0, 2);
          int64_t range = e;
          if (scenario == 1) {
            const int64_t start = rng.integer(0, e - 1), end = rng.integer(start + 1, e);
            a.has_active_expert_range = true;
            a.active_expert_range = {start, end};
            range = end - start;
          }
          if (scenario == 2) a.active_num = rng.integer(1, n * k + 2);
          if (scenario == 3) {
            a.drop_pad_mode = 1;
            a.expert_capacity = rng.integer(1, n);
          }
          auto random_floats = [&](int64_t count) {
            std::vector<float> v(static_cast<size_t>(count));
            for (float& f : v) f = rng.uniform(int(rng.integer(-3, 3)));
            return v;
          };
          if (rng.integer(0, 1))
            c.topk_weight = Tensor::floats(DType::float32, {n, k}, random_floats(n * k));
          if (quant == -1 && rng.integer(0, 1))
            c.scale = Tensor::floats(DType::float32, {n}, random_floats(n));
          if (quant == 0) {
            c.scale = Tensor::floats(DType::float32, {1}, {rng.uniform(6)});
            if (rng.integer(0, 1)) c.offset = Tensor::floats(DType::float32, {1}, {rng.uniform(3)});
          }
          if (quant == 1 && rng.integer(0, 2) != 0) {
            const int64_t rows = rng.integer(0, 1) ? range : 1;
            c.scale = Tensor::floats(DType::float32, {rows, h}, random_floats(rows * h));
          }
          SCOPED_TRACE(::testing::Message()
                       << dtype_name(dtype) << " scenario " << scenario << " quant " << quant
                       << " row_idx_type " << row_idx_type << " N=" << n << " K=" << k << " H=" << h
                       << " E=" << e);
          const testing::ForwardResult expected = testing::run_forward(c, reference);
          ASSERT_TRUE(expected.status.is_ok()) << expected.status.message();

          std::vector<std::pair<std::string, npy::Array>> inputs = {
              {"--x", to_array(c.x)}, {"--expert-idx", to_array(c.expert_idx)}};
          if (c.scale.present) inputs.push_back({"--scale", to_array(c.scale)});
          if (c.offset.present) inputs.push_back({"--offset", to_array(c.offset)});
          if (c.topk_weight.present) inputs.push_back({"--topk-weight", to_array(c.topk_weight)});
          std::vector<std::string> flags = {"--expert-num", std::to_string(e)};
          auto add = [&](const char* flag, int64_t value, int64_t default_value) {
            if (value != default_value) flags.insert(flags.end(), {flag, std::to_string(value)});
          };
          add("--active-num", a.active_num, -1);
          add("--expert-capacity", a.expert_capacity, -1);
          add("--drop-pad-mode", a.drop_pad_mode, 0);
          add("--expert-tokens-num-type", a.expert_tokens_num_type, 0);
          add("--expert-tokens-num-flag", a.expert_tokens_num_flag ? 1 : 0, 0);
          add("--quant-mode", a.quant_mode, -1);
          add("--row-idx-type", a.row_idx_type, 0);
          if (a.has_active_expert_range)
            flags.push_back("--active-expert-range=" + std::to_string(a.active_expert_range.start) +
                            "," + std::to_string(a.active_expert_range.end));
          if (a.numerics == Numerics::ascend_950)
            flags.insert(flags.end(), {"--numerics", "ascend_950"});
          flags.insert(flags.end(), {"--backend", backends[case_number % 3], "--threads",
                                     std::to_string(case_number % 4)});

          std::map<std::string, npy::Array> outputs;
          const std::pair<const char*, const Tensor*> all[] = {
              {"expanded_x", &expected.expanded_x},
              {"expanded_row_idx", &expected.expanded_row_idx},
              {"expert_tokens_count_or_cumsum", &expected.counts},
              {"expanded_scale", &expected.expanded_scale},
              {"expanded_topk_weight", &expected.expanded_topk_weight}};
          for (const auto& [name, tensor] : all)
            if (tensor->present) outputs[name] = to_array(*tensor);
          expect_outputs(run_forward_cli(dir, "init-routing", inputs, flags,
                                         "out" + std::to_string(case_number)),
                         outputs);
          ++case_number;
        }
}

// --- golden init-routing-v2 / init-routing: errors ---------------------------------------------

TEST(CliGoldenForward, ErrorsExitWith2AndWriteNothing) {
  TempDir dir;
  write_or_fail(dir.file("x.npy"), f32({2, 3}, {1, 2, 3, 4, 5, 6}));
  write_or_fail(dir.file("idx.npy"), i32({2, 2}, {0, 1, 2, 3}));
  write_or_fail(dir.file("idx7.npy"), i32({2, 2}, {0, 1, 7, 3}));
  write_or_fail(dir.file("idxneg.npy"), i32({2, 2}, {0, 1, -2, 3}));
  write_or_fail(dir.file("idx64.npy"), i64({2, 2}, {0, 1, 2, 3}));
  write_or_fail(dir.file("scale2.npy"), f32({2}, {1, 2}));
  write_or_fail(dir.file("x8.npy"), i8({2, 3}, {1, 2, 3, 4, 5, 6}));
  std::ofstream(dir.file("file.txt")) << "not a directory";

  struct Case {
    const char* name;
    std::vector<std::string> args;  // "X", "IDX", "OUT", ... are replaced by paths below
    std::string message;            // substring of stderr
    bool exact = false;             // stderr must be exactly message + "\n"
  };
  auto v2 = [](std::vector<std::string> extra, const char* idx = "IDX", const char* out = "OUT") {
    std::vector<std::string> args = {"golden", "init-routing-v2", "--x", "X", "--expert-idx",
                                     idx,      "--out-dir",       out};
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  };
  auto v4 = [](std::vector<std::string> extra, const char* idx = "IDX", const char* out = "OUT") {
    std::vector<std::string> args = {"golden", "init-routing", "--x", "X", "--expert-idx",
                                     idx,      "--out-dir",    out};
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  };
  const std::vector<Case> cases = {
      {"v2 missing flags",
       {"golden", "init-routing-v2"},
       "moe-routing: golden init-routing-v2: missing required flags: --x FILE, --expert-idx FILE, "
       "--out-dir DIR"},
      {"v4 missing --out-dir",
       {"golden", "init-routing", "--x", "X", "--expert-idx", "IDX"},
       "moe-routing: golden init-routing: missing required flags: --out-dir DIR"},
      {"unknown flag", v2({"--expert-nums", "4"}),
       "moe-routing: golden init-routing-v2: unknown flag '--expert-nums' (did you mean "
       "--expert-num?"},
      {"before-capacity flag not 0/1", v2({"--expert-tokens-before-capacity-flag", "2"}),
       "--expert-tokens-before-capacity-flag must be in [0, 1], got 2"},
      {"num flag not 0/1", v4({"--expert-num", "4", "--expert-tokens-num-flag", "true"}),
       "--expert-tokens-num-flag must be an integer in [0, 1], got 'true'"},
      {"range with one number", v4({"--expert-num", "4", "--active-expert-range", "2"}),
       "--active-expert-range must be 2 comma-separated integers START,END, got '2'"},
      {"bad numerics", v4({"--expert-num", "4", "--numerics", "a3"}),
       "--numerics must be one of atlas_a2, ascend_950, got 'a3'"},
      {"v2 drop_pad_mode 2 (library)", v2({"--drop-pad-mode", "2"}),
       "moe_init_routing_v2: drop_pad_mode must be 0 (dropless) or 1 (drop-pad), got 2", true},
      {"v2 negative active_num (library)", v2({"--active-num", "-1"}),
       "moe_init_routing_v2: active_num must be >= 0, got -1", true},
      {"v2 drop-pad without capacity (library)", v2({"--drop-pad-mode", "1", "--expert-num", "4"}),
       "moe_init_routing_v2: expert_capacity must be >= 1 when drop_pad_mode=1, got 0", true},
      {"v2 capacity above N (library)",
       v2({"--drop-pad-mode", "1", "--expert-num", "4", "--expert-capacity", "3"}),
       "moe_init_routing_v2: expert_capacity must be <= x.size(0) (2) when drop_pad_mode=1, got 3",
       true},
      {"v2 counts without expert_num (library)", v2({"--expert-tokens-count-or-cumsum-flag", "1"}),
       "moe_init_routing_v2: expert_num must be >= 1 when expert_tokens_count_or_cumsum_flag is 1 "
       "or 2, got 0",
       true},
      {"v2 id out of range (library)",
       v2({"--expert-num", "4", "--expert-tokens-count-or-cumsum-flag", "2"}, "IDX7"),
       "moe_init_routing_v2: expert_idx[1][0] = 7 is outside [0, 4) (expert_num)", true},
      {"v2 negative id (library)", v2({}, "IDXNEG"),
       "moe_init_routing_v2: expert_idx[1][0] = -2 is negative (expert ids must be >= 0)", true},
      {"v2 int64 ids (library)", v2({}, "IDX64"),
       "moe_init_routing_v2: expert_idx must be int32, got int64", true},
      {"v4 expert_num default (library)", v4({}),
       "moe_init_routing: expert_num must be >= 1, got -1", true},
      {"v4 range beyond expert_num (library)",
       v4({"--expert-num", "4", "--active-expert-range", "2,5"}),
       "moe_init_routing: active_expert_range must be [start, end) with 0 <= start < end <= "
       "expert_num (4), got [2, 5]",
       true},
      {"v4 static quant without scale (library)", v4({"--expert-num", "4", "--quant-mode", "0"}),
       "moe_init_routing: scale must be given (1-D float32 [1]) when quant_mode=0, got none", true},
      {"v4 unsupported quant mode (library)", v4({"--expert-num", "4", "--quant-mode", "3"}),
       "moe_init_routing: quant_mode must be one of the supported modes -1 (none), 0 (static int8) "
       "or 1 (dynamic int8)"},
      {"v4 scale of the wrong shape (library)",
       v4({"--expert-num", "4", "--quant-mode", "0", "--scale", "SCALE2"}),
       "moe_init_routing: scale must be 1-D float32 [1] when quant_mode=0, got 1-D float32 [2]",
       true},
      {"v4 row_idx_type 1 in drop-pad (library)",
       v4({"--expert-num", "4", "--drop-pad-mode", "1", "--expert-capacity", "1", "--row-idx-type",
           "1"}),
       "moe_init_routing: row_idx_type must be 0 when drop_pad_mode=1, got 1", true},
      {"v4 int8 x with quantisation (library)",
       {"golden", "init-routing", "--x", "X8", "--expert-idx", "IDX", "--out-dir", "OUT",
        "--expert-num", "4", "--quant-mode", "1"},
       "moe_init_routing: x must be float16, bfloat16 or float32 when quant_mode is 0 or 1, got "
       "int8",
       true},
      {"missing input file", v4({"--expert-num", "4"}, "MISSING"),
       "missing.npy: file must be readable, got 'No such file or directory'"},
      {"missing optional input file", v4({"--expert-num", "4", "--topk-weight", "MISSING"}),
       "missing.npy: file must be readable, got 'No such file or directory'"},
      {"--out-dir is a file", v2({}, "IDX", "FILE"),
       "moe-routing: golden init-routing-v2: --out-dir must be a directory, got '", false},
      {"--out-dir under a file", v4({"--expert-num", "4"}, "IDX", "UNDERFILE"),
       "moe-routing: golden init-routing: --out-dir must be a directory, got '", false},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string out = dir.file("out");
    const std::map<std::string, std::string> paths = {{"X", dir.file("x.npy")},
                                                      {"X8", dir.file("x8.npy")},
                                                      {"IDX", dir.file("idx.npy")},
                                                      {"IDX7", dir.file("idx7.npy")},
                                                      {"IDXNEG", dir.file("idxneg.npy")},
                                                      {"IDX64", dir.file("idx64.npy")},
                                                      {"SCALE2", dir.file("scale2.npy")},
                                                      {"MISSING", dir.file("missing.npy")},
                                                      {"OUT", out},
                                                      {"FILE", dir.file("file.txt")},
                                                      {"UNDERFILE", dir.file("file.txt/sub")}};
    std::vector<std::string> args;
    for (const std::string& a : c.args) args.push_back(paths.count(a) ? paths.at(a) : a);
    const CliResult r = run_cli(dir, args);
    EXPECT_EQ(r.exit_code, 2) << describe(args, r);
    if (c.exact)
      EXPECT_EQ(r.err, c.message + "\n") << describe(args, r);
    else
      EXPECT_NE(r.err.find(c.message), std::string::npos) << describe(args, r);
    EXPECT_TRUE(r.out.empty()) << describe(args, r);
    EXPECT_FALSE(exists(out)) << "--out-dir was created";
    EXPECT_EQ(read_text(dir.file("file.txt")), "not a directory");
  }
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
  const CliResult three = run_cli(dir, {"info"}, CliOptions{{"MOE_ROUTING_NUM_THREADS=3"}});
  EXPECT_NE(three.out.find("default threads: 3 (MOE_ROUTING_NUM_THREADS=3)"), std::string::npos)
      << three.out;
  EXPECT_EQ(run_cli(dir, {"info", "--bogus"}).exit_code, 2);
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
  while (std::getline(again, line)) {
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
       {"copy (memcpy", "read alone", "write alone (memset)", "zero lines (CLZERO"})
    EXPECT_NE(r.out.find(line), std::string::npos) << line << "\n" << r.out;
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

TEST(CliBench, RejectsABadTokenList) {
  TempDir dir;
  const CliResult r = run_cli(dir, {"bench", "--tokens", "4,x"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--tokens"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace moe_routing
