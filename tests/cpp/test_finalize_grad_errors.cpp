// Every check of moe_finalize_routing_grad: a valid call, one change -> category + message
// substring, on every runner, with every output poisoned and verified unchanged. The table is
// finalize_error_cases.h.
#include "finalize_error_cases.h"
#include "ops/moe_finalize_routing_grad/meta.h"

namespace moe_routing {
namespace {

using Fixture = testing::FinalizeGradFixture;
constexpr uint8_t kPoison = testing::kFinalizeGradPoison;

TEST(FinalizeGradErrors, EveryCheckHasItsCategoryAndMessageAndWritesNothing) {
  testing::expect_error_table<Fixture>(
      testing::finalize_grad_error_cases(),
      [](Fixture& f, const testing::Runner& r) {
        const ExecConfig base = r.config();
        f.config.backend = base.backend, f.config.isa = base.isa;
        f.config.num_threads = base.num_threads;
        if (f.config.workspace != nullptr && r.backend == Backend::reference)
          f.config.backend = Backend::cpu;  // the reference needs no workspace to check
        return moe_finalize_routing_grad(f.in, f.attrs, f.out, f.config);
      },
      [](const Fixture& f) {
        for (const std::vector<uint8_t>* b : {&f.gex, &f.gs, &f.gb})
          for (uint8_t byte : *b)
            if (byte != kPoison) return false;
        return true;
      });
}

TEST(FinalizeGradErrors, OptionalOutputsMayBeLeftOut) {
  Fixture f;
  f.out.grad_scales = TensorView();
  f.out.grad_bias = TensorView();
  MoeFinalizeRoutingGradPlan plan;
  ASSERT_TRUE(detail::validate_moe_finalize_routing_grad(f.in, f.attrs, f.out, ExecConfig(), &plan)
                  .is_ok());
  EXPECT_TRUE(plan.grad_scales.produced);
  EXPECT_FALSE(plan.compute_grad_scales);
  EXPECT_FALSE(plan.compute_grad_bias);
  ASSERT_TRUE(moe_finalize_routing_grad(f.in, f.attrs, f.out).is_ok());
  for (uint8_t byte : f.gs) EXPECT_EQ(byte, kPoison);
  for (uint8_t byte : f.gb) EXPECT_EQ(byte, kPoison);
  // Shape inference (no outputs) says what could be produced.
  ASSERT_TRUE(infer_moe_finalize_routing_grad(f.in, f.attrs, &plan).is_ok());
  EXPECT_TRUE(plan.compute_grad_scales);
  EXPECT_TRUE(plan.compute_grad_bias);
  EXPECT_EQ(plan.grad_bias.shape[0], 3);
  EXPECT_EQ(plan.grad_expanded_x.shape[0], 4);
}

// A bias of 2^62 - 1 rows of H = 0 columns holds no byte, so every buffer check passes; its row
// count once reached the CPU backend, whose workspace size (E + 2 int32 offsets) wrapped to 32
// bytes before the expert lists were written over it (a heap overflow), and the reference's
// vector of E lists threw std::length_error through the noexcept entry point (std::terminate).
TEST(FinalizeGradErrors, BiasRowsBeyondInt32AreRefusedBeforeAnyScratchIsSized) {
  const int64_t huge = (int64_t(1) << 62) - 1;
  std::vector<uint16_t> gy(1), gx(1), bias(1), grad_bias(1);
  std::vector<int32_t> idx{0}, experts{0};
  MoeFinalizeRoutingGradInputs in;
  in.grad_y = TensorView(gy.data(), DType::float16, {1, 0});
  in.expanded_row_idx = TensorView(idx.data(), DType::int32, {1});
  in.expert_idx = TensorView(experts.data(), DType::int32, {1, 1});
  in.bias = TensorView(bias.data(), DType::float16, {huge, 0});
  MoeFinalizeRoutingGradOutputs out;
  out.grad_expanded_x = TensorView(gx.data(), DType::float16, {1, 0});
  out.grad_bias = TensorView(grad_bias.data(), DType::float16, {huge, 0});
  const std::string expected =
      "moe_finalize_routing_grad: bias.size(0) (E) must be at most 2147483647 (expert_idx holds "
      "int32 rows of bias), got 4611686018427387903";
  for (const testing::Runner& runner : testing::all_runners()) {
    const Status s =
        moe_finalize_routing_grad(in, MoeFinalizeRoutingGradAttrs(), out, runner.config());
    EXPECT_EQ(s.code(), StatusCode::invalid_argument) << runner.name();
    EXPECT_EQ(s.message(), expected) << runner.name();
  }
  MoeFinalizeRoutingGradPlan plan;  // shape inference (the C ABI's phase one) refuses it too
  EXPECT_EQ(infer_moe_finalize_routing_grad(in, MoeFinalizeRoutingGradAttrs(), &plan).message(),
            expected);
}

// scales [2^62, 4] with grad_y [2^62, 0]: N * K overflowed int64 (undefined behaviour; it wrapped
// to 0, the length of an empty expanded_row_idx) before it was compared with the pairs (found by
// an adversarial review).
TEST(FinalizeGradErrors, ScalesWithMoreThanInt64ElementsAreRefused) {
  const int64_t N = int64_t(1) << 62;
  std::vector<float> gy(1), scales(1), gx(1);
  std::vector<int32_t> idx(1);
  MoeFinalizeRoutingGradInputs in;
  in.grad_y = TensorView(gy.data(), DType::float32, {N, 0});
  in.expanded_row_idx = TensorView(idx.data(), DType::int32, {0});
  in.scales = TensorView(scales.data(), DType::float32, {N, 4});
  MoeFinalizeRoutingGradOutputs out;
  out.grad_expanded_x = TensorView(gx.data(), DType::float32, {0, 0});
  MoeFinalizeRoutingGradPlan plan;
  const Status s = infer_moe_finalize_routing_grad(in, MoeFinalizeRoutingGradAttrs(), &plan);
  EXPECT_EQ(s.code(), StatusCode::invalid_argument);
  EXPECT_NE(s.message().find("moe_finalize_routing_grad: scales has too many elements"),
            std::string::npos)
      << s.message();
  EXPECT_EQ(moe_finalize_routing_grad(in, MoeFinalizeRoutingGradAttrs(), out).message(),
            s.message());
}

TEST(FinalizeGradErrors, ExpertIdsOfDroppedPairsAreNotChecked) {
  Fixture f;
  f.idx[1] = -1;
  f.experts[1] = -1;
  EXPECT_TRUE(moe_finalize_routing_grad(f.in, f.attrs, f.out).is_ok());
}

// With no rows, grad_y [0, H], grad_expanded_x [0, H] and expanded_x [0, H] are valid for any H;
// no byte count computed from H may overflow (found by the fuzzer: H * 4 overflowed int64 in the
// CPU backend's choice of store, undefined behaviour) nor anything be written.
TEST(FinalizeGradErrors, NoRowsWithAnyHiddenSize) {
  for (int64_t hidden : {INT64_MAX, INT64_MAX / 3, int64_t(1) << 61}) {
    SCOPED_TRACE("H=" + std::to_string(hidden));
    std::vector<float> gy(1), ex(1), gx(1, 7.0f);
    std::vector<int32_t> idx(1);
    MoeFinalizeRoutingGradInputs in;
    in.grad_y = TensorView(gy.data(), DType::float32, {0, hidden});
    in.expanded_row_idx = TensorView(idx.data(), DType::int32, {0});
    in.expanded_x = TensorView(ex.data(), DType::float32, {0, hidden});
    MoeFinalizeRoutingGradOutputs out;
    out.grad_expanded_x = TensorView(gx.data(), DType::float32, {0, hidden});
    for (const testing::Runner& runner : testing::all_runners()) {
      const Status s =
          moe_finalize_routing_grad(in, MoeFinalizeRoutingGradAttrs(), out, runner.config());
      EXPECT_TRUE(s.is_ok()) << runner.name() << ": " << s.message();
      EXPECT_EQ(gx[0], 7.0f) << runner.name();
    }
  }
}

}  // namespace
}  // namespace moe_routing
