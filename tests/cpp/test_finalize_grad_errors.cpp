// Every check of moe_finalize_routing_grad: a valid call, one change -> category + message
// substring, on every runner, with every output poisoned and verified unchanged.
#include "finalize_cases.h"

namespace moe_routing {
namespace {

constexpr uint8_t kPoison = 0xCD;

/// A valid call (drop_pad_mode 0, float32, N = 2, K = 2, H = 3, E = 3, every input and output).
struct Fixture {
  std::vector<float> gy = std::vector<float>(256, 1.0f), ex = gy, scales = gy, bias = gy;
  std::vector<uint8_t> gex = std::vector<uint8_t>(1024, kPoison), gs = gex, gb = gex;
  std::vector<int32_t> idx{1, 3, 0, 2, 0, 0, 0, 0}, experts{0, 1, 2, 0, 0, 0, 0, 0};
  MoeFinalizeRoutingGradInputs in;
  MoeFinalizeRoutingGradAttrs attrs;
  MoeFinalizeRoutingGradOutputs out;
  ExecConfig config;

  Fixture() {
    in.grad_y = f32(gy, {2, 3});
    in.expanded_row_idx = TensorView(idx.data(), DType::int32, {4});
    in.expanded_x = f32(ex, {4, 3});
    in.scales = f32(scales, {2, 2});
    in.expert_idx = TensorView(experts.data(), DType::int32, {2, 2});
    in.bias = f32(bias, {3, 3});
    out.grad_expanded_x = TensorView(gex.data(), DType::float32, {4, 3});
    out.grad_scales = TensorView(gs.data(), DType::float32, {2, 2});
    out.grad_bias = TensorView(gb.data(), DType::float32, {3, 3});
  }
  static TensorView f32(std::vector<float>& v, std::initializer_list<int64_t> shape) {
    return TensorView(v.data(), DType::float32, shape);
  }
  /// drop_pad_mode 1 with E = 2, C = 2.
  void drop_pad() {
    attrs.drop_pad_mode = 1;
    attrs.expert_num = 2;
    attrs.expert_capacity = 2;
    in.expanded_x = f32(ex, {2, 2, 3});
    out.grad_expanded_x = TensorView(gex.data(), DType::float32, {2, 2, 3});
  }
  /// active_num 3: 3 rows.
  void active() {
    attrs.active_num = 3;
    in.expanded_x.shape[0] = 3;
    out.grad_expanded_x.shape[0] = 3;
  }
};

using F = Fixture&;
constexpr StatusCode kInvalid = StatusCode::invalid_argument;
constexpr StatusCode kIndex = StatusCode::index_out_of_range;

std::vector<testing::ErrorCase<Fixture>> cases() {
  return {
      {"mode 2", [](F f) { f.attrs.drop_pad_mode = 2; }, kInvalid,
       "moe_finalize_routing_grad: drop_pad_mode must be 0 (dropless, row layout) or 1 (drop-pad, "
       "row layout), got 2"},
      {"active_num", [](F f) { f.attrs.active_num = -1; }, kInvalid,
       "active_num must be >= 0, got -1"},
      {"expert_num", [](F f) { f.attrs.expert_num = -1; }, kInvalid,
       "expert_num must be >= 0, got -1"},
      {"expert_capacity", [](F f) { f.attrs.expert_capacity = -2; }, kInvalid,
       "expert_capacity must be >= 0, got -2"},
      {"numerics", [](F f) { f.attrs.numerics = static_cast<Numerics>(3); }, kInvalid,
       "numerics must be atlas_a2 or ascend_950, got 3"},
      {"grad_y 3-D",
       [](F f) {
         f.in.grad_y = Fixture::f32(f.gy, {2, 3, 1});
       },
       kInvalid,
       "grad_y must be 2-D [N, H] float16, bfloat16 or float32, got 3-D float32 [2, 3, 1]"},
      {"grad_y int", [](F f) { f.in.grad_y.dtype = DType::int32; }, kInvalid,
       "grad_y must be 2-D [N, H] float16, bfloat16 or float32, got 2-D int32 [2, 3]"},
      {"grad_y negative", [](F f) { f.in.grad_y.shape[1] = -3; }, kInvalid,
       "grad_y dimensions must be >= 0, got [2, -3]"},
      {"idx int64", [](F f) { f.in.expanded_row_idx.dtype = DType::int64; }, kInvalid,
       "expanded_row_idx must be 1-D int32, got 1-D int64 [4]"},
      {"scales on cuda", [](F f) { f.in.scales.device = Device::cuda; }, kInvalid,
       "scales must be on the device of grad_y (cpu), got cuda"},
      {"scales fp16", [](F f) { f.in.scales.dtype = DType::float16; }, kInvalid,
       "scales must be 2-D [N, K] of the dtype of grad_y (float32), got 2-D float16 [2, 2]"},
      {"scales rows", [](F f) { f.in.scales.shape[0] = 3; }, kInvalid,
       "scales must be [N, K] with N = grad_y.size(0) (2) and K >= 1, got 2-D float32 [3, 2]"},
      {"length", [](F f) { f.in.expanded_row_idx.shape[0] = 5; }, kInvalid,
       "len(expanded_row_idx) must be N*K (2 * 2), got 5"},
      {"length without scales",
       [](F f) {
         f.in.scales = TensorView();
         f.in.expanded_row_idx.shape[0] = 5;
       },
       kInvalid,
       "len(expanded_row_idx) must be a positive multiple of N (2) when scales is absent, got 5"},
      {"E*C beyond int32",
       [](F f) {
         f.drop_pad();
         f.attrs.expert_num = f.attrs.expert_capacity = 65536;
       },
       kInvalid,
       "expert_num * expert_capacity must be at most 2147483647 (int32 indices), got 65536 * "
       "65536"},
      {"expanded_x shape", [](F f) { f.in.expanded_x.shape[1] = 4; }, kInvalid,
       "expanded_x must be 2-D float32 [4, 3] (the shape of grad_expanded_x), got 2-D float32 [4, "
       "4]"},
      {"expanded_x 2-D in drop-pad",
       [](F f) {
         f.drop_pad();
         f.in.expanded_x = Fixture::f32(f.ex, {4, 3});
       },
       kInvalid,
       "expanded_x must be 3-D float32 [2, 2, 3] (the shape of grad_expanded_x), got 2-D float32 "
       "[4, 3]"},
      {"expanded_x with active_num", [](F f) { f.attrs.active_num = 3; }, kInvalid,
       "expanded_x must be 2-D float32 [3, 3] (the shape of grad_expanded_x), got 2-D float32 [4, "
       "3]"},
      {"expert_idx shape", [](F f) { f.in.expert_idx.shape[1] = 3; }, kInvalid,
       "expert_idx must be 2-D int32 [2, 2] ([N, K]), got 2-D int32 [2, 3]"},
      {"bias alone", [](F f) { f.in.expert_idx = TensorView(); }, kInvalid,
       "bias needs expert_idx (the row of bias of each pair), got none"},
      {"bias H", [](F f) { f.in.bias.shape[1] = 4; }, kInvalid,
       "bias must be 2-D float32 [E, 3] ([E, H]), got 2-D float32 [3, 4]"},
      {"bias E in drop-pad", [](F f) { f.drop_pad(); }, kInvalid,
       "bias.size(0) must equal expert_num (2) in drop-pad mode, got 3"},
      {"null grad_y", [](F f) { f.in.grad_y.data = nullptr; }, kInvalid,
       "grad_y data must not be null for a non-empty tensor, got null"},
      {"grad_expanded_x shape", [](F f) { f.out.grad_expanded_x.shape[1] = 2; }, kInvalid,
       "grad_expanded_x must be 2-D float32 [4, 3] (the rows of expanded_x, dtype of grad_y), got "
       "2-D float32 [4, 2]"},
      {"grad_expanded_x dtype", [](F f) { f.out.grad_expanded_x.dtype = DType::bfloat16; },
       kInvalid, "grad_expanded_x must be 2-D float32 [4, 3]"},
      {"grad_expanded_x on cuda", [](F f) { f.out.grad_expanded_x.device = Device::cuda; },
       kInvalid, "grad_expanded_x must be on the device of grad_y (cpu), got cuda"},
      {"grad_expanded_x null", [](F f) { f.out.grad_expanded_x.data = nullptr; }, kInvalid,
       "grad_expanded_x data must not be null for a non-empty tensor, got null"},
      {"grad_scales without scales", [](F f) { f.in.scales = TensorView(); }, kInvalid,
       "grad_scales needs scales and expanded_x, got no scales"},
      {"grad_scales without expanded_x", [](F f) { f.in.expanded_x = TensorView(); }, kInvalid,
       "grad_scales needs scales and expanded_x, got no expanded_x"},
      {"grad_scales dtype", [](F f) { f.out.grad_scales.dtype = DType::float16; }, kInvalid,
       "grad_scales must be 2-D float32 [2, 2] ([N, K], dtype of scales), got 2-D float16 [2, 2]"},
      {"grad_bias without bias",
       [](F f) {
         f.in.bias = TensorView();
         f.in.expert_idx = TensorView();
       },
       kInvalid, "grad_bias needs bias, got none"},
      {"grad_bias shape", [](F f) { f.out.grad_bias.shape[0] = 2; }, kInvalid,
       "grad_bias must be 2-D float32 [3, 3] (the shape of bias, dtype of grad_y), got 2-D float32 "
       "[2, 3]"},
      {"outputs overlap", [](F f) { f.out.grad_scales.data = f.gex.data() + 4; }, kInvalid,
       "grad_scales must not share memory with grad_expanded_x, got overlapping bytes"},
      {"output overlaps an input", [](F f) { f.in.grad_y.data = f.gb.data(); }, kInvalid,
       "grad_bias must not share memory with grad_y, got overlapping bytes"},
      {"index too large", [](F f) { f.idx[2] = 9; }, kIndex,
       "moe_finalize_routing_grad: expanded_row_idx[2] = 9 is outside [0, 4) (-1 marks a dropped "
       "pair)"},
      {"index with active_num",
       [](F f) {
         f.active();
         f.idx = {3, 4, 0, 1, 0, 0, 0, 0};  // 3 is cut by active_num (skipped), 4 is not valid
       },
       kIndex,
       "expanded_row_idx[1] = 4 is outside [0, 3) (-1 marks a dropped pair, values in [3, 4) pairs "
       "cut by active_num)"},
      {"expert beyond bias", [](F f) { f.experts[2] = 3; }, kIndex,
       "moe_finalize_routing_grad: expert_idx[1][0] = 3 is outside [0, 3) (the rows of bias)"},
      {"workspace too small",
       [](F f) {
         f.config.workspace = f.ex.data();
         f.config.workspace_bytes = 8;
       },
       kInvalid, "workspace_bytes must be at least"},
      {"cuda tensors",
       [](F f) {
         for (TensorView* t : {&f.in.grad_y, &f.in.expanded_row_idx, &f.in.expanded_x, &f.in.scales,
                               &f.in.expert_idx, &f.in.bias, &f.out.grad_expanded_x,
                               &f.out.grad_scales, &f.out.grad_bias})
           t->device = Device::cuda;
       },
       StatusCode::not_supported,
       "moe_finalize_routing_grad: device must be cpu in this build, got cuda"},
  };
}

TEST(FinalizeGradErrors, EveryCheckHasItsCategoryAndMessageAndWritesNothing) {
  testing::expect_error_table<Fixture>(
      cases(),
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
  ASSERT_TRUE(infer_moe_finalize_routing_grad(f.in, f.attrs, &f.out, &plan).is_ok());
  EXPECT_TRUE(plan.grad_scales.produced);
  EXPECT_FALSE(plan.compute_grad_scales);
  EXPECT_FALSE(plan.compute_grad_bias);
  ASSERT_TRUE(moe_finalize_routing_grad(f.in, f.attrs, f.out).is_ok());
  for (uint8_t byte : f.gs) EXPECT_EQ(byte, kPoison);
  for (uint8_t byte : f.gb) EXPECT_EQ(byte, kPoison);
  // Without outputs, infer says what could be produced.
  ASSERT_TRUE(infer_moe_finalize_routing_grad(f.in, f.attrs, nullptr, &plan).is_ok());
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
