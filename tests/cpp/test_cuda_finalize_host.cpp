// The CUDA backend of moe_finalize_routing(_grad) run on the CPU, so that it is checked on every
// machine that builds with MOE_ROUTING_CUDA, GPU or not: the kernels' bodies
// (src/cuda/finalize_body.cuh) over every item, bitwise against the reference; the device-side
// index checks' verdicts against the CPU checks, message for message.
#include "cuda/cuda_backend.h"
#include "cuda/finalize_body.cuh"
#include "finalize_cases.h"
#include "ops/moe_finalize_routing_grad/meta.h"

namespace moe_routing {
namespace {

using testing::FinalizeCase;
using testing::FinalizeGradCase;
using testing::FloatBuffer;

/// The forward body over every item of a case.
FloatBuffer run_forward_body(FinalizeCase& c) {
  MoeFinalizeRoutingPlan plan;
  FloatBuffer out(c.dtype, c.N * c.H);
  out.poison();
  const MoeFinalizeRoutingInputs in = c.inputs();
  EXPECT_TRUE(infer_moe_finalize_routing(in, c.attrs, &plan).is_ok());
  const detail::FinalizeRoutingProblem p =
      detail::make_finalize_routing_problem(plan, in, out.data());
  for (int64_t i = 0; i < c.N; ++i)
    for (int64_t j = 0; j < c.H; ++j) cuda::finalize::finalize_item(p, i, j);
  return out;
}

TEST(CudaFinalizeHost, ForwardBodyMatchesTheReference) {
  testing::Random rng(606);
  const testing::Runner reference{Backend::reference, CpuIsa::automatic, 1};
  testing::for_each_forward_variant([&](DType dtype, int64_t mode, Numerics numerics,
                                        const testing::FinalizeOptions& o,
                                        const std::string& name) {
    FinalizeCase c = testing::make_finalize_case(rng, dtype, mode, numerics, o, rng.integer(1, 6),
                                                 rng.integer(1, 5), 19);
    testing::fill_special(rng, {&c.expanded_x, &c.x1});
    EXPECT_TRUE(
        testing::bitwise_equal(testing::run_finalize_case(c, reference), run_forward_body(c)))
        << name;
  });
}

/// The pair lists of a problem, grouped by `key_of` in increasing pair index (the lists the GPU
/// builds with its stable sort).
template <class KeyOf>
void host_pair_lists(const detail::FinalizeRoutingGradProblem& p, int64_t keys, KeyOf key_of,
                     std::vector<int32_t>* offsets, std::vector<int32_t>* pairs) {
  offsets->assign(size_t(keys) + 1, 0);
  pairs->clear();
  for (int64_t k = 0; k < keys; ++k) {
    (*offsets)[size_t(k)] = int32_t(pairs->size());
    for (int64_t q = 0; q < p.num_rows * p.top_k; ++q)
      if (!p.dropped(q) && key_of(q) == k) pairs->push_back(int32_t(q));
  }
  (*offsets)[size_t(keys)] = int32_t(pairs->size());
}

/// The grad bodies over every item of a case.
testing::GradResult run_grad_bodies(FinalizeGradCase& c) {
  testing::GradResult r = testing::poisoned_grad_result(c);
  const MoeFinalizeRoutingGradOutputs out = testing::grad_outputs(c, r);
  MoeFinalizeRoutingGradPlan plan;
  const MoeFinalizeRoutingGradInputs in = c.inputs();
  EXPECT_TRUE(
      detail::validate_moe_finalize_routing_grad(in, c.attrs, out, ExecConfig(), &plan).is_ok());
  detail::FinalizeRoutingGradProblem p = detail::make_finalize_routing_grad_problem(plan, in, out);
  std::vector<int32_t> row_offsets, row_pairs, expert_offsets, expert_pairs;
  host_pair_lists(
      p, p.expanded_rows, [&](int64_t q) { return p.expanded_row_idx[q]; }, &row_offsets,
      &row_pairs);
  p.row_offsets = row_offsets.data(), p.row_pairs = row_pairs.data();
  if (p.grad_bias != nullptr) {
    host_pair_lists(
        p, p.expert_num, [&](int64_t q) { return p.expert_idx[q]; }, &expert_offsets,
        &expert_pairs);
    p.expert_offsets = expert_offsets.data(), p.expert_pairs = expert_pairs.data();
  }
  for (int64_t row = 0; row < p.expanded_rows; ++row)
    for (int64_t j = 0; j < p.hidden; ++j) cuda::finalize::grad_row_item(p, row, j);
  for (int64_t e = 0; p.grad_bias != nullptr && e < p.expert_num; ++e)
    for (int64_t j = 0; j < p.hidden; ++j) cuda::finalize::grad_bias_item(p, e, j);
  for (int64_t q = 0; p.grad_scales != nullptr && q < p.num_rows * p.top_k; ++q)
    cuda::finalize::grad_scales_item(p, q);
  return r;
}

TEST(CudaFinalizeHost, GradBodiesMatchTheReference) {
  testing::Random rng(707);
  const testing::Runner reference{Backend::reference, CpuIsa::automatic, 1};
  int compared = 0;
  for (const testing::DtypeVariant& d : testing::kFinalizeDtypes)
    for (int64_t mode = 0; mode < 2; ++mode)
      for (Numerics numerics : testing::kFinalizeNumerics)
        for (int64_t h : {1, 40, 64, 65, 600, 8300, 2 * 14016 + 517}) {
          testing::GradOptions o;
          o.bias = h % 2 == 0, o.grad_bias = o.bias, o.mixed_scales = d.mixed_scales;
          o.duplicates = true;
          FinalizeGradCase c = testing::make_finalize_grad_case(rng, d.dtype, mode, numerics, o,
                                                                h > 1000 ? 2 : 5, 3, h);
          testing::fill_special(rng, {&c.grad_y});
          EXPECT_TRUE(testing::grad_results_equal(testing::run_finalize_grad_case(c, reference),
                                                  run_grad_bodies(c)))
              << dtype_name(d.dtype) << " mode " << mode << ' ' << numerics_name(numerics)
              << " H=" << h;
          ++compared;
        }
  EXPECT_EQ(compared, 4 * 2 * 2 * 7);
}

TEST(CudaFinalizeHost, IndexVerdictsGiveTheCpuMessages) {
  testing::Random rng(808);
  for (int trial = 0; trial < 200; ++trial) {
    testing::FinalizeOptions o;
    o.bias = true, o.scales = true, o.special = trial % 2 == 0;
    FinalizeCase c =
        testing::make_finalize_case(rng, DType::float32, trial % 4, Numerics::atlas_a2, o, 4, 3, 2);
    // Spoil some indices and expert ids.
    for (int32_t& r : c.idx)
      if (rng.integer(0, 20) == 0) r = int32_t(rng.integer(-3, int64_t(c.idx.size()) + 3));
    for (int32_t& e : c.expert_idx)
      if (rng.integer(0, 10) == 0) e = int32_t(rng.integer(-2, c.E + 2));
    MoeFinalizeRoutingPlan plan;
    const MoeFinalizeRoutingInputs in = c.inputs();
    ASSERT_TRUE(infer_moe_finalize_routing(in, c.attrs, &plan).is_ok());
    const detail::FinalizeRoutingProblem p =
        detail::make_finalize_routing_problem(plan, in, nullptr);
    cuda::IndexVerdict verdict;  // what the check kernel's atomicMin leaves
    for (int64_t i = 0; i < c.N; ++i)
      for (int64_t t = 0; t < c.K; ++t) {
        const auto v = cuda::finalize::check_pair(p, plan.skip_to, plan.expert_num, i, t);
        const uint32_t position = uint32_t(p.index_position(i, t)), q = uint32_t(i * c.K + t);
        if (!v.row_ok && position < verdict.row_position) verdict.row_position = position;
        if (!v.expert_ok && q < verdict.expert_position) verdict.expert_position = q;
      }
    if (verdict.row_position != cuda::IndexVerdict::kNoBadIndex)
      verdict.row_value = c.idx[verdict.row_position];
    if (verdict.expert_position != cuda::IndexVerdict::kNoBadIndex)
      verdict.expert_value = c.expert_idx[verdict.expert_position];
    const Status cpu = check_moe_finalize_routing_indices(c.idx.data(), c.expert_idx.data(), plan);
    const Status gpu = cuda::finalize_verdict_status(
        "moe_finalize_routing: ", verdict, plan.expanded_rows, plan.skip_to, c.K, plan.expert_num);
    EXPECT_EQ(cpu.code(), gpu.code()) << cpu.message();
    EXPECT_EQ(cpu.message(), gpu.message());
  }
}

TEST(CudaFinalizeHost, GradIndexVerdictsGiveTheCpuMessages) {
  testing::Random rng(909);
  for (int trial = 0; trial < 200; ++trial) {
    testing::GradOptions o;
    o.bias = true;
    FinalizeGradCase c = testing::make_finalize_grad_case(rng, DType::float32, trial % 2,
                                                          Numerics::atlas_a2, o, 4, 3, 2);
    for (int32_t& r : c.idx)
      if (rng.integer(0, 20) == 0) r = int32_t(rng.integer(-3, int64_t(c.idx.size()) + 3));
    for (int32_t& e : c.expert_idx)
      if (rng.integer(0, 10) == 0) e = int32_t(rng.integer(-2, c.E + 2));
    MoeFinalizeRoutingGradPlan plan;
    const MoeFinalizeRoutingGradInputs in = c.inputs();
    ASSERT_TRUE(infer_moe_finalize_routing_grad(in, c.attrs, &plan).is_ok());
    const detail::FinalizeRoutingGradProblem p =
        detail::make_finalize_routing_grad_problem(plan, in, MoeFinalizeRoutingGradOutputs());
    cuda::IndexVerdict verdict;
    for (int64_t q = int64_t(c.idx.size()) - 1; q >= 0; --q) {
      const auto v = cuda::finalize::check_grad_pair(p, plan.skip_to, q);
      if (!v.row_ok) verdict.row_position = uint32_t(q), verdict.row_value = c.idx[size_t(q)];
      if (!v.expert_ok)
        verdict.expert_position = uint32_t(q), verdict.expert_value = c.expert_idx[size_t(q)];
    }
    const Status cpu =
        check_moe_finalize_routing_grad_indices(c.idx.data(), c.expert_idx.data(), plan);
    const Status gpu =
        cuda::finalize_verdict_status("moe_finalize_routing_grad: ", verdict, plan.expanded_rows,
                                      plan.skip_to, c.K, plan.expert_num);
    EXPECT_EQ(cpu.code(), gpu.code()) << cpu.message();
    EXPECT_EQ(cpu.message(), gpu.message());
  }
}

TEST(CudaFinalizeHost, SortKeyBits) {
  EXPECT_EQ(cuda::finalize_sort_key_bits(1), 1);
  EXPECT_EQ(cuda::finalize_sort_key_bits(2), 1);
  EXPECT_EQ(cuda::finalize_sort_key_bits(3), 2);
  EXPECT_EQ(cuda::finalize_sort_key_bits(1024), 10);
  EXPECT_EQ(cuda::finalize_sort_key_bits(1025), 11);
  EXPECT_EQ(cuda::finalize_sort_key_bits(int64_t(1) << 31), 31);
}

}  // namespace
}  // namespace moe_routing
