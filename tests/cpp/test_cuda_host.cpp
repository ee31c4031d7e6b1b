// The CUDA backend's logic on the CPU, so that it is checked on every machine that builds with
// MOE_ROUTING_CUDA, GPU or not:
//  * the backward kernel's body (src/cuda/grad_body.cuh: the order walk, the pairwise-tree merge,
//    the loads-in-flight shapes, the thread mapping) run as __host__ code over a simulated grid,
//    for every instantiation the launcher can pick, bitwise against the reference backend;
//  * the forward's kernels (src/cuda/routing_body.cuh: keys, bounds, expanded_row_idx, the row
//    copies in every access width, static and dynamic quantisation, the counts) run as __host__
//    code over their index spaces in the launcher's order, with a stable sort standing in for
//    CUB's, bitwise against the reference backend for every configuration of both APIs;
//  * the int8 quantisation helpers of src/cuda/numerics.cuh against quantize.h;
//  * the CUDA launchers' index-error messages against the CPU checks', word for word.
// The device-only parts (intrinsics, CUB, launches) are covered by test_cuda_gpu.cpp on a machine
// with a GPU.
#include <vector_types.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "cuda/cuda_backend.h"
#include "cuda/grad_body.cuh"
#include "cuda/numerics.cuh"
#include "cuda/routing_body.cuh"
#include "grad_cases.h"
#include "ops/moe_init_routing/meta.h"
#include "params/quantize.h"
#include "routing_cases.h"

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
  // K = 5: ((a0 + a4) + a1) + (a2 + a3) (docs/spec/moe_init_routing.md §1.6 table).
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
            "moe_init_routing_grad: expanded_row_idx[5] must be in [0, 6), got 99");
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

// ---- the forward's kernels on the CPU ----------------------------------------------------------

using cuda::Flags;
using cuda::RowIdxArgs;
using cuda::RowsArgs;
using detail::CountFormat;
using detail::RoutingProblem;

/// The positions [0, pairs) stably sorted by the low `bits` bits of their keys, as CUB's
/// DeviceRadixSort::SortPairs over bits [0, bits) with the positions as values; `sorted_keys`
/// receives the (whole) keys in that order.
std::vector<int32_t> radix_sort(const std::vector<uint32_t>& keys, int bits,
                                std::vector<uint32_t>* sorted_keys) {
  const uint32_t mask = bits >= 32 ? 0xffffffffu : (uint32_t(1) << bits) - 1;
  std::vector<int32_t> order(keys.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return (keys[a] & mask) < (keys[b] & mask); });
  sorted_keys->resize(keys.size());
  for (size_t d = 0; d < order.size(); ++d) (*sorted_keys)[d] = keys[size_t(order[d])];
  return order;
}

/// quant_mode -1: scatter_rows then zero_rows, every lane of every group, in access type T.
template <class T>
void simulate_copy_rows(const RowsArgs& a, int64_t routed, int64_t row_bytes) {
  constexpr int kUnroll = 4, kThreads = 256;  // as routing_kernels.cu
  const int64_t n = row_bytes / int64_t(sizeof(T));
  const int lanes = 1 << cuda::copy_lanes_log2(n, kUnroll, kThreads);
  const int64_t limit = cuda::rows_with_data(a, routed);
  for (int64_t token = 0; token < a.num_rows; ++token)
    for (int lane = 0; lane < lanes; ++lane)
      cuda::scatter_token<T, kUnroll>(a, limit, token, lane, lanes, n);
  for (int64_t dest = a.drop_pad ? 0 : limit; dest < a.rows; ++dest)
    for (int lane = 0; lane < lanes; ++lane) cuda::zero_row<T>(a, routed, dest, lane, lanes, n);
}

/// quant_mode 0 and 1, one "block" per destination row; the dynamic row maximum is reduced in
/// `threads` interleaved partial maxima, as the block's threads reduce it.
template <class Tag>
void simulate_quant_rows(const RowsArgs& a, int64_t routed, int64_t quant_mode) {
  constexpr int kThreads = 7;  // any interleaving gives the same maximum
  const int64_t H = a.hidden;
  for (int64_t dest = 0; dest < a.rows; ++dest) {
    const int64_t p = cuda::row_source(a, dest, routed);
    if (quant_mode == 0) {
      cuda::static_quant_columns<Tag>(a, cuda::static_quant_params(a), dest, p, 0, 1);
      cuda::write_topk_weight(a, dest, p);
      continue;
    }
    int8_t* out = static_cast<int8_t*>(a.expanded_x) + dest * H;
    if (p < 0) {
      for (int64_t j = 0; j < H; ++j) out[j] = 0;
      a.expanded_scale[dest] = 0.0f;
      cuda::write_topk_weight(a, dest, p);
      continue;
    }
    const auto* in = static_cast<const typename Tag::Storage*>(a.x) + (p / a.top_k) * H;
    const float* smooth = cuda::smooth_row(a, p);
    float max[kThreads] = {};
    int nan_seen[kThreads] = {};
    for (int64_t j = 0; j < H; ++j)
      cuda::abs_max_step(cuda::dynamic_f<Tag>(in, smooth, j), &max[j % kThreads],
                         &nan_seen[j % kThreads]);
    float m = 0.0f;
    int any_nan = 0;
    for (int t = 0; t < kThreads; ++t) {
      m = max[t] > m ? max[t] : m;
      any_nan |= nan_seen[t];
    }
    const float sc = cuda::dynamic_row_scale(m, any_nan, a.ascend_950);
    for (int64_t j = 0; j < H; ++j)
      out[j] =
          cuda::num::int8_round_half_away(cuda::num::div(cuda::dynamic_f<Tag>(in, smooth, j), sc));
    a.expanded_scale[dest] = cuda::num::canonical(sc);
    cuda::write_topk_weight(a, dest, p);
  }
}

/// cuda::moe_init_routing's steps (routing_kernels.cu) with each kernel's body run over its index
/// space on the CPU. Returns the V2 API's id error as the launcher does.
Status simulate_forward(const RoutingProblem& pr, bool reject_unrouted) {
  const int64_t P = pr.pairs(), start = pr.range_start, end = pr.range_end;
  const int64_t range = end - start;
  const bool needs_bounds = pr.needs_counts();
  const bool track_max = range > cuda::kInt32Max;
  Flags flags{cuda::kNoError, 0, 0, 0};
  const size_t pairs = static_cast<size_t>(P);
  std::vector<uint32_t> keys(pairs), sorted_keys;
  std::vector<int32_t> rank(pairs), first(needs_bounds ? size_t(range) : 0),
      bound_end(needs_bounds ? size_t(range) : 0);

  // 1. keys, the V2 check and the largest key.
  for (int64_t p = 0; p < P; ++p) {
    keys[size_t(p)] = cuda::routing_key(pr.expert_idx[p], start, end);
    if (keys[size_t(p)] == cuda::kNotRouted) {
      if (reject_unrouted) flags.first_bad = std::min(flags.first_bad, uint32_t(p));
    } else {
      flags.max_key = std::max(flags.max_key, keys[size_t(p)]);
    }
  }
  if (reject_unrouted && flags.first_bad != cuda::kNoError)
    return cuda::v2_expert_id_error(pr.top_k, end, int64_t(flags.first_bad),
                                    pr.expert_idx[flags.first_bad]);
  int bits = cuda::key_bits(uint64_t(std::min<int64_t>(range, int64_t(1) << 32)));
  if (track_max) bits = cuda::key_bits(uint64_t(flags.max_key) + 1);

  // 2-4. the sorts and the bounds.
  std::vector<int32_t> order = radix_sort(keys, bits, &sorted_keys);
  for (int64_t d = 0; d < P; ++d)
    cuda::bounds_at(sorted_keys.data(), P, d, needs_bounds ? first.data() : nullptr,
                    needs_bounds ? bound_end.data() : nullptr, &flags.routed);
  std::vector<int32_t> tail_order;
  if (cuda::scatter_tail(pr)) {
    for (int64_t p = 0; p < P; ++p) keys[size_t(p)] = cuda::tail_key(pr.expert_idx[p], start, end);
    std::vector<uint32_t> unused;
    tail_order = radix_sort(keys, 32, &unused);
  }

  // 5. expanded_row_idx.
  cuda::RoutingBuffers b{};
  b.flags = &flags;
  b.sorted_keys = sorted_keys.data();
  b.order = order.data();
  b.tail_order = tail_order.data();
  b.rank = rank.data();
  b.first = first.data();
  b.end = bound_end.data();
  const RowIdxArgs r = cuda::row_idx_args(pr, b);
  for (int64_t d = 0; d < P; ++d) cuda::row_idx_at(r, flags.routed, d);

  // 6. the rows.
  if (pr.expanded_rows > 0) {
    const RowsArgs a = cuda::rows_args(pr, b);
    if (pr.quant_mode == -1) {
      const int64_t row_bytes = pr.hidden * int64_t(dtype_size(pr.x_dtype));
      switch (cuda::copy_width(row_bytes, pr.x, pr.expanded_x)) {
        case 16: simulate_copy_rows<uint4>(a, flags.routed, row_bytes); break;
        case 8: simulate_copy_rows<uint2>(a, flags.routed, row_bytes); break;
        case 4: simulate_copy_rows<uint32_t>(a, flags.routed, row_bytes); break;
        case 2: simulate_copy_rows<uint16_t>(a, flags.routed, row_bytes); break;
        default: simulate_copy_rows<uint8_t>(a, flags.routed, row_bytes); break;
      }
    } else if (pr.x_dtype == DType::float32) {
      simulate_quant_rows<cuda::num::Float32>(a, flags.routed, pr.quant_mode);
    } else if (pr.x_dtype == DType::float16) {
      simulate_quant_rows<cuda::num::Float16>(a, flags.routed, pr.quant_mode);
    } else {
      simulate_quant_rows<cuda::num::Bfloat16>(a, flags.routed, pr.quant_mode);
    }
  }

  // 7. the counts (the kernel's block-wide scans, sequentially).
  if (pr.count_format != CountFormat::none) {
    const cuda::CountArgs c = cuda::count_args(pr, b);
    int64_t running = 0, row = 0;
    for (int64_t j = 0; j < range; ++j) {
      const int64_t count = cuda::count_at(c, j);
      if (pr.count_format == CountFormat::count) cuda::write_count(c, j, count);
      if (pr.count_format == CountFormat::cumsum) cuda::write_count(c, j, running += count);
      if (pr.count_format == CountFormat::key_value && count > 0)
        cuda::write_key_value(c, row++, j, count);
    }
    if (pr.count_format == CountFormat::key_value)
      for (; row < pr.expert_num; ++row) {
        cuda::write_count(c, 2 * row, 0);
        cuda::write_count(c, 2 * row + 1, 0);
      }
  }
  return Status::ok();
}

using testing::ForwardCase;
using testing::ForwardResult;
using testing::Tensor;
using testing::V2Case;
using testing::V2Result;

/// The torch API case through the simulated kernels, outputs allocated and poisoned as run_forward
/// does.
ForwardResult simulate(ForwardCase& c) {
  ForwardResult r;
  if (!testing::plan_outputs(c, &r)) return r;
  RoutingProblem pr = detail::routing_problem(r.plan);
  pr.x = c.x.view().data;
  pr.expert_idx = c.expert_idx.as<int32_t>();
  if (r.plan.has_scale) pr.scale = c.scale.as<float>();
  if (r.plan.has_offset) pr.offset = c.offset.as<float>();
  if (r.plan.has_topk_weight) pr.topk_weight = c.topk_weight.as<float>();
  pr.expanded_x = r.expanded_x.view().data;
  pr.expanded_row_idx = r.expanded_row_idx.as<int32_t>();
  if (r.plan.expanded_scale.produced) pr.expanded_scale = r.expanded_scale.as<float>();
  if (r.plan.expanded_topk_weight.produced)
    pr.expanded_topk_weight = r.expanded_topk_weight.as<float>();
  if (r.plan.expert_tokens_num_flag) pr.counts = r.counts.view().data;
  r.status = simulate_forward(pr, false);
  return r;
}

/// The V2 case through the simulated kernels (ids are checked by the key pass, as on the GPU).
V2Result simulate(V2Case& c) {
  V2Result r;
  if (!testing::plan_outputs(c, &r)) return r;
  RoutingProblem pr = detail::routing_problem(r.plan);
  pr.x = c.x.view().data;
  pr.expert_idx = c.expert_idx.as<int32_t>();
  pr.expanded_x = r.expanded_x.view().data;
  pr.expanded_row_idx = r.expanded_row_idx.as<int32_t>();
  if (r.plan.expert_tokens_count_or_cumsum.produced)
    pr.counts = r.counts.view().data;
  else if (r.plan.expert_tokens_before_capacity.produced)
    pr.counts = r.before_capacity.view().data;
  r.status = simulate_forward(pr, true);
  return r;
}

TEST(CudaHostLogic, ForwardKernelBodiesMatchTheReferenceForEveryConfiguration) {
  Random rng(31337);
  const testing::Runner reference{Backend::reference, CpuIsa::automatic, 1};
  int compared = 0;
  for (DType dtype : {DType::float32, DType::float16, DType::bfloat16})
    for (testing::Scenario scenario : testing::kScenarios)
      for (int64_t quant : {-1, 0, 1})
        for (int64_t row_idx_type : {0, 1})
          for (int repeat = 0; repeat < 3; ++repeat) {
            if (scenario == testing::Scenario::drop_pad && (quant != -1 || row_idx_type != 0))
              continue;
            ForwardCase c =
                testing::make_forward_case(rng, dtype, scenario, quant, row_idx_type, false);
            SCOPED_TRACE(::testing::Message()
                         << dtype_name(dtype) << ' ' << testing::scenario_name(scenario)
                         << " quant " << quant << " row_idx_type " << row_idx_type
                         << " N=" << c.x.shape[0] << " K=" << c.expert_idx.shape[1]
                         << " H=" << c.x.shape[1] << " E=" << c.attrs.expert_num);
            const ForwardResult expected = testing::run_forward(c, reference);
            ASSERT_TRUE(expected.status.is_ok()) << expected.status.message();
            EXPECT_TRUE(testing::same_result(expected, simulate(c)));
            ++compared;
          }
  EXPECT_GT(compared, 150);
}

TEST(CudaHostLogic, V2KernelBodiesMatchTheReferenceAndRejectBadIdsAlike) {
  Random rng(4711);
  const testing::Runner reference{Backend::reference, CpuIsa::automatic, 1};
  for (DType dtype : {DType::float32, DType::float16, DType::bfloat16})
    for (int mode = 0; mode < 3; ++mode)  // dropless, active, drop-pad
      for (int repeat = 0; repeat < 6; ++repeat) {
        V2Case c = testing::make_v2_case(rng, dtype, mode, false);
        if (repeat == 5) {  // one bad id: the key pass finds the first, nothing is written
          int32_t* ids = c.expert_idx.as<int32_t>();
          ids[rng.integer(0, c.expert_idx.numel() - 1)] = rng.integer(0, 1) ? -3 : 99;
        }
        SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " mode " << mode << " repeat "
                                          << repeat << " N=" << c.x.shape[0]);
        const V2Result expected = testing::run_v2(c, reference);
        const V2Result got = simulate(c);
        EXPECT_TRUE(testing::same_result(expected, got));
        EXPECT_EQ(got.status.message(), expected.status.message());
      }
}

TEST(CudaHostLogic, LauncherChoicesAreExact) {
  EXPECT_EQ(cuda::key_bits(0), 1);
  EXPECT_EQ(cuda::key_bits(1), 1);
  EXPECT_EQ(cuda::key_bits(2), 2);
  EXPECT_EQ(cuda::key_bits(255), 8);
  EXPECT_EQ(cuda::key_bits(256), 9);
  EXPECT_EQ(cuda::key_bits(uint64_t(1) << 32), 32);
  alignas(16) static char buffer[64];
  EXPECT_EQ(cuda::copy_width(4096, buffer, buffer + 32), 16u);
  EXPECT_EQ(cuda::copy_width(4096, buffer, buffer + 8), 8u);
  EXPECT_EQ(cuda::copy_width(6, buffer, buffer + 16), 2u);
  EXPECT_EQ(cuda::copy_width(4096, buffer + 1, buffer), 1u);
  EXPECT_EQ(cuda::copy_lanes_log2(1, 4, 256), 0);
  EXPECT_EQ(cuda::copy_lanes_log2(4096, 4, 256), 8);
  EXPECT_EQ(cuda::copy_lanes_log2(17, 4, 256), 3);
}

}  // namespace
}  // namespace moe_routing
