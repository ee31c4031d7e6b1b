// Every check of moe_init_routing_grad: input -> category -> message substring, and nothing
// written to grad_x when a check fails.
#include "test_util.h"

namespace moe_routing {
namespace {

struct ErrorCase {
  const char* name;
  // Tensor descriptions: dtype + shape; data is allocated to fit.
  DType grad_dtype;
  std::vector<int64_t> grad_shape;
  DType idx_dtype;
  std::vector<int64_t> idx_shape;
  std::vector<int32_t> idx_values;  // when empty, filled with 0..n-1 (valid in dropless)
  MoeInitRoutingGradAttrs attrs;
  DType out_dtype;
  std::vector<int64_t> out_shape;
  StatusCode code;
  const char* message;
};

std::vector<ErrorCase> cases() {
  using D = DType;
  using C = StatusCode;
  MoeInitRoutingGradAttrs k2{2, 0, 0}, k3{3, 0, 0};
  return {
      {"mode 2",
       D::float32,
       {4, 3},
       D::int32,
       {4},
       {},
       {2, 2, 0},
       D::float32,
       {2, 3},
       C::invalid_argument,
       "moe_init_routing_grad: drop_pad_mode must be 0 (dropless/active) or 1 (drop-pad), got 2"},
      {"top_k 0",
       D::float32,
       {4, 3},
       D::int32,
       {4},
       {},
       {0, 0, 0},
       D::float32,
       {2, 3},
       C::invalid_argument,
       "top_k must be > 0, got 0"},
      {"top_k negative",
       D::float32,
       {4, 3},
       D::int32,
       {4},
       {},
       {-3, 0, 0},
       D::float32,
       {2, 3},
       C::invalid_argument,
       "top_k must be > 0, got -3"},
      {"active negative",
       D::float32,
       {4, 3},
       D::int32,
       {4},
       {},
       {2, 0, -1},
       D::float32,
       {2, 3},
       C::invalid_argument,
       "active_num must be >= 0, got -1"},
      {"3-D in mode 0",
       D::float32,
       {2, 2, 3},
       D::int32,
       {4},
       {},
       k2,
       D::float32,
       {2, 3},
       C::invalid_argument,
       "grad_expanded_x must be 2-D [rows, H] when drop_pad_mode=0, got 3-D float32 [2, 2, 3]"},
      {"2-D in mode 1",
       D::float32,
       {4, 3},
       D::int32,
       {4},
       {},
       {2, 1, 0},
       D::float32,
       {2, 3},
       C::invalid_argument,
       "grad_expanded_x must be 3-D [E, C, H] when drop_pad_mode=1, got 2-D"},
      {"1-D grad",
       D::float32,
       {4},
       D::int32,
       {4},
       {},
       k2,
       D::float32,
       {2, 3},
       C::invalid_argument,
       "grad_expanded_x must be 2-D [rows, H] when drop_pad_mode=0, got 1-D"},
      {"int dtype",
       D::int32,
       {4, 3},
       D::int32,
       {4},
       {},
       k2,
       D::int32,
       {2, 3},
       C::invalid_argument,
       "grad_expanded_x must be float16, bfloat16 or float32, got int32"},
      {"idx int64 2-D",
       D::float32,
       {4, 3},
       D::int64,
       {2, 2},
       {},
       k2,
       D::float32,
       {2, 3},
       C::invalid_argument,
       "expanded_row_idx must be 1-D int32, got 2-D int64"},
      {"idx int64",
       D::float32,
       {4, 3},
       D::int64,
       {4},
       {},
       k2,
       D::float32,
       {2, 3},
       C::invalid_argument,
       "expanded_row_idx must be 1-D int32, got 1-D int64"},
      {"negative dim",
       D::float32,
       {-4, 3},
       D::int32,
       {4},
       {},
       k2,
       D::float32,
       {2, 3},
       C::invalid_argument,
       "grad_expanded_x dimensions must be >= 0, got [-4, 3]"},
      {"not divisible",
       D::float32,
       {7, 3},
       D::int32,
       {7},
       {},
       k2,
       D::float32,
       {3, 3},
       C::invalid_argument,
       "len(expanded_row_idx) must be divisible by top_k (2), got 7"},
      {"dropless rows",
       D::float32,
       {5, 3},
       D::int32,
       {6},
       {0, 1, 2, 3, 4, 0},
       k3,
       D::float32,
       {2, 3},
       C::invalid_argument,
       "grad_expanded_x.size(0) must equal len(expanded_row_idx) (6) in the dropless"},
      {"active rows",
       D::float32,
       {4, 3},
       D::int32,
       {6},
       {},
       {3, 0, 3},
       D::float32,
       {2, 3},
       C::invalid_argument,
       "grad_expanded_x.size(0) must equal active_num (3) in the active scenario, got 4"},
      {"out shape",
       D::float32,
       {4, 3},
       D::int32,
       {4},
       {},
       k2,
       D::float32,
       {2, 4},
       C::invalid_argument,
       "grad_x must be 2-D float32 [2, 3], got 2-D float32 [2, 4]"},
      {"out dtype",
       D::float32,
       {4, 3},
       D::int32,
       {4},
       {},
       k2,
       D::float16,
       {2, 3},
       C::invalid_argument,
       "grad_x must be 2-D float32 [2, 3], got 2-D float16 [2, 3]"},
      {"index too big",
       D::float32,
       {6, 2},
       D::int32,
       {6},
       {0, 1, 2, 3, 4, 99},
       k2,
       D::float32,
       {3, 2},
       C::index_out_of_range,
       "moe_init_routing_grad: expanded_row_idx[5] must be in [0, 6), got 99"},
      {"index -2",
       D::float32,
       {6, 2},
       D::int32,
       {6},
       {0, 1, -2, 3, 4, 5},
       k2,
       D::float32,
       {3, 2},
       C::index_out_of_range,
       "moe_init_routing_grad: expanded_row_idx[2] must be in [0, 6) (-1, which marks a dropped "
       "pair, "
       "is the only negative value allowed), got -2"},
      {"drop-pad index = E*C",
       D::float32,
       {2, 2, 1},
       D::int32,
       {4},
       {0, 4, -1, 3},
       {2, 1, 0},
       D::float32,
       {2, 1},
       C::index_out_of_range,
       "moe_init_routing_grad: expanded_row_idx[1] must be in [0, 4), got 4"},
      {"drop-pad ignores active_num",
       D::float32,
       {2, 2, 1},
       D::int32,
       {4},
       {0, 9, -1, 3},
       {2, 1, 2},
       D::float32,
       {2, 1},
       C::index_out_of_range,
       "moe_init_routing_grad: expanded_row_idx[1] must be in [0, 4), got 9"},
      {"active negative index",
       D::float32,
       {3, 1},
       D::int32,
       {4},
       {0, -7, 5, 1},
       {2, 0, 3},
       D::float32,
       {2, 1},
       C::index_out_of_range,
       "moe_init_routing_grad: expanded_row_idx[1] must be in [0, 3) (-1, which marks a dropped "
       "pair, "
       "is the only negative value allowed), got -7"},
      {"numerics 7",
       D::float32,
       {4, 3},
       D::int32,
       {4},
       {},
       {2, 0, 0, AccumulationOrder::from_numerics, static_cast<Numerics>(7)},
       D::float32,
       {2, 3},
       C::invalid_argument,
       "moe_init_routing_grad: numerics must be atlas_a2 or ascend_950, got 7"},
      {"order 7",
       D::float32,
       {4, 3},
       D::int32,
       {4},
       {},
       {2, 0, 0, static_cast<AccumulationOrder>(7)},
       D::float32,
       {2, 3},
       C::invalid_argument,
       "moe_init_routing_grad: order must be from_numerics, tree or sequential, got 7"},
      {"empty drop-pad with index",
       D::float32,
       {0, 2, 1},
       D::int32,
       {2},
       {0, -1},
       {2, 1, 0},
       D::float32,
       {1, 1},
       C::index_out_of_range,
       "moe_init_routing_grad: expanded_row_idx[0] must be in [0, 0), got 0"},
  };
}

TEST(GradErrors, TableOfInvalidInputs) {
  for (const ErrorCase& c : cases()) {
    SCOPED_TRACE(c.name);
    auto count = [](const std::vector<int64_t>& shape) {
      int64_t n = 1;
      for (int64_t d : shape) n *= d < 0 ? 0 : d;
      return n;
    };
    std::vector<uint8_t> grad(size_t(count(c.grad_shape)) * dtype_size(c.grad_dtype) + 8, 0);
    std::vector<int32_t> idx32 = c.idx_values;
    if (idx32.empty())
      for (int64_t i = 0; i < count(c.idx_shape); ++i) idx32.push_back(int32_t(i));
    std::vector<int64_t> idx64(idx32.begin(), idx32.end());
    void* idx_data = c.idx_dtype == DType::int64 ? static_cast<void*>(idx64.data()) : idx32.data();
    std::vector<uint8_t> out(size_t(count(c.out_shape)) * dtype_size(c.out_dtype) + 8, 0xAB);
    TensorView g(grad.data(), c.grad_dtype, int(c.grad_shape.size()), c.grad_shape.data());
    TensorView r(idx_data, c.idx_dtype, int(c.idx_shape.size()), c.idx_shape.data());
    TensorView o(out.data(), c.out_dtype, int(c.out_shape.size()), c.out_shape.data());
    for (const testing::Runner& runner : testing::all_runners()) {
      Status s = moe_init_routing_grad(g, r, c.attrs, o, runner.config());
      EXPECT_EQ(s.code(), c.code) << runner.name() << ": " << s.message();
      EXPECT_NE(s.message().find(c.message), std::string::npos)
          << runner.name() << ": message was: " << s.message();
      for (uint8_t byte : out) ASSERT_EQ(byte, 0xAB) << "grad_x was written on error";
    }
  }
}

TEST(GradErrors, NullDataIsRejected) {
  std::vector<int32_t> idx{0, 1};
  std::vector<float> out(2);
  TensorView g(static_cast<void*>(nullptr), DType::float32, {2, 1});
  TensorView r(idx.data(), DType::int32, {2});
  TensorView o(out.data(), DType::float32, {1, 1});
  Status s = moe_init_routing_grad(g, r, {2, 0, 0}, o);
  EXPECT_EQ(s.code(), StatusCode::invalid_argument);
  EXPECT_NE(s.message().find("grad_expanded_x data must not be null"), std::string::npos)
      << s.message();
}

TEST(GradErrors, UnavailableIsaIsNotSupported) {
  std::vector<float> grad(2, 1.0f), out(1);
  std::vector<int32_t> idx{0, 1};
  for (CpuIsa isa : kCpuIsas) {
    ExecConfig config;
    config.isa = isa;
    Status s = moe_init_routing_grad(TensorView(grad.data(), DType::float32, {2, 1}),
                                     TensorView(idx.data(), DType::int32, {2}), {2, 0, 0},
                                     TensorView(out.data(), DType::float32, {1, 1}), config);
    if (cpu_isa_available(isa)) {
      EXPECT_TRUE(s.is_ok()) << cpu_isa_name(isa) << ": " << s.message();
      EXPECT_EQ(out[0], 2.0f);
    } else {
      EXPECT_EQ(s.code(), StatusCode::not_supported) << cpu_isa_name(isa);
    }
  }
}

TEST(GradErrors, ThrowIfErrorCarriesTheCategory) {
  try {
    throw_if_error(index_out_of_range("op: x[1] must be in [0, 2), got 5"));
    FAIL() << "no exception";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), StatusCode::index_out_of_range);
    EXPECT_STREQ(e.what(), "op: x[1] must be in [0, 2), got 5");
  }
}

}  // namespace
}  // namespace moe_routing
