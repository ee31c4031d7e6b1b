// Every check of moe_finalize_routing: a valid call, one change -> category + message substring,
// on every runner, with the output poisoned and verified unchanged (nothing is written on error).
// The table is finalize_error_cases.h.
#include "finalize_error_cases.h"

namespace moe_routing {
namespace {

using Fixture = testing::FinalizeFixture;
constexpr uint8_t kPoison = testing::kFinalizePoison;

TEST(FinalizeErrors, EveryCheckHasItsCategoryAndMessageAndWritesNothing) {
  testing::expect_error_table<Fixture>(
      testing::finalize_error_cases(),
      [](Fixture& f, const testing::Runner& r) {
        return moe_finalize_routing(f.in, f.attrs, f.out_view, r.config());
      },
      [](const Fixture& f) {
        return std::all_of(f.out.begin(), f.out.end(), [](uint8_t b) { return b == kPoison; });
      });
}

TEST(FinalizeErrors, ValidIndicesThatSkipTheirPair) {
  // -1 with any expert id, an expert id of a zero expert beyond the rows of bias, a row cut by
  // active_num: all valid.
  Fixture f;
  f.special();
  f.attrs.zero_expert_range = {5, 6};
  f.idx = {-1, 1, 2, 3, 0, 0, 0, 0};
  f.experts = {-1, 5, 1, 0, 0, 0, 0, 0};
  f.in.expanded_x.shape[0] = 3;  // index 3 is cut
  MoeFinalizeRoutingPlan plan;
  ASSERT_TRUE(infer_moe_finalize_routing(f.in, f.attrs, &plan).is_ok());
  EXPECT_TRUE(check_moe_finalize_routing_indices(f.idx.data(), f.experts.data(), plan).is_ok());
  EXPECT_TRUE(moe_finalize_routing(f.in, f.attrs, f.out_view).is_ok());
}

TEST(FinalizeErrors, InferNeedsNoOutput) {
  Fixture f;
  MoeFinalizeRoutingPlan plan;
  ASSERT_TRUE(infer_moe_finalize_routing(f.in, f.attrs, &plan).is_ok());
  EXPECT_TRUE(plan.out.produced);
  EXPECT_EQ(plan.out.dtype, DType::float32);
  EXPECT_EQ(plan.out.shape[0], 2);
  EXPECT_EQ(plan.out.shape[1], 3);
  EXPECT_EQ(plan.top_k, 2);
  EXPECT_EQ(plan.expert_num, 3);
  EXPECT_FALSE(plan.column_layout);
}

TEST(FinalizeErrors, UnavailableIsaIsNotSupported) {
  for (CpuIsa isa : kCpuIsas) {
    Fixture f;
    ExecConfig config;
    config.isa = isa;
    const Status s = moe_finalize_routing(f.in, f.attrs, f.out_view, config);
    if (cpu_isa_available(isa))
      EXPECT_TRUE(s.is_ok()) << cpu_isa_name(isa) << ": " << s.message();
    else
      EXPECT_EQ(s.code(), StatusCode::not_supported) << cpu_isa_name(isa);
  }
}

TEST(FinalizeErrors, ApiNamesParse) {
  FinalizeRoutingApi api = FinalizeRoutingApi::v2;
  EXPECT_TRUE(parse_finalize_routing_api("v1", &api));
  EXPECT_EQ(api, FinalizeRoutingApi::v1);
  EXPECT_STREQ(finalize_routing_api_name(api), "v1");
  EXPECT_FALSE(parse_finalize_routing_api("v3", &api));
  EXPECT_FALSE(parse_finalize_routing_api(nullptr, &api));
  EXPECT_EQ(api, FinalizeRoutingApi::v1);
}

}  // namespace
}  // namespace moe_routing
