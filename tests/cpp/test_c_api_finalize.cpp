// The C ABI of the combine (mrMoeFinalizeRouting = V1, mrMoeFinalizeRoutingV2,
// mrMoeFinalizeRoutingV2Grad and their InferShape): the spec's worked examples, results bitwise
// equal to the C++ API for every dtype, mode, numerics and optional input, every row of the C++
// error tables that C can express answered with the same status and words (nothing written), the
// C-only checks (NULL handles, workspace, executors), and mrSetNumerics on combine executors.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "c_api/c_api_internal.h"
#include "finalize_error_cases.h"
#include "moe_routing/moe_routing.h"

namespace moe_routing::testing {
namespace {

struct TensorDeleter {
  void operator()(mrTensor* t) const { EXPECT_EQ(mrDestroyTensor(t), MR_SUCCESS); }
};
using Handle = std::unique_ptr<mrTensor, TensorDeleter>;

/// The C handle of a view (NULL for an absent one). `ok` turns false when the C ABI cannot
/// describe the view (mrCreateTensor refuses it, e.g. a negative extent).
Handle handle_of(const TensorView& v, bool* ok) {
  if (v.data == nullptr && v.ndim == 0) return Handle();
  mrTensor* t = nullptr;
  if (mrCreateTensor(v.shape, uint64_t(v.ndim), mrDataType(v.dtype), mrDevice(v.device), v.data,
                     &t) != MR_SUCCESS)
    *ok = false;
  return Handle(t);
}

/// The outcome of a call: status, message ("" on success), phase one's workspace size.
struct Outcome {
  mrStatus status = MR_SUCCESS;
  std::string message;
  uint64_t workspace_size = 0;
};

Outcome outcome_of(mrStatus status) {
  Outcome o;
  o.status = status;
  if (status != MR_SUCCESS) o.message = mrGetLastErrorMessage();
  return o;
}

Outcome outcome_of(const Status& s) {
  Outcome o;
  o.status = mrStatus(s.code());
  if (!s.is_ok()) o.message = s.message();
  return o;
}

using PhaseTwo = mrStatus (*)(void*, uint64_t, mrExecutor*, mrStream);

/// After a phase one with `status`: sets the numerics (when not the default), then phase two with
/// a workspace of exactly the reported size, one byte off alignment.
Outcome finish(mrStatus status, uint64_t workspace_size, mrExecutor* executor, Numerics numerics,
               PhaseTwo phase_two) {
  Outcome o = outcome_of(status);
  o.workspace_size = workspace_size;
  if (status != MR_SUCCESS) {
    EXPECT_EQ(executor, nullptr);
    EXPECT_EQ(workspace_size, 0u);
    return o;
  }
  if (numerics != Numerics::atlas_a2) {
    EXPECT_EQ(mrSetNumerics(executor, mrNumerics(numerics)), MR_SUCCESS);
  }
  std::vector<unsigned char> workspace(size_t(workspace_size) + 1);
  o = outcome_of(phase_two(workspace.data() + 1, workspace_size, executor, nullptr));
  o.workspace_size = workspace_size;
  return o;
}

/// The forward through the C ABI: V1 (attrs.api v1) or V2. *expressible turns false when C cannot
/// state the call (a tensor mrCreateTensor refuses; attributes V1/V2 do not have).
Outcome c_forward(const MoeFinalizeRoutingInputs& in, const MoeFinalizeRoutingAttrs& attrs,
                  const TensorView& out, bool* expressible = nullptr) {
  bool ok = true;
  const Handle ex = handle_of(in.expanded_x, &ok), idx = handle_of(in.expanded_row_idx, &ok),
               x1 = handle_of(in.x1, &ok), x2 = handle_of(in.x2, &ok),
               bias = handle_of(in.bias, &ok), scales = handle_of(in.scales, &ok),
               experts = handle_of(in.expert_idx, &ok), o = handle_of(out, &ok);
  const bool v1 = attrs.api == FinalizeRoutingApi::v1;
  ok = ok && attrs.top_k == 1 && !attrs.zero_expert_range.enabled() &&
       !attrs.copy_expert_range.enabled() && !attrs.constant_expert_range.enabled() &&
       in.x.ndim == 0 && in.alpha1.ndim == 0 && in.alpha2.ndim == 0 && in.v.ndim == 0 &&
       is_valid_numerics(int32_t(attrs.numerics)) &&
       (attrs.api == FinalizeRoutingApi::v2 ||
        (v1 && attrs.drop_pad_mode == 0 && x1 && bias && scales && experts));
  if (expressible != nullptr) *expressible = ok;
  if (!ok) return Outcome();
  uint64_t ws = 7;
  mrExecutor* executor = nullptr;
  const mrStatus s = v1 ? mrMoeFinalizeRoutingGetWorkspaceSize(
                              ex.get(), x1.get(), x2.get(), bias.get(), scales.get(), idx.get(),
                              experts.get(), o.get(), &ws, &executor)
                        : mrMoeFinalizeRoutingV2GetWorkspaceSize(
                              ex.get(), idx.get(), x1.get(), x2.get(), bias.get(), scales.get(),
                              experts.get(), attrs.drop_pad_mode, o.get(), &ws, &executor);
  return finish(s, ws, executor, attrs.numerics,
                v1 ? &mrMoeFinalizeRouting : &mrMoeFinalizeRoutingV2);
}

/// The backward through the C ABI (the outputs' handles NULL where the views are absent).
Outcome c_grad(const MoeFinalizeRoutingGradInputs& in, const MoeFinalizeRoutingGradAttrs& attrs,
               const MoeFinalizeRoutingGradOutputs& out, bool* expressible = nullptr) {
  bool ok = true;
  const Handle gy = handle_of(in.grad_y, &ok), idx = handle_of(in.expanded_row_idx, &ok),
               ex = handle_of(in.expanded_x, &ok), scales = handle_of(in.scales, &ok),
               experts = handle_of(in.expert_idx, &ok), bias = handle_of(in.bias, &ok),
               gex = handle_of(out.grad_expanded_x, &ok), gs = handle_of(out.grad_scales, &ok),
               gb = handle_of(out.grad_bias, &ok);
  ok = ok && is_valid_numerics(int32_t(attrs.numerics)) && gex;
  if (expressible != nullptr) *expressible = ok;
  if (!ok) return Outcome();
  uint64_t ws = 7;
  mrExecutor* executor = nullptr;
  const mrStatus s = mrMoeFinalizeRoutingV2GradGetWorkspaceSize(
      gy.get(), idx.get(), ex.get(), scales.get(), experts.get(), bias.get(), attrs.drop_pad_mode,
      attrs.active_num, attrs.expert_num, attrs.expert_capacity, gex.get(), gs.get(), gb.get(), &ws,
      &executor);
  return finish(s, ws, executor, attrs.numerics, &mrMoeFinalizeRoutingV2Grad);
}

void expect_same(const Outcome& c, const Outcome& cpp, const std::string& what) {
  EXPECT_EQ(c.status, cpp.status) << what << ": C said " << c.message << "; C++ said "
                                  << cpp.message;
  EXPECT_EQ(c.message, cpp.message) << what;
}

// ---- the spec's worked examples (docs/spec/moe_finalize_routing.md §5) -------------------------

TEST(CApiFinalize, SpecExampleV2RowAndColumnLayouts) {
  std::vector<float> ex{1, 2, 3, 4}, scales{0.5f, 0.25f, 2, 1}, x1{10, 20};
  const std::vector<int32_t> row_layout{1, 3, 0, 2}, column_layout{1, 0, 3, 2};
  for (int64_t mode : {2, 0}) {
    std::vector<int32_t> idx = mode == 2 ? row_layout : column_layout;
    MoeFinalizeRoutingInputs in;
    in.expanded_x = TensorView(ex.data(), DType::float32, {4, 1});
    in.expanded_row_idx = TensorView(idx.data(), DType::int32, {4});
    in.scales = TensorView(scales.data(), DType::float32, {2, 2});
    in.x1 = TensorView(x1.data(), DType::float32, {2, 1});
    MoeFinalizeRoutingAttrs attrs;
    attrs.drop_pad_mode = mode;
    for (Numerics numerics : kFinalizeNumerics) {
      attrs.numerics = numerics;
      std::vector<float> out{-1, -1};
      const Outcome o = c_forward(in, attrs, TensorView(out.data(), DType::float32, {2, 1}));
      ASSERT_EQ(o.status, MR_SUCCESS) << o.message;
      EXPECT_EQ(o.workspace_size, 0u);
      EXPECT_EQ(out, (std::vector<float>{12, 25})) << "mode " << mode;
    }
  }
}

TEST(CApiFinalize, SpecExampleV1) {
  // V1 needs bias and expert ids: a zero bias row adds +0, which changes nothing here.
  std::vector<float> ex{1, 2, 3, 4}, scales{0.5f, 0.25f, 2, 1}, x1{10, 20}, bias{0};
  std::vector<int32_t> idx{1, 0, 3, 2}, experts{0, 0, 0, 0};
  MoeFinalizeRoutingInputs in;
  in.expanded_x = TensorView(ex.data(), DType::float32, {4, 1});
  in.expanded_row_idx = TensorView(idx.data(), DType::int32, {4});
  in.scales = TensorView(scales.data(), DType::float32, {2, 2});
  in.x1 = TensorView(x1.data(), DType::float32, {2, 1});
  in.bias = TensorView(bias.data(), DType::float32, {1, 1});
  in.expert_idx = TensorView(experts.data(), DType::int32, {2, 2});
  MoeFinalizeRoutingAttrs attrs;
  attrs.api = FinalizeRoutingApi::v1;
  std::vector<float> out{-1, -1};
  const Outcome o = c_forward(in, attrs, TensorView(out.data(), DType::float32, {2, 1}));
  ASSERT_EQ(o.status, MR_SUCCESS) << o.message;
  EXPECT_EQ(out, (std::vector<float>{12, 25}));
}

TEST(CApiFinalize, SpecExampleAccumulationTypeFollowsMrSetNumerics) {
  // float16, mode 2, N = 1, K = 3, no x1: atlas_a2 adds in float16 (2048 + 1 ties to 2048, twice),
  // ascend_950 in float32 (2050).
  FloatBuffer ex = FloatBuffer::from_floats(DType::float16, {2048, 1, 1});
  FloatBuffer scales = FloatBuffer::from_floats(DType::float16, {1, 1, 1});
  std::vector<int32_t> idx{0, 1, 2};
  MoeFinalizeRoutingInputs in;
  in.expanded_x = TensorView(ex.data(), DType::float16, {3, 1});
  in.expanded_row_idx = TensorView(idx.data(), DType::int32, {3});
  in.scales = TensorView(scales.data(), DType::float16, {1, 3});
  MoeFinalizeRoutingAttrs attrs;
  attrs.drop_pad_mode = 2;
  for (Numerics numerics : kFinalizeNumerics) {
    attrs.numerics = numerics;
    FloatBuffer out(DType::float16, 1);
    out.poison();
    const Outcome o = c_forward(in, attrs, TensorView(out.data(), DType::float16, {1, 1}));
    ASSERT_EQ(o.status, MR_SUCCESS) << o.message;
    EXPECT_EQ(out.at(0), numerics == Numerics::atlas_a2 ? 2048.0f : 2050.0f)
        << numerics_name(numerics);
  }
}

TEST(CApiFinalize, SpecExampleGrad) {
  std::vector<float> gy{1, 2, 3, 4}, ex{0, 1, 2, 3, 4, 5, 6, 7}, scales{0.5f, 0.25f, 2, 1};
  std::vector<int32_t> idx{1, 3, 0, 2};
  MoeFinalizeRoutingGradInputs in;
  in.grad_y = TensorView(gy.data(), DType::float32, {2, 2});
  in.expanded_row_idx = TensorView(idx.data(), DType::int32, {4});
  in.expanded_x = TensorView(ex.data(), DType::float32, {4, 2});
  in.scales = TensorView(scales.data(), DType::float32, {2, 2});
  for (Numerics numerics : kFinalizeNumerics) {
    MoeFinalizeRoutingGradAttrs attrs;
    attrs.numerics = numerics;
    std::vector<float> gex(8, -1), gs(4, -1);
    MoeFinalizeRoutingGradOutputs out;
    out.grad_expanded_x = TensorView(gex.data(), DType::float32, {4, 2});
    out.grad_scales = TensorView(gs.data(), DType::float32, {2, 2});
    const Outcome o = c_grad(in, attrs, out);
    ASSERT_EQ(o.status, MR_SUCCESS) << o.message;
    // The CPU backend's pair lists, the size docs/c_api.md states: 4 * (2R + 2 + P) + 4 bytes
    // for R = 4 rows and P = 4 pairs.
    EXPECT_EQ(o.workspace_size, 4u * (2 * 4 + 2 + 4) + 4);
    EXPECT_EQ(gex, (std::vector<float>{6, 8, 0.5f, 1, 3, 4, 0.25f, 0.5f}));
    EXPECT_EQ(gs, (std::vector<float>{8, 20, 4, 32}));
  }
}

// ---- the C ABI equals the C++ API, bit for bit
// ---------------------------------------------------

TEST(CApiFinalize, ForwardEqualsTheCppApiForEveryVariant) {
  Random rng(2024);
  for_each_forward_variant([&](DType dtype, int64_t mode, Numerics numerics,
                               const FinalizeOptions& options, const std::string& name) {
    FinalizeOptions o = options;
    o.special = false;  // V3/V4's special experts are not part of V1/V2
    FinalizeCase c = make_finalize_case(rng, dtype, mode, numerics, o, rng.integer(1, 9),
                                        rng.integer(1, 4), rng.integer(1, 40));
    fill_special(rng, {&c.x1});
    const FloatBuffer expected = run_finalize_case(c, Runner{Backend::cpu, CpuIsa::automatic, 0});
    FloatBuffer got(c.dtype, c.N * c.H);
    got.poison();
    const Outcome out = c_forward(c.inputs(), c.attrs, TensorView(got.data(), dtype, {c.N, c.H}));
    ASSERT_EQ(out.status, MR_SUCCESS) << name << ": " << out.message;
    EXPECT_TRUE(bitwise_equal(expected, got)) << name;
  });
}

TEST(CApiFinalize, V1EqualsTheCppApi) {
  Random rng(7);
  for (const DtypeVariant& d : kFinalizeDtypes)
    for (Numerics numerics : kFinalizeNumerics)
      for (bool x2 : {false, true}) {
        FinalizeOptions o;
        o.x1 = o.bias = o.scales = o.expert_idx = true;
        o.x2 = x2, o.mixed_scales = d.mixed_scales, o.duplicates = true;
        FinalizeCase c = make_finalize_case(rng, d.dtype, 0, numerics, o, rng.integer(1, 9),
                                            rng.integer(1, 4), 35, FinalizeRoutingApi::v1);
        // Signed zeros, NaN, infinities and overflowing values in x2.
        fill_special(rng, {&c.x2});
        const FloatBuffer expected =
            run_finalize_case(c, Runner{Backend::cpu, CpuIsa::automatic, 0});
        FloatBuffer got(c.dtype, c.N * c.H);
        got.poison();
        const Outcome out =
            c_forward(c.inputs(), c.attrs, TensorView(got.data(), d.dtype, {c.N, c.H}));
        ASSERT_EQ(out.status, MR_SUCCESS) << out.message;
        EXPECT_TRUE(bitwise_equal(expected, got))
            << dtype_name(d.dtype) << ' ' << numerics_name(numerics) << " x2 " << x2;
      }
}

TEST(CApiFinalize, GradEqualsTheCppApiForEveryVariant) {
  Random rng(31);
  const Runner cpu{Backend::cpu, CpuIsa::automatic, 0};
  for (const DtypeVariant& d : kFinalizeDtypes)
    for (int64_t mode : {0, 1})
      for (Numerics numerics : kFinalizeNumerics)
        for (int options = 0; options < 8; ++options) {
          GradOptions o;
          o.scales = options & 1, o.bias = options & 2, o.grad_bias = options & 2;
          o.grad_scales = options & 4, o.mixed_scales = d.mixed_scales, o.duplicates = true;
          const int64_t K = o.scales ? rng.integer(1, 4) : 1;
          FinalizeGradCase c = make_finalize_grad_case(rng, d.dtype, mode, numerics, o,
                                                       rng.integer(1, 9), K, rng.integer(1, 70));
          const GradResult expected = run_finalize_grad_case(c, cpu);
          GradResult got = poisoned_grad_result(c);
          const Outcome out = c_grad(c.inputs(), c.attrs, grad_outputs(c, got));
          const std::string name = std::string(dtype_name(d.dtype)) + " mode " +
                                   std::to_string(mode) + ' ' + numerics_name(numerics) +
                                   " options " + std::to_string(options);
          ASSERT_EQ(out.status, MR_SUCCESS) << name << ": " << out.message;
          EXPECT_TRUE(grad_results_equal(expected, got)) << name;
        }
}

TEST(CApiFinalize, InferShapeDescribesWhatTheCppPlanSays) {
  Random rng(5);
  FinalizeOptions o;
  o.x1 = o.scales = true;
  FinalizeCase c = make_finalize_case(rng, DType::bfloat16, 3, Numerics::atlas_a2, o, 6, 2, 9);
  const MoeFinalizeRoutingInputs in = c.inputs();
  bool ok = true;
  const Handle ex = handle_of(in.expanded_x, &ok), idx = handle_of(in.expanded_row_idx, &ok),
               x1 = handle_of(in.x1, &ok), scales = handle_of(in.scales, &ok);
  ASSERT_TRUE(ok);
  mrTensorDesc desc;
  ASSERT_EQ(mrMoeFinalizeRoutingV2InferShape(ex.get(), idx.get(), x1.get(), nullptr, nullptr,
                                             scales.get(), nullptr, 3, &desc),
            MR_SUCCESS)
      << mrGetLastErrorMessage();
  EXPECT_TRUE(desc.produced);
  EXPECT_EQ(desc.dtype, MR_BFLOAT16);
  EXPECT_EQ(desc.ndim, 2u);
  EXPECT_EQ(desc.shape[0], 6);
  EXPECT_EQ(desc.shape[1], 9);
  EXPECT_EQ(mrMoeFinalizeRoutingV2InferShape(ex.get(), idx.get(), x1.get(), nullptr, nullptr,
                                             scales.get(), nullptr, 3, nullptr),
            MR_ERROR_INVALID_ARGUMENT);
  EXPECT_STREQ(mrGetLastErrorMessage(), "moe_finalize_routing: out must not be NULL, got NULL");
  // Shape inference reads no data: every buffer may be NULL.
  mrTensor* bare = nullptr;
  const int64_t shape[3] = {c.expanded_shape[0], c.expanded_shape[1], c.expanded_shape[2]};
  ASSERT_EQ(mrCreateTensor(shape, 3, MR_BFLOAT16, MR_DEVICE_CPU, nullptr, &bare), MR_SUCCESS);
  EXPECT_EQ(mrMoeFinalizeRoutingV2InferShape(bare, idx.get(), x1.get(), nullptr, nullptr,
                                             scales.get(), nullptr, 3, &desc),
            MR_SUCCESS);
  mrDestroyTensor(bare);
  // mode 2 is the wrong layout for a 3-D expanded_x: the C++ words.
  MoeFinalizeRoutingAttrs attrs = c.attrs;
  attrs.drop_pad_mode = 2;
  MoeFinalizeRoutingPlan plan;
  const Status expected = infer_moe_finalize_routing(in, attrs, &plan);
  EXPECT_EQ(mrMoeFinalizeRoutingV2InferShape(ex.get(), idx.get(), x1.get(), nullptr, nullptr,
                                             scales.get(), nullptr, 2, &desc),
            MR_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(mrGetLastErrorMessage(), expected.message());
}

TEST(CApiFinalize, GradInferShapeDescribesEveryOutput) {
  Random rng(6);
  GradOptions o;
  o.bias = o.grad_bias = true;
  FinalizeGradCase c =
      make_finalize_grad_case(rng, DType::float16, 1, Numerics::atlas_a2, o, 5, 2, 12);
  const MoeFinalizeRoutingGradInputs in = c.inputs();
  bool ok = true;
  const Handle gy = handle_of(in.grad_y, &ok), idx = handle_of(in.expanded_row_idx, &ok),
               ex = handle_of(in.expanded_x, &ok), scales = handle_of(in.scales, &ok),
               experts = handle_of(in.expert_idx, &ok), bias = handle_of(in.bias, &ok);
  ASSERT_TRUE(ok);
  mrTensorDesc gex, gs, gb;
  ASSERT_EQ(mrMoeFinalizeRoutingV2GradInferShape(gy.get(), idx.get(), ex.get(), scales.get(),
                                                 experts.get(), bias.get(), 1, 0, c.E,
                                                 c.attrs.expert_capacity, &gex, &gs, &gb),
            MR_SUCCESS)
      << mrGetLastErrorMessage();
  EXPECT_TRUE(gex.produced && gs.produced && gb.produced);
  EXPECT_EQ(gex.ndim, 3u);
  EXPECT_EQ(gex.shape[0], c.E);
  EXPECT_EQ(gex.shape[1], c.attrs.expert_capacity);
  EXPECT_EQ(gex.shape[2], 12);
  EXPECT_EQ(gs.shape[0], 5);
  EXPECT_EQ(gs.shape[1], 2);
  EXPECT_EQ(gs.dtype, MR_FLOAT16);
  EXPECT_EQ(gb.shape[0], c.E);
  EXPECT_EQ(gb.shape[1], 12);
  // Without scales and bias, gradScales and gradBias are not produced.
  ASSERT_EQ(mrMoeFinalizeRoutingV2GradInferShape(gy.get(), idx.get(), ex.get(), nullptr, nullptr,
                                                 nullptr, 0, 0, 0, 0, &gex, &gs, &gb),
            MR_ERROR_INVALID_ARGUMENT);  // K = 2 needs scales: the C++ words
  MoeFinalizeRoutingGradInputs no_scales = in;
  no_scales.scales = no_scales.expert_idx = no_scales.bias = TensorView();
  MoeFinalizeRoutingGradPlan plan;
  MoeFinalizeRoutingGradAttrs attrs;
  EXPECT_EQ(mrGetLastErrorMessage(),
            infer_moe_finalize_routing_grad(no_scales, attrs, &plan).message());
  EXPECT_EQ(mrMoeFinalizeRoutingV2GradInferShape(gy.get(), idx.get(), ex.get(), scales.get(),
                                                 nullptr, nullptr, 1, 0, c.E,
                                                 c.attrs.expert_capacity, &gex, &gs, nullptr),
            MR_ERROR_INVALID_ARGUMENT);
  EXPECT_STREQ(mrGetLastErrorMessage(),
               "moe_finalize_routing_grad: grad_bias_out must not be NULL, got NULL");
}

// ---- errors: the C++ tables through the C ABI
// ----------------------------------------------------

TEST(CApiFinalizeErrors, EveryExpressibleForwardRowAnswersAsTheCppApi) {
  int expressed = 0;
  for (const ErrorCase<FinalizeFixture>& c : finalize_error_cases()) {
    SCOPED_TRACE(c.name);
    FinalizeFixture cpp, in_c;
    c.change(cpp);
    c.change(in_c);
    const Outcome expected = outcome_of(moe_finalize_routing(cpp.in, cpp.attrs, cpp.out_view));
    ASSERT_NE(expected.status, MR_SUCCESS);
    bool expressible = false;
    const Outcome got = c_forward(in_c.in, in_c.attrs, in_c.out_view, &expressible);
    if (!expressible) continue;
    ++expressed;
    expect_same(got, expected, c.name);
    for (uint8_t b : in_c.out) ASSERT_EQ(b, kFinalizePoison) << "an output was written on error";
  }
  EXPECT_GE(expressed, 30);  // every row but those of V3/V4 attributes and C's own checks
}

TEST(CApiFinalizeErrors, EveryExpressibleGradRowAnswersAsTheCppApi) {
  int expressed = 0;
  for (const ErrorCase<FinalizeGradFixture>& c : finalize_grad_error_cases()) {
    SCOPED_TRACE(c.name);
    FinalizeGradFixture cpp, in_c;
    c.change(cpp);
    c.change(in_c);
    if (in_c.config.workspace != nullptr) continue;  // C's workspace is phase two's argument
    const Outcome expected = outcome_of(moe_finalize_routing_grad(cpp.in, cpp.attrs, cpp.out));
    ASSERT_NE(expected.status, MR_SUCCESS);
    bool expressible = false;
    const Outcome got = c_grad(in_c.in, in_c.attrs, in_c.out, &expressible);
    if (!expressible) continue;
    ++expressed;
    expect_same(got, expected, c.name);
    for (const std::vector<uint8_t>* b : {&in_c.gex, &in_c.gs, &in_c.gb})
      for (uint8_t byte : *b) ASSERT_EQ(byte, kFinalizeGradPoison) << "an output was written";
  }
  EXPECT_GE(expressed, 20);
}

TEST(CApiFinalizeErrors, RequiredHandlesMustNotBeNull) {
  FinalizeFixture f;
  f.v1();
  bool ok = true;
  const MoeFinalizeRoutingInputs& in = f.in;
  const Handle ex = handle_of(in.expanded_x, &ok), idx = handle_of(in.expanded_row_idx, &ok),
               x1 = handle_of(in.x1, &ok), bias = handle_of(in.bias, &ok),
               scales = handle_of(in.scales, &ok), experts = handle_of(in.expert_idx, &ok),
               out = handle_of(f.out_view, &ok);
  ASSERT_TRUE(ok);
  uint64_t ws = 9;
  mrExecutor* executor = reinterpret_cast<mrExecutor*>(&ws);
  struct Row {
    const mrTensor *e, *x1, *b, *s, *r, *x;
    mrTensor* o;
    const char* message;
  } rows[] = {
      {nullptr, x1.get(), bias.get(), scales.get(), idx.get(), experts.get(), out.get(),
       "expanded_x must not be NULL, got NULL"},
      {ex.get(), nullptr, bias.get(), scales.get(), idx.get(), experts.get(), out.get(),
       "x1 must not be NULL, got NULL"},
      {ex.get(), x1.get(), nullptr, scales.get(), idx.get(), experts.get(), out.get(),
       "bias must not be NULL, got NULL"},
      {ex.get(), x1.get(), bias.get(), nullptr, idx.get(), experts.get(), out.get(),
       "scales must not be NULL, got NULL"},
      {ex.get(), x1.get(), bias.get(), scales.get(), nullptr, experts.get(), out.get(),
       "expanded_row_idx must not be NULL, got NULL"},
      {ex.get(), x1.get(), bias.get(), scales.get(), idx.get(), nullptr, out.get(),
       "expert_idx must not be NULL, got NULL"},
      {ex.get(), x1.get(), bias.get(), scales.get(), idx.get(), experts.get(), nullptr,
       "out must not be NULL, got NULL"},
  };
  for (const Row& r : rows) {
    EXPECT_EQ(mrMoeFinalizeRoutingGetWorkspaceSize(r.e, r.x1, nullptr, r.b, r.s, r.r, r.x, r.o, &ws,
                                                   &executor),
              MR_ERROR_INVALID_ARGUMENT);
    EXPECT_EQ(std::string(mrGetLastErrorMessage()),
              std::string("moe_finalize_routing: ") + r.message);
    EXPECT_EQ(ws, 0u);
    EXPECT_EQ(executor, nullptr);
  }
  EXPECT_EQ(
      mrMoeFinalizeRoutingGetWorkspaceSize(ex.get(), x1.get(), nullptr, bias.get(), scales.get(),
                                           idx.get(), experts.get(), out.get(), nullptr, &executor),
      MR_ERROR_INVALID_ARGUMENT);
  EXPECT_STREQ(mrGetLastErrorMessage(),
               "moe_finalize_routing: workspace_size must not be NULL, got NULL");
  // V2: only expanded_x, expanded_row_idx and out are required; the backward its grad_y,
  // expanded_row_idx and grad_expanded_x.
  EXPECT_EQ(mrMoeFinalizeRoutingV2GetWorkspaceSize(ex.get(), nullptr, nullptr, nullptr, nullptr,
                                                   nullptr, nullptr, 0, out.get(), &ws, &executor),
            MR_ERROR_INVALID_ARGUMENT);
  EXPECT_STREQ(mrGetLastErrorMessage(),
               "moe_finalize_routing: expanded_row_idx must not be NULL, got NULL");
  EXPECT_EQ(mrMoeFinalizeRoutingV2GradGetWorkspaceSize(nullptr, idx.get(), nullptr, nullptr,
                                                       nullptr, nullptr, 0, 0, 0, 0, out.get(),
                                                       nullptr, nullptr, &ws, &executor),
            MR_ERROR_INVALID_ARGUMENT);
  EXPECT_STREQ(mrGetLastErrorMessage(),
               "moe_finalize_routing_grad: grad_y must not be NULL, got NULL");
  FinalizeGradFixture g;
  const Handle gy = handle_of(g.in.grad_y, &ok), gidx = handle_of(g.in.expanded_row_idx, &ok);
  EXPECT_EQ(mrMoeFinalizeRoutingV2GradGetWorkspaceSize(gy.get(), gidx.get(), nullptr, nullptr,
                                                       nullptr, nullptr, 0, 0, 0, 0, nullptr,
                                                       nullptr, nullptr, &ws, &executor),
            MR_ERROR_INVALID_ARGUMENT);
  EXPECT_STREQ(mrGetLastErrorMessage(),
               "moe_finalize_routing_grad: grad_expanded_x must not be NULL, got NULL");
  EXPECT_EQ(c_api::live_executors(), 0);
}

/// A valid backward executor (the grad fixture), its workspace size reported in *ws.
mrExecutor* grad_executor(FinalizeGradFixture& g, uint64_t* ws) {
  bool ok = true;
  const Handle gy = handle_of(g.in.grad_y, &ok), idx = handle_of(g.in.expanded_row_idx, &ok),
               ex = handle_of(g.in.expanded_x, &ok), scales = handle_of(g.in.scales, &ok),
               gex = handle_of(g.out.grad_expanded_x, &ok);
  EXPECT_TRUE(ok);
  mrExecutor* executor = nullptr;
  EXPECT_EQ(mrMoeFinalizeRoutingV2GradGetWorkspaceSize(gy.get(), idx.get(), ex.get(), scales.get(),
                                                       nullptr, nullptr, 0, 0, 0, 0, gex.get(),
                                                       nullptr, nullptr, ws, &executor),
            MR_SUCCESS)
      << mrGetLastErrorMessage();
  return executor;  // the handles may go: the executor keeps the views
}

TEST(CApiFinalizeErrors, PhaseTwoChecksTheWorkspaceAndTheExecutor) {
  FinalizeGradFixture g;
  uint64_t ws = 0;
  std::vector<unsigned char> workspace(4096);
  // Too small a workspace.
  mrExecutor* executor = grad_executor(g, &ws);
  ASSERT_GT(ws, 0u);
  EXPECT_EQ(mrMoeFinalizeRoutingV2Grad(workspace.data(), ws - 1, executor, nullptr),
            MR_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(std::string(mrGetLastErrorMessage()),
            "moe_finalize_routing_grad: workspace_size must be at least " + std::to_string(ws) +
                " (the size phase one reported), got " + std::to_string(ws - 1));
  // No workspace with a size.
  executor = grad_executor(g, &ws);
  EXPECT_EQ(mrMoeFinalizeRoutingV2Grad(nullptr, ws, executor, nullptr), MR_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(mrGetLastErrorMessage()).find("workspace must not be NULL"),
            std::string::npos);
  // The executor of another operator, and the accumulation order of the init_routing backward.
  executor = grad_executor(g, &ws);
  EXPECT_EQ(mrSetAccumulationOrder(executor, MR_ACCUMULATION_SEQUENTIAL),
            MR_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(mrMoeFinalizeRoutingV2(workspace.data(), ws, executor, nullptr),
            MR_ERROR_INVALID_ARGUMENT);
  EXPECT_STREQ(mrGetLastErrorMessage(),
               "moe_finalize_routing: executor must come from "
               "mrMoeFinalizeRoutingV2GetWorkspaceSize, got one from "
               "mrMoeFinalizeRoutingV2GradGetWorkspaceSize");
  FinalizeFixture f;
  bool ok = true;
  const Handle ex = handle_of(f.in.expanded_x, &ok), idx = handle_of(f.in.expanded_row_idx, &ok),
               scales = handle_of(f.in.scales, &ok), out = handle_of(f.out_view, &ok);
  ASSERT_TRUE(ok);
  ASSERT_EQ(
      mrMoeFinalizeRoutingV2GetWorkspaceSize(ex.get(), idx.get(), nullptr, nullptr, nullptr,
                                             scales.get(), nullptr, 2, out.get(), &ws, &executor),
      MR_SUCCESS)
      << mrGetLastErrorMessage();
  EXPECT_EQ(ws, 0u);
  EXPECT_EQ(mrMoeFinalizeRouting(nullptr, 0, executor, nullptr), MR_ERROR_INVALID_ARGUMENT);
  EXPECT_STREQ(mrGetLastErrorMessage(),
               "moe_finalize_routing: executor must come from "
               "mrMoeFinalizeRoutingGetWorkspaceSize, got one from "
               "mrMoeFinalizeRoutingV2GetWorkspaceSize");
  EXPECT_EQ(mrMoeFinalizeRoutingV2Grad(nullptr, 0, nullptr, nullptr), MR_ERROR_INVALID_ARGUMENT);
  EXPECT_STREQ(mrGetLastErrorMessage(),
               "moe_finalize_routing_grad: executor must not be NULL, got NULL");
  for (uint8_t b : f.out) EXPECT_EQ(b, kFinalizePoison);
  for (uint8_t b : g.gex) EXPECT_EQ(b, kFinalizeGradPoison);
  EXPECT_EQ(c_api::live_executors(), 0);
}

// A handle is present even when its tensor looks like the C++ API's absent view (0-d, data NULL):
// that is one element without a buffer, refused, never taken for an absent argument (V2 computed
// out without x1 instead, and the backward skipped a grad_scales it could give).
TEST(CApiFinalizeErrors, AHandleLikeTheAbsentViewIsNotAbsent) {
  const std::string rule =
      " data must not be null for a non-empty tensor, got null for a 0-d tensor (one element; an "
      "absent argument is a NULL handle)";
  mrTensor* raw = nullptr;
  ASSERT_EQ(mrCreateTensor(nullptr, 0, MR_FLOAT32, MR_DEVICE_CPU, nullptr, &raw), MR_SUCCESS);
  const Handle null0d(raw);
  FinalizeFixture f;
  bool ok = true;
  const Handle ex = handle_of(f.in.expanded_x, &ok), idx = handle_of(f.in.expanded_row_idx, &ok),
               x1 = handle_of(f.in.x1, &ok), bias = handle_of(f.in.bias, &ok),
               scales = handle_of(f.in.scales, &ok), experts = handle_of(f.in.expert_idx, &ok),
               out = handle_of(f.out_view, &ok);
  ASSERT_TRUE(ok);
  const mrTensor* const z = null0d.get();
  // The optional inputs of V2 in its order: x1, x2, bias, scales, expert_idx.
  const char* names[] = {"x1", "x2", "bias", "scales", "expert_idx"};
  for (int slot = 0; slot < 5; ++slot) {
    SCOPED_TRACE(names[slot]);
    const mrTensor* given[5] = {x1.get(), slot == 1 ? z : nullptr, bias.get(), scales.get(),
                                experts.get()};
    given[slot] = z;
    uint64_t ws = 9;
    mrExecutor* executor = reinterpret_cast<mrExecutor*>(&ws);
    EXPECT_EQ(
        mrMoeFinalizeRoutingV2GetWorkspaceSize(ex.get(), idx.get(), given[0], given[1], given[2],
                                               given[3], given[4], 2, out.get(), &ws, &executor),
        MR_ERROR_INVALID_ARGUMENT);
    EXPECT_EQ(std::string(mrGetLastErrorMessage()),
              std::string("moe_finalize_routing: ") + names[slot] + rule);
    EXPECT_EQ(ws, 0u);
    EXPECT_EQ(executor, nullptr);
    mrTensorDesc desc;
    EXPECT_EQ(mrMoeFinalizeRoutingV2InferShape(ex.get(), idx.get(), given[0], given[1], given[2],
                                               given[3], given[4], 2, &desc),
              MR_ERROR_INVALID_ARGUMENT);
    EXPECT_EQ(std::string(mrGetLastErrorMessage()),
              std::string("moe_finalize_routing: ") + names[slot] + rule);
  }
  uint64_t ws = 9;
  mrExecutor* executor = nullptr;
  EXPECT_EQ(
      mrMoeFinalizeRoutingGetWorkspaceSize(ex.get(), z, nullptr, bias.get(), scales.get(),
                                           idx.get(), experts.get(), out.get(), &ws, &executor),
      MR_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(std::string(mrGetLastErrorMessage()), "moe_finalize_routing: x1" + rule);
  for (uint8_t b : f.out) EXPECT_EQ(b, kFinalizePoison);

  // The backward: its optional inputs (expanded_x, scales, expert_idx, bias) and outputs.
  FinalizeGradFixture g;
  const Handle gy = handle_of(g.in.grad_y, &ok), gidx = handle_of(g.in.expanded_row_idx, &ok),
               gex_in = handle_of(g.in.expanded_x, &ok), gscales = handle_of(g.in.scales, &ok),
               gexperts = handle_of(g.in.expert_idx, &ok), gbias = handle_of(g.in.bias, &ok),
               gex = handle_of(g.out.grad_expanded_x, &ok), gs = handle_of(g.out.grad_scales, &ok),
               gb = handle_of(g.out.grad_bias, &ok);
  ASSERT_TRUE(ok);
  const char* grad_names[] = {"expanded_x", "scales",      "expert_idx",
                              "bias",       "grad_scales", "grad_bias"};
  for (int slot = 0; slot < 6; ++slot) {
    SCOPED_TRACE(grad_names[slot]);
    const mrTensor* in[4] = {gex_in.get(), gscales.get(), gexperts.get(), gbias.get()};
    mrTensor* outs[2] = {gs.get(), gb.get()};
    if (slot < 4)
      in[slot] = z;
    else
      outs[slot - 4] = null0d.get();
    ws = 9;
    executor = reinterpret_cast<mrExecutor*>(&ws);
    EXPECT_EQ(mrMoeFinalizeRoutingV2GradGetWorkspaceSize(gy.get(), gidx.get(), in[0], in[1], in[2],
                                                         in[3], 0, 0, 0, 0, gex.get(), outs[0],
                                                         outs[1], &ws, &executor),
              MR_ERROR_INVALID_ARGUMENT);
    EXPECT_EQ(std::string(mrGetLastErrorMessage()),
              std::string("moe_finalize_routing_grad: ") + grad_names[slot] + rule);
    EXPECT_EQ(ws, 0u);
    EXPECT_EQ(executor, nullptr);
    if (slot < 4) {
      mrTensorDesc d1, d2, d3;
      EXPECT_EQ(mrMoeFinalizeRoutingV2GradInferShape(gy.get(), gidx.get(), in[0], in[1], in[2],
                                                     in[3], 0, 0, 0, 0, &d1, &d2, &d3),
                MR_ERROR_INVALID_ARGUMENT);
      EXPECT_EQ(std::string(mrGetLastErrorMessage()),
                std::string("moe_finalize_routing_grad: ") + grad_names[slot] + rule);
    }
  }
  for (uint8_t b : g.gex) EXPECT_EQ(b, kFinalizeGradPoison);
  // An output the inputs cannot give (grad_bias without bias: InferShape describes it as not
  // produced, 0-d) may still be such a handle, and is ignored.
  ws = 0;
  executor = nullptr;
  EXPECT_EQ(mrMoeFinalizeRoutingV2GradGetWorkspaceSize(
                gy.get(), gidx.get(), gex_in.get(), gscales.get(), nullptr, nullptr, 0, 0, 0, 0,
                gex.get(), gs.get(), null0d.get(), &ws, &executor),
            MR_SUCCESS)
      << mrGetLastErrorMessage();
  EXPECT_EQ(mrDestroyExecutor(executor), MR_SUCCESS);
  EXPECT_EQ(c_api::live_executors(), 0);
}

TEST(CApiFinalizeErrors, MrSetNumericsKeepsACombineExecutorOnFailure) {
  FinalizeGradFixture g;
  uint64_t ws = 0;
  mrExecutor* executor = grad_executor(g, &ws);
  // The executor behind the handle (the registry's lock held only while reading).
  const auto numerics = [&] {
    return c_api::find_executor(executor).executor->finalize_grad.attrs.numerics;
  };
  EXPECT_EQ(mrSetNumerics(executor, 2), MR_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(numerics(), Numerics::atlas_a2);
  EXPECT_EQ(mrSetNumerics(executor, MR_NUMERICS_ASCEND_950), MR_SUCCESS);
  EXPECT_EQ(numerics(), Numerics::ascend_950);
  EXPECT_EQ(mrDestroyExecutor(executor), MR_SUCCESS);
  EXPECT_EQ(c_api::live_executors(), 0);
}

// Fuzzer regression (fuzz/regressions/finalize_threads_for_a_huge_empty_k.bin): with no tokens,
// scales [0, K] is valid for any K, and the thread count's byte estimate computed K + 2 (UBSan:
// signed overflow at K = 2^63 - 1) in phase one.
TEST(CApiFinalize, NoTokensWithAnyK) {
  float none[1] = {0};
  int32_t no_index[1] = {0};
  for (int64_t k : {INT64_MAX, INT64_MAX - 1, int64_t(1) << 62}) {
    SCOPED_TRACE("K=" + std::to_string(k));
    MoeFinalizeRoutingInputs in;
    in.expanded_x = TensorView(none, DType::float32, {0, 4});
    in.expanded_row_idx = TensorView(no_index, DType::int32, {0});
    in.scales = TensorView(none, DType::float32, {0, k});
    MoeFinalizeRoutingAttrs attrs;
    attrs.drop_pad_mode = 2;
    const Outcome out = c_forward(in, attrs, TensorView(none, DType::float32, {0, 4}));
    EXPECT_EQ(out.status, MR_SUCCESS) << out.message;
    MoeFinalizeRoutingGradInputs grad_in;
    grad_in.grad_y = TensorView(none, DType::float32, {0, 4});
    grad_in.expanded_row_idx = in.expanded_row_idx;
    grad_in.expanded_x = in.expanded_x;
    grad_in.scales = in.scales;
    MoeFinalizeRoutingGradOutputs grad_out;
    grad_out.grad_expanded_x = TensorView(none, DType::float32, {0, 4});
    grad_out.grad_scales = TensorView(none, DType::float32, {0, k});
    const Outcome grad = c_grad(grad_in, MoeFinalizeRoutingGradAttrs(), grad_out);
    EXPECT_EQ(grad.status, MR_SUCCESS) << grad.message;
  }
}

}  // namespace
}  // namespace moe_routing::testing
