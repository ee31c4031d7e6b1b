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

TEST(FinalizeGradErrors, ExpertIdsOfDroppedPairsAreNotChecked) {
  Fixture f;
  f.idx[1] = -1;
  f.experts[1] = -1;
  EXPECT_TRUE(moe_finalize_routing_grad(f.in, f.attrs, f.out).is_ok());
}

}  // namespace
}  // namespace moe_routing
