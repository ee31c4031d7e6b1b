// The moe-routing binary run as a subprocess, the forward commands `golden init-routing-v2` and
// `golden init-routing`: the spec's examples F1-F3, Q1, Q2 and the static-quant numerics, random
// cases (every output equal to the library's reference byte for byte) and errors (exit status 2,
// no file in --out-dir).
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
#include "npy.h"
#include "routing_cases.h"

namespace moe_routing {
namespace {

using namespace testing;  // moe_routing::testing: the helpers of cli_test_util.h

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
        testing::V2CaseSpec spec;
        spec.dtype = dtype;
        spec.mode = scenario;
        spec.sizes.tokens = {1, 14};
        spec.sizes.top_k = {1, 5};
        spec.sizes.hidden = {1, 9};
        spec.sizes.experts = {1, 9};
        testing::V2Case c = testing::make_v2_case(rng, spec);
        // Every count flag, with the counts before capacity whenever there are counts.
        c.attrs.expert_tokens_count_or_cumsum_flag = flag;
        c.attrs.expert_tokens_before_capacity_flag = flag != 0;
        const int64_t n = c.x.shape[0], k = c.expert_idx.shape[1], h = c.x.shape[1],
                      e = c.attrs.expert_num;
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
          testing::ForwardCaseSpec spec;
          spec.dtype = dtype;
          spec.scenario = testing::kScenarios[scenario];
          spec.quant_mode = quant;
          spec.row_idx_type = row_idx_type;
          spec.sizes.tokens = {1, 12};
          spec.sizes.top_k = {1, 4};
          spec.sizes.hidden = {1, 9};
          spec.sizes.experts = {1, 8};
          testing::ForwardCase c = testing::make_forward_case(rng, spec);
          const MoeInitRoutingAttrs& a = c.attrs;
          const int64_t n = c.x.shape[0], k = c.expert_idx.shape[1], h = c.x.shape[1],
                        e = a.expert_num;
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
       "moe_init_routing_v2: expert_idx[1][0] must be in [0, 4) (expert_num), got 7", true},
      {"v2 negative id (library)", v2({}, "IDXNEG"),
       "moe_init_routing_v2: expert_idx[1][0] must be >= 0 (expert ids are never negative), got -2",
       true},
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

}  // namespace
}  // namespace moe_routing
