// `moe-routing golden finalize-routing` and `golden finalize-routing-grad` run as a subprocess:
// the spec's worked examples (docs/spec/moe_finalize_routing.md §5) in both numerics, bfloat16 as
// uint16 bit patterns with float32 scales, results byte for byte equal to the C++ API for every
// layout, V1 and V2, every error exiting with status 2 and writing nothing, and the help.
#include "cli_test_util.h"
#include "finalize_cases.h"

namespace moe_routing::testing {
namespace {

npy::Array array_of(const FloatBuffer& b, std::vector<int64_t> shape) {
  return array_from(b.dtype, std::move(shape), b.data());
}

/// `golden finalize-routing` with `inputs` (flag -> array, written as dir/in<flag>.npy) and
/// `flags`, writing dir/out.npy; the output read back after a successful run.
struct ForwardResult {
  std::vector<std::string> args;
  CliResult result;
  npy::Array out;
};

ForwardResult run_finalize_cli(const TempDir& dir,
                               const std::vector<std::pair<std::string, npy::Array>>& inputs,
                               const std::vector<std::string>& flags) {
  ForwardResult run;
  run.args = {"golden", "finalize-routing"};
  for (const auto& [flag, array] : inputs) {
    const std::string path = dir.file("in" + flag + ".npy");
    write_or_fail(path, array);
    run.args.insert(run.args.end(), {flag, path});
  }
  run.args.insert(run.args.end(), flags.begin(), flags.end());
  run.args.insert(run.args.end(), {"--out", dir.file("out.npy")});
  run.result = run_cli(dir, run.args);
  if (run.result.exit_code == 0) {
    const Status s = npy::read(dir.file("out.npy"), &run.out);
    EXPECT_TRUE(s.is_ok()) << s.message();
  }
  return run;
}

std::vector<float> values_of(const npy::Array& a) {
  std::vector<float> v;
  for (int64_t k = 0; k < a.numel(); ++k) v.push_back(load_as_float(a.bytes.data(), a.dtype, k));
  return v;
}

TEST(CliFinalize, SpecExampleInBothLayoutsAndNumerics) {
  TempDir dir;
  for (int64_t mode : {2, 0})
    for (const char* numerics : {"atlas_a2", "ascend_950"}) {
      const std::vector<int32_t> idx =
          mode == 2 ? std::vector<int32_t>{1, 3, 0, 2} : std::vector<int32_t>{1, 0, 3, 2};
      const ForwardResult run =
          run_finalize_cli(dir,
                           {{"--expanded-x", f32({4, 1}, {1, 2, 3, 4})},
                            {"--expanded-row-idx", i32({4}, idx)},
                            {"--x1", f32({2, 1}, {10, 20})},
                            {"--scales", f32({2, 2}, {0.5f, 0.25f, 2, 1})}},
                           {"--drop-pad-mode", std::to_string(mode), "--numerics", numerics});
      ASSERT_EQ(run.result.exit_code, 0) << describe(run.args, run.result);
      EXPECT_TRUE(same_array(f32({2, 1}, {12, 25}), run.out)) << describe(run.args, run.result);
      EXPECT_NE(run.result.out.find("out float32 [2, 1]"), std::string::npos) << run.result.out;
    }
}

TEST(CliFinalize, SpecExampleThroughV1) {
  TempDir dir;
  const ForwardResult run = run_finalize_cli(dir,
                                             {{"--expanded-x", f32({4, 1}, {1, 2, 3, 4})},
                                              {"--expanded-row-idx", i32({4}, {1, 0, 3, 2})},
                                              {"--x1", f32({2, 1}, {10, 20})},
                                              {"--bias", f32({1, 1}, {0})},
                                              {"--scales", f32({2, 2}, {0.5f, 0.25f, 2, 1})},
                                              {"--expert-idx", i32({2, 2}, {0, 0, 0, 0})}},
                                             {"--api", "v1"});
  ASSERT_EQ(run.result.exit_code, 0) << describe(run.args, run.result);
  EXPECT_TRUE(same_array(f32({2, 1}, {12, 25}), run.out));
}

TEST(CliFinalize, SpecExampleAccumulationTypeFollowsNumerics) {
  TempDir dir;
  for (const char* numerics : {"atlas_a2", "ascend_950"}) {
    const ForwardResult run =
        run_finalize_cli(dir,
                         {{"--expanded-x", floats(DType::float16, {3, 1}, {2048, 1, 1})},
                          {"--expanded-row-idx", i32({3}, {0, 1, 2})},
                          {"--scales", floats(DType::float16, {1, 3}, {1, 1, 1})}},
                         {"--drop-pad-mode", "2", "--numerics", numerics});
    ASSERT_EQ(run.result.exit_code, 0) << describe(run.args, run.result);
    EXPECT_EQ(values_of(run.out),
              std::vector<float>{std::string(numerics) == "atlas_a2" ? 2048.0f : 2050.0f});
    EXPECT_EQ(run.out.dtype, DType::float16);
  }
}

TEST(CliFinalize, TopKGivesKWithoutScales) {
  TempDir dir;
  // K = 2 from --top-k: out[i] = x[idx[2i]] + x[idx[2i+1]] (row layout).
  const ForwardResult run = run_finalize_cli(dir,
                                             {{"--expanded-x", f32({4, 1}, {1, 2, 4, 8})},
                                              {"--expanded-row-idx", i32({4}, {3, 0, -1, 2})}},
                                             {"--drop-pad-mode", "2", "--top-k", "2"});
  ASSERT_EQ(run.result.exit_code, 0) << describe(run.args, run.result);
  EXPECT_TRUE(same_array(f32({2, 1}, {9, 4}), run.out));
}

TEST(CliFinalize, SpecExampleGradWithEveryOutput) {
  TempDir dir;
  const ForwardRun run = run_forward_cli(dir, "finalize-routing-grad",
                                         {{"--grad-y", f32({2, 2}, {1, 2, 3, 4})},
                                          {"--expanded-row-idx", i32({4}, {1, 3, 0, 2})},
                                          {"--expanded-x", f32({4, 2}, {0, 1, 2, 3, 4, 5, 6, 7})},
                                          {"--scales", f32({2, 2}, {0.5f, 0.25f, 2, 1})}},
                                         {}, "out");
  expect_outputs(run, {{"grad_expanded_x", f32({4, 2}, {6, 8, 0.5f, 1, 3, 4, 0.25f, 0.5f})},
                       {"grad_scales", f32({2, 2}, {8, 20, 4, 32})}});
  // With a zero bias for experts {0, 1}: grad_bias[e] sums scales[p] * grad_y[i] over e's pairs.
  const ForwardRun with_bias =
      run_forward_cli(dir, "finalize-routing-grad",
                      {{"--grad-y", f32({2, 2}, {1, 2, 3, 4})},
                       {"--expanded-row-idx", i32({4}, {1, 3, 0, 2})},
                       {"--expanded-x", f32({4, 2}, {0, 1, 2, 3, 4, 5, 6, 7})},
                       {"--scales", f32({2, 2}, {0.5f, 0.25f, 2, 1})},
                       {"--expert-idx", i32({2, 2}, {0, 1, 1, 0})},
                       {"--bias", f32({2, 2}, {0, 0, 0, 0})}},
                      {"--numerics", "ascend_950"}, "out_bias");
  // expert 0: pairs 0 (0.5 * [1, 2]) and 3 (1 * [3, 4]); expert 1: pairs 1 (0.25 * [1, 2]) and 2
  // (2 * [3, 4]).
  expect_outputs(with_bias, {{"grad_expanded_x", f32({4, 2}, {6, 8, 0.5f, 1, 3, 4, 0.25f, 0.5f})},
                             {"grad_scales", f32({2, 2}, {8, 20, 4, 32})},
                             {"grad_bias", f32({2, 2}, {3.5f, 5, 6.25f, 8.5f})}});
}

TEST(CliFinalize, GradWithoutScalesWritesOnlyGradExpandedX) {
  TempDir dir;
  const ForwardRun run = run_forward_cli(dir, "finalize-routing-grad",
                                         {{"--grad-y", f32({2, 1}, {1, 2})},
                                          {"--expanded-row-idx", i32({4}, {3, -1, 0, 1})},
                                          {"--expanded-x", f32({4, 1}, {9, 9, 9, 9})}},
                                         {}, "out");
  // K = 2 from the lengths; row 2 is named by no pair: zero.
  expect_outputs(run, {{"grad_expanded_x", f32({4, 1}, {2, 2, 0, 1})}});
}

/// Every dtype (bfloat16 as uint16, with float32 scales too), layout and api through the tool,
/// byte for byte equal to the C++ API.
TEST(CliFinalize, RandomCasesEqualTheCppApiByteForByte) {
  TempDir dir;
  Random rng(4242);
  const Runner cpu{Backend::cpu, CpuIsa::automatic, 0};
  for (const DtypeVariant& d : kFinalizeDtypes)
    for (int64_t mode = 0; mode < 5; ++mode) {  // 4: V1
      const bool v1 = mode == 4;
      FinalizeOptions o;
      o.x1 = o.scales = o.duplicates = true;
      o.x2 = o.bias = o.expert_idx = mode % 2 == 0 || v1;
      o.mixed_scales = d.mixed_scales;
      const Numerics numerics = mode % 2 ? Numerics::ascend_950 : Numerics::atlas_a2;
      FinalizeCase c = make_finalize_case(rng, d.dtype, v1 ? 0 : mode, numerics, o, 5, 3, 21,
                                          v1 ? FinalizeRoutingApi::v1 : FinalizeRoutingApi::v2);
      fill_special(rng, {&c.x2});
      const FloatBuffer expected = run_finalize_case(c, cpu);
      std::vector<std::pair<std::string, npy::Array>> inputs = {
          {"--expanded-x", array_of(c.expanded_x, c.expanded_shape)},
          {"--expanded-row-idx", i32({c.N * c.K}, c.idx)},
          {"--x1", array_of(c.x1, {c.N, c.H})},
          {"--scales", array_of(c.scales, {c.N, c.K})}};
      if (o.bias) {
        inputs.push_back({"--x2", array_of(c.x2, {c.N, c.H})});
        inputs.push_back({"--bias", array_of(c.bias, {c.E, c.H})});
        inputs.push_back({"--expert-idx", i32({c.N, c.K}, c.expert_idx)});
      }
      const ForwardResult run =
          run_finalize_cli(dir, inputs,
                           {"--drop-pad-mode", std::to_string(c.attrs.drop_pad_mode), "--api",
                            v1 ? "v1" : "v2", "--numerics", numerics_name(numerics)});
      ASSERT_EQ(run.result.exit_code, 0) << describe(run.args, run.result);
      EXPECT_TRUE(same_array(array_of(expected, {c.N, c.H}), run.out))
          << dtype_name(d.dtype) << " mode " << mode;
    }
  for (const DtypeVariant& d : kFinalizeDtypes)
    for (int64_t mode : {0, 1}) {
      GradOptions o;
      o.bias = o.grad_bias = true;
      o.mixed_scales = d.mixed_scales;
      FinalizeGradCase c =
          make_finalize_grad_case(rng, d.dtype, mode, Numerics::atlas_a2, o, 6, 2, 19);
      const GradResult expected = run_finalize_grad_case(c, cpu);
      std::vector<std::string> flags = {"--drop-pad-mode", std::to_string(mode)};
      if (c.attrs.active_num > 0)
        flags.insert(flags.end(), {"--active-num", std::to_string(c.attrs.active_num)});
      if (mode == 1)
        flags.insert(flags.end(), {"--expert-num", std::to_string(c.attrs.expert_num),
                                   "--expert-capacity", std::to_string(c.attrs.expert_capacity)});
      const ForwardRun run =
          run_forward_cli(dir, "finalize-routing-grad",
                          {{"--grad-y", array_of(c.grad_y, {c.N, c.H})},
                           {"--expanded-row-idx", i32({c.N * c.K}, c.idx)},
                           {"--expanded-x", array_of(c.expanded_x, c.expanded_shape)},
                           {"--scales", array_of(c.scales, {c.N, c.K})},
                           {"--expert-idx", i32({c.N, c.K}, c.expert_idx)},
                           {"--bias", array_of(c.bias, {c.E, c.H})}},
                          flags, "grad" + std::to_string(mode) + dtype_name(d.dtype));
      expect_outputs(run,
                     {{"grad_expanded_x", array_of(expected.grad_expanded_x, c.expanded_shape)},
                      {"grad_scales", array_of(expected.grad_scales, {c.N, c.K})},
                      {"grad_bias", array_of(expected.grad_bias, {c.E, c.H})}});
    }
}

TEST(CliFinalize, ErrorsExitWith2AndWriteNothing) {
  TempDir dir;
  write_or_fail(dir.file("ex.npy"), f32({4, 1}, {1, 2, 3, 4}));
  write_or_fail(dir.file("ex3.npy"), f32({2, 2, 1}, {1, 2, 3, 4}));
  write_or_fail(dir.file("r.npy"), i32({4}, {1, 3, 0, 2}));
  write_or_fail(dir.file("r99.npy"), i32({4}, {1, 99, 0, 2}));
  write_or_fail(dir.file("x1.npy"), f32({2, 1}, {10, 20}));
  write_or_fail(dir.file("s.npy"), f32({2, 2}, {0.5f, 0.25f, 2, 1}));
  write_or_fail(dir.file("s16.npy"), floats(DType::float16, {2, 2}, {1, 1, 1, 1}));
  write_or_fail(dir.file("gy.npy"), f32({2, 1}, {1, 2}));
  write_or_fail(dir.file("gy_int.npy"), i32({2, 1}, {1, 2}));
  std::ofstream(dir.file("text.npy")) << "not an array";
  write_or_fail(dir.file("r_dropped.npy"), i32({4}, {-1, -1, -1, -1}));
  // Empty, but its other extent makes 2^64 bytes: NumPy refuses the shape (and would refuse the
  // [0, 2^62] out it gives). Written by hand: npy::write refuses it too.
  {
    std::string header =
        "{'descr': '<f4', 'fortran_order': False, 'shape': (0, 4611686018427387904), }";
    header.append(63 - (10 + header.size()) % 64, ' ');
    header += '\n';
    std::ofstream(dir.file("ex_huge.npy"), std::ios::binary)
        << std::string("\x93NUMPY\x01\x00", 8) << char(header.size() & 0xff)
        << char(header.size() >> 8) << header;
  }
  struct Case {
    const char* name;
    std::vector<std::string> args;  // EX, R, ... are replaced by paths below
    std::string message;            // stderr must be exactly this plus "\n"
  };
  auto forward = [](std::vector<std::string> extra) {
    std::vector<std::string> args = {
        "golden", "finalize-routing", "--expanded-x", "EX", "--expanded-row-idx", "R", "--out",
        "OUT"};
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  };
  auto grad = [](std::vector<std::string> extra) {
    std::vector<std::string> args = {
        "golden", "finalize-routing-grad", "--grad-y", "GY", "--expanded-row-idx", "R", "--out-dir",
        "OUTDIR"};
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  };
  const std::string fr = "moe-routing: golden finalize-routing: ";
  const std::string frg = "moe-routing: golden finalize-routing-grad: ";
  const std::vector<Case> cases = {
      {"missing --out",
       {"golden", "finalize-routing", "--expanded-x", "EX", "--expanded-row-idx", "R"},
       fr + "missing required flags: --out FILE (run 'moe-routing golden finalize-routing --help' "
            "to see the flags)"},
      {"bad api", forward({"--api", "v3"}), fr + "--api must be one of v1, v2, got 'v3'"},
      {"bad numerics", forward({"--numerics", "a3"}),
       fr + "--numerics must be one of atlas_a2, ascend_950, got 'a3'"},
      {"bad mode (library)", forward({"--drop-pad-mode", "4"}),
       "moe_finalize_routing: drop_pad_mode must be 0 (dropless, column), 1 (drop-pad, column), 2 "
       "(dropless, row) or 3 (drop-pad, row), got 4"},
      {"v1 without x1 (library)", forward({"--api", "v1"}),
       "moe_finalize_routing: x1 must be present with api v1, got none"},
      {"x2 without x1 (library)", forward({"--x2", "X1"}),
       "moe_finalize_routing: x2 needs x1 (CANN adds x2 only to x1), got x2 without x1"},
      {"scales dtype (library)", forward({"--x1", "X1", "--scales", "S16"}),
       "moe_finalize_routing: scales must be 2-D [N, K] of the dtype of expanded_x (float32), got "
       "2-D float16 [2, 2]"},
      {"3-D dropless (library)",
       {"golden", "finalize-routing", "--expanded-x", "EX3", "--expanded-row-idx", "R", "--out",
        "OUT"},
       "moe_finalize_routing: expanded_x must be 2-D [R, H] when drop_pad_mode=0 (dropless), got "
       "3-D float32 [2, 2, 1]"},
      {"index out of range (library)",
       {"golden", "finalize-routing", "--expanded-x", "EX", "--expanded-row-idx", "R99", "--x1",
        "X1", "--scales", "S", "--drop-pad-mode", "2", "--out", "OUT"},
       "moe_finalize_routing: expanded_row_idx[1] must be in [0, 4) (-1 marks a dropped pair), got "
       "99"},
      {"not an .npy file", forward({"--scales", "TEXT"}),
       "moe-routing: --scales " + dir.file("text.npy") +
           ": file must start with the .npy magic string \\x93NUMPY, got not an (not an .npy "
           "file)"},
      {"an empty input NumPy refuses",
       {"golden", "finalize-routing", "--expanded-x", "EXHUGE", "--expanded-row-idx", "R", "--out",
        "OUT"},
       "moe-routing: --expanded-x " + dir.file("ex_huge.npy") +
           ": shape must describe fewer than 2^63 bytes counting its zero extents as 1 (NumPy's "
           "limit), got (0, 4611686018427387904)"},
      {"grad: an empty output NumPy could not load",
       {"golden", "finalize-routing-grad", "--grad-y", "GY", "--expanded-row-idx", "RDROPPED",
        "--drop-pad-mode", "1", "--expert-num", "4611686018427387904", "--expert-capacity", "0",
        "--out-dir", "OUTDIR"},
       "moe-routing: --out-dir " + dir.file("outdir") +
           "/grad_expanded_x.npy: shape must describe fewer than 2^63 bytes counting its zero "
           "extents as 1 (NumPy's limit), got (4611686018427387904, 0, 1)"},
      {"grad: bad mode (library)", grad({"--drop-pad-mode", "2"}),
       "moe_finalize_routing_grad: drop_pad_mode must be 0 (dropless, row layout) or 1 (drop-pad, "
       "row layout), got 2"},
      {"grad: int32 grad_y (library)",
       {"golden", "finalize-routing-grad", "--grad-y", "GYINT", "--expanded-row-idx", "R",
        "--out-dir", "OUTDIR"},
       "moe_finalize_routing_grad: grad_y must be 2-D [N, H] float16, bfloat16 or float32, got 2-D "
       "int32 [2, 1]"},
      {"grad: index out of range (library)",
       {"golden", "finalize-routing-grad", "--grad-y", "GY", "--expanded-row-idx", "R99",
        "--out-dir", "OUTDIR"},
       "moe_finalize_routing_grad: expanded_row_idx[1] must be in [0, 4) (-1 marks a dropped "
       "pair), "
       "got 99"},
      {"grad: a file in the way of --out-dir", grad({}),
       frg + "--out-dir must be a directory, got '" + dir.file("file") + "', which is a file"},
      {"grad: missing --grad-y",
       {"golden", "finalize-routing-grad", "--expanded-row-idx", "R", "--out-dir", "OUTDIR"},
       frg + "missing required flags: --grad-y FILE (run 'moe-routing golden "
             "finalize-routing-grad --help' to see the flags)"},
  };
  std::ofstream(dir.file("file")) << "in the way";
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const bool file_in_the_way = std::string(c.name) == "grad: a file in the way of --out-dir";
    const std::map<std::string, std::string> paths = {
        {"EX", dir.file("ex.npy")},
        {"EX3", dir.file("ex3.npy")},
        {"R", dir.file("r.npy")},
        {"R99", dir.file("r99.npy")},
        {"X1", dir.file("x1.npy")},
        {"S", dir.file("s.npy")},
        {"S16", dir.file("s16.npy")},
        {"GY", dir.file("gy.npy")},
        {"GYINT", dir.file("gy_int.npy")},
        {"TEXT", dir.file("text.npy")},
        {"EXHUGE", dir.file("ex_huge.npy")},
        {"RDROPPED", dir.file("r_dropped.npy")},
        {"OUT", dir.file("out.npy")},
        {"OUTDIR", file_in_the_way ? dir.file("file") : dir.file("outdir")}};
    std::vector<std::string> args;
    for (const std::string& a : c.args) args.push_back(paths.count(a) ? paths.at(a) : a);
    const std::set<std::string> before = files_in(dir.path());
    const CliResult r = run_cli(dir, args);
    EXPECT_EQ(r.exit_code, 2) << describe(args, r);
    EXPECT_EQ(r.err, c.message + "\n") << describe(args, r);
    EXPECT_TRUE(r.out.empty()) << describe(args, r);
    EXPECT_EQ(files_in(dir.path()), before) << "a file was written or removed";
  }
}

TEST(CliFinalize, HelpDocumentsEveryFlag) {
  TempDir dir;
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      {"finalize-routing",
       {"--expanded-x FILE", "--expanded-row-idx FILE", "--x1 FILE", "--x2 FILE", "--bias FILE",
        "--scales FILE", "--expert-idx FILE", "--drop-pad-mode 0..3", "--top-k K", "--api v1|v2",
        "(default: v2)", "--numerics atlas_a2|ascend_950", "--backend", "--threads T", "--out FILE",
        "'<u2'", "Examples:"}},
      {"finalize-routing-grad",
       {"--grad-y FILE", "--expanded-row-idx FILE", "--expanded-x FILE", "--scales FILE",
        "--expert-idx FILE", "--bias FILE", "--drop-pad-mode 0|1", "--active-num A",
        "--expert-num E", "--expert-capacity C", "--numerics atlas_a2|ascend_950", "--backend",
        "--threads T", "--out-dir DIR", "grad_expanded_x.npy", "grad_scales.npy", "grad_bias.npy",
        "Examples:"}},
  };
  for (const auto& [command, mentions] : cases) {
    const std::vector<std::string> args = {"golden", command, "--help"};
    const CliResult help = run_cli(dir, args);
    EXPECT_EQ(help.exit_code, 0) << describe(args, help);
    for (const std::string& text : mentions)
      EXPECT_NE(help.out.find(text), std::string::npos) << "'" << text << "' missing from\n"
                                                        << help.out;
  }
  const CliResult top = run_cli(dir, {"--help"});
  EXPECT_NE(top.out.find("golden finalize-routing-grad"), std::string::npos) << top.out;
}

TEST(CliFinalize, BenchRowsOfTheCombineVerifyAgainstTheReference) {
  TempDir dir;
  const std::string csv = dir.file("bench.csv");
  const std::vector<std::string> args = {
      "bench", "--op",      "finalize", "--shape",  "qwen3-30b",  "--tokens",   "1,5",   "--runs",
      "1",     "--threads", "2",        "--verify", "--numerics", "ascend_950", "--csv", csv};
  const CliResult r = run_cli(dir, args);
  ASSERT_EQ(r.exit_code, 0) << describe(args, r);
  EXPECT_NE(r.out.find("verify: 2 of 2 rows bitwise equal to the reference backend"),
            std::string::npos)
      << r.out;
  // bytes moved: N*K rows of H bfloat16 values, the indices and scales read; [N, H] written.
  const double n = 5, k = 8, h = 2048;
  std::ifstream in(csv);
  std::string line;
  std::getline(in, line);
  std::getline(in, line);  // N = 1
  std::getline(in, line);  // N = 5
  EXPECT_EQ(line.rfind("finalize,dropless,qwen3-30b,5,2048,128,8,bfloat16,2,", 0), 0u) << line;
  std::stringstream fields(line);
  std::string field;
  for (int f = 0; f <= 10; ++f) std::getline(fields, field, ',');  // the 11th: bytes
  EXPECT_EQ(std::stod(field), n * k * h * 2 + n * k * 8 + n * h * 2) << line;
  const std::vector<std::string> grad = {
      "bench",  "--op", "finalize-grad", "--shape", "qwen3-30b", "--tokens", "3",
      "--runs", "1",    "--threads",     "2",       "--verify"};
  const CliResult g = run_cli(dir, grad);
  ASSERT_EQ(g.exit_code, 0) << describe(grad, g);
  EXPECT_NE(g.out.find("finalize-grad"), std::string::npos) << g.out;
  EXPECT_NE(g.out.find("verify: 1 of 1 rows bitwise equal"), std::string::npos) << g.out;
}

}  // namespace
}  // namespace moe_routing::testing
