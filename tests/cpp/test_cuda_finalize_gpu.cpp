// moe_finalize_routing(_grad) on a GPU: random cases of every dtype, mode, numerics and optional
// input bitwise against the CPU backend (outputs poisoned on the device first, so unwritten
// elements show); bad indices give the CPU's message and leave every output untouched. Every test
// skips, saying why, when no GPU is present.
#include <cuda_runtime.h>

#include <memory>
#include <string>
#include <vector>

#include "cuda/device_memory.h"
#include "cuda_test_util.h"
#include "finalize_cases.h"

namespace moe_routing {
namespace {

using testing::FinalizeCase;
using testing::FinalizeGradCase;
using testing::FloatBuffer;

const testing::Runner kCpu{Backend::cpu, CpuIsa::automatic, 4};
constexpr int kPoisonByte = 0x5A;

/// Device copies of host tensors, alive as long as the object; absent views stay absent.
class OnDevice {
 public:
  TensorView copy(const TensorView& host) {
    if (host.data == nullptr && host.ndim == 0) return TensorView();
    cuda::DeviceBuffer& buffer = add(host.nbytes());
    EXPECT_TRUE(buffer.upload(host.data, host.nbytes()).is_ok());
    TensorView view = host;
    view.data = buffer.data();
    view.device = Device::cuda;
    return view;
  }
  /// A poisoned device output shaped like `host` (absent stays absent).
  TensorView poisoned(const TensorView& host) {
    if (host.data == nullptr && host.ndim == 0) return TensorView();
    cuda::DeviceBuffer& buffer = add(host.nbytes());
    EXPECT_TRUE(buffer.fill(kPoisonByte).is_ok());
    TensorView view = host;
    view.data = buffer.data();
    view.device = Device::cuda;
    return view;
  }
  /// Copies a device tensor back into `host` (same shape).
  static void fetch(const TensorView& device, FloatBuffer* host) {
    if (host->bytes.empty()) return;
    EXPECT_EQ(cudaMemcpy(host->data(), device.data, host->bytes.size(), cudaMemcpyDeviceToHost),
              cudaSuccess);
  }

 private:
  cuda::DeviceBuffer& add(size_t bytes) {
    buffers_.push_back(std::make_unique<cuda::DeviceBuffer>());
    EXPECT_TRUE(buffers_.back()->allocate(bytes).is_ok());
    return *buffers_.back();
  }
  std::vector<std::unique_ptr<cuda::DeviceBuffer>> buffers_;
};

FloatBuffer run_forward_cuda(FinalizeCase& c, Status* status) {
  OnDevice d;
  FloatBuffer result(c.dtype, c.N * c.H);
  const TensorView out = d.poisoned(TensorView(result.data(), c.dtype, {c.N, c.H}));
  *status = moe_finalize_routing(
      testing::map_tensors(c.inputs(), [&](const TensorView& t) { return d.copy(t); }), c.attrs,
      out);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  OnDevice::fetch(out, &result);
  return result;
}

TEST(CudaFinalize, RandomCasesMatchTheCpuBitwise) {
  SKIP_WITHOUT_GPU();
  testing::Random rng(1001);
  testing::for_each_forward_variant([&](DType dtype, int64_t mode, Numerics numerics,
                                        const testing::FinalizeOptions& o,
                                        const std::string& name) {
    FinalizeCase c = testing::make_finalize_case(rng, dtype, mode, numerics, o, 37,
                                                 rng.integer(1, 9), 4096 + 13);
    testing::fill_special(rng, {&c.x1});
    Status s;
    const FloatBuffer got = run_forward_cuda(c, &s);
    ASSERT_TRUE(s.is_ok()) << s.message();
    EXPECT_TRUE(testing::bitwise_equal(testing::run_finalize_case(c, kCpu), got)) << name;
  });
}

TEST(CudaFinalize, BadIndexGivesTheCpuMessageAndWritesNothing) {
  SKIP_WITHOUT_GPU();
  testing::Random rng(1002);
  testing::FinalizeOptions o;
  o.bias = true, o.scales = true;
  FinalizeCase c =
      testing::make_finalize_case(rng, DType::bfloat16, 2, Numerics::atlas_a2, o, 8, 2, 64);
  c.expanded_shape = {c.N * c.K, c.H};  // every row present: index 0 is a row
  c.expanded_x = testing::random_buffer(rng, c.dtype, c.N * c.K * c.H);
  for (int spoil = 0; spoil < 2; ++spoil) {
    FinalizeCase bad = c;
    if (spoil == 0) bad.idx[5] = int32_t(bad.idx.size() + 7);
    if (spoil == 1) bad.expert_idx[3] = int32_t(bad.E), bad.idx[3] = 0;
    Status s;
    const FloatBuffer got = run_forward_cuda(bad, &s);
    const Status cpu = moe_finalize_routing(bad.inputs(), bad.attrs,
                                            TensorView(got.bytes.data(), bad.dtype, {bad.N, bad.H}),
                                            kCpu.config());
    EXPECT_EQ(s.code(), StatusCode::index_out_of_range) << s.message();
    EXPECT_EQ(s.message(), cpu.message());
    for (uint8_t byte : got.bytes) ASSERT_EQ(byte, kPoisonByte) << "out was written on error";
  }
}

testing::GradResult run_grad_cuda(FinalizeGradCase& c, Status* status) {
  OnDevice d;
  testing::GradResult r = testing::poisoned_grad_result(c);
  const MoeFinalizeRoutingGradOutputs out = testing::map_tensors(
      testing::grad_outputs(c, r), [&](const TensorView& t) { return d.poisoned(t); });
  *status = moe_finalize_routing_grad(
      testing::map_tensors(c.inputs(), [&](const TensorView& t) { return d.copy(t); }), c.attrs,
      out);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  OnDevice::fetch(out.grad_expanded_x, &r.grad_expanded_x);
  OnDevice::fetch(out.grad_scales, &r.grad_scales);
  OnDevice::fetch(out.grad_bias, &r.grad_bias);
  return r;
}

TEST(CudaFinalizeGrad, RandomCasesMatchTheCpuBitwise) {
  SKIP_WITHOUT_GPU();
  testing::Random rng(1003);
  for (const testing::DtypeVariant& v : testing::kFinalizeDtypes)
    for (int64_t mode = 0; mode < 2; ++mode)
      for (Numerics numerics : testing::kFinalizeNumerics)
        for (int64_t h : {7, 64, 4096, 7168, 16484}) {
          testing::GradOptions o;
          o.bias = h != 64, o.grad_bias = o.bias, o.mixed_scales = v.mixed_scales;
          o.duplicates = true;
          FinalizeGradCase c =
              testing::make_finalize_grad_case(rng, v.dtype, mode, numerics, o, 33, 4, h);
          Status s;
          const testing::GradResult got = run_grad_cuda(c, &s);
          ASSERT_TRUE(s.is_ok()) << s.message();
          EXPECT_TRUE(testing::grad_results_equal(testing::run_finalize_grad_case(c, kCpu), got))
              << dtype_name(v.dtype) << " mode " << mode << ' ' << numerics_name(numerics)
              << " H=" << h;
        }
}

TEST(CudaFinalizeGrad, BadIndexGivesTheCpuMessageAndWritesNothing) {
  SKIP_WITHOUT_GPU();
  testing::Random rng(1004);
  testing::GradOptions o;
  o.bias = true, o.grad_bias = true;
  FinalizeGradCase c =
      testing::make_finalize_grad_case(rng, DType::float16, 0, Numerics::ascend_950, o, 8, 2, 64);
  c.idx[3] = -5;
  Status s;
  const testing::GradResult got = run_grad_cuda(c, &s);
  EXPECT_EQ(s.code(), StatusCode::index_out_of_range) << s.message();
  EXPECT_EQ(s.message(),
            "moe_finalize_routing_grad: expanded_row_idx[3] must be in [0, 9) (-1 marks a dropped "
            "pair, values in [9, 16) pairs cut by active_num), got -5");
  for (const FloatBuffer* b : {&got.grad_expanded_x, &got.grad_scales, &got.grad_bias})
    for (uint8_t byte : b->bytes) ASSERT_EQ(byte, kPoisonByte) << "an output was written on error";
}

/// The GPU's int32 limit on the pair lists applies only to lists that are built: with no columns
/// (no lists) a drop-pad layout of 2^31 - 1 rows and 2^31 - 1 bias rows run as on the CPU (every
/// grad_scales +0), and a bad index is still reported with the CPU's message. (Regression: the
/// launcher refused them as not supported before looking at H or at the indices.)
TEST(CudaFinalizeGrad, NoColumnsNeedNoPairListsWhateverTheRows) {
  SKIP_WITHOUT_GPU();
  constexpr int64_t kMax = 2147483647;
  const int64_t N = 2, K = 2;
  for (int64_t mode = 0; mode < 2; ++mode) {
    MoeFinalizeRoutingGradAttrs attrs;
    attrs.drop_pad_mode = mode;
    attrs.expert_num = mode == 1 ? 1 : 0;
    attrs.expert_capacity = mode == 1 ? kMax : 0;
    const int64_t E = mode == 1 ? 1 : kMax;  // bias rows
    const int64_t rows = mode == 1 ? kMax : N * K;
    std::vector<int32_t> idx = {0, mode == 1 ? int32_t(kMax - 1) : 3, -1, 1};
    std::vector<int32_t> experts(size_t(N * K), 0);
    std::vector<float> scales(size_t(N * K), 0.5f);
    for (int bad = 0; bad < 2; ++bad) {
      if (bad == 1) idx[1] = -7;
      cuda::DeviceBuffer d_gy, d_idx, d_x, d_scales, d_experts, d_bias, d_gx, d_gs, d_gb;
      ASSERT_TRUE(d_gy.allocate(0).is_ok());
      ASSERT_TRUE(d_idx.upload(idx.data(), idx.size() * 4).is_ok());
      ASSERT_TRUE(d_x.allocate(0).is_ok());
      ASSERT_TRUE(d_scales.upload(scales.data(), scales.size() * 4).is_ok());
      ASSERT_TRUE(d_experts.upload(experts.data(), experts.size() * 4).is_ok());
      ASSERT_TRUE(d_bias.allocate(0).is_ok());
      ASSERT_TRUE(d_gx.allocate(0).is_ok());
      ASSERT_TRUE(d_gs.allocate(size_t(N * K) * 4).is_ok());
      ASSERT_TRUE(d_gs.fill(kPoisonByte).is_ok());
      ASSERT_TRUE(d_gb.allocate(0).is_ok());
      const Device cu = Device::cuda;
      MoeFinalizeRoutingGradInputs in;
      in.grad_y = TensorView(d_gy.data(), DType::float32, {N, 0}, cu);
      in.expanded_row_idx = TensorView(d_idx.data(), DType::int32, {N * K}, cu);
      in.scales = TensorView(d_scales.data(), DType::float32, {N, K}, cu);
      in.expert_idx = TensorView(d_experts.data(), DType::int32, {N, K}, cu);
      in.bias = TensorView(d_bias.data(), DType::float32, {E, 0}, cu);
      MoeFinalizeRoutingGradOutputs out;
      if (mode == 1) {
        in.expanded_x = TensorView(d_x.data(), DType::float32, {1, kMax, 0}, cu);
        out.grad_expanded_x = TensorView(d_gx.data(), DType::float32, {1, kMax, 0}, cu);
      } else {
        in.expanded_x = TensorView(d_x.data(), DType::float32, {rows, 0}, cu);
        out.grad_expanded_x = TensorView(d_gx.data(), DType::float32, {rows, 0}, cu);
      }
      out.grad_scales = TensorView(d_gs.data(), DType::float32, {N, K}, cu);
      out.grad_bias = TensorView(d_gb.data(), DType::float32, {E, 0}, cu);
      const Status s = moe_finalize_routing_grad(in, attrs, out);
      std::vector<uint32_t> gs(size_t(N * K));
      ASSERT_TRUE(d_gs.download(gs.data(), gs.size() * 4).is_ok());
      if (bad == 0) {
        ASSERT_TRUE(s.is_ok()) << "mode " << mode << ": " << s.message();
        for (uint32_t bits : gs) EXPECT_EQ(bits, 0u) << "mode " << mode;
      } else {
        EXPECT_EQ(s.code(), StatusCode::index_out_of_range)
            << "mode " << mode << ": " << s.message();
        EXPECT_NE(s.message().find("expanded_row_idx[1]"), std::string::npos) << s.message();
        for (uint32_t bits : gs) EXPECT_EQ(bits, 0x5A5A5A5Au) << "written on error";
      }
    }
  }
}

}  // namespace
}  // namespace moe_routing
