// The error tables of moe_finalize_routing and its grad: a valid call (a fixture over buffers
// large enough for any shape a case gives them) and, per row, one change and the category and
// message the call must then return, writing nothing. test_finalize_errors.cpp and
// test_finalize_grad_errors.cpp run every row through the C++ API on every runner;
// test_c_api_finalize.cpp runs every row the C ABI can express through both phases and expects
// the same status and words.
#pragma once

#include <cstdint>
#include <vector>

#include "finalize_cases.h"

namespace moe_routing::testing {

constexpr uint8_t kFinalizePoison = 0xAB;

/// A valid call (drop_pad_mode 2, float32, N = 2, K = 2, H = 3, E = 3, every input but the
/// special experts'), over buffers large enough for any shape a case gives them.
struct FinalizeFixture {
  std::vector<float> ex = std::vector<float>(256, 1.0f), x1 = ex, x2 = ex, bias = ex, scales = ex,
                     x = ex, alpha1 = ex, alpha2 = ex, v = ex;
  std::vector<uint8_t> out = std::vector<uint8_t>(1024, kFinalizePoison);
  std::vector<int32_t> idx{0, 1, 2, 3, 0, 0, 0, 0}, experts{0, 1, 2, 0, 0, 0, 0, 0};
  MoeFinalizeRoutingInputs in;
  MoeFinalizeRoutingAttrs attrs;
  TensorView out_view;

  FinalizeFixture() {
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

inline std::vector<ErrorCase<FinalizeFixture>> finalize_error_cases() {
  using F = FinalizeFixture&;
  constexpr StatusCode kInvalid = StatusCode::invalid_argument;
  constexpr StatusCode kIndex = StatusCode::index_out_of_range;
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
         f.in.x = FinalizeFixture::f32(f.x, {2, 3});
       },
       kInvalid, "x must be absent with api v1 (it belongs to V3/V4), got 2-D float32 [2, 3]"},
      {"3-D dropless",
       [](F f) {
         f.in.expanded_x = FinalizeFixture::f32(f.ex, {2, 2, 3});
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
      {"scales 1-D", [](F f) { f.in.scales = FinalizeFixture::f32(f.scales, {4}); }, kInvalid,
       "scales must be 2-D [N, K] of the dtype of expanded_x (float32), got 1-D float32 [4]"},
      {"scales K 0", [](F f) { f.in.scales.shape[1] = 0; }, kInvalid,
       "scales.size(1) (K) must be >= 1, got 0"},
      {"top_k mismatch", [](F f) { f.attrs.top_k = 3; }, kInvalid,
       "top_k must be 1 or scales.size(1) (2) when scales is given, got 3"},
      {"length", [](F f) { f.in.expanded_row_idx.shape[0] = 5; }, kInvalid,
       "len(expanded_row_idx) must be a multiple of K (2), got 5"},
      {"length without scales",
       [](F f) {
         f.in.scales = TensorView();
         f.attrs.top_k = 3;
       },
       kInvalid, "len(expanded_row_idx) must be a multiple of top_k (3), got 4"},
      {"scales rows", [](F f) { f.in.scales.shape[0] = 3; }, kInvalid,
       "scales must be [N, K] = [2, 2], got 2-D float32 [3, 2]"},
      {"too many rows", [](F f) { f.in.expanded_x.shape[0] = 5; }, kInvalid,
       "expanded_x.size(0) must be at most N*K (4) in dropless mode, got 5"},
      {"E*C beyond int32",
       [](F f) {
         f.attrs.drop_pad_mode = 3;
         f.in.expanded_x = FinalizeFixture::f32(f.ex, {65536, 65536, 0});
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
         f.in.expanded_x = FinalizeFixture::f32(f.ex, {2, 2, 3});
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
       "out must be 2-D float32 [2, 3], got 2-D float32 [2, 4]"},
      {"out dtype", [](F f) { f.out_view.dtype = DType::float16; }, kInvalid,
       "out must be 2-D float32 [2, 3], got 2-D float16 [2, 3]"},
      {"out on cuda", [](F f) { f.out_view.device = Device::cuda; }, kInvalid,
       "out must be on the device of expanded_x (cpu), got cuda"},
      {"out null", [](F f) { f.out_view.data = nullptr; }, kInvalid,
       "out data must not be null for a non-empty tensor, got null"},
      {"out overlaps x1", [](F f) { f.in.x1.data = f.out.data() + 8; }, kInvalid,
       "out must not overlap x1 (an output may share no byte with an input or another output), "
       "got 16 shared bytes"},
      {"index too large", [](F f) { f.idx[2] = 9; }, kIndex,
       "moe_finalize_routing: expanded_row_idx[2] must be in [0, 4) (-1 marks a dropped pair), got "
       "9"},
      {"index -2", [](F f) { f.idx[1] = -2; }, kIndex,
       "moe_finalize_routing: expanded_row_idx[1] must be in [0, 4) (-1 marks a dropped pair), got "
       "-2"},
      {"index beyond N*K with cut rows",
       [](F f) {
         f.in.expanded_x.shape[0] = 3;
         f.idx = {3, 4, 0, 1, 0, 0, 0, 0};  // 3 is cut by active_num (skipped), 4 is not valid
         f.in.expanded_row_idx.data = f.idx.data();
       },
       kIndex,
       "moe_finalize_routing: expanded_row_idx[1] must be in [0, 3) (-1 marks a dropped pair, "
       "values "
       "in [3, 4) pairs cut by active_num), got 4"},
      {"drop-pad index",
       [](F f) {
         f.attrs.drop_pad_mode = 3;
         f.in.expanded_x = FinalizeFixture::f32(f.ex, {3, 1, 3});
       },
       kIndex,
       "moe_finalize_routing: expanded_row_idx[3] must be in [0, 3) (-1 marks a dropped pair), got "
       "3"},
      {"expert beyond bias", [](F f) { f.experts[3] = 3; }, kIndex,
       "moe_finalize_routing: expert_idx[1][1] must be in [0, 3) (the rows of bias), got 3"},
      {"expert -1 read", [](F f) { f.experts[0] = -1; }, kIndex,
       "moe_finalize_routing: expert_idx[0][0] must be in [0, 3) (the rows of bias), got -1"},
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

constexpr uint8_t kFinalizeGradPoison = 0xCD;

/// A valid call (drop_pad_mode 0, float32, N = 2, K = 2, H = 3, E = 3, every input and output).
struct FinalizeGradFixture {
  std::vector<float> gy = std::vector<float>(256, 1.0f), ex = gy, scales = gy, bias = gy;
  std::vector<uint8_t> gex = std::vector<uint8_t>(1024, kFinalizeGradPoison), gs = gex, gb = gex;
  std::vector<int32_t> idx{1, 3, 0, 2, 0, 0, 0, 0}, experts{0, 1, 2, 0, 0, 0, 0, 0};
  MoeFinalizeRoutingGradInputs in;
  MoeFinalizeRoutingGradAttrs attrs;
  MoeFinalizeRoutingGradOutputs out;
  ExecConfig config;

  FinalizeGradFixture() {
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

inline std::vector<ErrorCase<FinalizeGradFixture>> finalize_grad_error_cases() {
  using F = FinalizeGradFixture&;
  constexpr StatusCode kInvalid = StatusCode::invalid_argument;
  constexpr StatusCode kIndex = StatusCode::index_out_of_range;
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
         f.in.grad_y = FinalizeGradFixture::f32(f.gy, {2, 3, 1});
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
         f.in.expanded_x = FinalizeGradFixture::f32(f.ex, {4, 3});
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
       "grad_expanded_x must be 2-D float32 [4, 3], got 2-D float32 [4, 2]"},
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
       "grad_scales must be 2-D float32 [2, 2], got 2-D float16 [2, 2]"},
      {"grad_bias without bias",
       [](F f) {
         f.in.bias = TensorView();
         f.in.expert_idx = TensorView();
       },
       kInvalid, "grad_bias needs bias, got none"},
      {"grad_bias shape", [](F f) { f.out.grad_bias.shape[0] = 2; }, kInvalid,
       "grad_bias must be 2-D float32 [3, 3], got 2-D float32 [2, 3]"},
      {"outputs overlap", [](F f) { f.out.grad_scales.data = f.gex.data() + 4; }, kInvalid,
       "grad_scales must not overlap grad_expanded_x (an output may share no byte with an input or "
       "another output), got 16 shared bytes"},
      {"output overlaps an input", [](F f) { f.in.grad_y.data = f.gb.data(); }, kInvalid,
       "grad_bias must not overlap grad_y (an output may share no byte with an input or another "
       "output), got 24 shared bytes"},
      {"index too large", [](F f) { f.idx[2] = 9; }, kIndex,
       "moe_finalize_routing_grad: expanded_row_idx[2] must be in [0, 4) (-1 marks a dropped "
       "pair), "
       "got 9"},
      {"index with active_num",
       [](F f) {
         f.active();
         f.idx = {3, 4, 0, 1, 0, 0, 0, 0};  // 3 is cut by active_num (skipped), 4 is not valid
       },
       kIndex,
       "moe_finalize_routing_grad: expanded_row_idx[1] must be in [0, 3) (-1 marks a dropped pair, "
       "values in [3, 4) pairs cut by active_num), got 4"},
      {"expert beyond bias", [](F f) { f.experts[2] = 3; }, kIndex,
       "moe_finalize_routing_grad: expert_idx[1][0] must be in [0, 3) (the rows of bias), got 3"},
      {"workspace too small",
       [](F f) {
         f.config.workspace = f.ex.data();
         f.config.workspace_bytes = 8;
       },
       kInvalid, "workspace_bytes must be at least"},
      // Found by an adversarial review: only the size was checked, and the pair lists were then
      // written over expanded_x while it was read.
      {"workspace overlapping an input",
       [](F f) {
         f.config.workspace = f.ex.data();
         f.config.workspace_bytes = f.ex.size() * sizeof(float);
       },
       kInvalid,
       "moe_finalize_routing_grad: workspace must not overlap expanded_x (the call writes its "
       "scratch there while it reads the inputs and writes the outputs), got 48 shared bytes"},
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

}  // namespace moe_routing::testing
