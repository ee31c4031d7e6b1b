// moe_routing_gpu_check: the CUDA backend against the CPU backend, bit for bit, on random inputs
// for every scenario, dtype, order and quantisation numerics of the dispatch and its backward, and
// every layout, api, numerics and optional input of the combine and its backward, then benchmarks
// at model shapes in GB/s against a device-to-device cudaMemcpy measured in the same run.
// Run by tools/gpu_check.sh (docs/cuda.md); needs no GoogleTest. The random cases, the sizes
// they are drawn at, the model shapes and the benchmarks' routing are those of tools/cases/, which
// the C++ tests (tests/cpp/test_cuda_gpu.cpp, test_cuda_finalize_gpu.cpp) and `moe-routing bench`
// use too.
//
//   moe_routing_gpu_check [--checks-only | --bench-only] [--results FILE]
//
// Prints PASS/FAIL per check group, then one benchmark line per case; with --results, appends
// `RESULT|op|impl|case|dtype|ms|GB/s|%copy|verified` lines to FILE (the script's final table).
// Exit status: 0 when every check passed, 1 on a mismatch, 2 when no GPU or a CUDA error.
#include <cuda_runtime.h>

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "cases/finalize_cases.h"
#include "cases/grad_cases.h"
#include "cases/model_shapes.h"
#include "cases/random.h"
#include "cases/routing_cases.h"
#include "cases/synthetic.h"
#include "cuda/device_memory.h"
#include "moe_routing/moe_routing.hpp"

namespace {

using namespace moe_routing;
using cases::FloatBuffer;
using cases::Tensor;

// ---- small utilities ------------------------------------------------------------------------

#define CHECK_CUDA(call)                                                                 \
  do {                                                                                   \
    const cudaError_t e_ = (call);                                                       \
    if (e_ != cudaSuccess) {                                                             \
      std::fprintf(stderr, "gpu_check: %s failed: %s\n", #call, cudaGetErrorString(e_)); \
      std::exit(2);                                                                      \
    }                                                                                    \
  } while (0)

void require(const Status& s, const char* what) {
  if (!s.is_ok()) {
    std::fprintf(stderr, "gpu_check: %s failed: %s\n", what, s.message().c_str());
    std::exit(2);
  }
}

/// The CPU backend every check and benchmark is compared with (default threads, best ISA).
const cases::Runner kCpu{Backend::cpu, CpuIsa::automatic, 0};

/// Device copies kept alive together.
class DeviceCopies {
 public:
  /// The host tensor's bytes on the device, as a view of the same shape (absent stays absent).
  TensorView upload(const TensorView& host) {
    if (host.data == nullptr && host.ndim == 0) return TensorView();
    buffers_.emplace_back();
    require(buffers_.back().upload(host.data, host.nbytes()), "upload");
    TensorView v = host;
    v.data = buffers_.back().data();
    v.device = Device::cuda;
    return v;
  }
  /// A poisoned (0x5A, as the host outputs of the cases) device output of the host view's shape
  /// (absent stays absent).
  TensorView output(const TensorView& host) {
    if (host.data == nullptr && host.ndim == 0) return TensorView();
    buffers_.emplace_back();
    require(buffers_.back().allocate(host.nbytes()), "allocate");
    require(buffers_.back().fill(0x5A), "fill");
    TensorView v = host;
    v.data = buffers_.back().data();
    v.device = Device::cuda;
    return v;
  }
  static void download(const TensorView& device, void* host, size_t bytes) {
    if (device.data != nullptr && bytes > 0)
      CHECK_CUDA(cudaMemcpy(host, device.data, bytes, cudaMemcpyDeviceToHost));
  }
  static void download(const TensorView& device, Tensor& host) {
    download(device, host.bytes.data(), host.bytes.size());
  }
  static void download(const TensorView& device, FloatBuffer& host) {
    download(device, host.bytes.data(), host.bytes.size());
  }

 private:
  std::vector<cuda::DeviceBuffer> buffers_;
};

int failures = 0, passes = 0;

void report(bool ok, const std::string& what) {
  if (ok) {
    ++passes;
  } else {
    ++failures;
    std::printf("FAIL %s\n", what.c_str());
  }
}

/// The first difference of a group of cases, or "" when all agreed.
class Group {
 public:
  void add(const std::string& what, const std::string& difference) {
    if (!difference.empty() && first_.empty())
      first_ = " (first: " + what + ": " + difference + ")";
  }
  /// Reports the group: PASS, or FAIL with its first difference.
  void finish(const std::string& name) {
    const bool ok = first_.empty();
    report(ok, name + first_);
    std::printf("%s %s\n", ok ? "PASS" : "----", name.c_str());
  }

 private:
  std::string first_;
};

// ---- the backward ---------------------------------------------------------------------------

FloatBuffer grad_gpu(cases::GradCase& c, Status* status) {
  DeviceCopies dev;
  FloatBuffer out(c.dtype, c.num_rows * c.hidden);
  const TensorView o = dev.output(TensorView(out.data(), c.dtype, {c.num_rows, c.hidden}));
  *status = moe_init_routing_grad(dev.upload(c.grad_view()), dev.upload(c.idx_view()), c.attrs, o);
  CHECK_CUDA(cudaDeviceSynchronize());
  DeviceCopies::download(o, out.data(), out.bytes.size());
  return out;
}

void check_grad() {
  cases::Random rng(1);
  for (DType dtype : {DType::float32, DType::float16, DType::bfloat16})
    for (GradScenario scenario :
         {GradScenario::dropless, GradScenario::active, GradScenario::drop_pad})
      for (AccumulationOrder order : {AccumulationOrder::tree, AccumulationOrder::sequential}) {
        Group group;
        for (const cases::GradShape& s : cases::kGradShapes) {
          cases::GradCase c =
              cases::make_grad_case(rng, scenario, dtype, s.num_rows, s.top_k, s.hidden);
          c.attrs.order = order;
          FloatBuffer expected;
          require(cases::run_grad(c, kCpu, &expected), "CPU grad");
          Status status;
          const FloatBuffer got = grad_gpu(c, &status);
          group.add("N=" + std::to_string(s.num_rows) + " K=" + std::to_string(s.top_k) +
                        " H=" + std::to_string(s.hidden),
                    status.is_ok() ? cases::difference(expected, got) : status.message());
        }
        group.finish(std::string("moe_init_routing_grad ") + dtype_name(dtype) + " " +
                     grad_scenario_name(scenario) + " " + accumulation_order_name(order));
      }
  // A bad index: the CPU's message, nothing written.
  cases::GradCase c = cases::make_grad_case(rng, GradScenario::dropless, DType::float32, 3, 2, 8);
  c.expanded_row_idx[5] = 99;
  FloatBuffer cpu_out;
  const Status cpu_status = cases::run_grad(c, kCpu, &cpu_out);
  Status gpu_status;
  const FloatBuffer got = grad_gpu(c, &gpu_status);
  bool untouched = true;
  for (uint8_t b : got.bytes) untouched = untouched && b == 0x5A;
  const bool ok = cpu_status.code() == StatusCode::index_out_of_range &&
                  gpu_status.code() == cpu_status.code() &&
                  gpu_status.message() == cpu_status.message() && untouched;
  report(ok, "moe_init_routing_grad bad index: \"" + gpu_status.message() + "\" vs \"" +
                 cpu_status.message() + "\", output untouched " + (untouched ? "yes" : "NO"));
  std::printf("%s moe_init_routing_grad invalid index: %s\n", ok ? "PASS" : "----",
              gpu_status.message().c_str());
}

// ---- the forward ------------------------------------------------------------------------------

/// cases::run_forward on the GPU: inputs uploaded, the produced outputs poisoned on the device.
cases::ForwardResult forward_gpu(cases::ForwardCase& c) {
  cases::ForwardResult r;
  if (!cases::plan_outputs(c, &r)) return r;
  Tensor* outputs[] = {&r.expanded_x, &r.expanded_row_idx, &r.counts, &r.expanded_scale,
                       &r.expanded_topk_weight};
  DeviceCopies dev;
  TensorView o[5];
  for (int i = 0; i < 5; ++i) o[i] = dev.output(outputs[i]->view());
  r.status =
      moe_init_routing(dev.upload(c.x.view()), dev.upload(c.expert_idx.view()),
                       dev.upload(c.scale.view()), dev.upload(c.offset.view()),
                       dev.upload(c.topk_weight.view()), c.attrs, o[0], o[1], o[2], o[3], o[4]);
  CHECK_CUDA(cudaDeviceSynchronize());
  for (int i = 0; i < 5; ++i) DeviceCopies::download(o[i], *outputs[i]);
  return r;
}

/// cases::run_v2 on the GPU.
cases::V2Result v2_gpu(cases::V2Case& c) {
  cases::V2Result r;
  if (!cases::plan_outputs(c, &r)) return r;
  Tensor* outputs[] = {&r.expanded_x, &r.expanded_row_idx, &r.counts, &r.before_capacity};
  DeviceCopies dev;
  TensorView o[4];
  for (int i = 0; i < 4; ++i) o[i] = dev.output(outputs[i]->view());
  r.status = moe_init_routing_v2(dev.upload(c.x.view()), dev.upload(c.expert_idx.view()), c.attrs,
                                 o[0], o[1], o[2], o[3]);
  CHECK_CUDA(cudaDeviceSynchronize());
  for (int i = 0; i < 4; ++i) DeviceCopies::download(o[i], *outputs[i]);
  return r;
}

/// The CPU's result must succeed; then the GPU's must equal it.
template <class Result>
std::string difference_from_cpu(const Result& expected, const Result& got) {
  if (!expected.status.is_ok()) return "the CPU failed: " + expected.status.message();
  return cases::difference(expected, got);
}

void check_forward() {
  cases::Random rng(2);
  for (DType dtype : {DType::float32, DType::float16, DType::bfloat16})
    for (cases::Scenario scenario : cases::kScenarios)
      for (int64_t quant : {-1, 0, 1})
        for (int64_t row_idx_type : {0, 1})
          for (Numerics numerics : {Numerics::atlas_a2, Numerics::ascend_950}) {
            if (scenario == cases::Scenario::drop_pad && (quant != -1 || row_idx_type != 0))
              continue;
            if (quant == -1 && numerics == Numerics::ascend_950) continue;
            Group group;
            for (int repeat = 0; repeat < 6; ++repeat) {
              cases::ForwardCaseSpec spec;
              spec.dtype = dtype;
              spec.scenario = scenario;
              spec.quant_mode = quant;
              spec.row_idx_type = row_idx_type;
              spec.sizes = cases::gpu_forward_sizes(repeat == 5);
              spec.drop_pad_ids_in_range = true;
              cases::ForwardCase c = cases::make_forward_case(rng, spec);
              c.attrs.numerics = numerics;
              const cases::ForwardResult expected = cases::run_forward(c, kCpu);
              const cases::ForwardResult got = forward_gpu(c);
              group.add("N=" + std::to_string(c.x.shape[0]) +
                            " K=" + std::to_string(c.expert_idx.shape[1]) +
                            " H=" + std::to_string(c.x.shape[1]) +
                            " E=" + std::to_string(c.attrs.expert_num),
                        difference_from_cpu(expected, got));
            }
            group.finish(std::string("moe_init_routing ") + dtype_name(dtype) + " " +
                         cases::scenario_name(scenario) + " quant " + std::to_string(quant) +
                         " row_idx_type " + std::to_string(row_idx_type) + " " +
                         numerics_name(numerics));
          }
}

void check_v2() {
  cases::Random rng(3);
  for (DType dtype : {DType::float32, DType::float16, DType::bfloat16})
    for (int mode = 0; mode < 3; ++mode) {  // dropless, active_num, drop-pad
      Group group;
      for (int repeat = 0; repeat < 8; ++repeat) {
        cases::V2CaseSpec spec;
        spec.dtype = dtype;
        spec.mode = mode;
        spec.sizes = cases::gpu_v2_sizes(repeat);
        cases::V2Case c = cases::make_v2_case(rng, spec);
        const cases::V2Result expected = cases::run_v2(c, kCpu);
        const cases::V2Result got = v2_gpu(c);
        group.add("N=" + std::to_string(c.x.shape[0]) + " E=" + std::to_string(c.attrs.expert_num),
                  difference_from_cpu(expected, got));
      }
      const char* modes[] = {"dropless", "active", "drop_pad"};
      group.finish(std::string("moe_init_routing_v2 ") + dtype_name(dtype) + " " + modes[mode]);
    }
}

// ---- the combine --------------------------------------------------------------------------------

/// cases::run_finalize on the GPU: inputs uploaded, the output poisoned on the device.
FloatBuffer finalize_gpu(cases::FinalizeCase& c, Status* status) {
  DeviceCopies dev;
  FloatBuffer out(c.dtype, c.N * c.H);
  const TensorView o = dev.output(TensorView(out.data(), c.dtype, {c.N, c.H}));
  *status = moe_finalize_routing(
      cases::map_tensors(c.inputs(), [&](const TensorView& t) { return dev.upload(t); }), c.attrs,
      o);
  CHECK_CUDA(cudaDeviceSynchronize());
  DeviceCopies::download(o, out);
  return out;
}

/// cases::run_finalize_grad on the GPU: inputs uploaded, the outputs poisoned on the device.
cases::GradResult finalize_grad_gpu(cases::FinalizeGradCase& c, Status* status) {
  DeviceCopies dev;
  cases::GradResult r = cases::poisoned_grad_result(c);
  const MoeFinalizeRoutingGradOutputs o = cases::map_tensors(
      cases::grad_outputs(c, r), [&](const TensorView& t) { return dev.output(t); });
  *status = moe_finalize_routing_grad(
      cases::map_tensors(c.inputs(), [&](const TensorView& t) { return dev.upload(t); }), c.attrs,
      o);
  CHECK_CUDA(cudaDeviceSynchronize());
  DeviceCopies::download(o.grad_expanded_x, r.grad_expanded_x);
  DeviceCopies::download(o.grad_scales, r.grad_scales);
  DeviceCopies::download(o.grad_bias, r.grad_bias);
  return r;
}

/// The GPU's status must be ok and its outputs those of the CPU, which must succeed.
template <class Result>
std::string finalize_difference(const Status& cpu, const Result& expected, const Status& gpu,
                                const Result& got) {
  if (!cpu.is_ok()) return "the CPU failed: " + cpu.message();
  if (!gpu.is_ok()) return gpu.message();
  return cases::difference(expected, got);
}

std::string describe_shape(int64_t n, int64_t k, int64_t h) {
  return "N=" + std::to_string(n) + " K=" + std::to_string(k) + " H=" + std::to_string(h);
}

/// The combine's case of a group in every variant 0..7 (cases::forward_variant_options: x1, x2,
/// bias with the special experts; scales always); api v1 (mode 4 here) takes x1, bias, scales and
/// expert_idx always, x2 in half the variants, and no special experts.
cases::FinalizeCase finalize_case(cases::Random& rng, const cases::DtypeVariant& d, int64_t mode,
                                  Numerics numerics, int options, int64_t n, int64_t k, int64_t h) {
  cases::FinalizeOptions o = cases::forward_variant_options(options, d.mixed_scales);
  if (mode != 4) return cases::make_finalize_case(rng, d.dtype, mode, numerics, o, n, k, h);
  o.x1 = o.bias = true, o.special = false;
  return cases::make_finalize_case(rng, d.dtype, 0, numerics, o, n, k, h, FinalizeRoutingApi::v1);
}

void check_finalize() {
  cases::Random rng(5);
  struct Shape {
    int64_t n, k, h;
  };
  const Shape shapes[] = {{1, 1, 1},    {7, 2, 8},   {33, 3, 24},   {5, 4, 64},
                          {9, 8, 7168}, {4, 40, 40}, {97, 2, 4096}, {64, 8, 257}};
  for (const cases::DtypeVariant& d : cases::kFinalizeDtypes)
    for (int64_t mode = 0; mode < 5; ++mode)  // 4: api v1
      for (Numerics numerics : cases::kFinalizeNumerics) {
        Group group;
        for (int options = 0; options < 8; ++options)
          for (const Shape& s : shapes) {
            cases::FinalizeCase c = finalize_case(rng, d, mode, numerics, options, s.n, s.k, s.h);
            FloatBuffer expected;
            const Status cpu_status = cases::run_finalize(c, kCpu, &expected);
            Status gpu_status;
            const FloatBuffer got = finalize_gpu(c, &gpu_status);
            group.add("options " + std::to_string(options) + " " + describe_shape(s.n, s.k, s.h),
                      finalize_difference(cpu_status, expected, gpu_status, got));
          }
        group.finish(std::string("moe_finalize_routing ") + dtype_name(d.dtype) +
                     (d.mixed_scales ? "+f32 scales" : "") +
                     (mode == 4 ? " v1" : " mode " + std::to_string(mode)) + " " +
                     numerics_name(numerics));
      }
  // A bad index and a bad expert id: the CPU's message, nothing written. Every pair names a row
  // (no drops, no rows cut), so that every pair reads a bias row.
  for (int bad = 0; bad < 2; ++bad) {
    cases::FinalizeOptions o;
    o.x1 = o.x2 = o.bias = o.scales = true;
    o.drop_fraction = 0, o.cut_rows = false;
    cases::FinalizeCase c =
        cases::make_finalize_case(rng, DType::float32, 2, Numerics::atlas_a2, o, 3, 2, 8);
    if (bad == 0)
      c.idx[5] = 99;
    else
      for (int32_t& e : c.expert_idx) e = int32_t(c.E);
    FloatBuffer cpu_out;
    const Status cpu_status = cases::run_finalize(c, kCpu, &cpu_out);
    Status gpu_status;
    const FloatBuffer got = finalize_gpu(c, &gpu_status);
    bool untouched = true;
    for (uint8_t b : got.bytes) untouched = untouched && b == 0x5A;
    const bool ok = cpu_status.code() == StatusCode::index_out_of_range &&
                    gpu_status.code() == cpu_status.code() &&
                    gpu_status.message() == cpu_status.message() && untouched;
    report(ok, "moe_finalize_routing bad index: \"" + gpu_status.message() + "\" vs \"" +
                   cpu_status.message() + "\", output untouched " + (untouched ? "yes" : "NO"));
    std::printf("%s moe_finalize_routing invalid index: %s\n", ok ? "PASS" : "----",
                gpu_status.message().c_str());
  }
}

void check_finalize_grad() {
  cases::Random rng(7);
  struct Shape {
    int64_t n, k, h;
  };
  // H across the grad_scales orders' regimes: one 64-lane tree, the fold, several 512-lane groups,
  // more than one atlas_a2 chunk (16352 float32 products without bias).
  const Shape shapes[] = {{1, 1, 1},   {7, 2, 8},     {33, 3, 64},  {5, 4, 65},  {9, 8, 7168},
                          {4, 40, 40}, {3, 2, 16400}, {64, 8, 257}, {2, 130, 24}};
  for (const cases::DtypeVariant& d : cases::kFinalizeDtypes)
    for (int64_t mode : {0, 1})
      for (Numerics numerics : cases::kFinalizeNumerics) {
        Group group;
        for (int bias = 0; bias < 2; ++bias)
          for (const Shape& s : shapes) {
            cases::GradOptions o;  // scales and expanded_x: grad_scales always
            o.bias = o.grad_bias = bias == 1;
            o.mixed_scales = d.mixed_scales, o.duplicates = true;
            cases::FinalizeGradCase c =
                cases::make_finalize_grad_case(rng, d.dtype, mode, numerics, o, s.n, s.k, s.h);
            cases::GradResult expected;
            const Status cpu_status = cases::run_finalize_grad(c, kCpu, &expected);
            Status gpu_status;
            const cases::GradResult got = finalize_grad_gpu(c, &gpu_status);
            group.add("bias " + std::to_string(bias) + " " + describe_shape(s.n, s.k, s.h),
                      finalize_difference(cpu_status, expected, gpu_status, got));
          }
        group.finish(std::string("moe_finalize_routing_grad ") + dtype_name(d.dtype) +
                     (d.mixed_scales ? "+f32 scales" : "") + " mode " + std::to_string(mode) + " " +
                     numerics_name(numerics));
      }
}

// ---- benchmarks -------------------------------------------------------------------------------

/// Median milliseconds of `runs` calls timed with events (after 3 warm-ups).
double time_ms(const std::function<void()>& call, int runs = 20) {
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  for (int i = 0; i < 3; ++i) call();
  CHECK_CUDA(cudaDeviceSynchronize());
  std::vector<double> times;
  for (int i = 0; i < runs; ++i) {
    CHECK_CUDA(cudaEventRecord(start));
    call();
    CHECK_CUDA(cudaEventRecord(stop));
    CHECK_CUDA(cudaEventSynchronize(stop));
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
    times.push_back(ms);
  }
  CHECK_CUDA(cudaEventDestroy(start));
  CHECK_CUDA(cudaEventDestroy(stop));
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

/// Device-to-device cudaMemcpy of 2 GiB: GB/s counting bytes read plus bytes written.
double copy_bandwidth() {
  const size_t bytes = size_t(2) << 30;
  cuda::DeviceBuffer a, b;
  require(a.allocate(bytes), "allocate");
  require(b.allocate(bytes), "allocate");
  require(a.fill(1), "fill");
  const double ms = time_ms(
      [&] { CHECK_CUDA(cudaMemcpyAsync(b.data(), a.data(), bytes, cudaMemcpyDeviceToDevice)); });
  return 2.0 * double(bytes) / (ms * 1e-3) / 1e9;
}

FILE* results = nullptr;

void result_line(const char* op, const char* impl, const std::string& name, DType dtype, double ms,
                 double bytes, double copy_gbps, const char* verified) {
  const double gbps = bytes / (ms * 1e-3) / 1e9;
  std::printf("BENCH %-22s %-7s %-26s %-8s %9.3f ms %8.1f GB/s %6.1f%% of copy  verified %s\n", op,
              impl, name.c_str(), dtype_name(dtype), ms, gbps, 100.0 * gbps / copy_gbps, verified);
  if (results != nullptr)
    std::fprintf(results, "RESULT|%s|%s|%s|%s|%.4f|%.1f|%.1f|%s\n", op, impl, name.c_str(),
                 dtype_name(dtype), ms, gbps, 100.0 * gbps / copy_gbps, verified);
  std::fflush(stdout);
}

/// One model's MoE layer at `tokens` tokens, on the routing and data `moe-routing bench` uses for
/// the same sizes (K distinct experts per token, skewed toward low ids).
void bench(const cases::ModelShape& m, int64_t tokens, DType dtype, double copy_gbps) {
  const int64_t N = tokens, K = m.top_k, H = m.hidden, E = m.experts, P = N * K;
  const size_t el = dtype_size(dtype);
  const std::string name = std::string(m.name) + " N=" + std::to_string(N);
  const uint64_t seed = uint64_t(N * 131 + H);
  cases::ForwardCase c;
  c.x = Tensor(dtype, {N, H});
  cases::fill_random(c.x.bytes.data(), dtype, N * H, seed);
  c.expert_idx = Tensor::int32s({N, K}, cases::random_expert_idx(N, K, E, seed));

  // Forward (torch API, dropless, counts): read x once and the ids, write expanded_x,
  // expanded_row_idx and the counts.
  c.attrs.expert_num = E;
  c.attrs.expert_tokens_num_flag = true;
  c.attrs.expert_tokens_num_type = 1;
  cases::ForwardResult got;
  if (!cases::plan_outputs(c, &got)) require(got.status, "infer");
  DeviceCopies dev;
  const TensorView dx = dev.upload(c.x.view()), dids = dev.upload(c.expert_idx.view());
  const TensorView ox = dev.output(got.expanded_x.view()),
                   orow = dev.output(got.expanded_row_idx.view()),
                   oc = dev.output(got.counts.view());
  const double fwd_ms = time_ms([&] {
    require(moe_init_routing(dx, dids, TensorView(), TensorView(), TensorView(), c.attrs, ox, orow,
                             oc, TensorView(), TensorView()),
            "moe_init_routing");
  });
  DeviceCopies::download(ox, got.expanded_x);
  DeviceCopies::download(orow, got.expanded_row_idx);
  DeviceCopies::download(oc, got.counts);
  const std::string fwd_difference = difference_from_cpu(cases::run_forward(c, kCpu), got);
  report(fwd_difference.empty(),
         "benchmark forward " + name + " differs from the CPU: " + fwd_difference);
  const double fwd_bytes =
      double(N * H * el) + double(P) * 4 + double(P * H * el) + double(P) * 4 + double(E) * 8;
  result_line("moe_init_routing", "ours", name, dtype, fwd_ms, fwd_bytes, copy_gbps,
              fwd_difference.empty() ? "yes" : "NO");

  // Backward (dropless) on the forward's expanded_row_idx: read every grad row once and the
  // indices, write grad_x.
  Tensor g(dtype, {P, H});
  cases::fill_random(g.bytes.data(), dtype, P * H, seed + 1);
  const TensorView dg = dev.upload(g.view());
  Tensor gx(dtype, {N, H});
  const TensorView ogx = dev.output(gx.view());
  for (AccumulationOrder order : {AccumulationOrder::tree, AccumulationOrder::sequential}) {
    MoeInitRoutingGradAttrs ga;
    ga.top_k = K;
    ga.order = order;
    const double ms = time_ms(
        [&] { require(moe_init_routing_grad(dg, orow, ga, ogx), "moe_init_routing_grad"); });
    DeviceCopies::download(ogx, gx);
    Tensor expected(dtype, {N, H});
    require(moe_init_routing_grad(g.view(), got.expanded_row_idx.view(), ga, expected.view(),
                                  kCpu.config()),
            "CPU grad");
    const std::string difference = cases::difference(expected, gx);
    report(difference.empty(), "benchmark backward " + name + " " + accumulation_order_name(order) +
                                   " differs from the CPU: " + difference);
    const double bytes = double(P * H * el) + double(P) * 4 + double(N * H * el);
    result_line("moe_init_routing_grad", order == AccumulationOrder::tree ? "ours" : "ours-seq",
                name, dtype, ms, bytes, copy_gbps, difference.empty() ? "yes" : "NO");
  }

  // The combine of the forward's rows (drop_pad_mode 2: the row layout the forward returned),
  // float32 scales with bfloat16 data: read every expanded row once, the indices and scales,
  // write out [N, H]. Then its backward (grad_expanded_x and grad_scales), with the dispatch
  // backward's grad_x as grad_y.
  const DType scales_dtype = dtype == DType::bfloat16 ? DType::float32 : dtype;
  const size_t sl = dtype_size(scales_dtype);
  Tensor scales(scales_dtype, {N, K});
  cases::fill_random(scales.bytes.data(), scales_dtype, N * K, seed + 2);
  const TensorView dscales = dev.upload(scales.view());
  for (Numerics numerics : cases::kFinalizeNumerics) {
    const char* impl = numerics == Numerics::atlas_a2 ? "ours" : "ours-950";
    MoeFinalizeRoutingAttrs fa;
    fa.drop_pad_mode = 2;
    fa.numerics = numerics;
    MoeFinalizeRoutingInputs din, hin;
    din.expanded_x = ox, din.expanded_row_idx = orow, din.scales = dscales;
    hin.expanded_x = got.expanded_x.view(), hin.expanded_row_idx = got.expanded_row_idx.view();
    hin.scales = scales.view();
    Tensor out(dtype, {N, H});
    const TensorView dout = dev.output(out.view());
    const double ms =
        time_ms([&] { require(moe_finalize_routing(din, fa, dout), "moe_finalize_routing"); });
    DeviceCopies::download(dout, out);
    Tensor expected(dtype, {N, H});
    require(moe_finalize_routing(hin, fa, expected.view(), kCpu.config()),
            "CPU moe_finalize_routing");
    const std::string difference = cases::difference(expected, out);
    report(difference.empty(), "benchmark combine " + name + " " + numerics_name(numerics) +
                                   " differs from the CPU: " + difference);
    result_line("moe_finalize_routing", impl, name, dtype, ms,
                double(P * H * el) + double(P) * double(4 + sl) + double(N * H * el), copy_gbps,
                difference.empty() ? "yes" : "NO");

    MoeFinalizeRoutingGradAttrs ga;
    ga.numerics = numerics;
    MoeFinalizeRoutingGradInputs dgin, hgin;
    dgin.grad_y = ogx, dgin.expanded_row_idx = orow, dgin.expanded_x = ox, dgin.scales = dscales;
    hgin.grad_y = gx.view(), hgin.expanded_row_idx = got.expanded_row_idx.view();
    hgin.expanded_x = got.expanded_x.view(), hgin.scales = scales.view();
    Tensor gex(dtype, {P, H}), gs(scales_dtype, {N, K});
    const MoeFinalizeRoutingGradOutputs dgo = {dev.output(gex.view()), dev.output(gs.view()),
                                               TensorView()};
    const double grad_ms = time_ms(
        [&] { require(moe_finalize_routing_grad(dgin, ga, dgo), "moe_finalize_routing_grad"); });
    DeviceCopies::download(dgo.grad_expanded_x, gex);
    DeviceCopies::download(dgo.grad_scales, gs);
    Tensor egex(dtype, {P, H}), egs(scales_dtype, {N, K});
    require(
        moe_finalize_routing_grad(hgin, ga, {egex.view(), egs.view(), TensorView()}, kCpu.config()),
        "CPU moe_finalize_routing_grad");
    std::string grad_difference = cases::difference(egex, gex);
    if (grad_difference.empty()) grad_difference = cases::difference(egs, gs);
    report(grad_difference.empty(), "benchmark combine backward " + name + " " +
                                        numerics_name(numerics) +
                                        " differs from the CPU: " + grad_difference);
    result_line("moe_finalize_routing_grad", impl, name, dtype, grad_ms,
                double(N * H * el) + double(P * H * el) + double(P) * double(4 + sl) +
                    double(P * H * el) + double(P) * double(sl),
                copy_gbps, grad_difference.empty() ? "yes" : "NO");
  }
}

}  // namespace

int main(int argc, char** argv) {
  bool checks = true, benchmarks = true;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--checks-only")
      benchmarks = false;
    else if (arg == "--bench-only")
      checks = false;
    else if (arg == "--results" && i + 1 < argc)
      results = std::fopen(argv[++i], "a");
    else {
      std::fprintf(stderr, "usage: %s [--checks-only | --bench-only] [--results FILE]\n", argv[0]);
      return 2;
    }
  }
  std::string why;
  if (!cuda::device_available(&why)) {
    std::fprintf(stderr, "gpu_check: no GPU is present: %s\n", why.c_str());
    return 2;
  }
  std::printf("gpu_check on %s\n", cuda::device_description().c_str());
  if (checks) {
    check_grad();
    check_forward();
    check_v2();
    check_finalize();
    check_finalize_grad();
    std::printf("%s: %d check groups passed, %d failed (CUDA vs CPU backend, bit for bit)\n",
                failures == 0 ? "PASS" : "FAIL", passes, failures);
  }
  if (benchmarks) {
    const double copy_gbps = copy_bandwidth();
    std::printf("BENCH device-to-device cudaMemcpy: %.1f GB/s (read + write)\n", copy_gbps);
    if (results != nullptr) std::fprintf(results, "COPY|%.1f\n", copy_gbps);
    for (const cases::ModelShape& m : cases::kModelShapes)
      bench(m, 8192, DType::bfloat16, copy_gbps);
    bench(cases::model_shape("deepseek-v3"), 2048, DType::bfloat16, copy_gbps);
    bench(cases::model_shape("deepseek-v3"), 16384, DType::bfloat16, copy_gbps);
    bench(cases::model_shape("qwen3-235b"), 8192, DType::float32, copy_gbps);
  }
  if (results != nullptr) std::fclose(results);
  return failures == 0 ? 0 : 1;
}
