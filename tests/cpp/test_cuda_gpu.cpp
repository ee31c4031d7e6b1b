// The CUDA backend on a GPU, for both operators: every scenario, dtype, order, quantisation
// numerics and row_idx_type, bitwise against the CPU backend on random inputs (outputs poisoned on
// the device first, so unwritten elements show); the spec's examples; bad indices give the CPU's
// message word for word and leave every output untouched; canonical NaNs; streams; host pointers
// rejected. Every test skips, saying why, when no GPU is present.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>

#include "cases/model_shapes.h"
#include "cuda/device_memory.h"
#include "cuda_test_util.h"
#include "grad_cases.h"
#include "routing_cases.h"

namespace moe_routing {
namespace {

using testing::FloatBuffer;
using testing::ForwardCase;
using testing::ForwardResult;
using testing::GradCase;
using testing::Random;
using testing::random_values;
using testing::Scenario;
using testing::Tensor;
using testing::V2Case;
using testing::V2Result;

const testing::Runner kCpu{Backend::cpu, CpuIsa::automatic, 4};
const DType kFloatDtypes[] = {DType::float32, DType::float16, DType::bfloat16};
constexpr uint8_t kPoison = 0x5A;

/// Device copies of host tensors, kept alive for one call.
class DeviceArena {
 public:
  /// The host tensor's bytes on the device (a view of the same shape and dtype on cuda), starting
  /// `offset_bytes` into the allocation (to test unaligned pointers); absent stays absent.
  TensorView upload(const TensorView& host, size_t offset_bytes = 0) {
    if (host.data == nullptr && host.ndim == 0) return TensorView();
    auto buffer = std::make_unique<cuda::DeviceBuffer>();
    EXPECT_TRUE(buffer->allocate(host.nbytes() + offset_bytes).is_ok());
    char* base = static_cast<char*>(buffer->data()) + offset_bytes;
    if (host.nbytes() > 0) {
      EXPECT_EQ(cudaMemcpy(base, host.data, host.nbytes(), cudaMemcpyHostToDevice), cudaSuccess);
    }
    TensorView view = host;
    view.data = base;
    view.device = Device::cuda;
    buffers_.push_back(std::move(buffer));
    return view;
  }
  /// An output of the spec's shape filled with kPoison (absent when not produced).
  TensorView output(const OutputSpec& spec, size_t offset_bytes = 0) {
    if (!spec.produced) return TensorView();
    auto buffer = std::make_unique<cuda::DeviceBuffer>();
    const size_t bytes = size_t(spec.numel()) * dtype_size(spec.dtype);
    EXPECT_TRUE(buffer->allocate(bytes + offset_bytes).is_ok());
    EXPECT_TRUE(buffer->fill(kPoison).is_ok());
    TensorView view(static_cast<char*>(buffer->data()) + offset_bytes, spec.dtype, spec.ndim,
                    spec.shape, Device::cuda);
    buffers_.push_back(std::move(buffer));
    return view;
  }

 private:
  std::vector<std::unique_ptr<cuda::DeviceBuffer>> buffers_;
};

/// Copies a device output back into a host tensor (absent stays absent).
Tensor download(const TensorView& device, const OutputSpec& spec) {
  if (!spec.produced) return Tensor();
  Tensor host = Tensor::from_spec(spec);
  if (!host.bytes.empty()) {
    EXPECT_EQ(cudaMemcpy(host.bytes.data(), device.data, host.bytes.size(), cudaMemcpyDeviceToHost),
              cudaSuccess);
  }
  return host;
}

// ---------------------------------------------------------------------------------------------
// moe_init_routing_grad
// ---------------------------------------------------------------------------------------------

/// Runs a grad case on the GPU (grad_expanded_x and grad_x `offset_bytes` into their buffers).
FloatBuffer run_grad_cuda(GradCase& c, Status* status, size_t offset_bytes = 0,
                          void* stream = nullptr) {
  DeviceArena arena;
  const TensorView grad = arena.upload(c.grad_view(), offset_bytes);
  const TensorView idx = arena.upload(c.idx_view());
  OutputSpec spec;
  spec.produced = true;
  spec.dtype = c.dtype;
  spec.ndim = 2;
  spec.shape[0] = c.num_rows;
  spec.shape[1] = c.hidden;
  const TensorView out = arena.output(spec, offset_bytes);
  ExecConfig config;
  config.stream = stream;
  *status = moe_init_routing_grad(grad, idx, c.attrs, out, config);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  FloatBuffer result(c.dtype, c.num_rows * c.hidden);
  if (!result.bytes.empty()) {
    EXPECT_EQ(cudaMemcpy(result.data(), out.data, result.bytes.size(), cudaMemcpyDeviceToHost),
              cudaSuccess);
  }
  return result;
}

TEST(CudaGrad, RandomCasesMatchTheCpuBitwise) {
  SKIP_WITHOUT_GPU();
  Random rng(2026);
  int compared = 0;
  for (DType dtype : kFloatDtypes)
    for (GradScenario scenario :
         {GradScenario::dropless, GradScenario::active, GradScenario::drop_pad})
      for (AccumulationOrder order : {AccumulationOrder::tree, AccumulationOrder::sequential})
        for (const testing::GradShape& s : testing::kGradShapes)
          for (size_t offset :
               {size_t(0), dtype_size(dtype)}) {  // aligned, then unaligned pointers
            GradCase c =
                testing::make_grad_case(rng, scenario, dtype, s.num_rows, s.top_k, s.hidden, 0.1);
            c.attrs.order = order;
            SCOPED_TRACE(::testing::Message()
                         << dtype_name(dtype) << ' ' << grad_scenario_name(scenario) << ' '
                         << accumulation_order_name(order) << " N=" << s.num_rows
                         << " K=" << s.top_k << " H=" << s.hidden << " offset " << offset);
            const FloatBuffer expected = testing::run_grad_case(c, kCpu);
            Status status;
            const FloatBuffer got = run_grad_cuda(c, &status, offset);
            ASSERT_TRUE(status.is_ok()) << status.message();
            EXPECT_TRUE(testing::bitwise_equal(expected, got));
            ++compared;
          }
  EXPECT_GT(compared, 500);
}

/// A grad case from explicit float values.
GradCase explicit_case(DType dtype, std::vector<int64_t> grad_shape,
                       const std::vector<float>& values, std::vector<int32_t> idx, int64_t top_k,
                       int64_t drop_pad_mode, int64_t active_num, AccumulationOrder order) {
  GradCase c;
  c.scenario = drop_pad_mode ? GradScenario::drop_pad
                             : (active_num ? GradScenario::active : GradScenario::dropless);
  c.dtype = dtype;
  c.top_k = top_k;
  c.num_rows = int64_t(idx.size()) / top_k;
  c.hidden = grad_shape.back();
  c.attrs.top_k = top_k;
  c.attrs.drop_pad_mode = drop_pad_mode;
  c.attrs.active_num = active_num;
  c.attrs.order = order;
  c.grad_shape = std::move(grad_shape);
  c.grad = FloatBuffer::from_floats(dtype, values);
  c.expanded_row_idx = std::move(idx);
  return c;
}

std::vector<float> values_of(const FloatBuffer& b) {
  std::vector<float> v;
  for (int64_t i = 0; i < b.count(); ++i) v.push_back(b.at(i));
  return v;
}

TEST(CudaGrad, SpecExamplesG1ToG5) {
  SKIP_WITHOUT_GPU();
  const float tiny = std::ldexp(1.0f, -30), e24 = std::ldexp(1.0f, -24);
  Status s;
  // G1: dropless, K=3, fp32; tree and sequential differ.
  for (AccumulationOrder order : {AccumulationOrder::tree, AccumulationOrder::sequential}) {
    GradCase g1 = explicit_case(DType::float32, {6, 2},
                                {-1, 0.5f, 0.5f, 0.5f, tiny, 0.25f, 0.125f, 2, 1, 3, 0.25f, -1},
                                {4, 0, 2, 1, 5, 3}, 3, 0, 0, order);
    const std::vector<float> got = values_of(run_grad_cuda(g1, &s));
    ASSERT_TRUE(s.is_ok()) << s.message();
    const float first = order == AccumulationOrder::tree ? 0.0f : tiny;
    EXPECT_EQ(got, (std::vector<float>{first, 3.75f, 0.875f, 1.5f}))
        << accumulation_order_name(order);
  }
  // G2: active, bf16: skip + the final RNE (1.00390625 -> 1.0).
  GradCase g2 = explicit_case(DType::bfloat16, {3, 2}, {1.0f, 0.00390625f, -2.5f, 3.0f, 0.5f, 1.0f},
                              {2, 0, 4, 3, 1, 5}, 2, 0, 3, AccumulationOrder::tree);
  EXPECT_EQ(values_of(run_grad_cuda(g2, &s)), (std::vector<float>{1.5f, 1.0f, 0, 0, -2.5f, 3.0f}));
  ASSERT_TRUE(s.is_ok()) << s.message();
  // G3: drop-pad, fp16.
  GradCase g3 = explicit_case(DType::float16, {3, 2, 1}, {1, 2, 4, 8, 16, 32},
                              {0, 2, 1, 4, -1, 3, -1, -1}, 2, 1, 0, AccumulationOrder::tree);
  EXPECT_EQ(values_of(run_grad_cuda(g3, &s)), (std::vector<float>{5, 18, 8, 0}));
  ASSERT_TRUE(s.is_ok()) << s.message();
  // G4: fp16 K=3: tree gives 0, sequential the subnormal 2^-24.
  for (AccumulationOrder order : {AccumulationOrder::tree, AccumulationOrder::sequential}) {
    GradCase g4 =
        explicit_case(DType::float16, {3, 1}, {1.0f, -1.0f, e24}, {0, 1, 2}, 3, 0, 0, order);
    EXPECT_EQ(values_of(run_grad_cuda(g4, &s)),
              (std::vector<float>{order == AccumulationOrder::tree ? 0.0f : e24}));
    ASSERT_TRUE(s.is_ok()) << s.message();
  }
  // G5: K=5 fp32: tree 2^-24, sequential 2^-23.
  for (AccumulationOrder order : {AccumulationOrder::tree, AccumulationOrder::sequential}) {
    GradCase g5 = explicit_case(DType::float32, {5, 1}, {1.0f, e24, -1.0f, e24, e24},
                                {0, 1, 2, 3, 4}, 5, 0, 0, order);
    EXPECT_EQ(values_of(run_grad_cuda(g5, &s)),
              (std::vector<float>{order == AccumulationOrder::tree ? e24 : 2 * e24}));
    ASSERT_TRUE(s.is_ok()) << s.message();
  }
}

TEST(CudaGrad, InvalidIndicesGiveTheCpuMessageAndWriteNothing) {
  SKIP_WITHOUT_GPU();
  struct Bad {
    std::vector<int32_t> idx;
    int64_t active_num;
  };
  const Bad cases[] = {
      {{0, 1, 2, 3, 4, 99}, 0},  // the example: expanded_row_idx[5] = 99
      {{0, -2, 2, 3, 4, 5}, 0},  // a negative other than -1
      {{0, 1, 7, 3, -5, 6}, 0},  // several: the first is reported
      {{0, 9, 2, -3, 1, 2}, 4},  // active: 9 >= active_num is skipped, -3 is not
      {{std::numeric_limits<int32_t>::min(), 1, 2, 3, 4, 5}, 0},
  };
  for (const Bad& bad : cases) {
    for (DType dtype : kFloatDtypes) {
      const int64_t rows = bad.active_num ? bad.active_num : 6;
      GradCase c = explicit_case(dtype, {rows, 3}, std::vector<float>(size_t(rows * 3), 1.0f),
                                 bad.idx, 2, 0, bad.active_num, AccumulationOrder::tree);
      FloatBuffer cpu_out(dtype, 9);
      cpu_out.poison();
      const Status cpu =
          moe_init_routing_grad(c.grad_view(), c.idx_view(), c.attrs,
                                TensorView(cpu_out.data(), dtype, {3, 3}), kCpu.config());
      ASSERT_EQ(cpu.code(), StatusCode::index_out_of_range);
      Status gpu;
      const FloatBuffer got = run_grad_cuda(c, &gpu);
      EXPECT_EQ(gpu.code(), cpu.code());
      EXPECT_EQ(gpu.message(), cpu.message());
      for (uint8_t byte : got.bytes) ASSERT_EQ(byte, kPoison) << "grad_x was written on error";
    }
  }
  GradCase c = explicit_case(DType::float32, {6, 1}, {1, 2, 3, 4, 5, 6}, {0, 1, 2, 3, 4, 99}, 2, 0,
                             0, AccumulationOrder::tree);
  Status gpu;
  run_grad_cuda(c, &gpu);
  EXPECT_EQ(gpu.message(), "moe_init_routing_grad: expanded_row_idx[5] must be in [0, 6), got 99");
}

TEST(CudaGrad, NanResultsAreCanonical) {
  SKIP_WITHOUT_GPU();
  // Payload and sign of NaN inputs vary; every NaN result is the canonical quiet NaN.
  const uint32_t f32_nans[] = {0x7f800001u, 0xffc12345u, 0x7fffffffu};
  for (DType dtype : kFloatDtypes)
    for (AccumulationOrder order : {AccumulationOrder::tree, AccumulationOrder::sequential}) {
      GradCase c = explicit_case(dtype, {8, 2}, std::vector<float>(16, 1.5f),
                                 {0, 1, 2, 3, 4, 5, 6, 7}, 4, 0, 0, order);
      for (int i = 0; i < 3; ++i) {
        if (dtype == DType::float32)
          std::memcpy(c.grad.bytes.data() + 4 * (5 * i), &f32_nans[i], 4);
        if (dtype == DType::float16)
          reinterpret_cast<uint16_t*>(c.grad.bytes.data())[5 * i] =
              uint16_t(0x7c01 + 0x8000 * (i & 1));
        if (dtype == DType::bfloat16)
          reinterpret_cast<uint16_t*>(c.grad.bytes.data())[5 * i] =
              uint16_t(0xff81 - 0x8000 * (i & 1));
      }
      const FloatBuffer expected = testing::run_grad_case(c, kCpu);
      Status s;
      const FloatBuffer got = run_grad_cuda(c, &s);
      ASSERT_TRUE(s.is_ok()) << s.message();
      EXPECT_TRUE(testing::bitwise_equal(expected, got)) << dtype_name(dtype);
      int nans = 0;
      for (int64_t i = 0; i < got.count(); ++i)
        if (std::isnan(got.at(i))) {
          ++nans;
          const uint32_t canonical = dtype == DType::float32   ? kCanonicalNanFloat32
                                     : dtype == DType::float16 ? kCanonicalNanFloat16
                                                               : kCanonicalNanBfloat16;
          EXPECT_EQ(got.bits(i), canonical) << dtype_name(dtype) << " element " << i;
        }
      EXPECT_GT(nans, 0);
    }
}

TEST(CudaGrad, RunsOnTheGivenStream) {
  SKIP_WITHOUT_GPU();
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  Random rng(3);
  GradCase c = testing::make_grad_case(rng, GradScenario::dropless, DType::bfloat16, 300, 8, 1024);
  const FloatBuffer expected = testing::run_grad_case(c, kCpu);
  Status s;
  const FloatBuffer got = run_grad_cuda(c, &s, 0, stream);
  ASSERT_TRUE(s.is_ok()) << s.message();
  EXPECT_TRUE(testing::bitwise_equal(expected, got));
  EXPECT_EQ(cudaStreamDestroy(stream), cudaSuccess);
}

TEST(CudaGrad, HostPointersAndHostBackendsAreRejected) {
  SKIP_WITHOUT_GPU();
  std::vector<float> grad(4, 1.0f), out(2);
  std::vector<int32_t> idx{0, 1, 2, 3};
  const TensorView g(grad.data(), DType::float32, {4, 1}, Device::cuda);
  const TensorView r(idx.data(), DType::int32, {4}, Device::cuda);
  const TensorView o(out.data(), DType::float32, {2, 1}, Device::cuda);
  Status s = moe_init_routing_grad(g, r, {2, 0, 0}, o);
  EXPECT_EQ(s.code(), StatusCode::invalid_argument);
  EXPECT_NE(s.message().find("must be CUDA device memory"), std::string::npos) << s.message();
  ExecConfig reference;
  reference.backend = Backend::reference;
  s = moe_init_routing_grad(g, r, {2, 0, 0}, o, reference);
  EXPECT_EQ(s.code(), StatusCode::not_supported);
  EXPECT_NE(s.message().find("backend must be automatic for cuda tensors"), std::string::npos)
      << s.message();
}

TEST(CudaGrad, EmptyInputsAreValid) {
  SKIP_WITHOUT_GPU();
  Random rng(4);
  for (const testing::GradShape& shape : testing::kEmptyGradShapes) {
    GradCase c = testing::make_grad_case(rng, GradScenario::dropless, DType::float16,
                                         shape.num_rows, shape.top_k, shape.hidden);
    Status s;
    run_grad_cuda(c, &s);
    EXPECT_TRUE(s.is_ok()) << s.message();
  }
}

// ---------------------------------------------------------------------------------------------
// moe_init_routing (torch API / V4) and moe_init_routing_v2
// ---------------------------------------------------------------------------------------------

/// run_forward on the GPU: inputs uploaded, produced outputs poisoned on the device.
ForwardResult run_forward_cuda(ForwardCase& c, bool pass_unproduced_outputs = false) {
  ForwardResult r;
  r.status = infer_moe_init_routing(c.x.view(), c.expert_idx.view(), c.scale.view(),
                                    c.offset.view(), c.topk_weight.view(), c.attrs, &r.plan);
  if (!r.status.is_ok()) return r;
  DeviceArena arena;
  const OutputSpec* specs[] = {&r.plan.expanded_x, &r.plan.expanded_row_idx,
                               &r.plan.expert_tokens_count_or_cumsum, &r.plan.expanded_scale,
                               &r.plan.expanded_topk_weight};
  TensorView views[5];
  OutputSpec passed[5];
  for (int i = 0; i < 5; ++i) {
    passed[i] = *specs[i];
    if (pass_unproduced_outputs) passed[i].produced = true;  // not-produced outputs with data
    views[i] = arena.output(passed[i]);
  }
  r.status = moe_init_routing(arena.upload(c.x.view()), arena.upload(c.expert_idx.view()),
                              arena.upload(c.scale.view()), arena.upload(c.offset.view()),
                              arena.upload(c.topk_weight.view()), c.attrs, views[0], views[1],
                              views[2], views[3], views[4]);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  Tensor* outputs[] = {&r.expanded_x, &r.expanded_row_idx, &r.counts, &r.expanded_scale,
                       &r.expanded_topk_weight};
  for (int i = 0; i < 5; ++i) *outputs[i] = download(views[i], passed[i]);
  return r;
}

V2Result run_v2_cuda(V2Case& c) {
  V2Result r;
  r.status = infer_moe_init_routing_v2(c.x.view(), c.expert_idx.view(), c.attrs, &r.plan);
  if (!r.status.is_ok()) return r;
  DeviceArena arena;
  const OutputSpec* specs[] = {&r.plan.expanded_x, &r.plan.expanded_row_idx,
                               &r.plan.expert_tokens_count_or_cumsum,
                               &r.plan.expert_tokens_before_capacity};
  TensorView views[4];
  for (int i = 0; i < 4; ++i) views[i] = arena.output(*specs[i]);
  r.status = moe_init_routing_v2(arena.upload(c.x.view()), arena.upload(c.expert_idx.view()),
                                 c.attrs, views[0], views[1], views[2], views[3]);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  Tensor* outputs[] = {&r.expanded_x, &r.expanded_row_idx, &r.counts, &r.before_capacity};
  for (int i = 0; i < 4; ++i) *outputs[i] = download(views[i], *specs[i]);
  return r;
}

TEST(CudaRouting, TorchApiMatchesTheCpuForEveryConfiguration) {
  SKIP_WITHOUT_GPU();
  Random rng(9001);
  int checked = 0;
  for (bool large : {false, true})
    for (DType dtype : kFloatDtypes)
      for (Scenario scenario : testing::kScenarios)
        for (int64_t quant : {-1, 0, 1})
          for (int64_t row_idx_type : {0, 1})
            for (int repeat = 0; repeat < (large ? 1 : 3); ++repeat) {
              if (scenario == Scenario::drop_pad && (quant != -1 || row_idx_type != 0)) continue;
              testing::ForwardCaseSpec spec;
              spec.dtype = dtype;
              spec.scenario = scenario;
              spec.quant_mode = quant;
              spec.row_idx_type = row_idx_type;
              spec.sizes = testing::gpu_forward_sizes(large);
              spec.drop_pad_ids_in_range = true;
              ForwardCase c = testing::make_forward_case(rng, spec);
              SCOPED_TRACE(::testing::Message()
                           << dtype_name(dtype) << " scenario " << int(scenario) << " quant "
                           << quant << " row_idx_type " << row_idx_type << " numerics "
                           << numerics_name(c.attrs.numerics) << " N=" << c.x.shape[0]
                           << " K=" << c.expert_idx.shape[1] << " H=" << c.x.shape[1]
                           << " E=" << c.attrs.expert_num);
              const ForwardResult expected = testing::run_forward(c, kCpu);
              ASSERT_TRUE(expected.status.is_ok()) << expected.status.message();
              const ForwardResult got = run_forward_cuda(c);
              ASSERT_TRUE(got.status.is_ok()) << got.status.message();
              EXPECT_TRUE(testing::same_result(expected, got));
              ++checked;
            }
  EXPECT_GT(checked, 150);
}

TEST(CudaRouting, Int8InputCopiesAndModelShapesMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  Random rng(12);
  // int8 x (quant_mode -1 copies bytes), and rows of model sizes with every row_idx_type.
  struct Shape {
    int64_t N, K, H, E;
    DType dtype;
  };
  auto model = [](const char* name, int64_t tokens, DType dtype) {
    const testing::ModelShape& m = testing::model_shape(name);
    return Shape{tokens, m.top_k, m.hidden, m.experts, dtype};
  };
  for (const Shape s :
       {Shape{300, 8, 77, 16, DType::int8}, model("deepseek-v3", 512, DType::bfloat16),
        model("qwen3-235b", 700, DType::float16), model("mixtral", 1000, DType::float32)})
    for (int64_t row_idx_type : {0, 1}) {
      ForwardCase c;
      c.x = Tensor(s.dtype, {s.N, s.H});
      for (size_t i = 0; i < c.x.bytes.size(); ++i) c.x.bytes[i] = uint8_t(rng.next());
      if (s.dtype == DType::float32 || s.dtype == DType::float16 || s.dtype == DType::bfloat16)
        c.x = Tensor::floats(s.dtype, {s.N, s.H}, random_values(rng, s.N * s.H));
      std::vector<int32_t> ids(size_t(s.N * s.K));
      for (int32_t& id : ids) id = int32_t(rng.integer(0, s.E - 1));
      c.expert_idx = Tensor::int32s({s.N, s.K}, ids);
      c.topk_weight = Tensor::floats(DType::float32, {s.N, s.K}, random_values(rng, s.N * s.K));
      c.attrs.expert_num = s.E;
      c.attrs.row_idx_type = row_idx_type;
      c.attrs.expert_tokens_num_flag = true;
      c.attrs.expert_tokens_num_type = 1;
      const ForwardResult expected = testing::run_forward(c, kCpu);
      ASSERT_TRUE(expected.status.is_ok()) << expected.status.message();
      const ForwardResult got = run_forward_cuda(c);
      ASSERT_TRUE(got.status.is_ok()) << got.status.message();
      EXPECT_TRUE(testing::same_result(expected, got)) << dtype_name(s.dtype) << " H=" << s.H;
    }
}

TEST(CudaRouting, HugeIdsAndTheRowIdxTypeOneTailMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  Random rng(5);
  const int32_t int_max = std::numeric_limits<int32_t>::max(),
                int_min = std::numeric_limits<int32_t>::min();
  const int64_t N = 2500, K = 4, H = 3;
  for (bool with_int_max : {true, false})
    for (int64_t count_type : {0, 2}) {
      const int32_t choices[] = {
          int_min, -1, 0, 3, 7, 99999, 80000, 1 << 20, with_int_max ? int_max : 1 << 24};
      std::vector<int32_t> ids(size_t(N * K));
      for (int32_t& id : ids) id = choices[rng.integer(0, 8)];
      ForwardCase c;
      c.x = Tensor::floats(DType::float32, {N, H}, random_values(rng, N * H));
      c.expert_idx = Tensor::int32s({N, K}, ids);
      c.attrs.expert_num = 8;
      c.attrs.has_active_expert_range = true;
      c.attrs.active_expert_range = {1, 8};
      c.attrs.row_idx_type = 1;
      c.attrs.expert_tokens_num_flag = true;
      c.attrs.expert_tokens_num_type = count_type;
      const ForwardResult expected = testing::run_forward(c, kCpu);
      ASSERT_TRUE(expected.status.is_ok()) << expected.status.message();
      EXPECT_TRUE(testing::same_result(expected, run_forward_cuda(c)));
    }
  // V2 without counts: ids need only be >= 0 (the key range comes from the largest id).
  const int32_t choices[] = {0, 5, 70000, int_max, 123456789, 65535, 65536};
  std::vector<int32_t> ids(size_t(N * K));
  for (int32_t& id : ids) id = choices[rng.integer(0, 6)];
  V2Case v2;
  v2.x = Tensor::floats(DType::bfloat16, {N, H}, random_values(rng, N * H));
  v2.expert_idx = Tensor::int32s({N, K}, ids);
  v2.attrs.active_num = 9000;
  const V2Result expected = testing::run_v2(v2, kCpu);
  ASSERT_TRUE(expected.status.is_ok()) << expected.status.message();
  EXPECT_TRUE(testing::same_result(expected, run_v2_cuda(v2)));
}

TEST(CudaRouting, V2MatchesTheCpuForEveryConfiguration) {
  SKIP_WITHOUT_GPU();
  Random rng(17);
  for (DType dtype : kFloatDtypes)
    for (int mode : {0, 1, 2})
      for (int repeat = 0; repeat < 6; ++repeat) {
        testing::V2CaseSpec spec;
        spec.dtype = dtype;
        spec.mode = mode;
        spec.sizes = testing::gpu_v2_sizes(repeat);
        V2Case c = testing::make_v2_case(rng, spec);
        SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " mode " << mode
                                          << " N=" << c.x.shape[0] << " K=" << c.expert_idx.shape[1]
                                          << " H=" << c.x.shape[1] << " E=" << c.attrs.expert_num);
        const V2Result expected = testing::run_v2(c, kCpu);
        ASSERT_TRUE(expected.status.is_ok()) << expected.status.message();
        const V2Result got = run_v2_cuda(c);
        ASSERT_TRUE(got.status.is_ok()) << got.status.message();
        EXPECT_TRUE(testing::same_result(expected, got));
      }
}

TEST(CudaRouting, V2BadExpertIdsGiveTheCpuMessageAndWriteNothing) {
  SKIP_WITHOUT_GPU();
  struct Bad {
    std::vector<int32_t> ids;
    int64_t flag, drop_pad;
  };
  for (const Bad& bad : {Bad{{0, 1, 2, 7, 1, 0}, 2, 0}, Bad{{0, 1, -3, 2, 9, 0}, 0, 0},
                         Bad{{0, 1, 2, 3, 4, 0}, 0, 1}, Bad{{-1, 0, 0, 0, 0, 0}, 1, 0}}) {
    V2Case c;
    c.x = Tensor::floats(DType::float16, {3, 4}, std::vector<float>(12, 2.0f));
    c.expert_idx = Tensor::int32s({3, 2}, bad.ids);
    c.attrs.expert_num = 4;
    c.attrs.expert_tokens_count_or_cumsum_flag = bad.flag;
    c.attrs.drop_pad_mode = bad.drop_pad;
    c.attrs.expert_capacity = bad.drop_pad ? 2 : 0;
    const V2Result cpu = testing::run_v2(c, kCpu);
    ASSERT_EQ(cpu.status.code(), StatusCode::index_out_of_range) << cpu.status.message();
    const V2Result gpu = run_v2_cuda(c);
    EXPECT_EQ(gpu.status.code(), cpu.status.code());
    EXPECT_EQ(gpu.status.message(), cpu.status.message());
    for (const Tensor* t :
         {&gpu.expanded_x, &gpu.expanded_row_idx, &gpu.counts, &gpu.before_capacity})
      for (uint8_t byte : t->bytes) ASSERT_EQ(byte, kPoison) << "an output was written on error";
  }
}

TEST(CudaRouting, SpecExampleF3AndQuantisationExamples) {
  SKIP_WITHOUT_GPU();
  // F3: active_expert_range [1, 3), both row_idx_types, the three count types.
  for (int64_t row_idx_type : {0, 1})
    for (int64_t count_type : {0, 1, 2}) {
      ForwardCase c;
      c.x = Tensor::floats(DType::float32, {3, 2}, {1, 2, 3, 4, 5, 6});
      c.expert_idx = Tensor::int32s({3, 2}, {1, 3, 0, 2, 2, 1});
      c.topk_weight = Tensor::floats(DType::float32, {3, 2}, {.1f, .2f, .3f, .4f, .5f, .6f});
      c.attrs.expert_num = 4;
      c.attrs.has_active_expert_range = true;
      c.attrs.active_expert_range = {1, 3};
      c.attrs.row_idx_type = row_idx_type;
      c.attrs.expert_tokens_num_flag = true;
      c.attrs.expert_tokens_num_type = count_type;
      const ForwardResult r = run_forward_cuda(c);
      ASSERT_TRUE(r.status.is_ok()) << r.status.message();
      const std::vector<int32_t> row_idx[] = {{0, -1, -1, 2, 3, 1}, {0, 5, 3, 4, 1, 2}};
      EXPECT_EQ(r.expanded_row_idx.values<int32_t>(), row_idx[row_idx_type]);
      EXPECT_EQ(r.expanded_x.float_values(),
                (std::vector<float>{1, 2, 5, 6, 3, 4, 5, 6, 0, 0, 0, 0}));
      EXPECT_EQ(r.expanded_topk_weight.float_values(),
                (std::vector<float>{.1f, .6f, .4f, .5f, 0, 0}));
      const std::vector<int64_t> counts[] = {{2, 4}, {2, 2}, {1, 2, 2, 2, 0, 0, 0, 0}};
      EXPECT_EQ(r.counts.values<int64_t>(), counts[count_type]);
    }
  // Q1: dynamic int8, round half away from zero, with and without a smooth scale.
  for (Numerics numerics : {Numerics::atlas_a2, Numerics::ascend_950}) {
    ForwardCase c;
    c.x = Tensor::floats(DType::float32, {2, 5},
                         {127.0f, 2.5f, -2.5f, 0.5f, -126.4f, 1.0f, -0.5f, 0.25f, 0.0f, 0.0f});
    c.expert_idx = Tensor::int32s({2, 1}, {0, 0});
    c.attrs.expert_num = 1;
    c.attrs.quant_mode = 1;
    c.attrs.numerics = numerics;
    const ForwardResult r = run_forward_cuda(c);
    ASSERT_TRUE(r.status.is_ok()) << r.status.message();
    EXPECT_EQ(r.expanded_x.values<int8_t>(),
              (std::vector<int8_t>{127, 3, -3, 1, -126, 127, -64, 32, 0, 0}));
    EXPECT_EQ(r.expanded_scale.float_values()[0], 1.0f);
  }
  // Q2 and the §3.3 numerics example (fp32 path 7, fp16 path 6).
  for (Numerics numerics : {Numerics::atlas_a2, Numerics::ascend_950}) {
    ForwardCase c;
    c.x = Tensor::floats(DType::float32, {1, 6},
                         {1.0f, -0.75f, 0.25f, 100.0f, -1.25f, 3.824000835418701f});
    c.expert_idx = Tensor::int32s({1, 1}, {0});
    c.scale = Tensor::floats(DType::float32, {1}, {2.0f});
    c.offset = Tensor::floats(DType::float32, {1}, {0.5f});
    c.attrs.expert_num = 1;
    c.attrs.quant_mode = 0;
    c.attrs.numerics = numerics;
    const ForwardResult r = run_forward_cuda(c);
    ASSERT_TRUE(r.status.is_ok()) << r.status.message();
    const std::vector<int8_t> q = r.expanded_x.values<int8_t>();
    EXPECT_EQ(std::vector<int8_t>(q.begin(), q.begin() + 5),
              (std::vector<int8_t>{2, -1, 1, 127, -2}));
    const ForwardResult cpu = testing::run_forward(c, kCpu);
    EXPECT_TRUE(testing::same_result(cpu, r)) << numerics_name(numerics);
  }
}

TEST(CudaRouting, NotProducedOutputsWithDataAreZeroedAndEmptyInputsAreValid) {
  SKIP_WITHOUT_GPU();
  ForwardCase c;
  c.x = Tensor::floats(DType::bfloat16, {4, 3}, std::vector<float>(12, 1.0f));
  c.expert_idx = Tensor::int32s({4, 2}, {0, 1, 1, 0, 2, 2, 0, 1});
  c.attrs.expert_num = 3;
  c.attrs.quant_mode = 0;  // expanded_scale is not produced
  c.scale = Tensor::floats(DType::float32, {1}, {1.0f});
  const ForwardResult r = run_forward_cuda(c, true);
  ASSERT_TRUE(r.status.is_ok()) << r.status.message();
  ASSERT_FALSE(r.plan.expanded_scale.produced);
  for (uint8_t byte : r.expanded_scale.bytes) EXPECT_EQ(byte, 0);
  for (uint8_t byte : r.counts.bytes) EXPECT_EQ(byte, 0);  // expert_tokens_num_flag false
  // N = 0: counts of zeros; drop-pad slots all zero.
  for (int64_t drop_pad : {0, 1}) {
    ForwardCase e;
    e.x = Tensor::floats(DType::float16, {0, 5}, {});
    e.expert_idx = Tensor::int32s({0, 2}, {});
    e.attrs.expert_num = 3;
    e.attrs.drop_pad_mode = drop_pad;
    e.attrs.expert_capacity = drop_pad ? 2 : -1;
    e.attrs.expert_tokens_num_flag = true;
    e.attrs.expert_tokens_num_type = 2;
    const ForwardResult expected = testing::run_forward(e, kCpu);
    ASSERT_TRUE(expected.status.is_ok()) << expected.status.message();
    EXPECT_TRUE(testing::same_result(expected, run_forward_cuda(e))) << "drop_pad " << drop_pad;
  }
}

}  // namespace
}  // namespace moe_routing
