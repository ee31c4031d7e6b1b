// Every check of moe_finalize_routing: a valid call, one change -> category + message substring,
// on every runner, with the output poisoned and verified unchanged (nothing is written on error).
#include "finalize_cases.h"

namespace moe_routing {
namespace {

constexpr uint8_t kPoison = 0xAB;

/// A valid call (drop_pad_mode 2, float32, N = 2, K = 2, H = 3, E = 3, every input but the
/// special experts'), over buffers large enough for any shape a case gives them.
struct Fixture {
  std::vector<float> ex = std::vector<float>(256, 1.0f), x1 = ex, x2 = ex, bias = ex, scales = ex,
                     x = ex, alpha1 = ex, alpha2 = ex, v = ex;
  std::vector<uint8_t> out = std::vector<uint8_t>(1024, kPoison);
  std::vector<int32_t> idx{0, 1, 2, 3, 0, 0, 0, 0}, experts{0, 1, 2, 0, 0, 0, 0, 0};
  MoeFinalizeRoutingInputs in;
  MoeFinalizeRoutingAttrs attrs;
  TensorView out_view;

  Fixture() {
    in.expanded_x = f32(ex, {4, 3});
    in.expanded_row_idx = TensorView(idx.data(), DType::int32, {4});
    in.x1 = f32(x1, {2, 3});
    in.x2 = f32(x2, {2, 3});
    in.bias = f32(bias, {3, 3});
    in.scales = f32(scales, {2, 2});
    in.expert_idx = TensorView(experts.data(), DType::int32, {2, 2});
    attrs.drop_pad_mode = 2;
    out_view = TensorView(out.data(), DType::float32, {2, 3});
  }
  static TensorView f32(std::vector<float>& v, std::initializer_list<int64_t> shape) {
    return TensorView(v.data(), DType::float32, shape);
  }
  /// Turns on the special experts: zero [0, 1), copy [1, 2), constant [2, 3).
  void special() {
    attrs.zero_expert_range = {0, 1};
    attrs.copy_expert_range = {1, 2};
    attrs.constant_expert_range = {2, 3};
    in.x = f32(x, {2, 3});
    in.alpha1 = f32(alpha1, {1, 3});
    in.alpha2 = f32(alpha2, {1, 3});
    in.v = f32(v, {1, 3});
  }
  void v1() {
    attrs.api = FinalizeRoutingApi::v1;
    attrs.drop_pad_mode = 0;
  }
};

using F = Fixture&;
constexpr StatusCode kInvalid = StatusCode::invalid_argument;
constexpr StatusCode kIndex = StatusCode::index_out_of_range;

std::vector<testing::ErrorCase<Fixture>> cases() {
  return {
      {"mode 4", [](F f) { f.attrs.drop_pad_mode = 4; }, kInvalid,
       "moe_finalize_routing: drop_pad_mode must be 0 (dropless, column), 1 (drop-pad, column), 2 "
       "(dropless, row) or 3 (drop-pad, row), got 4"},
      {"api 3", [](F f) { f.attrs.api = static_cast<FinalizeRoutingApi>(3); }, kInvalid,
       "api must be v1 or v2, got 3"},
      {"numerics 2", [](F f) { f.attrs.numerics = static_cast<Numerics>(2); }, kInvalid,
       "numerics must be atlas_a2 or ascend_950, got 2"},
      {"top_k 0", [](F f) { f.attrs.top_k = 0; }, kInvalid, "top_k must be >= 1, got 0"},
      {"range start",
       [](F f) {
         f.attrs.zero_expert_range = {-2, 1};
       },
       kInvalid,
       "zero_expert_range must be [-1, -1] (none) or [start, end) with 0 <= start < end, got [-2, "
       "1)"},
      {"range empty",
       [](F f) {
         f.attrs.copy_expert_range = {2, 2};
       },
       kInvalid,
       "copy_expert_range must be [-1, -1] (none) or [start, end) with 0 <= start < end, got [2, "
       "2)"},
      {"ranges overlap",
       [](F f) {
         f.special();
         f.attrs.zero_expert_range = {0, 3};
       },
       kInvalid, "zero_expert_range and copy_expert_range must not overlap, got [0, 3) and [1, 2)"},
      {"v1 mode 2",
       [](F f) {
         f.v1();
         f.attrs.drop_pad_mode = 2;
       },
       kInvalid, "drop_pad_mode must be 0 with api v1 (its column layout), got 2"},
      {"v1 ranges",
       [](F f) {
         f.special();
         f.v1();
       },
       kInvalid, "expert ranges must be [-1, -1] with api v1"},
      {"v1 bias",
       [](F f) {
         f.v1();
         f.in.bias = TensorView();
       },
       kInvalid, "bias must be present with api v1, got none"},
      {"v1 x1",
       [](F f) {
         f.v1();
         f.in.x1 = f.in.x2 = TensorView();
       },
       kInvalid, "x1 must be present with api v1, got none"},
      {"v1 x",
       [](F f) {
         f.v1();
         f.in.x = Fixture::f32(f.x, {2, 3});
       },
       kInvalid, "x must be absent with api v1 (it belongs to V3/V4), got 2-D float32 [2, 3]"},
      {"3-D dropless",
       [](F f) {
         f.in.expanded_x = Fixture::f32(f.ex, {2, 2, 3});
       },
       kInvalid,
       "expanded_x must be 2-D [R, H] when drop_pad_mode=2 (dropless), got 3-D float32 [2, 2, 3]"},
      {"2-D drop-pad", [](F f) { f.attrs.drop_pad_mode = 3; }, kInvalid,
       "expanded_x must be 3-D [E, C, H] when drop_pad_mode=3 (drop-pad), got 2-D float32 [4, 3]"},
      {"int dtype", [](F f) { f.in.expanded_x.dtype = DType::int32; }, kInvalid,
       "expanded_x must be float16, bfloat16 or float32, got int32"},
      {"negative dim", [](F f) { f.in.expanded_x.shape[0] = -4; }, kInvalid,
       "expanded_x dimensions must be >= 0, got [-4, 3]"},
      {"idx int64", [](F f) { f.in.expanded_row_idx.dtype = DType::int64; }, kInvalid,
       "expanded_row_idx must be 1-D int32, got 1-D int64 [4]"},
      {"idx 2-D",
       [](F f) {
         f.in.expanded_row_idx = TensorView(f.idx.data(), DType::int32, {2, 2});
       },
       kInvalid, "expanded_row_idx must be 1-D int32, got 2-D int32 [2, 2]"},
      {"idx on cuda", [](F f) { f.in.expanded_row_idx.device = Device::cuda; }, kInvalid,
       "expanded_row_idx must be on the device of expanded_x (cpu), got cuda"},
      {"x1 on cuda", [](F f) { f.in.x1.device = Device::cuda; }, kInvalid,
       "x1 must be on the device of expanded_x (cpu), got cuda"},
      {"x2 alone", [](F f) { f.in.x1 = TensorView(); }, kInvalid,
       "x2 needs x1 (CANN adds x2 only to x1), got x2 without x1"},
      {"bias alone", [](F f) { f.in.expert_idx = TensorView(); }, kInvalid,
       "bias needs expert_idx (the row of bias of each pair), got none"},
      {"range without expert_idx",
       [](F f) {
         f.in.bias = TensorView();
         f.in.expert_idx = TensorView();
         f.attrs.zero_expert_range = {0, 1};
       },
       kInvalid, "zero_expert_range needs expert_idx, got none"},
      {"copy without x",
       [](F f) {
         f.special();
         f.in.x = TensorView();
       },
       kInvalid, "copy_expert_range needs x (the tokens' input rows), got none"},
      {"alpha1 alone",
       [](F f) {
         f.special();
         f.in.alpha2 = f.in.v = TensorView();
       },
       kInvalid, "alpha1, alpha2 and v must be given together, got alpha1, no alpha2 and no v"},
      {"constant without alpha",
       [](F f) {
         f.special();
         f.in.alpha1 = f.in.alpha2 = f.in.v = TensorView();
       },
       kInvalid, "constant_expert_range needs alpha1, alpha2 and v, got none"},
      {"alpha without range",
       [](F f) {
         f.special();
         f.attrs.constant_expert_range = {};
       },
       kInvalid, "alpha1, alpha2 and v need constant_expert_range, got [-1, -1] (none)"},
      {"scales fp16", [](F f) { f.in.scales.dtype = DType::float16; }, kInvalid,
       "scales must be 2-D [N, K] of the dtype of expanded_x (float32), got 2-D float16 [2, 2]"},
      {"scales 1-D", [](F f) { f.in.scales = Fixture::f32(f.scales, {4}); }, kInvalid,
       "scales must be 2-D [N, K] of the dtype of expanded_x (float32), got 1-D float32 [4]"},
      {"scales K 0", [](F f) { f.in.scales.shape[1] = 0; }, kInvalid,
       "scales.size(1) (K) must be >= 1, got 0"},
      {"top_k mismatch", [](F f) { f.attrs.top_k = 3; }, kInvalid,
       "top_k must be 1 or scales.size(1) (2) when scales is given, got 3"},
      {"length", [](F f) { f.in.expanded_row_idx.shape[0] = 5; }, kInvalid,
       "len(expanded_row_idx) must be a multiple of K (2), got 5"},
      {"scales rows", [](F f) { f.in.scales.shape[0] = 3; }, kInvalid,
       "scales must be [N, K] = [2, 2], got 2-D float32 [3, 2]"},
      {"too many rows", [](F f) { f.in.expanded_x.shape[0] = 5; }, kInvalid,
       "expanded_x.size(0) must be at most N*K (4) in dropless mode, got 5"},
      {"E*C beyond int32",
       [](F f) {
         f.attrs.drop_pad_mode = 3;
         f.in.expanded_x = Fixture::f32(f.ex, {65536, 65536, 0});
       },
       kInvalid, "expanded_x must have at most 2147483647 rows E*C (int32 indices), got [65536"},
      {"x1 shape", [](F f) { f.in.x1.shape[1] = 4; }, kInvalid,
       "x1 must be 2-D float32 [2, 3] ([N, H]), got 2-D float32 [2, 4]"},
      {"x2 dtype", [](F f) { f.in.x2.dtype = DType::float16; }, kInvalid,
       "x2 must be 2-D float32 [2, 3] ([N, H]), got 2-D float16 [2, 3]"},
      {"expert_idx dtype", [](F f) { f.in.expert_idx.dtype = DType::float32; }, kInvalid,
       "expert_idx must be 2-D int32 [2, 2] ([N, K]), got 2-D float32 [2, 2]"},
      {"bias H", [](F f) { f.in.bias.shape[1] = 4; }, kInvalid,
       "bias must be 2-D float32 [E, 3] ([E, H]), got 2-D float32 [3, 4]"},
      {"bias E in drop-pad",
       [](F f) {
         f.attrs.drop_pad_mode = 3;
         f.in.expanded_x = Fixture::f32(f.ex, {2, 2, 3});
       },
       kInvalid, "bias.size(0) must equal expanded_x.size(0) (E = 2) in drop-pad mode, got 3"},
      {"x shape",
       [](F f) {
         f.special();
         f.in.x.shape[0] = 3;
       },
       kInvalid, "x must be 2-D float32 [2, 3] ([N, H]), got 2-D float32 [3, 3]"},
      {"alpha1 rows",
       [](F f) {
         f.special();
         f.attrs.constant_expert_range = {2, 4};
       },
       kInvalid,
       "alpha1 must be 2-D float32 [2, 3] ([constant_expert_range size, H]), got 2-D float32 [1, "
       "3]"},
      {"null expanded_x", [](F f) { f.in.expanded_x.data = nullptr; }, kInvalid,
       "expanded_x data must not be null for a non-empty tensor, got null"},
      {"null scales", [](F f) { f.in.scales.data = nullptr; }, kInvalid,
       "scales data must not be null for a non-empty tensor, got null"},
      {"out shape", [](F f) { f.out_view.shape[1] = 4; }, kInvalid,
       "out must be 2-D float32 [2, 3] ([N, H], dtype of expanded_x), got 2-D float32 [2, 4]"},
      {"out dtype", [](F f) { f.out_view.dtype = DType::float16; }, kInvalid,
       "out must be 2-D float32 [2, 3] ([N, H], dtype of expanded_x), got 2-D float16 [2, 3]"},
      {"out on cuda", [](F f) { f.out_view.device = Device::cuda; }, kInvalid,
       "out must be on the device of expanded_x (cpu), got cuda"},
      {"out null", [](F f) { f.out_view.data = nullptr; }, kInvalid,
       "out data must not be null for a non-empty tensor, got null"},
      {"out overlaps x1", [](F f) { f.in.x1.data = f.out.data() + 8; }, kInvalid,
       "out must not share memory with x1, got overlapping bytes"},
      {"index too large", [](F f) { f.idx[2] = 9; }, kIndex,
       "moe_finalize_routing: expanded_row_idx[2] = 9 is outside [0, 4) (-1 marks a dropped pair)"},
      {"index -2", [](F f) { f.idx[1] = -2; }, kIndex,
       "expanded_row_idx[1] = -2 is outside [0, 4) (-1 marks a dropped pair)"},
      {"index beyond N*K with cut rows",
       [](F f) {
         f.in.expanded_x.shape[0] = 3;
         f.idx = {3, 4, 0, 1, 0, 0, 0, 0};  // 3 is cut by active_num (skipped), 4 is not valid
         f.in.expanded_row_idx.data = f.idx.data();
       },
       kIndex,
       "expanded_row_idx[1] = 4 is outside [0, 3) (-1 marks a dropped pair, values in [3, 4) pairs "
       "cut by active_num)"},
      {"drop-pad index",
       [](F f) {
         f.attrs.drop_pad_mode = 3;
         f.in.expanded_x = Fixture::f32(f.ex, {3, 1, 3});
       },
       kIndex, "expanded_row_idx[3] = 3 is outside [0, 3) (-1 marks a dropped pair)"},
      {"expert beyond bias", [](F f) { f.experts[3] = 3; }, kIndex,
       "moe_finalize_routing: expert_idx[1][1] = 3 is outside [0, 3) (the rows of bias)"},
      {"expert -1 read", [](F f) { f.experts[0] = -1; }, kIndex,
       "expert_idx[0][0] = -1 is outside [0, 3) (the rows of bias)"},
      {"cuda tensors",
       [](F f) {
         for (TensorView* t : {&f.in.expanded_x, &f.in.expanded_row_idx, &f.in.x1, &f.in.x2,
                               &f.in.bias, &f.in.scales, &f.in.expert_idx, &f.out_view})
           t->device = Device::cuda;
       },
       StatusCode::not_supported,
       "moe_finalize_routing: device must be cpu in this build, got cuda"},
  };
}

TEST(FinalizeErrors, EveryCheckHasItsCategoryAndMessageAndWritesNothing) {
  testing::expect_error_table<Fixture>(
      cases(),
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
  ASSERT_TRUE(infer_moe_finalize_routing(f.in, f.attrs, &f.out_view, &plan).is_ok());
  EXPECT_TRUE(check_moe_finalize_routing_indices(f.idx.data(), f.experts.data(), plan).is_ok());
  EXPECT_TRUE(moe_finalize_routing(f.in, f.attrs, f.out_view).is_ok());
}

TEST(FinalizeErrors, InferWithoutAnOutputOnlyInfers) {
  Fixture f;
  MoeFinalizeRoutingPlan plan;
  ASSERT_TRUE(infer_moe_finalize_routing(f.in, f.attrs, nullptr, &plan).is_ok());
  EXPECT_TRUE(plan.out.produced);
  EXPECT_EQ(plan.out.dtype, DType::float32);
  EXPECT_EQ(plan.out.shape[0], 2);
  EXPECT_EQ(plan.out.shape[1], 3);
  EXPECT_EQ(plan.top_k, 2);
  EXPECT_EQ(plan.expert_num, 3);
  EXPECT_FALSE(plan.column_layout);
}

TEST(FinalizeErrors, UnavailableIsaIsNotSupported) {
  for (CpuIsa isa : {CpuIsa::baseline, CpuIsa::avx2}) {
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
