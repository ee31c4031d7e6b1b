// The CUDA backend's logic on the CPU, so that it is checked on every machine that builds with
// MOE_ROUTING_CUDA, GPU or not:
//  * the backward kernel's body (src/cuda/grad_body.cuh: the order walk, the pairwise-tree merge,
//    the loads-in-flight shapes, the thread mapping) run as __host__ code over a simulated grid,
//    for every instantiation the launcher can pick, bitwise against the reference backend;
//  * the int8 quantisation helpers of src/cuda/numerics.cuh against quantize.h;
//  * the CUDA launchers' index-error messages against the CPU checks', word for word.
// The device-only parts (intrinsics, CUB, launches) are covered by test_cuda_grad.cpp and
// test_cuda_routing.cpp on a machine with a GPU.
#include <algorithm>
#include <cmath>
#include <limits>

#include "cuda/cuda_backend.h"
#include "cuda/grad_body.cuh"
#include "cuda/numerics.cuh"
#include "grad_cases.h"
#include "params/quantize.h"

namespace moe_routing {
namespace {

using testing::FloatBuffer;
using testing::GradCase;
using testing::Random;

/// Runs grad_items<Tag, kBytes, D, V, kLevels> over a simulated grid of `threads`-thread blocks
/// (one block looping over the chunks, as a grid-stride kernel with gridDim 1 does).
template <class Tag, int kBytes, int D, int V, int kLevels>
void run_simulated(const cuda::GradArgs& args, int threads) {
  const int64_t total = args.num_rows * args.vectors_per_row;
  const int64_t chunk = int64_t(threads) * V;
  for (int64_t base = 0; base < total; base += chunk)
    for (int t = 0; t < threads; ++t)
      cuda::grad_items<Tag, kBytes, D, V, kLevels>(args, base + t, threads);
}

cuda::GradArgs make_args(GradCase& c, void* out, const MoeInitRoutingGradPlan& plan,
                         bool vectorized) {
  cuda::GradArgs a{};
  a.grad_expanded_x = c.grad.data();
  a.expanded_row_idx = c.expanded_row_idx.data();
  a.grad_x = out;
  a.num_rows = plan.num_rows;
  a.top_k = plan.top_k;
  a.hidden = plan.hidden;
  a.skip_from = plan.skip_from;
  a.sequential = plan.order == AccumulationOrder::sequential;
  a.bins = a.sequential ? 1 : tree_shape(plan.top_k).bins;
  const int64_t element = int64_t(dtype_size(plan.dtype));
  a.vectors_per_row = vectorized ? plan.hidden * element / 16 : plan.hidden;
  a.items_fit_32_bits = (plan.num_rows + plan.top_k) % 2 == 0;  // both paths, whatever the case
  return a;
}

/// Every instantiation the launcher may choose for this K and order, run on the CPU.
template <class Tag>
std::vector<std::pair<std::string, FloatBuffer>> simulate_all(GradCase& c,
                                                              const MoeInitRoutingGradPlan& plan) {
  std::vector<std::pair<std::string, FloatBuffer>> results;
  const int64_t K = plan.top_k;
  const int levels = plan.order == AccumulationOrder::sequential ? 0 : tree_shape(K).levels;
  const bool can_vectorize = (plan.hidden * int64_t(dtype_size(plan.dtype))) % 16 == 0;
  auto run = [&](const char* name, bool vectorized, auto launcher) {
    for (int threads : {256, 32}) {
      FloatBuffer out(plan.dtype, plan.num_rows * plan.hidden);
      out.poison();
      launcher(make_args(c, out.data(), plan, vectorized), threads);
      results.emplace_back(std::string(name) + " threads " + std::to_string(threads),
                           std::move(out));
    }
  };
  constexpr int kScalar = int(sizeof(typename Tag::Storage));
  run("scalar D8 V1 L6", false, run_simulated<Tag, kScalar, 8, 1, 6>);
  if (!can_vectorize) return results;
  if (K <= 2) run("vec D2 V4 L0", true, run_simulated<Tag, 16, 2, 4, 0>);
  if (K <= 4) run("vec D4 V2 L1", true, run_simulated<Tag, 16, 4, 2, 1>);
  if (levels <= 2) run("vec D8 V1 L2", true, run_simulated<Tag, 16, 8, 1, 2>);
  run("vec D4 V1 L6", true, run_simulated<Tag, 16, 4, 1, 6>);
  return results;
}

TEST(CudaHostLogic, GradKernelBodyMatchesTheReferenceForEveryInstantiation) {
  Random rng(424242);
  int compared = 0;
  for (DType dtype : {DType::float32, DType::float16, DType::bfloat16})
    for (GradScenario scenario :
         {GradScenario::dropless, GradScenario::active, GradScenario::drop_pad})
      for (AccumulationOrder order : {AccumulationOrder::tree, AccumulationOrder::sequential})
        for (int64_t K : {1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 33, 64, 127, 128, 130})
          for (int64_t H : {1, 8, 24, 40}) {
            const int64_t N = K > 32 ? 3 : 5;
            GradCase c = testing::make_grad_case(rng, scenario, dtype, N, K, H, 0.15);
            c.attrs.order = order;
            SCOPED_TRACE(::testing::Message()
                         << dtype_name(dtype) << ' ' << grad_scenario_name(scenario) << ' '
                         << accumulation_order_name(order) << " K=" << K << " H=" << H);
            MoeInitRoutingGradPlan plan;
            ASSERT_TRUE(
                infer_moe_init_routing_grad(c.grad_view(), c.idx_view(), c.attrs, &plan).is_ok());
            const FloatBuffer expected =
                testing::run_grad_case(c, {Backend::reference, CpuIsa::automatic, 1});
            std::vector<std::pair<std::string, FloatBuffer>> got;
            if (dtype == DType::float32) got = simulate_all<cuda::num::Float32>(c, plan);
            if (dtype == DType::float16) got = simulate_all<cuda::num::Float16>(c, plan);
            if (dtype == DType::bfloat16) got = simulate_all<cuda::num::Bfloat16>(c, plan);
            ASSERT_FALSE(got.empty());
            for (auto& [name, out] : got) {
              EXPECT_TRUE(testing::bitwise_equal(expected, out)) << name;
              ++compared;
            }
          }
  EXPECT_GT(compared, 1000);
}

TEST(CudaHostLogic, OrderWalkVisitsEveryAddendOnceInTheTreeOrder) {
  // K = 5: ((a0 + a4) + a1) + (a2 + a3) (spec §1.6 table).
  cuda::OrderWalk walk(5, 2, false);
  std::vector<int32_t> ts, bins;
  std::vector<bool> seeds, ends;
  for (int s = 0; s < 5; ++s) {
    int32_t t, bin;
    bool start, seed, end;
    walk.next(&t, &bin, &start, &seed, &end);
    ts.push_back(t);
    bins.push_back(bin);
    seeds.push_back(seed);
    ends.push_back(end);
  }
  EXPECT_EQ(ts, (std::vector<int32_t>{0, 4, 1, 2, 3}));
  EXPECT_EQ(bins, (std::vector<int32_t>{0, 0, 0, 1, 1}));
  EXPECT_EQ(seeds, (std::vector<bool>{true, false, false, true, false}));
  EXPECT_EQ(ends, (std::vector<bool>{false, false, true, false, true}));
  for (int64_t K : {1, 2, 3, 6, 100, 127, 128, 129, 1000}) {
    cuda::OrderWalk w(K, tree_shape(K).bins, false);
    std::vector<int> seen(size_t(K), 0);
    int closed = 0;
    for (int64_t s = 0; s < K; ++s) {
      int32_t t, bin;
      bool start, seed, end;
      w.next(&t, &bin, &start, &seed, &end);
      ASSERT_GE(t, 0);
      ASSERT_LT(t, K);
      ++seen[size_t(t)];
      EXPECT_EQ(bin, closed) << "K=" << K;
      closed += end;
    }
    EXPECT_EQ(closed, tree_shape(K).bins) << "K=" << K;
    EXPECT_TRUE(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; })) << "K=" << K;
  }
}

TEST(CudaHostLogic, QuantisationHelpersMatchQuantizeH) {
  Random rng(77);
  std::vector<float> values{0.0f,
                            -0.0f,
                            0.5f,
                            -0.5f,
                            1.5f,
                            2.5f,
                            -2.5f,
                            126.5f,
                            127.5f,
                            -128.5f,
                            0.49999997f,
                            1e30f,
                            -1e30f,
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(),
                            3.824000835418701f,
                            6.5f};
  for (int i = 0; i < 200000; ++i) values.push_back(rng.uniform(int(rng.integer(-10, 9))));
  for (float v : values) {
    EXPECT_EQ(cuda::num::int8_round_half_away(v), quantize::int8_round_half_away(v)) << v;
    EXPECT_EQ(cuda::num::int8_round_half_even(v), quantize::int8_round_half_even(v)) << v;
  }
  const float scales[] = {1.7f, 0.013f, 3.0f};
  const float offsets[] = {0.0f, 0.5f, -1.25f};
  for (Numerics numerics : {Numerics::atlas_a2, Numerics::ascend_950})
    for (int s = 0; s < 3; ++s) {
      const quantize::StaticParams params =
          quantize::static_params(numerics, &scales[s], &offsets[s]);
      const bool ascend_950 = numerics == Numerics::ascend_950;
      for (size_t i = 0; i < values.size(); i += 7) {
        const float v = values[i] * 64.0f;
        EXPECT_EQ(cuda::num::static_quantize(v, params.scale, params.offset, ascend_950),
                  quantize::static_quantize(v, params))
            << v;
      }
      for (size_t i = 0; i < values.size(); i += 11) {
        const float m = std::fabs(values[i]) * 100.0f;
        EXPECT_EQ(float_bits(cuda::num::dynamic_scale(m, ascend_950)),
                  float_bits(quantize::dynamic_scale(m, numerics)))
            << m;
      }
    }
}

TEST(CudaHostLogic, GradIndexMessagesMatchTheCpuCheck) {
  MoeInitRoutingGradPlan plan;
  plan.num_rows = 3;
  plan.top_k = 2;
  plan.source_rows = 6;
  plan.skip_from = std::numeric_limits<int64_t>::max();
  for (int32_t bad : {99, 6, -2, std::numeric_limits<int32_t>::min()}) {
    std::vector<int32_t> idx{0, -1, 2, 3, 4, 5};
    idx[5] = bad;
    const Status cpu = check_moe_init_routing_grad_indices(idx.data(), plan);
    const Status gpu = cuda::grad_index_error(plan, 5, bad);
    EXPECT_EQ(cpu.code(), StatusCode::index_out_of_range);
    EXPECT_EQ(gpu.code(), cpu.code());
    EXPECT_EQ(gpu.message(), cpu.message());
  }
  // The example, word for word.
  EXPECT_EQ(cuda::grad_index_error(plan, 5, 99).message(),
            "moe_init_routing_grad: expanded_row_idx[5] = 99 is outside [0, 6)");
}

TEST(CudaHostLogic, V2ExpertIdMessagesMatchTheCpuCheck) {
  for (int64_t limit : {int64_t(4), std::numeric_limits<int64_t>::max()}) {
    MoeInitRoutingV2Plan plan;
    plan.num_rows = 2;
    plan.top_k = 3;
    plan.expert_id_limit = limit;
    for (int32_t bad : {-1, -7, 4, 1000}) {
      if (limit == std::numeric_limits<int64_t>::max() && bad >= 0) continue;
      std::vector<int32_t> ids{0, 1, 2, 3, 0, 1};
      ids[4] = bad;
      const Status cpu = check_moe_init_routing_v2_expert_idx(ids.data(), plan);
      const Status gpu = cuda::v2_expert_id_error(plan.top_k, limit, 4, bad);
      EXPECT_EQ(cpu.code(), StatusCode::index_out_of_range);
      EXPECT_EQ(gpu.code(), cpu.code());
      EXPECT_EQ(gpu.message(), cpu.message());
    }
  }
}

}  // namespace
}  // namespace moe_routing
