// Every check of moe_init_routing (the torch API): input -> category -> message substring, and
// nothing written to any output when a check fails (moe_init_routing_v2's: in
// test_routing_errors_v2.cpp).
#include <limits>

#include "routing_errors_util.h"

namespace moe_routing::testing {
namespace {

// ---------------------------------------------------------------------------------------------
// moe_init_routing
// ---------------------------------------------------------------------------------------------

struct ErrorCase {
  const char* name;
  Desc x;
  Desc idx;
  Desc scale, offset, topk_weight;
  MoeInitRoutingAttrs attrs;
  std::vector<Override> outputs;
  StatusCode code;
  const char* message;
};

MoeInitRoutingAttrs attrs_of(int64_t experts, int64_t quant = -1) {
  MoeInitRoutingAttrs a;
  a.expert_num = experts;
  a.quant_mode = quant;
  return a;
}

template <class Edit>
MoeInitRoutingAttrs edited(MoeInitRoutingAttrs a, const Edit& edit) {
  edit(a);
  return a;
}

MoeInitRoutingAttrs drop_pad(int64_t capacity) {
  return edited(attrs_of(4), [&](MoeInitRoutingAttrs& a) {
    a.drop_pad_mode = 1;
    a.expert_capacity = capacity;
  });
}

MoeInitRoutingAttrs with_range(int64_t start, int64_t end) {
  return edited(attrs_of(4), [&](MoeInitRoutingAttrs& a) {
    a.has_active_expert_range = true;
    a.active_expert_range = {start, end};
  });
}

std::vector<ErrorCase> cases() {
  const Desc x32(D::float32, {3, 2}), idx(D::int32, {3, 2}), one(D::float32, {1});
  const auto ok = attrs_of(4);
  return {
      {"quant 2",
       x32,
       idx,
       kNone,
       kNone,
       kNone,
       attrs_of(4, 2),
       {},
       C::not_supported,
       "moe_init_routing: quant_mode must be one of the supported modes -1 (none), 0 (static int8) "
       "or 1 "
       "(dynamic int8); CANN's MX/FP8/HiF8/INT4 modes are not implemented, got 2"},
      {"quant 17", x32, idx, kNone, kNone, kNone, attrs_of(4, 17), {}, C::not_supported, "got 17"},
      {"quant 10",
       x32,
       idx,
       kNone,
       kNone,
       kNone,
       attrs_of(4, 10),
       {},
       C::invalid_argument,
       "quant_mode must be -1 (none), 0 (static int8), 1 (dynamic int8) or one of CANN's modes "
       "2-9, 11-17 "
       "(not supported here), got 10"},
      {"quant -2",
       x32,
       idx,
       kNone,
       kNone,
       kNone,
       attrs_of(4, -2),
       {},
       C::invalid_argument,
       "got -2"},
      {"mode 2",
       x32,
       idx,
       kNone,
       kNone,
       kNone,
       edited(ok, [](auto& a) { a.drop_pad_mode = 2; }),
       {},
       C::invalid_argument,
       "moe_init_routing: drop_pad_mode must be 0 (dropless) or 1 (drop-pad), got 2"},
      {"expert_num default",
       x32,
       idx,
       kNone,
       kNone,
       kNone,
       MoeInitRoutingAttrs(),
       {},
       C::invalid_argument,
       "moe_init_routing: expert_num must be >= 1, got -1"},
      {"empty range",
       x32,
       idx,
       kNone,
       kNone,
       kNone,
       with_range(2, 2),
       {},
       C::invalid_argument,
       "active_expert_range must be [start, end) with 0 <= start < end <= expert_num (4), got [2, "
       "2]"},
      {"negative start",
       x32,
       idx,
       kNone,
       kNone,
       kNone,
       with_range(-1, 2),
       {},
       C::invalid_argument,
       "active_expert_range must be [start, end) with 0 <= start < end <= expert_num (4), got [-1, "
       "2]"},
      {"end above E",
       x32,
       idx,
       kNone,
       kNone,
       kNone,
       with_range(0, 5),
       {},
       C::invalid_argument,
       "got [0, 5]"},
      {"count type 3",
       x32,
       idx,
       kNone,
       kNone,
       kNone,
       edited(ok, [](auto& a) { a.expert_tokens_num_type = 3; }),
       {},
       C::invalid_argument,
       "expert_tokens_num_type must be 0 (cumsum), 1 (count) or 2 (key_value), got 3"},
      {"row_idx_type 2",
       x32,
       idx,
       kNone,
       kNone,
       kNone,
       edited(ok, [](auto& a) { a.row_idx_type = 2; }),
       {},
       C::invalid_argument,
       "row_idx_type must be 0 (gather) or 1 (scatter), got 2"},
      {"active_num -2",
       x32,
       idx,
       kNone,
       kNone,
       kNone,
       edited(ok, [](auto& a) { a.active_num = -2; }),
       {},
       C::invalid_argument,
       "active_num must be -1 or 0 (keep every routed pair) or > 0, got -2"},
      {"numerics",
       x32,
       idx,
       kNone,
       kNone,
       kNone,
       edited(ok, [](auto& a) { a.numerics = static_cast<Numerics>(7); }),
       {},
       C::invalid_argument,
       "numerics must be atlas_a2 or ascend_950, got 7"},
      {"drop-pad capacity default",
       x32,
       idx,
       kNone,
       kNone,
       kNone,
       drop_pad(-1),
       {},
       C::invalid_argument,
       "expert_capacity must be >= 1 when drop_pad_mode=1, got -1"},
      {"drop-pad row_idx_type 1",
       x32,
       idx,
       kNone,
       kNone,
       kNone,
       edited(drop_pad(2), [](auto& a) { a.row_idx_type = 1; }),
       {},
       C::invalid_argument,
       "row_idx_type must be 0 when drop_pad_mode=1, got 1"},
      {"drop-pad quant",
       x32,
       idx,
       kNone,
       kNone,
       kNone,
       edited(drop_pad(2), [](auto& a) { a.quant_mode = 1; }),
       {},
       C::invalid_argument,
       "quant_mode must be -1 when drop_pad_mode=1, got 1"},
      {"drop-pad partial range",
       x32,
       idx,
       kNone,
       kNone,
       kNone,
       edited(drop_pad(2),
              [](auto& a) {
                a.has_active_expert_range = true;
                a.active_expert_range = {1, 4};
              }),
       {},
       C::invalid_argument,
       "active_expert_range must be the full [0, expert_num) = [0, 4) when drop_pad_mode=1, got "
       "[1, 4]"},
      {"drop-pad capacity above N",
       x32,
       idx,
       kNone,
       kNone,
       kNone,
       drop_pad(4),
       {},
       C::invalid_argument,
       "expert_capacity must be <= x.size(0) (3) when drop_pad_mode=1, got 4"},
      {"x 1-D",
       Desc(D::float32, {6}),
       idx,
       kNone,
       kNone,
       kNone,
       ok,
       {},
       C::invalid_argument,
       "moe_init_routing: x must be 2-D [N, H], got 1-D float32 [6]"},
      {"idx int64",
       x32,
       Desc(D::int64, {3, 2}),
       kNone,
       kNone,
       kNone,
       ok,
       {},
       C::invalid_argument,
       "expert_idx must be int32, got int64"},
      {"row mismatch",
       x32,
       Desc(D::int32, {2, 2}),
       kNone,
       kNone,
       kNone,
       ok,
       {},
       C::invalid_argument,
       "expert_idx.size(0) must equal x.size(0) (3), got 2"},
      {"x int8 quantised",
       Desc(D::int8, {3, 2}),
       idx,
       kNone,
       kNone,
       kNone,
       attrs_of(4, 1),
       {},
       C::invalid_argument,
       "x must be float16, bfloat16 or float32 when quant_mode is 0 or 1, got int8"},
      {"x int32",
       Desc(D::int32, {3, 2}),
       idx,
       kNone,
       kNone,
       kNone,
       ok,
       {},
       C::invalid_argument,
       "x must be float16, bfloat16, float32 or int8, got int32"},
      {"per-token scale length",
       x32,
       idx,
       Desc(D::float32, {2}),
       kNone,
       kNone,
       ok,
       {},
       C::invalid_argument,
       "scale must be 1-D float32 [N] = [3] (a per-token scale) when quant_mode=-1, got 1-D "
       "float32 [2]"},
      {"per-token scale dtype",
       x32,
       idx,
       Desc(D::float16, {3}),
       kNone,
       kNone,
       ok,
       {},
       C::invalid_argument,
       "got 1-D float16 [3]"},
      {"static without scale",
       x32,
       idx,
       kNone,
       kNone,
       kNone,
       attrs_of(4, 0),
       {},
       C::invalid_argument,
       "scale must be given (1-D float32 [1]) when quant_mode=0, got none"},
      {"static scale shape",
       x32,
       idx,
       Desc(D::float32, {2}),
       kNone,
       kNone,
       attrs_of(4, 0),
       {},
       C::invalid_argument,
       "scale must be 1-D float32 [1] when quant_mode=0, got 1-D float32 [2]"},
      {"static offset shape",
       x32,
       idx,
       one,
       Desc(D::float32, {1, 1}),
       kNone,
       attrs_of(4, 0),
       {},
       C::invalid_argument,
       "offset must be 1-D float32 [1] when quant_mode=0, got 2-D float32 [1, 1]"},
      {"offset without static quant",
       x32,
       idx,
       kNone,
       one,
       kNone,
       attrs_of(4, 1),
       {},
       C::invalid_argument,
       "offset must be none unless quant_mode=0 (it is only used by static quantisation), got 1-D "
       "float32 [1] "
       "with quant_mode=1"},
      {"smooth scale rows",
       x32,
       idx,
       Desc(D::float32, {3, 2}),
       kNone,
       kNone,
       attrs_of(4, 1),
       {},
       C::invalid_argument,
       "scale must be 2-D float32 [end - start, H] = [4, 2] or [1, 2] (a smooth scale) when "
       "quant_mode=1, got "
       "2-D float32 [3, 2]"},
      {"smooth scale 1-D",
       x32,
       idx,
       Desc(D::float32, {2}),
       kNone,
       kNone,
       attrs_of(4, 1),
       {},
       C::invalid_argument,
       "got 1-D float32 [2]"},
      {"topk_weight shape",
       x32,
       idx,
       kNone,
       kNone,
       Desc(D::float32, {3, 1}),
       ok,
       {},
       C::invalid_argument,
       "topk_weight must be 2-D float32 [N, K] = [3, 2], got 2-D float32 [3, 1]"},
      {"topk_weight dtype",
       x32,
       idx,
       kNone,
       kNone,
       Desc(D::float16, {3, 2}),
       ok,
       {},
       C::invalid_argument,
       "got 2-D float16 [3, 2]"},
      {"expanded_x int8 expected",
       x32,
       idx,
       kNone,
       kNone,
       kNone,
       attrs_of(4, 1),
       {{"expanded_x", Desc(D::float32, {6, 2})}},
       C::invalid_argument,
       "moe_init_routing: expanded_x must be 2-D int8 [6, 2], got 2-D float32 [6, 2]"},
      {"expanded_x dropless shape is N*K",
       x32,
       idx,
       kNone,
       kNone,
       kNone,
       edited(ok, [](auto& a) { a.active_num = 2; }),
       {{"expanded_x", Desc(D::float32, {2, 2})}},
       C::invalid_argument,
       "expanded_x must be 2-D float32 [6, 2], got 2-D float32 [2, 2]"},
      {"key_value shape",
       x32,
       idx,
       kNone,
       kNone,
       kNone,
       edited(ok,
              [](auto& a) {
                a.expert_tokens_num_flag = true;
                a.expert_tokens_num_type = 2;
              }),
       {{"counts", Desc(D::int64, {4})}},
       C::invalid_argument,
       "expert_tokens_count_or_cumsum must be 2-D int64 [4, 2], got 1-D int64 [4]"},
      {"count range length",
       x32,
       idx,
       kNone,
       kNone,
       kNone,
       edited(with_range(1, 3), [](auto& a) { a.expert_tokens_num_flag = true; }),
       {{"counts", Desc(D::int64, {4})}},
       C::invalid_argument,
       "expert_tokens_count_or_cumsum must be 1-D int64 [2], got 1-D int64 [4]"},
      {"count int32",
       x32,
       idx,
       kNone,
       kNone,
       kNone,
       edited(ok, [](auto& a) { a.expert_tokens_num_flag = true; }),
       {{"counts", Desc(D::int32, {4})}},
       C::invalid_argument,
       "must be 1-D int64 [4], got 1-D int32 [4]"},
      {"expanded_scale shape",
       x32,
       idx,
       kNone,
       kNone,
       kNone,
       attrs_of(4, 1),
       {{"expanded_scale", Desc(D::float32, {3})}},
       C::invalid_argument,
       "expanded_scale must be 1-D float32 [6], got 1-D float32 [3]"},
      {"expanded_scale drop-pad",
       x32,
       idx,
       Desc(D::float32, {3}),
       kNone,
       kNone,
       drop_pad(2),
       {{"expanded_scale", Desc(D::float32, {6})}},
       C::invalid_argument,
       "expanded_scale must be 1-D float32 [8], got 1-D float32 [6]"},
      {"expanded_topk_weight shape",
       x32,
       idx,
       kNone,
       kNone,
       Desc(D::float32, {3, 2}),
       ok,
       {{"expanded_topk_weight", Desc(D::float32, {6})}},
       C::invalid_argument,
       "expanded_topk_weight must be 2-D float32 [6, 1], got 1-D float32 [6]"},
      {"expanded_scale not produced",
       x32,
       idx,
       kNone,
       kNone,
       kNone,
       ok,
       {{"expanded_scale", Desc(D::float32, {5})}},
       C::invalid_argument,
       "expanded_scale must be 1-D float32 [6] or have null data (it is not produced here), got "
       "1-D float32 [5]"},
  };
}

TEST(RoutingErrors, TableOfInvalidInputs) {
  for (const ErrorCase& c : cases()) {
    SCOPED_TRACE(c.name);
    Tensor x = c.x.make(), idx = c.idx.make(), scale = c.scale.make(), offset = c.offset.make(),
           topk = c.topk_weight.make();
    MoeInitRoutingPlan plan;
    const bool inferred = infer_moe_init_routing(x.view(), idx.view(), scale.view(), offset.view(),
                                                 topk.view(), c.attrs, &plan)
                              .is_ok();
    Tensor expanded_x = output_for("expanded_x", inferred ? &plan.expanded_x : nullptr, c.outputs);
    Tensor row_idx =
        output_for("expanded_row_idx", inferred ? &plan.expanded_row_idx : nullptr, c.outputs);
    Tensor counts =
        output_for("counts", inferred ? &plan.expert_tokens_count_or_cumsum : nullptr, c.outputs);
    Tensor exp_scale =
        output_for("expanded_scale", inferred ? &plan.expanded_scale : nullptr, c.outputs);
    Tensor exp_topk = output_for("expanded_topk_weight",
                                 inferred ? &plan.expanded_topk_weight : nullptr, c.outputs);
    expect_error(
        {&expanded_x, &row_idx, &counts, &exp_scale, &exp_topk},
        [&](const ExecConfig& config) {
          return moe_init_routing(x.view(), idx.view(), scale.view(), offset.view(), topk.view(),
                                  c.attrs, expanded_x.view(), row_idx.view(), counts.view(),
                                  exp_scale.view(), exp_topk.view(), config);
        },
        c.code, c.message);
  }
}

TEST(RoutingErrors, PresentOptionalInputWithNullDataIsRejected) {
  std::vector<float> x(6), out(12), scale_out(6);
  std::vector<int32_t> ids(6, 0), row_idx(6);
  Status s = moe_init_routing(
      TensorView(x.data(), DType::float32, {3, 2}), TensorView(ids.data(), DType::int32, {3, 2}),
      TensorView(static_cast<void*>(nullptr), DType::float32, {3}), TensorView(), TensorView(),
      attrs_of(4), TensorView(out.data(), DType::float32, {6, 2}),
      TensorView(row_idx.data(), DType::int32, {6}), TensorView(),
      TensorView(scale_out.data(), DType::float32, {6}), TensorView());
  EXPECT_EQ(s.code(), StatusCode::invalid_argument);
  EXPECT_NE(
      s.message().find("moe_init_routing: scale data must not be null for a non-empty tensor"),
      std::string::npos)
      << s.message();
}

TEST(RoutingErrors, OutOfRangeIdsAreNotRoutedInTheTorchApi) {
  // No error for ids outside the range (docs/decisions.md §6): they get -1 and no row.
  testing::ForwardCase c;
  c.x = Tensor::floats(DType::float32, {3, 1}, {1, 2, 3});
  c.expert_idx = Tensor::int32s({3, 1}, {-1, 7, std::numeric_limits<int32_t>::min()});
  c.attrs = attrs_of(4);
  for (const testing::Runner& runner : testing::all_runners()) {
    testing::ForwardResult r = testing::run_forward(c, runner);
    ASSERT_TRUE(r.status.is_ok()) << r.status.message();
    EXPECT_EQ(r.expanded_row_idx.values<int32_t>(), (std::vector<int32_t>{-1, -1, -1}))
        << runner.name();
    EXPECT_EQ(r.expanded_x.float_values(), (std::vector<float>{0, 0, 0})) << runner.name();
  }
}

}  // namespace
}  // namespace moe_routing::testing
