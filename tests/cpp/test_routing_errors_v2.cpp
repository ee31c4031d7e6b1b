// Every check of moe_init_routing_v2: input -> category -> message substring, and nothing written
// to any output when a check fails.
#include "routing_errors_util.h"

namespace moe_routing::testing {
namespace {

// ---------------------------------------------------------------------------------------------
// moe_init_routing_v2
// ---------------------------------------------------------------------------------------------

struct V2ErrorCase {
  const char* name;
  Desc x;
  Desc idx;
  std::vector<int32_t> idx_values;  // when empty: all zero
  MoeInitRoutingV2Attrs attrs;
  std::vector<Override> outputs;
  StatusCode code;
  const char* message;
};

MoeInitRoutingV2Attrs v2(int64_t active_num, int64_t capacity, int64_t experts, int64_t mode,
                         int64_t flag, bool before = false) {
  MoeInitRoutingV2Attrs a;
  a.active_num = active_num;
  a.expert_capacity = capacity;
  a.expert_num = experts;
  a.drop_pad_mode = mode;
  a.expert_tokens_count_or_cumsum_flag = flag;
  a.expert_tokens_before_capacity_flag = before;
  return a;
}

std::vector<V2ErrorCase> v2_cases() {
  const Desc x32(D::float32, {3, 2}), idx(D::int32, {3, 2});
  const auto ok = v2(0, 0, 4, 0, 0);
  return {
      {"mode 2",
       x32,
       idx,
       {},
       v2(0, 0, 4, 2, 0),
       {},
       C::invalid_argument,
       "moe_init_routing_v2: drop_pad_mode must be 0 (dropless) or 1 (drop-pad), got 2"},
      {"active negative",
       x32,
       idx,
       {},
       v2(-1, 0, 4, 0, 0),
       {},
       C::invalid_argument,
       "moe_init_routing_v2: active_num must be >= 0, got -1"},
      {"capacity negative",
       x32,
       idx,
       {},
       v2(0, -1, 4, 0, 0),
       {},
       C::invalid_argument,
       "expert_capacity must be >= 0, got -1"},
      {"experts negative",
       x32,
       idx,
       {},
       v2(0, 0, -2, 0, 0),
       {},
       C::invalid_argument,
       "expert_num must be >= 0, got -2"},
      {"experts too many",
       x32,
       idx,
       {},
       v2(0, 0, int64_t(1) << 31, 0, 0),
       {},
       C::invalid_argument,
       "expert_num must be at most 2147483647 (int32 expert ids), got 2147483648"},
      {"flag 3",
       x32,
       idx,
       {},
       v2(0, 0, 4, 0, 3),
       {},
       C::invalid_argument,
       "expert_tokens_count_or_cumsum_flag must be 0 (none), 1 (cumsum) or 2 (count), got 3"},
      {"drop-pad capacity 0",
       x32,
       idx,
       {},
       v2(0, 0, 4, 1, 0),
       {},
       C::invalid_argument,
       "expert_capacity must be >= 1 when drop_pad_mode=1, got 0"},
      {"drop-pad experts 0",
       x32,
       idx,
       {},
       v2(0, 1, 0, 1, 0),
       {},
       C::invalid_argument,
       "expert_num must be >= 1 when drop_pad_mode=1, got 0"},
      {"counts need experts",
       x32,
       idx,
       {},
       v2(0, 0, 0, 0, 2),
       {},
       C::invalid_argument,
       "expert_num must be >= 1 when expert_tokens_count_or_cumsum_flag is 1 or 2, got 0"},
      {"x 3-D",
       Desc(D::float32, {3, 2, 1}),
       idx,
       {},
       ok,
       {},
       C::invalid_argument,
       "moe_init_routing_v2: x must be 2-D [N, H], got 3-D float32 [3, 2, 1]"},
      {"idx 1-D",
       x32,
       Desc(D::int32, {6}),
       {},
       ok,
       {},
       C::invalid_argument,
       "expert_idx must be 2-D [N, K], got 1-D int32 [6]"},
      {"negative dim",
       Desc(D::float32, {3, -2}),
       idx,
       {},
       ok,
       {},
       C::invalid_argument,
       "x dimensions must be >= 0, got [3, -2]"},
      {"idx int64",
       x32,
       Desc(D::int64, {3, 2}),
       {},
       ok,
       {},
       C::invalid_argument,
       "expert_idx must be int32, got int64"},
      {"x int32",
       Desc(D::int32, {3, 2}),
       idx,
       {},
       ok,
       {},
       C::invalid_argument,
       "x must be float16, bfloat16 or float32, got int32"},
      {"x int8",
       Desc(D::int8, {3, 2}),
       idx,
       {},
       ok,
       {},
       C::invalid_argument,
       "x must be float16, bfloat16 or float32, got int8"},
      {"row mismatch",
       x32,
       Desc(D::int32, {4, 2}),
       {},
       ok,
       {},
       C::invalid_argument,
       "expert_idx.size(0) must equal x.size(0) (3), got 4"},
      {"too many pairs",
       Desc(D::float32, {65536, 0}),
       Desc(D::int32, {65536, 32768}),
       {},
       ok,
       {},
       C::invalid_argument,
       "expert_idx must have at most 2147483647 elements (N*K, int32 indices), got [65536, 32768]"},
      {"capacity above N",
       x32,
       idx,
       {},
       v2(0, 4, 4, 1, 0),
       {},
       C::invalid_argument,
       "expert_capacity must be <= x.size(0) (3) when drop_pad_mode=1, got 4"},
      {"expanded_x rows",
       x32,
       idx,
       {},
       ok,
       {{"expanded_x", Desc(D::float32, {5, 2})}},
       C::invalid_argument,
       "moe_init_routing_v2: expanded_x must be 2-D float32 [6, 2], got 2-D float32 [5, 2]"},
      {"expanded_x active rows",
       x32,
       idx,
       {},
       v2(4, 0, 4, 0, 0),
       {{"expanded_x", Desc(D::float32, {6, 2})}},
       C::invalid_argument,
       "expanded_x must be 2-D float32 [4, 2], got 2-D float32 [6, 2]"},
      {"expanded_x dtype",
       x32,
       idx,
       {},
       ok,
       {{"expanded_x", Desc(D::float16, {6, 2})}},
       C::invalid_argument,
       "expanded_x must be 2-D float32 [6, 2], got 2-D float16 [6, 2]"},
      {"expanded_x drop-pad",
       x32,
       idx,
       {},
       v2(0, 2, 4, 1, 0),
       {{"expanded_x", Desc(D::float32, {8, 2})}},
       C::invalid_argument,
       "expanded_x must be 3-D float32 [4, 2, 2], got 2-D float32 [8, 2]"},
      {"row idx dtype",
       x32,
       idx,
       {},
       ok,
       {{"expanded_row_idx", Desc(D::int64, {6})}},
       C::invalid_argument,
       "expanded_row_idx must be 1-D int32 [6], got 1-D int64 [6]"},
      {"count length",
       x32,
       idx,
       {},
       v2(0, 0, 4, 0, 1),
       {{"counts", Desc(D::int32, {3})}},
       C::invalid_argument,
       "expert_tokens_count_or_cumsum must be 1-D int32 [4], got 1-D int32 [3]"},
      {"count dtype",
       x32,
       idx,
       {},
       v2(0, 0, 4, 0, 2),
       {{"counts", Desc(D::int64, {4})}},
       C::invalid_argument,
       "expert_tokens_count_or_cumsum must be 1-D int32 [4], got 1-D int64 [4]"},
      {"count not produced, wrong shape",
       x32,
       idx,
       {},
       ok,
       {{"counts", Desc(D::int32, {2})}},
       C::invalid_argument,
       "expert_tokens_count_or_cumsum must be 1-D int32 [4] or have null data (it is not produced "
       "here), got"},
      {"before capacity length",
       x32,
       idx,
       {},
       v2(0, 2, 4, 1, 0, true),
       {{"before", Desc(D::int32, {5})}},
       C::invalid_argument,
       "expert_tokens_before_capacity must be 1-D int32 [4], got 1-D int32 [5]"},
      {"id above expert_num with counts",
       x32,
       idx,
       {0, 1, 7, 2, 3, 0},
       v2(0, 0, 4, 0, 1),
       {},
       C::index_out_of_range,
       "moe_init_routing_v2: expert_idx[1][0] must be in [0, 4) (expert_num), got 7"},
      {"id equal expert_num in drop-pad",
       x32,
       idx,
       {0, 1, 2, 3, 4, 0},
       v2(0, 1, 4, 1, 0),
       {},
       C::index_out_of_range,
       "moe_init_routing_v2: expert_idx[2][0] must be in [0, 4) (expert_num), got 4"},
      {"negative id with counts",
       x32,
       idx,
       {0, 1, 2, 3, 0, -1},
       v2(0, 0, 4, 0, 2),
       {},
       C::index_out_of_range,
       "moe_init_routing_v2: expert_idx[2][1] must be in [0, 4) (expert_num), got -1"},
      {"negative id without counts",
       x32,
       idx,
       {0, -1, 2, 3, 0, 1},
       ok,
       {},
       C::index_out_of_range,
       "moe_init_routing_v2: expert_idx[0][1] must be >= 0 (expert ids are never negative), got "
       "-1"},
  };
}

TEST(RoutingErrors, V2TableOfInvalidInputs) {
  for (const V2ErrorCase& c : v2_cases()) {
    SCOPED_TRACE(c.name);
    Tensor x = c.x.make(), idx = c.idx.make();
    if (!c.idx_values.empty())
      std::memcpy(idx.bytes.data(), c.idx_values.data(), c.idx_values.size() * 4);
    MoeInitRoutingV2Plan plan;
    const bool inferred = infer_moe_init_routing_v2(x.view(), idx.view(), c.attrs, &plan).is_ok();
    Tensor expanded_x = output_for("expanded_x", inferred ? &plan.expanded_x : nullptr, c.outputs);
    Tensor row_idx =
        output_for("expanded_row_idx", inferred ? &plan.expanded_row_idx : nullptr, c.outputs);
    Tensor counts =
        output_for("counts", inferred ? &plan.expert_tokens_count_or_cumsum : nullptr, c.outputs);
    Tensor before =
        output_for("before", inferred ? &plan.expert_tokens_before_capacity : nullptr, c.outputs);
    expect_error(
        {&expanded_x, &row_idx, &counts, &before},
        [&](const ExecConfig& config) {
          return moe_init_routing_v2(x.view(), idx.view(), c.attrs, expanded_x.view(),
                                     row_idx.view(), counts.view(), before.view(), config);
        },
        c.code, c.message);
  }
}

TEST(RoutingErrors, V2NullDataIsRejected) {
  std::vector<int32_t> ids(6, 0);
  std::vector<float> out(12);
  std::vector<int32_t> row_idx(6);
  MoeInitRoutingV2Attrs attrs;
  Status s = moe_init_routing_v2(TensorView(static_cast<void*>(nullptr), DType::float32, {3, 2}),
                                 TensorView(ids.data(), DType::int32, {3, 2}), attrs,
                                 TensorView(out.data(), DType::float32, {6, 2}),
                                 TensorView(row_idx.data(), DType::int32, {6}), TensorView(),
                                 TensorView());
  EXPECT_EQ(s.code(), StatusCode::invalid_argument);
  EXPECT_NE(s.message().find("moe_init_routing_v2: x data must not be null for a non-empty tensor"),
            std::string::npos)
      << s.message();
  std::vector<float> x(6);
  s = moe_init_routing_v2(
      TensorView(x.data(), DType::float32, {3, 2}), TensorView(ids.data(), DType::int32, {3, 2}),
      attrs, TensorView(static_cast<void*>(nullptr), DType::float32, {6, 2}),
      TensorView(row_idx.data(), DType::int32, {6}), TensorView(), TensorView());
  EXPECT_EQ(s.code(), StatusCode::invalid_argument);
  EXPECT_NE(s.message().find("expanded_x data must not be null"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace moe_routing::testing
