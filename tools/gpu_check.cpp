// moe_routing_gpu_check: the CUDA backend against the CPU backend, bit for bit, on random inputs
// for every scenario, dtype, order and quantisation numerics of the dispatch and its backward, and
// every layout, api, numerics and optional input of the combine and its backward, then benchmarks
// at model shapes in GB/s against a device-to-device cudaMemcpy measured in the same run.
// Run by tools/gpu_check.sh (docs/cuda.md); needs no GoogleTest.
//
//   moe_routing_gpu_check [--checks-only | --bench-only] [--results FILE]
//
// Prints PASS/FAIL per check group, then one benchmark line per case; with --results, appends
// `RESULT|op|impl|case|dtype|ms|GB/s|%copy|verified` lines to FILE (the script's final table).
// Exit status: 0 when every check passed, 1 on a mismatch, 2 when no GPU or a CUDA error.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cuda/device_memory.h"
#include "moe_routing/moe_routing.hpp"

namespace {

using namespace moe_routing;

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

/// Host bytes of a tensor plus its shape and dtype.
struct Host {
  DType dtype = DType::float32;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
  bool present = false;

  Host() = default;
  Host(DType d, std::vector<int64_t> s) : dtype(d), shape(std::move(s)), present(true) {
    bytes.assign(size_t(numel()) * dtype_size(dtype), 0);
  }
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t e : shape) n *= e;
    return n;
  }
  TensorView view() {
    if (!present) return TensorView();
    static uint64_t empty = 0;
    return TensorView(bytes.empty() ? static_cast<void*>(&empty) : bytes.data(), dtype,
                      int(shape.size()), shape.data());
  }
};

Host from_spec(const OutputSpec& spec) {
  if (!spec.produced) return Host();
  return Host(spec.dtype, std::vector<int64_t>(spec.shape, spec.shape + spec.ndim));
}

/// Device copies kept alive together.
class DeviceCopies {
 public:
  TensorView upload(Host& h) {
    if (!h.present) return TensorView();
    buffers_.emplace_back();
    require(buffers_.back().upload(h.bytes.data(), h.bytes.size()), "upload");
    TensorView v = h.view();
    v.data = buffers_.back().data();
    v.device = Device::cuda;
    return v;
  }
  /// A poisoned device output for `h` (absent stays absent).
  TensorView output(Host& h) {
    if (!h.present) return TensorView();
    buffers_.emplace_back();
    require(buffers_.back().allocate(h.bytes.size()), "allocate");
    require(buffers_.back().fill(0x5A), "fill");
    TensorView v = h.view();
    v.data = buffers_.back().data();
    v.device = Device::cuda;
    return v;
  }
  static void download(const TensorView& d, Host& h) {
    if (h.present && !h.bytes.empty())
      CHECK_CUDA(cudaMemcpy(h.bytes.data(), d.data, h.bytes.size(), cudaMemcpyDeviceToHost));
  }

 private:
  std::vector<cuda::DeviceBuffer> buffers_;
};

/// Deterministic random fill of a floating tensor (values over several binades), in parallel.
void fill_float(Host& h, uint64_t seed) {
  const int64_t n = h.numel();
  const unsigned threads = std::max(1u, std::min(16u, std::thread::hardware_concurrency()));
  std::vector<std::thread> pool;
  for (unsigned w = 0; w < threads; ++w)
    pool.emplace_back([&, w] {
      std::mt19937_64 rng(seed * 1000003 + w);
      for (int64_t i = n * w / threads; i < n * (w + 1) / threads; ++i) {
        const uint64_t bits = rng();
        const float unit = float(int64_t(bits >> 40) - (int64_t(1) << 23)) / 8388608.0f;
        store_from_float(h.bytes.data(), h.dtype, i, std::ldexp(unit, int(bits & 15) - 8));
      }
    });
  for (std::thread& t : pool) t.join();
}

int64_t uniform(std::mt19937_64& rng, int64_t lo, int64_t hi) {
  return lo + int64_t(rng() % uint64_t(hi - lo + 1));
}

/// top_k distinct experts per token (as a router gives), skewed toward low ids.
std::vector<int32_t> route(std::mt19937_64& rng, int64_t n, int64_t k, int64_t e) {
  std::vector<int32_t> ids(size_t(n * k));
  std::vector<int32_t> experts(static_cast<size_t>(e));
  std::iota(experts.begin(), experts.end(), 0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t t = 0; t < k; ++t) {
      const int64_t j = t + int64_t(rng() % uint64_t(e - t));
      std::swap(experts[size_t(t)], experts[size_t(j)]);
      ids[size_t(i * k + t)] = experts[size_t(t)];
    }
  return ids;
}

int failures = 0, passes = 0;

void report(bool ok, const std::string& what) {
  if (ok) {
    ++passes;
  } else {
    ++failures;
    std::printf("FAIL %s\n", what.c_str());
  }
}

bool same(const Host& a, const Host& b) { return a.present == b.present && a.bytes == b.bytes; }

// ---- the backward ---------------------------------------------------------------------------

struct GradInput {
  Host grad, idx;
  MoeInitRoutingGradAttrs attrs;
  int64_t n = 0, h = 0;
};

GradInput grad_input(std::mt19937_64& rng, DType dtype, GradScenario scenario, int64_t n, int64_t k,
                     int64_t h, AccumulationOrder order) {
  GradInput in;
  in.n = n;
  in.h = h;
  const int64_t pairs = n * k;
  std::vector<int32_t> perm(static_cast<size_t>(pairs));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  int64_t rows = pairs;
  in.attrs.top_k = k;
  in.attrs.order = order;
  std::vector<int64_t> shape{rows, h};
  if (scenario == GradScenario::active) {
    rows = uniform(rng, 1, std::max<int64_t>(1, pairs));
    in.attrs.active_num = rows;
    shape = {rows, h};
  } else if (scenario == GradScenario::drop_pad) {
    const int64_t experts = uniform(rng, 1, 9), capacity = uniform(rng, 1, pairs / experts + 1);
    rows = experts * capacity;
    in.attrs.drop_pad_mode = 1;
    shape = {experts, capacity, h};
    for (int32_t& p : perm) p = p < rows ? p : -1;
  }
  for (int32_t& p : perm)
    if (rng() % 10 == 0) p = -1;
  in.grad = Host(dtype, shape);
  fill_float(in.grad, rng());
  in.idx = Host(DType::int32, {pairs});
  std::memcpy(in.idx.bytes.data(), perm.data(), perm.size() * 4);
  return in;
}

Host grad_cpu(GradInput& in) {
  Host out(in.grad.dtype, {in.n, in.h});
  ExecConfig cpu;
  cpu.backend = Backend::cpu;
  require(moe_init_routing_grad(in.grad.view(), in.idx.view(), in.attrs, out.view(), cpu),
          "CPU grad");
  return out;
}

Host grad_gpu(GradInput& in, Status* status) {
  DeviceCopies dev;
  Host out(in.grad.dtype, {in.n, in.h});
  const TensorView o = dev.output(out);
  *status = moe_init_routing_grad(dev.upload(in.grad), dev.upload(in.idx), in.attrs, o);
  CHECK_CUDA(cudaDeviceSynchronize());
  DeviceCopies::download(o, out);
  return out;
}

void check_grad() {
  std::mt19937_64 rng(1);
  struct Shape {
    int64_t n, k, h;
  };
  const Shape shapes[] = {{1, 1, 1},    {7, 2, 8},     {33, 3, 24}, {5, 4, 64}, {13, 5, 100},
                          {9, 8, 7168}, {8, 9, 40},    {6, 16, 72}, {4, 33, 8}, {3, 128, 16},
                          {2, 130, 24}, {97, 2, 4096}, {64, 8, 257}};
  for (DType dtype : {DType::float32, DType::float16, DType::bfloat16})
    for (GradScenario scenario :
         {GradScenario::dropless, GradScenario::active, GradScenario::drop_pad})
      for (AccumulationOrder order : {AccumulationOrder::tree, AccumulationOrder::sequential}) {
        bool ok = true;
        std::string first;
        for (const Shape& s : shapes) {
          GradInput in = grad_input(rng, dtype, scenario, s.n, s.k, s.h, order);
          const Host expected = grad_cpu(in);
          Status status;
          const Host got = grad_gpu(in, &status);
          if (!status.is_ok() || !same(expected, got)) {
            if (ok)
              first = " (first: N=" + std::to_string(s.n) + " K=" + std::to_string(s.k) +
                      " H=" + std::to_string(s.h) +
                      (status.is_ok() ? "" : ": " + status.message()) + ")";
            ok = false;
          }
        }
        const std::string name = std::string("moe_init_routing_grad ") + dtype_name(dtype) + " " +
                                 grad_scenario_name(scenario) + " " +
                                 accumulation_order_name(order);
        report(ok, name + first);
        std::printf("%s %s\n", ok ? "PASS" : "----", name.c_str());
      }
  // A bad index: the CPU's message, nothing written.
  GradInput in =
      grad_input(rng, DType::float32, GradScenario::dropless, 3, 2, 8, AccumulationOrder::tree);
  reinterpret_cast<int32_t*>(in.idx.bytes.data())[5] = 99;
  Host cpu_out(DType::float32, {3, 8});
  ExecConfig cpu;
  cpu.backend = Backend::cpu;
  const Status cpu_status =
      moe_init_routing_grad(in.grad.view(), in.idx.view(), in.attrs, cpu_out.view(), cpu);
  Status gpu_status;
  const Host got = grad_gpu(in, &gpu_status);
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

struct ForwardInput {
  Host x, ids, scale, offset, weight;
  MoeInitRoutingAttrs attrs;
};

struct ForwardOutput {
  Status status;
  Host out[5];
};

ForwardOutput forward(ForwardInput& in, bool gpu) {
  ForwardOutput r;
  MoeInitRoutingPlan plan;
  r.status = infer_moe_init_routing(in.x.view(), in.ids.view(), in.scale.view(), in.offset.view(),
                                    in.weight.view(), in.attrs, &plan);
  if (!r.status.is_ok()) return r;
  const OutputSpec* specs[] = {&plan.expanded_x, &plan.expanded_row_idx,
                               &plan.expert_tokens_count_or_cumsum, &plan.expanded_scale,
                               &plan.expanded_topk_weight};
  for (int i = 0; i < 5; ++i) r.out[i] = from_spec(*specs[i]);
  if (!gpu) {
    ExecConfig cpu;
    cpu.backend = Backend::cpu;
    r.status = moe_init_routing(in.x.view(), in.ids.view(), in.scale.view(), in.offset.view(),
                                in.weight.view(), in.attrs, r.out[0].view(), r.out[1].view(),
                                r.out[2].view(), r.out[3].view(), r.out[4].view(), cpu);
    return r;
  }
  DeviceCopies dev;
  TensorView o[5];
  for (int i = 0; i < 5; ++i) o[i] = dev.output(r.out[i]);
  r.status = moe_init_routing(dev.upload(in.x), dev.upload(in.ids), dev.upload(in.scale),
                              dev.upload(in.offset), dev.upload(in.weight), in.attrs, o[0], o[1],
                              o[2], o[3], o[4]);
  CHECK_CUDA(cudaDeviceSynchronize());
  for (int i = 0; i < 5; ++i) DeviceCopies::download(o[i], r.out[i]);
  return r;
}

void check_forward() {
  std::mt19937_64 rng(2);
  const int64_t hiddens[] = {1, 5, 16, 19, 96, 1031, 4096};
  for (DType dtype : {DType::float32, DType::float16, DType::bfloat16})
    for (int scenario = 0; scenario < 4; ++scenario)  // dropless, partial range, active, drop-pad
      for (int64_t quant : {-1, 0, 1})
        for (int64_t row_idx_type : {0, 1})
          for (Numerics numerics : {Numerics::atlas_a2, Numerics::ascend_950}) {
            if (scenario == 3 && (quant != -1 || row_idx_type != 0)) continue;
            if (quant == -1 && numerics == Numerics::ascend_950) continue;
            bool ok = true;
            std::string first;
            for (int repeat = 0; repeat < 6; ++repeat) {
              ForwardInput in;
              const bool large = repeat == 5;
              const int64_t N = large ? 3000 : uniform(rng, 1, 40), K = uniform(rng, 1, 8);
              const int64_t H = large ? 24 : hiddens[uniform(rng, 0, 6)],
                            E = uniform(rng, 1, large ? 300 : 40);
              in.x = Host(dtype, {N, H});
              fill_float(in.x, rng());
              in.ids = Host(DType::int32, {N, K});
              int32_t* ids = reinterpret_cast<int32_t*>(in.ids.bytes.data());
              for (int64_t p = 0; p < N * K; ++p) ids[p] = int32_t(uniform(rng, -1, E));
              MoeInitRoutingAttrs& a = in.attrs;
              a.expert_num = E;
              a.quant_mode = quant;
              a.row_idx_type = row_idx_type;
              a.numerics = numerics;
              a.expert_tokens_num_flag = rng() % 4 != 0;
              a.expert_tokens_num_type = uniform(rng, 0, 2);
              int64_t range = E;
              if (scenario == 1) {
                const int64_t s = uniform(rng, 0, E - 1), e = uniform(rng, s + 1, E);
                a.has_active_expert_range = true;
                a.active_expert_range = {s, e};
                range = e - s;
              }
              if (scenario == 2) a.active_num = uniform(rng, 1, N * K + 2);
              if (scenario == 3) {
                a.drop_pad_mode = 1;
                a.expert_capacity = uniform(rng, 1, N);
                for (int64_t p = 0; p < N * K; ++p)
                  ids[p] = std::min<int32_t>(std::max<int32_t>(ids[p], 0), int32_t(E - 1));
              }
              if (rng() % 2) {
                in.weight = Host(DType::float32, {N, K});
                fill_float(in.weight, rng());
              }
              if (quant == -1 && rng() % 2) {
                in.scale = Host(DType::float32, {N});
                fill_float(in.scale, rng());
              }
              if (quant == 0) {
                in.scale = Host(DType::float32, {1});
                fill_float(in.scale, rng());
                if (rng() % 2) {
                  in.offset = Host(DType::float32, {1});
                  fill_float(in.offset, rng());
                }
              }
              if (quant == 1 && rng() % 3 != 0) {
                in.scale = Host(DType::float32, {rng() % 2 ? range : 1, H});
                fill_float(in.scale, rng());
              }
              const ForwardOutput expected = forward(in, false);
              const ForwardOutput got = forward(in, true);
              bool same_all = expected.status.is_ok() && got.status.is_ok();
              for (int i = 0; same_all && i < 5; ++i) same_all = same(expected.out[i], got.out[i]);
              if (!same_all && ok) {
                first = " (first: N=" + std::to_string(N) + " K=" + std::to_string(K) +
                        " H=" + std::to_string(H) + " E=" + std::to_string(E) +
                        (got.status.is_ok() ? "" : ": " + got.status.message()) + ")";
                ok = false;
              }
            }
            const char* scenarios[] = {"dropless", "partial_range", "active", "drop_pad"};
            const std::string name = std::string("moe_init_routing ") + dtype_name(dtype) + " " +
                                     scenarios[scenario] + " quant " + std::to_string(quant) +
                                     " row_idx_type " + std::to_string(row_idx_type) + " " +
                                     numerics_name(numerics);
            report(ok, name + first);
            std::printf("%s %s\n", ok ? "PASS" : "----", name.c_str());
          }
}

void check_v2() {
  std::mt19937_64 rng(3);
  for (DType dtype : {DType::float32, DType::float16, DType::bfloat16})
    for (int mode = 0; mode < 3; ++mode) {  // dropless, active_num, drop-pad
      bool ok = true;
      for (int repeat = 0; repeat < 8; ++repeat) {
        const int64_t N = uniform(rng, 1, repeat < 4 ? 40 : 3000), K = uniform(rng, 1, 8);
        const int64_t H = repeat % 2 ? uniform(rng, 1, 20) : 64 * uniform(rng, 1, 4),
                      E = uniform(rng, 1, 300);
        Host x(dtype, {N, H}), ids(DType::int32, {N, K});
        fill_float(x, rng());
        for (int64_t p = 0; p < N * K; ++p)
          reinterpret_cast<int32_t*>(ids.bytes.data())[p] = int32_t(uniform(rng, 0, E - 1));
        MoeInitRoutingV2Attrs a;
        a.expert_num = E;
        a.expert_tokens_count_or_cumsum_flag = uniform(rng, 0, 2);
        a.expert_tokens_before_capacity_flag = rng() % 2;
        if (mode == 1) a.active_num = uniform(rng, 1, N * K + 2);
        if (mode == 2) {
          a.drop_pad_mode = 1;
          a.expert_capacity = uniform(rng, 1, N);
        }
        MoeInitRoutingV2Plan plan;
        require(infer_moe_init_routing_v2(x.view(), ids.view(), a, &plan), "infer v2");
        Host cpu_out[4] = {from_spec(plan.expanded_x), from_spec(plan.expanded_row_idx),
                           from_spec(plan.expert_tokens_count_or_cumsum),
                           from_spec(plan.expert_tokens_before_capacity)};
        Host gpu_out[4] = {cpu_out[0], cpu_out[1], cpu_out[2], cpu_out[3]};
        ExecConfig cpu;
        cpu.backend = Backend::cpu;
        require(moe_init_routing_v2(x.view(), ids.view(), a, cpu_out[0].view(), cpu_out[1].view(),
                                    cpu_out[2].view(), cpu_out[3].view(), cpu),
                "CPU v2");
        DeviceCopies dev;
        TensorView o[4];
        for (int i = 0; i < 4; ++i) o[i] = dev.output(gpu_out[i]);
        const Status s =
            moe_init_routing_v2(dev.upload(x), dev.upload(ids), a, o[0], o[1], o[2], o[3]);
        CHECK_CUDA(cudaDeviceSynchronize());
        for (int i = 0; i < 4; ++i) DeviceCopies::download(o[i], gpu_out[i]);
        bool same_all = s.is_ok();
        for (int i = 0; same_all && i < 4; ++i) same_all = same(cpu_out[i], gpu_out[i]);
        ok = ok && same_all;
      }
      const char* modes[] = {"dropless", "active", "drop_pad"};
      const std::string name =
          std::string("moe_init_routing_v2 ") + dtype_name(dtype) + " " + modes[mode];
      report(ok, name);
      std::printf("%s %s\n", ok ? "PASS" : "----", name.c_str());
    }
}

// ---- the combine --------------------------------------------------------------------------------

/// Row indices of `pairs` pairs over `rows` rows: a permutation of [0, pairs) (dropless: values
/// >= rows are pairs cut by active_num; drop-pad: they become -1), and some -1.
std::vector<int32_t> combine_rows(std::mt19937_64& rng, int64_t pairs, int64_t rows,
                                  bool drop_pad) {
  std::vector<int32_t> idx(static_cast<size_t>(pairs));
  std::iota(idx.begin(), idx.end(), 0);
  std::shuffle(idx.begin(), idx.end(), rng);
  for (int32_t& r : idx) {
    if (drop_pad && r >= rows) r = -1;
    if (rng() % 10 == 0) r = -1;
  }
  return idx;
}

Host int32_host(std::vector<int64_t> shape, const std::vector<int32_t>& values) {
  Host h(DType::int32, std::move(shape));
  std::memcpy(h.bytes.data(), values.data(), values.size() * 4);
  return h;
}

/// One forward call: its inputs (absent where not given) and attributes.
struct FinalizeCall {
  Host ex, idx, x1, x2, bias, scales, experts;
  MoeFinalizeRoutingAttrs attrs;
  int64_t n = 0, h = 0;

  MoeFinalizeRoutingInputs views() {
    MoeFinalizeRoutingInputs in;
    in.expanded_x = ex.view();
    in.expanded_row_idx = idx.view();
    in.x1 = x1.view();
    in.x2 = x2.view();
    in.bias = bias.view();
    in.scales = scales.view();
    in.expert_idx = experts.view();
    return in;
  }
  MoeFinalizeRoutingInputs upload(DeviceCopies& dev) {
    MoeFinalizeRoutingInputs in;
    in.expanded_x = dev.upload(ex);
    in.expanded_row_idx = dev.upload(idx);
    in.x1 = dev.upload(x1);
    in.x2 = dev.upload(x2);
    in.bias = dev.upload(bias);
    in.scales = dev.upload(scales);
    in.expert_idx = dev.upload(experts);
    return in;
  }
};

/// options: bit 0 x1, bit 1 x2 (with x1), bit 2 bias (with expert_idx); scales always.
FinalizeCall finalize_call(std::mt19937_64& rng, DType dtype, bool f32_scales, int64_t mode,
                           Numerics numerics, bool v1, int options, int64_t n, int64_t k,
                           int64_t h) {
  FinalizeCall c;
  c.n = n, c.h = h;
  if (v1) options = 7;
  const bool drop_pad = mode == 1 || mode == 3;
  const int64_t pairs = n * k, experts = uniform(rng, 1, 9);
  int64_t rows = pairs;
  if (drop_pad) {
    const int64_t capacity = uniform(rng, 1, pairs / experts + 1);
    rows = experts * capacity;
    c.ex = Host(dtype, {experts, capacity, h});
  } else {
    if (rng() % 3 == 0) rows = uniform(rng, 0, pairs);  // rows cut by active_num
    c.ex = Host(dtype, {rows, h});
  }
  fill_float(c.ex, rng());
  c.idx = int32_host({pairs}, combine_rows(rng, pairs, rows, drop_pad));
  c.scales = Host(f32_scales ? DType::float32 : dtype, {n, k});
  fill_float(c.scales, rng());
  if (options & 3) {
    c.x1 = Host(dtype, {n, h});
    fill_float(c.x1, rng());
  }
  if (options & 2) {
    c.x2 = Host(dtype, {n, h});
    fill_float(c.x2, rng());
  }
  if (options & 4) {
    c.bias = Host(dtype, {experts, h});
    fill_float(c.bias, rng());
    std::vector<int32_t> ids(static_cast<size_t>(pairs));
    for (int32_t& e : ids) e = int32_t(uniform(rng, 0, experts - 1));
    c.experts = int32_host({n, k}, ids);
  }
  c.attrs.drop_pad_mode = mode;
  c.attrs.numerics = numerics;
  c.attrs.api = v1 ? FinalizeRoutingApi::v1 : FinalizeRoutingApi::v2;
  return c;
}

/// The forward on the CPU backend, or on the GPU into a poisoned output.
Host finalize_run(FinalizeCall& c, bool gpu, Status* status) {
  Host out(c.ex.dtype, {c.n, c.h});
  if (!gpu) {
    ExecConfig cpu;
    cpu.backend = Backend::cpu;
    *status = moe_finalize_routing(c.views(), c.attrs, out.view(), cpu);
    return out;
  }
  DeviceCopies dev;
  const TensorView o = dev.output(out);
  *status = moe_finalize_routing(c.upload(dev), c.attrs, o);
  CHECK_CUDA(cudaDeviceSynchronize());
  DeviceCopies::download(o, out);
  return out;
}

void check_finalize() {
  std::mt19937_64 rng(5);
  struct Shape {
    int64_t n, k, h;
  };
  const Shape shapes[] = {{1, 1, 1},    {7, 2, 8},   {33, 3, 24},   {5, 4, 64},
                          {9, 8, 7168}, {4, 40, 40}, {97, 2, 4096}, {64, 8, 257}};
  const std::pair<DType, bool> dtypes[] = {{DType::float32, false},
                                           {DType::float16, false},
                                           {DType::bfloat16, false},
                                           {DType::bfloat16, true}};
  for (const auto& [dtype, f32_scales] : dtypes)
    for (int64_t mode = 0; mode < 5; ++mode)  // 4: api v1
      for (Numerics numerics : {Numerics::atlas_a2, Numerics::ascend_950}) {
        bool ok = true;
        std::string first;
        for (int options = 0; options < 8; ++options)
          for (const Shape& s : shapes) {
            FinalizeCall c = finalize_call(rng, dtype, f32_scales, mode % 4, numerics, mode == 4,
                                           options, s.n, s.k, s.h);
            Status cpu_status, gpu_status;
            const Host expected = finalize_run(c, false, &cpu_status);
            require(cpu_status, "CPU moe_finalize_routing");
            const Host got = finalize_run(c, true, &gpu_status);
            if (!gpu_status.is_ok() || !same(expected, got)) {
              if (ok)
                first = " (first: options " + std::to_string(options) +
                        " N=" + std::to_string(s.n) + " K=" + std::to_string(s.k) +
                        " H=" + std::to_string(s.h) +
                        (gpu_status.is_ok() ? "" : ": " + gpu_status.message()) + ")";
              ok = false;
            }
          }
        const std::string name = std::string("moe_finalize_routing ") + dtype_name(dtype) +
                                 (f32_scales ? "+f32 scales" : "") +
                                 (mode == 4 ? " v1" : " mode " + std::to_string(mode)) + " " +
                                 numerics_name(numerics);
        report(ok, name + first);
        std::printf("%s %s\n", ok ? "PASS" : "----", name.c_str());
      }
  // A bad index and a bad expert id: the CPU's message, nothing written.
  for (int bad = 0; bad < 2; ++bad) {
    FinalizeCall c =
        finalize_call(rng, DType::float32, false, 2, Numerics::atlas_a2, false, 7, 3, 2, 8);
    if (bad == 0)
      reinterpret_cast<int32_t*>(c.idx.bytes.data())[5] = 99;
    else
      for (int64_t p = 0; p < 6; ++p) reinterpret_cast<int32_t*>(c.experts.bytes.data())[p] = 99;
    Status cpu_status, gpu_status;
    finalize_run(c, false, &cpu_status);
    const Host got = finalize_run(c, true, &gpu_status);
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

/// One backward call; grad_scales with scales, grad_bias with bias.
struct FinalizeGradCall {
  Host gy, idx, ex, scales, experts, bias;
  MoeFinalizeRoutingGradAttrs attrs;
  std::vector<int64_t> rows_shape;
  int64_t n = 0, k = 0, h = 0, e = 0;
};

FinalizeGradCall finalize_grad_call(std::mt19937_64& rng, DType dtype, bool f32_scales,
                                    int64_t mode, Numerics numerics, int options, int64_t n,
                                    int64_t k, int64_t h) {
  FinalizeGradCall c;
  c.n = n, c.k = k, c.h = h;
  const int64_t pairs = n * k;
  c.e = uniform(rng, 1, 9);
  int64_t rows = pairs;
  if (mode == 1) {
    c.attrs.drop_pad_mode = 1;
    c.attrs.expert_num = c.e;
    c.attrs.expert_capacity = uniform(rng, 1, pairs / c.e + 1);
    rows = c.e * c.attrs.expert_capacity;
    c.rows_shape = {c.e, c.attrs.expert_capacity, h};
  } else {
    if (pairs > 1 && rng() % 3 == 0) {
      c.attrs.active_num = uniform(rng, 1, pairs - 1);
      rows = c.attrs.active_num;
    }
    c.rows_shape = {rows, h};
  }
  c.attrs.numerics = numerics;
  c.gy = Host(dtype, {n, h});
  fill_float(c.gy, rng());
  c.idx = int32_host({pairs}, combine_rows(rng, pairs, rows, mode == 1));
  c.ex = Host(dtype, c.rows_shape);
  fill_float(c.ex, rng());
  c.scales = Host(f32_scales ? DType::float32 : dtype, {n, k});
  fill_float(c.scales, rng());
  if (options & 1) {
    c.bias = Host(dtype, {c.e, h});
    fill_float(c.bias, rng());
    std::vector<int32_t> ids(static_cast<size_t>(pairs));
    for (int32_t& id : ids) id = int32_t(uniform(rng, 0, c.e - 1));
    c.experts = int32_host({n, k}, ids);
  }
  return c;
}

/// The backward's three outputs on the CPU backend, or on the GPU into poisoned outputs.
std::vector<Host> finalize_grad_run(FinalizeGradCall& c, bool gpu, Status* status) {
  std::vector<Host> out = {Host(c.gy.dtype, c.rows_shape), Host(c.scales.dtype, {c.n, c.k}),
                           c.bias.present ? Host(c.gy.dtype, {c.e, c.h}) : Host()};
  if (!gpu) {
    ExecConfig cpu;
    cpu.backend = Backend::cpu;
    MoeFinalizeRoutingGradInputs in;
    in.grad_y = c.gy.view();
    in.expanded_row_idx = c.idx.view();
    in.expanded_x = c.ex.view();
    in.scales = c.scales.view();
    in.expert_idx = c.experts.view();
    in.bias = c.bias.view();
    *status =
        moe_finalize_routing_grad(in, c.attrs, {out[0].view(), out[1].view(), out[2].view()}, cpu);
    return out;
  }
  DeviceCopies dev;
  MoeFinalizeRoutingGradInputs in;
  in.grad_y = dev.upload(c.gy);
  in.expanded_row_idx = dev.upload(c.idx);
  in.expanded_x = dev.upload(c.ex);
  in.scales = dev.upload(c.scales);
  in.expert_idx = dev.upload(c.experts);
  in.bias = dev.upload(c.bias);
  const MoeFinalizeRoutingGradOutputs o = {dev.output(out[0]), dev.output(out[1]),
                                           dev.output(out[2])};
  *status = moe_finalize_routing_grad(in, c.attrs, o);
  CHECK_CUDA(cudaDeviceSynchronize());
  DeviceCopies::download(o.grad_expanded_x, out[0]);
  DeviceCopies::download(o.grad_scales, out[1]);
  DeviceCopies::download(o.grad_bias, out[2]);
  return out;
}

void check_finalize_grad() {
  std::mt19937_64 rng(7);
  struct Shape {
    int64_t n, k, h;
  };
  // H across the grad_scales orders' regimes: one 64-lane tree, the fold, several 512-lane groups,
  // more than one atlas_a2 chunk (16352 float32 products without bias).
  const Shape shapes[] = {{1, 1, 1},   {7, 2, 8},     {33, 3, 64},  {5, 4, 65},  {9, 8, 7168},
                          {4, 40, 40}, {3, 2, 16400}, {64, 8, 257}, {2, 130, 24}};
  const std::pair<DType, bool> dtypes[] = {{DType::float32, false},
                                           {DType::float16, false},
                                           {DType::bfloat16, false},
                                           {DType::bfloat16, true}};
  for (const auto& [dtype, f32_scales] : dtypes)
    for (int64_t mode : {0, 1})
      for (Numerics numerics : {Numerics::atlas_a2, Numerics::ascend_950}) {
        bool ok = true;
        std::string first;
        for (int options = 0; options < 2; ++options)
          for (const Shape& s : shapes) {
            FinalizeGradCall c =
                finalize_grad_call(rng, dtype, f32_scales, mode, numerics, options, s.n, s.k, s.h);
            Status cpu_status, gpu_status;
            const std::vector<Host> expected = finalize_grad_run(c, false, &cpu_status);
            require(cpu_status, "CPU moe_finalize_routing_grad");
            const std::vector<Host> got = finalize_grad_run(c, true, &gpu_status);
            bool equal = gpu_status.is_ok();
            for (size_t i = 0; equal && i < got.size(); ++i) equal = same(expected[i], got[i]);
            if (!equal) {
              if (ok)
                first = " (first: bias " + std::to_string(options) + " N=" + std::to_string(s.n) +
                        " K=" + std::to_string(s.k) + " H=" + std::to_string(s.h) +
                        (gpu_status.is_ok() ? "" : ": " + gpu_status.message()) + ")";
              ok = false;
            }
          }
        const std::string name = std::string("moe_finalize_routing_grad ") + dtype_name(dtype) +
                                 (f32_scales ? "+f32 scales" : "") + " mode " +
                                 std::to_string(mode) + " " + numerics_name(numerics);
        report(ok, name + first);
        std::printf("%s %s\n", ok ? "PASS" : "----", name.c_str());
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

struct Model {
  const char* name;
  int64_t hidden, experts, top_k;
};

void bench(const Model& m, int64_t tokens, DType dtype, double copy_gbps) {
  const int64_t N = tokens, K = m.top_k, H = m.hidden, E = m.experts, P = N * K;
  const size_t el = dtype_size(dtype);
  const std::string name = std::string(m.name) + " N=" + std::to_string(N);
  std::mt19937_64 rng(uint64_t(N * 131 + H));
  Host x(dtype, {N, H}), ids(DType::int32, {N, K});
  fill_float(x, rng());
  const std::vector<int32_t> routing = route(rng, N, K, E);
  std::memcpy(ids.bytes.data(), routing.data(), routing.size() * 4);

  // Forward (torch API, dropless, counts): read x once and the ids, write expanded_x,
  // expanded_row_idx and the counts.
  MoeInitRoutingAttrs attrs;
  attrs.expert_num = E;
  attrs.expert_tokens_num_flag = true;
  attrs.expert_tokens_num_type = 1;
  MoeInitRoutingPlan plan;
  require(infer_moe_init_routing(x.view(), ids.view(), TensorView(), TensorView(), TensorView(),
                                 attrs, &plan),
          "infer");
  Host fx = from_spec(plan.expanded_x), fr = from_spec(plan.expanded_row_idx),
       fc = from_spec(plan.expert_tokens_count_or_cumsum);
  DeviceCopies dev;
  const TensorView dx = dev.upload(x), dids = dev.upload(ids);
  const TensorView ox = dev.output(fx), orow = dev.output(fr), oc = dev.output(fc);
  const double fwd_ms = time_ms([&] {
    require(moe_init_routing(dx, dids, TensorView(), TensorView(), TensorView(), attrs, ox, orow,
                             oc, TensorView(), TensorView()),
            "moe_init_routing");
  });
  DeviceCopies::download(ox, fx);
  DeviceCopies::download(orow, fr);
  DeviceCopies::download(oc, fc);
  Host cx = from_spec(plan.expanded_x), cr = from_spec(plan.expanded_row_idx),
       cc = from_spec(plan.expert_tokens_count_or_cumsum);
  ExecConfig cpu;
  cpu.backend = Backend::cpu;
  require(moe_init_routing(x.view(), ids.view(), TensorView(), TensorView(), TensorView(), attrs,
                           cx.view(), cr.view(), cc.view(), TensorView(), TensorView(), cpu),
          "CPU forward");
  const bool fwd_ok = same(cx, fx) && same(cr, fr) && same(cc, fc);
  report(fwd_ok, "benchmark forward " + name + " differs from the CPU");
  const double fwd_bytes =
      double(N * H * el) + double(P) * 4 + double(P * H * el) + double(P) * 4 + double(E) * 8;
  result_line("moe_init_routing", "ours", name, dtype, fwd_ms, fwd_bytes, copy_gbps,
              fwd_ok ? "yes" : "NO");

  // Backward (dropless) on the forward's expanded_row_idx: read every grad row once and the
  // indices, write grad_x.
  Host g(dtype, {P, H});
  fill_float(g, rng());
  const TensorView dg = dev.upload(g);
  Host gx(dtype, {N, H});
  const TensorView ogx = dev.output(gx);
  for (AccumulationOrder order : {AccumulationOrder::tree, AccumulationOrder::sequential}) {
    MoeInitRoutingGradAttrs ga;
    ga.top_k = K;
    ga.order = order;
    const double ms = time_ms(
        [&] { require(moe_init_routing_grad(dg, orow, ga, ogx), "moe_init_routing_grad"); });
    DeviceCopies::download(ogx, gx);
    Host expected(dtype, {N, H});
    require(moe_init_routing_grad(g.view(), fr.view(), ga, expected.view(), cpu), "CPU grad");
    const bool ok = same(expected, gx);
    report(ok, "benchmark backward " + name + " " + accumulation_order_name(order) +
                   " differs from the CPU");
    const double bytes = double(P * H * el) + double(P) * 4 + double(N * H * el);
    result_line("moe_init_routing_grad", order == AccumulationOrder::tree ? "ours" : "ours-seq",
                name, dtype, ms, bytes, copy_gbps, ok ? "yes" : "NO");
  }

  // The combine of the forward's rows (drop_pad_mode 2: the row layout the forward returned),
  // float32 scales with bfloat16 data: read every expanded row once, the indices and scales,
  // write out [N, H]. Then its backward (grad_expanded_x and grad_scales).
  const DType scales_dtype = dtype == DType::bfloat16 ? DType::float32 : dtype;
  const size_t sl = dtype_size(scales_dtype);
  Host scales(scales_dtype, {N, K});
  fill_float(scales, rng());
  const TensorView dscales = dev.upload(scales);
  for (Numerics numerics : {Numerics::atlas_a2, Numerics::ascend_950}) {
    const char* impl = numerics == Numerics::atlas_a2 ? "ours" : "ours-950";
    MoeFinalizeRoutingAttrs fa;
    fa.drop_pad_mode = 2;
    fa.numerics = numerics;
    MoeFinalizeRoutingInputs din, hin;
    din.expanded_x = ox, din.expanded_row_idx = orow, din.scales = dscales;
    hin.expanded_x = cx.view(), hin.expanded_row_idx = cr.view(), hin.scales = scales.view();
    Host out(dtype, {N, H});
    const TensorView dout = dev.output(out);
    const double ms =
        time_ms([&] { require(moe_finalize_routing(din, fa, dout), "moe_finalize_routing"); });
    DeviceCopies::download(dout, out);
    Host expected(dtype, {N, H});
    require(moe_finalize_routing(hin, fa, expected.view(), cpu), "CPU moe_finalize_routing");
    const bool ok = same(expected, out);
    report(ok,
           "benchmark combine " + name + " " + numerics_name(numerics) + " differs from the CPU");
    result_line("moe_finalize_routing", impl, name, dtype, ms,
                double(P * H * el) + double(P) * double(4 + sl) + double(N * H * el), copy_gbps,
                ok ? "yes" : "NO");

    MoeFinalizeRoutingGradAttrs ga;
    ga.numerics = numerics;
    MoeFinalizeRoutingGradInputs dgin, hgin;
    dgin.grad_y = dev.upload(gx), dgin.expanded_row_idx = orow, dgin.expanded_x = ox;
    dgin.scales = dscales;
    hgin.grad_y = gx.view(), hgin.expanded_row_idx = cr.view(), hgin.expanded_x = cx.view();
    hgin.scales = scales.view();
    Host gex(dtype, {P, H}), gs(scales_dtype, {N, K});
    const MoeFinalizeRoutingGradOutputs dgo = {dev.output(gex), dev.output(gs), TensorView()};
    const double grad_ms = time_ms(
        [&] { require(moe_finalize_routing_grad(dgin, ga, dgo), "moe_finalize_routing_grad"); });
    DeviceCopies::download(dgo.grad_expanded_x, gex);
    DeviceCopies::download(dgo.grad_scales, gs);
    Host egex(dtype, {P, H}), egs(scales_dtype, {N, K});
    require(moe_finalize_routing_grad(hgin, ga, {egex.view(), egs.view(), TensorView()}, cpu),
            "CPU moe_finalize_routing_grad");
    const bool grad_ok = same(egex, gex) && same(egs, gs);
    report(grad_ok, "benchmark combine backward " + name + " " + numerics_name(numerics) +
                        " differs from the CPU");
    result_line("moe_finalize_routing_grad", impl, name, dtype, grad_ms,
                double(N * H * el) + double(P * H * el) + double(P) * double(4 + sl) +
                    double(P * H * el) + double(P) * double(sl),
                copy_gbps, grad_ok ? "yes" : "NO");
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
    const Model models[] = {
        {"DeepSeek-V3", 7168, 256, 8}, {"Qwen3", 4096, 128, 8}, {"Mixtral", 4096, 8, 2}};
    for (const Model& m : models) bench(m, 8192, DType::bfloat16, copy_gbps);
    bench(models[0], 2048, DType::bfloat16, copy_gbps);
    bench(models[0], 16384, DType::bfloat16, copy_gbps);
    bench(models[1], 8192, DType::float32, copy_gbps);
  }
  if (results != nullptr) std::fclose(results);
  return failures == 0 ? 0 : 1;
}
