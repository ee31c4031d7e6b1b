// `moe-routing demo`: a seeded synthetic MoE batch through the forward (moe_init_routing_v2) and
// the backward (moe_init_routing_grad) in all three scenarios, timed on the CPU kernels and
// verified bit for bit against the reference backend.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <sstream>

#include "cases/random.h"
#include "cases/synthetic.h"
#include "commands.h"
#include "moe_routing/moe_routing.hpp"
#if defined(MOE_ROUTING_HAVE_CUDA)
#include "cuda/device_memory.h"
#endif

namespace moe_routing::cli {
namespace {

using cases::fill_random;
using cases::grad_problem;
using cases::GradProblem;
using cases::random_expert_idx;
using cases::routing_scenarios;
using cases::RoutingScenario;

using Clock = std::chrono::steady_clock;

double milliseconds_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

void progress(const std::string& line) { std::cerr << "[demo] " << line << std::endl; }

/// First difference between two same-sized buffers of `dtype` elements, as text for stderr; empty
/// when they are equal.
std::string first_difference(DType dtype, const uint8_t* got, const uint8_t* expected,
                             size_t bytes) {
  if (bytes == 0 || std::memcmp(got, expected, bytes) == 0) return "";
  const size_t element = dtype_size(dtype);
  const int64_t count = int64_t(bytes / element);
  int64_t differing = 0, first = -1;
  for (int64_t i = 0; i < count; ++i)
    if (std::memcmp(got + i * element, expected + i * element, element) != 0) {
      if (first < 0) first = i;
      ++differing;
    }
  auto value = [&](const uint8_t* data) -> std::string {
    std::ostringstream text;
    switch (dtype) {
      case DType::int8: text << int(reinterpret_cast<const int8_t*>(data)[first]); break;
      case DType::int32: text << reinterpret_cast<const int32_t*>(data)[first]; break;
      case DType::int64: text << reinterpret_cast<const int64_t*>(data)[first]; break;
      default: text << load_as_float(data, dtype, first); break;
    }
    return text.str();
  };
  std::ostringstream out;
  out << differing << " of " << count << " elements differ from the reference; first at flat index "
      << first << ": expected " << value(expected) << ", got " << value(got);
  return out.str();
}

/// Every output of one moe_init_routing_v2 call, allocated from its plan.
struct ForwardOutputs {
  std::vector<uint8_t> expanded_x;
  std::vector<int32_t> expanded_row_idx, counts, before_capacity;

  ForwardOutputs(const MoeInitRoutingV2Plan& plan, uint8_t poison) {
    const int32_t poison32 = int32_t(uint32_t(poison) * 0x01010101u);
    expanded_x.assign(size_t(plan.expanded_x.numel()) * dtype_size(plan.dtype), poison);
    expanded_row_idx.assign(size_t(plan.expanded_row_idx.numel()), poison32);
    if (plan.expert_tokens_count_or_cumsum.produced)
      counts.assign(size_t(plan.expert_num), poison32);
    if (plan.expert_tokens_before_capacity.produced)
      before_capacity.assign(size_t(plan.expert_num), poison32);
  }

  static TensorView view(void* data, const OutputSpec& spec) {
    if (!spec.produced) return TensorView();
    static uint64_t empty = 0;  // a non-null pointer for empty outputs
    return TensorView(data != nullptr ? data : &empty, spec.dtype, spec.ndim, spec.shape);
  }

  Status run(const TensorView& x, const TensorView& expert_idx, const MoeInitRoutingV2Attrs& attrs,
             const MoeInitRoutingV2Plan& plan, const ExecConfig& config) {
    return moe_init_routing_v2(x, expert_idx, attrs, view(expanded_x.data(), plan.expanded_x),
                               view(expanded_row_idx.data(), plan.expanded_row_idx),
                               view(counts.data(), plan.expert_tokens_count_or_cumsum),
                               view(before_capacity.data(), plan.expert_tokens_before_capacity),
                               config);
  }

  /// Empty when every output equals `expected`'s bit for bit; else the first difference.
  std::string compare(const ForwardOutputs& expected, DType dtype) const {
    const struct {
      const char* name;
      DType dtype;
      const uint8_t *got, *expected;
      size_t bytes;
    } parts[] = {
        {"expanded_x", dtype, expanded_x.data(), expected.expanded_x.data(), expanded_x.size()},
        {"expanded_row_idx", DType::int32, bytes_of(expanded_row_idx),
         bytes_of(expected.expanded_row_idx), expanded_row_idx.size() * 4},
        {"expert_tokens_count_or_cumsum", DType::int32, bytes_of(counts), bytes_of(expected.counts),
         counts.size() * 4},
        {"expert_tokens_before_capacity", DType::int32, bytes_of(before_capacity),
         bytes_of(expected.before_capacity), before_capacity.size() * 4},
    };
    for (const auto& part : parts) {
      const std::string difference =
          first_difference(part.dtype, part.got, part.expected, part.bytes);
      if (!difference.empty()) return std::string(part.name) + ": " + difference;
    }
    return "";
  }

 private:
  static const uint8_t* bytes_of(const std::vector<int32_t>& v) {
    return reinterpret_cast<const uint8_t*>(v.data());
  }
};

struct Row {
  std::string op, scenario, order;
  double ms = 0, gb_per_s = 0;
  bool verified = false;
};

/// Median milliseconds of `runs` calls after one warm-up call; stops at the first error.
template <typename Call>
Status time_runs(int64_t runs, Call call, double* ms) {
  MOE_ROUTING_RETURN_IF_ERROR(call());  // warm-up
  std::vector<double> times;
  for (int64_t run = 0; run < runs; ++run) {
    const Clock::time_point start = Clock::now();
    const Status s = call();
    times.push_back(milliseconds_since(start));
    MOE_ROUTING_RETURN_IF_ERROR(s);
  }
  *ms = median(times);
  return Status::ok();
}

class DemoCommand : public Command {
 public:
  CommandInfo info() const override {
    return {"demo",
            "synthetic MoE batch: forward and backward on the CPU, timed and verified bit for bit",
            R"(Builds a seeded synthetic MoE batch: each of N tokens picks top_k distinct experts
out of E, skewed toward low expert ids as real routers are, and x [N, H] holds random values.
Three scenarios: dropless (every pair kept, per-expert counts); active (active_num = 3/4 of
N*top_k, cumulative counts); drop-pad (expert_capacity = ceil(N*top_k / E), each expert's pairs
beyond its capacity dropped, counts before capacity).

For each scenario it runs the forward moe_init_routing_v2 on x, then the backward
moe_init_routing_grad on a random grad_expanded_x of the forward's expanded_x shape with the
forward's expanded_row_idx. Each operator runs on the CPU kernels (median of --runs timed runs
after a warm-up) and is checked bit for bit, every output, against the reference backend. One
table row per operator and scenario: time, GB/s (bytes that must move: inputs read once, outputs
written once; for the backward only the grad rows that are summed) and whether it verified.

Exits with status 1 if anything fails verification. Progress goes to stderr, the table to
stdout.)",
            "moe-routing demo\n"
            "moe-routing demo --tokens 1024 --hidden 7168 --experts 256 --dtype fp32\n"
            "moe-routing demo --dtype fp16 --order sequential --threads 1 --runs 11"};
  }

  void declare(ArgParser& p) override {
    p.add_int("--tokens", "N", "number of tokens (rows of x)", &tokens_, 1, 2147483647);
    p.add_int("--hidden", "H", "hidden size", &hidden_, 1, 1 << 24);
    p.add_int("--experts", "E", "number of experts (expert_num)", &experts_, 1, 1 << 24);
    p.add_int("--top-k", "K", "experts per token (top_k), at most --experts", &top_k_, 1, 1 << 24);
    p.add_choice("--dtype", "dtype of x, expanded_x, grad_expanded_x and grad_x",
                 {"bf16", "fp16", "fp32"}, &dtype_);
    p.add_choice("--order",
                 "float32 accumulation order of the backward: tree (Atlas A2/A3 kernel) or "
                 "sequential (Ascend 950 kernel)",
                 {"tree", "sequential"}, &order_);
    p.add_int("--threads", "T",
              "CPU threads; 0 = library default (MOE_ROUTING_NUM_THREADS or every core)", &threads_,
              0, kMaxNumThreads);
    p.add_int("--seed", "S", "seed of the routing, x and the gradient values", &seed_, 0,
              std::numeric_limits<int64_t>::max());
    p.add_choice("--device",
                 "where the operators run: cpu (the CPU kernels) or cuda (the GPU: inputs copied "
                 "there once, outputs copied back and verified against the CPU reference; needs a "
                 "build with MOE_ROUTING_CUDA)",
                 {"cpu", "cuda"}, &device_);
    p.add_int("--runs", "R", "timed runs per operator and scenario (the median is reported)",
              &runs_, 1, 1000);
  }

  int run(const ArgParser&) override {
    const std::string command = "moe-routing: demo: ";
    if (top_k_ > experts_)
      return report_error(invalid_argument(command, "--top-k must be at most --experts (", experts_,
                                           "), got ", top_k_));
    const int64_t n = tokens_, k = top_k_, e = experts_, h = hidden_;
    if (n * k > 2147483647)
      return report_error(invalid_argument(command,
                                           "--tokens * --top-k must be at most 2147483647 (int32 "
                                           "indices), got ",
                                           n * k));
    const DType dtype = dtype_ == "fp32"   ? DType::float32
                        : dtype_ == "fp16" ? DType::float16
                                           : DType::bfloat16;
    AccumulationOrder order = AccumulationOrder::tree;
    parse_accumulation_order(order_.c_str(), &order);
    const size_t element = dtype_size(dtype);

    // Storage: x, the forward's expanded_x twice (CPU kernels and reference), one
    // grad_expanded_x big enough for every scenario, and the backward's two outputs.
    const int64_t capacity = (n * k + e - 1) / e;
    const int64_t max_rows = std::max(n * k, e * capacity);
    const double needed = double(3 * max_rows * h + 3 * n * h) * double(element);
    const double physical = double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGESIZE));
    if (physical > 0 && needed > 0.8 * physical)
      return report_error(invalid_argument(command, "the arrays must fit in 80% of memory (",
                                           gib(physical), "), got ", gib(needed),
                                           " (lower --tokens, --top-k or --hidden)"));

    const int threads = threads_ > 0 ? int(threads_) : get_num_threads();
    ExecConfig cpu;
    cpu.backend = Backend::cpu;
    cpu.num_threads = threads;
    ExecConfig reference;
    reference.backend = Backend::reference;
    const bool on_cuda = device_ == "cuda";
    if (on_cuda) {
      const Status cuda_status = check_cuda(command);
      if (!cuda_status.is_ok()) return report_error(cuda_status);
    }
    const std::string on_cpu = on_cuda ? " on the GPU (" + cuda_device_text() + ")"
                                       : std::string(" on the CPU kernels (") +
                                             cpu_isa_name(best_cpu_isa()) + ", " +
                                             threads_text(threads) + ")";

    progress("routing " + std::to_string(n) + " tokens to top-" + std::to_string(k) + " of " +
             std::to_string(e) + " experts (seed " + std::to_string(seed_) + ")");
    std::vector<int32_t> expert_idx = random_expert_idx(n, k, e, uint64_t(seed_));
    progress("filling x (" + std::to_string(n) + " x " + std::to_string(h) + ") and " +
             "grad_expanded_x (" + std::to_string(max_rows) + " x " + std::to_string(h) + ") " +
             dtype_name(dtype) + ", " + gib(double((n + max_rows) * h) * double(element)));
    std::vector<uint8_t> x_data(size_t(n * h) * element);
    fill_random(x_data.data(), dtype, n * h, uint64_t(seed_) ^ 0x5eed5eed5eed5eedull);
    std::vector<uint8_t> grad(size_t(max_rows * h) * element);
    fill_random(grad.data(), dtype, max_rows * h, uint64_t(seed_));
    std::vector<uint8_t> out(size_t(n * h) * element), expected(out.size());
    const TensorView x(x_data.data(), dtype, {n, h});
    const TensorView ids(expert_idx.data(), DType::int32, {n, k});

    std::vector<Row> rows;
    bool all_verified = true;
    for (const RoutingScenario& scenario : routing_scenarios(n, k, e)) {
      const std::string name = grad_scenario_name(scenario.scenario);
      const MoeInitRoutingV2Attrs& fwd = scenario.attrs;

      // --- forward: moe_init_routing_v2 ---
      MoeInitRoutingV2Plan plan;
      Status s = infer_moe_init_routing_v2(x, ids, fwd, &plan);
      if (!s.is_ok()) return report_error(s);
      std::ostringstream detail;
      if (scenario.scenario == GradScenario::active) detail << ", active_num " << fwd.active_num;
      if (scenario.scenario == GradScenario::drop_pad)
        detail << ", expert_capacity " << fwd.expert_capacity;
      progress(name + ": moe_init_routing_v2" + on_cpu + detail.str());
      ForwardOutputs got(plan, 0xff), want(plan, 0x7f);  // different poisons: unwritten shows
      double forward_ms = 0;
      s = on_cuda ? forward_on_cuda(x, ids, fwd, plan, &got, &forward_ms)
                  : time_runs(
                        runs_, [&] { return got.run(x, ids, fwd, plan, cpu); }, &forward_ms);
      if (!s.is_ok()) return report_error(s);
      progress(name + ": moe_init_routing_v2: verifying against the reference backend");
      Clock::time_point reference_start = Clock::now();
      s = want.run(x, ids, fwd, plan, reference);
      if (!s.is_ok()) return report_error(s);
      const std::string forward_difference = got.compare(want, dtype);
      report(name + ": moe_init_routing_v2", forward_difference, reference_start);
      const double forward_bytes = double(n * h) * double(element) + double(n * k) * 4.0 +
                                   double(plan.expanded_x.numel()) * double(element) +
                                   double(n * k) * 4.0 +
                                   double(got.counts.size() + got.before_capacity.size()) * 4.0;
      rows.push_back({"moe_init_routing_v2", name, "-", forward_ms,
                      forward_bytes / (forward_ms * 1e-3) / 1e9, forward_difference.empty()});
      all_verified = all_verified && forward_difference.empty();

      // --- backward: moe_init_routing_grad on the forward's expanded_row_idx ---
      GradProblem problem = grad_problem(scenario, n, k, h, got.expanded_row_idx);
      MoeInitRoutingGradAttrs attrs = problem.attrs;
      attrs.order = order;
      TensorView g(grad.data(), dtype, int(problem.grad_shape.size()), problem.grad_shape.data());
      TensorView r(problem.expanded_row_idx.data(), DType::int32,
                   {int64_t(problem.expanded_row_idx.size())});
      TensorView o(out.data(), dtype, {n, h});
      TensorView ref_out(expected.data(), dtype, {n, h});

      int64_t present = 0;
      for (int32_t index : problem.expanded_row_idx)
        present += index != -1 &&
                   (attrs.active_num == 0 || attrs.drop_pad_mode == 1 || index < attrs.active_num);
      std::ostringstream grad_detail;
      if (scenario.scenario == GradScenario::drop_pad)
        grad_detail << ", " << (n * k - present) << " of " << n * k << " pairs dropped";
      if (scenario.scenario == GradScenario::active)
        grad_detail << ", " << (n * k - present) << " of " << n * k << " pairs cut";
      progress(name + ": moe_init_routing_grad" + on_cpu + grad_detail.str());
      std::memset(out.data(), 0xff, out.size());  // pre-touch the pages; unwritten output shows
      double grad_ms = 0;
      s = on_cuda
              ? grad_on_cuda(g, r, attrs, o, &grad_ms)
              : time_runs(
                    runs_, [&] { return moe_init_routing_grad(g, r, attrs, o, cpu); }, &grad_ms);
      if (!s.is_ok()) return report_error(s);
      progress(name + ": moe_init_routing_grad: verifying against the reference backend");
      std::memset(expected.data(), 0x7f, expected.size());  // a different poison than `out`
      reference_start = Clock::now();
      s = moe_init_routing_grad(g, r, attrs, ref_out, reference);
      if (!s.is_ok()) return report_error(s);
      const std::string grad_difference =
          first_difference(dtype, out.data(), expected.data(), out.size());
      report(name + ": moe_init_routing_grad",
             grad_difference.empty() ? "" : "grad_x: " + grad_difference, reference_start);
      const double grad_bytes = double(present * h) * double(element) +
                                double(problem.expanded_row_idx.size() * sizeof(int32_t)) +
                                double(n * h) * double(element);
      rows.push_back({"moe_init_routing_grad", name, order_, grad_ms,
                      grad_bytes / (grad_ms * 1e-3) / 1e9, grad_difference.empty()});
      all_verified = all_verified && grad_difference.empty();
    }

    std::printf("moe_init_routing_v2 and moe_init_routing_grad%s, median of %lld runs\n",
                on_cpu.c_str(), static_cast<long long>(runs_));
    std::printf("%-21s %-9s %-9s %-10s %7s %5s %6s %6s %9s %7s  %s\n", "operator", "scenario",
                "dtype", "order", "N", "K", "E", "H", "ms", "GB/s", "verified");
    for (const Row& row : rows)
      std::printf("%-21s %-9s %-9s %-10s %7lld %5lld %6lld %6lld %9.3f %7.2f  %s\n", row.op.c_str(),
                  row.scenario.c_str(), dtype_name(dtype), row.order.c_str(),
                  static_cast<long long>(n), static_cast<long long>(k), static_cast<long long>(e),
                  static_cast<long long>(h), row.ms, row.gb_per_s, row.verified ? "yes" : "NO");
    std::fflush(stdout);
    if (!all_verified) {
      std::cerr << "moe-routing: demo: every operator and scenario must match the reference bit "
                   "for bit, got a mismatch (see above)"
                << std::endl;
      return kExitVerificationFailed;
    }
    return kExitOk;
  }

 private:
  static std::string threads_text(int threads) {
    return std::to_string(threads) + (threads == 1 ? " thread" : " threads");
  }

  static std::string gib(double bytes) {
    char text[32];
    std::snprintf(text, sizeof text, "%.2f GiB", bytes / (1024.0 * 1024.0 * 1024.0));
    return text;
  }

  /// Progress line for a verification; a difference also goes to stderr as an error line.
  static void report(const std::string& what, const std::string& difference,
                     Clock::time_point reference_start) {
    char took[64];
    std::snprintf(took, sizeof took, " (reference took %.0f ms)",
                  milliseconds_since(reference_start));
    if (!difference.empty())
      std::cerr << "moe-routing: demo: " << what << ": " << difference << std::endl;
    progress(what + (difference.empty() ? ": bitwise identical" : ": MISMATCH") + took);
  }

  int64_t tokens_ = 4096, hidden_ = 4096, experts_ = 64, top_k_ = 8;
  // --- --device cuda: the same calls on device copies (src/cuda/device_memory.h) -------------
  static Status check_cuda(const std::string& command) {
#if defined(MOE_ROUTING_HAVE_CUDA)
    std::string why;
    if (!cuda::device_available(&why))
      return runtime_error(command, "--device cuda needs a CUDA GPU, got none (", why, ")");
    return Status::ok();
#else
    return not_supported(command,
                         "--device cuda needs a build with CUDA (cmake "
                         "-DMOE_ROUTING_CUDA=ON), got a build without it");
#endif
  }

  static std::string cuda_device_text() {
#if defined(MOE_ROUTING_HAVE_CUDA)
    return cuda::device_description();
#else
    return "none";
#endif
  }

#if defined(MOE_ROUTING_HAVE_CUDA)
  /// Device copies of host tensors; `download` copies a device view back to host memory.
  struct DeviceCopies {
    std::vector<cuda::DeviceBuffer> buffers;
    Status copy(const TensorView& host, bool upload, TensorView* device) {
      *device = host;
      if (host.data == nullptr) return Status::ok();  // an output not produced
      buffers.emplace_back();
      cuda::DeviceBuffer& buffer = buffers.back();
      MOE_ROUTING_RETURN_IF_ERROR(upload ? buffer.upload(host.data, host.nbytes())
                                         : buffer.allocate(host.nbytes()));
      device->data = buffer.data();
      device->device = Device::cuda;
      return Status::ok();
    }
    Status download(const TensorView& device, const TensorView& host) {
      if (host.data == nullptr || host.nbytes() == 0) return Status::ok();
      for (const cuda::DeviceBuffer& buffer : buffers)
        if (buffer.data() == device.data) return buffer.download(host.data, host.nbytes());
      return internal_error("moe-routing: demo: no device copy of an output, got an unknown one");
    }
  };
#endif

  /// Times `call` plus a device synchronisation (the GPU's work, not just its queueing).
  template <typename Call>
  Status time_device_runs(Call call, double* ms) {
#if defined(MOE_ROUTING_HAVE_CUDA)
    return time_runs(
        runs_,
        [&] {
          MOE_ROUTING_RETURN_IF_ERROR(call());
          return cuda::synchronize_device();
        },
        ms);
#else
    static_cast<void>(call), static_cast<void>(ms);
    return internal_error("moe-routing: demo: no CUDA in this build, got a GPU run");
#endif
  }

  Status forward_on_cuda(const TensorView& x, const TensorView& ids,
                         const MoeInitRoutingV2Attrs& fwd, const MoeInitRoutingV2Plan& plan,
                         ForwardOutputs* got, double* ms) {
#if defined(MOE_ROUTING_HAVE_CUDA)
    const TensorView host[] = {
        ForwardOutputs::view(got->expanded_x.data(), plan.expanded_x),
        ForwardOutputs::view(got->expanded_row_idx.data(), plan.expanded_row_idx),
        ForwardOutputs::view(got->counts.data(), plan.expert_tokens_count_or_cumsum),
        ForwardOutputs::view(got->before_capacity.data(), plan.expert_tokens_before_capacity)};
    DeviceCopies copies;
    TensorView dx, dids, out[4];
    MOE_ROUTING_RETURN_IF_ERROR(copies.copy(x, true, &dx));
    MOE_ROUTING_RETURN_IF_ERROR(copies.copy(ids, true, &dids));
    for (int i = 0; i < 4; ++i) MOE_ROUTING_RETURN_IF_ERROR(copies.copy(host[i], true, &out[i]));
    MOE_ROUTING_RETURN_IF_ERROR(time_device_runs(
        [&] { return moe_init_routing_v2(dx, dids, fwd, out[0], out[1], out[2], out[3]); }, ms));
    for (int i = 0; i < 4; ++i) MOE_ROUTING_RETURN_IF_ERROR(copies.download(out[i], host[i]));
    return Status::ok();
#else
    static_cast<void>(x), static_cast<void>(ids), static_cast<void>(fwd), static_cast<void>(plan),
        static_cast<void>(got), static_cast<void>(ms);
    return internal_error("moe-routing: demo: no CUDA in this build, got a GPU run");
#endif
  }

  Status grad_on_cuda(const TensorView& g, const TensorView& r,
                      const MoeInitRoutingGradAttrs& attrs, const TensorView& o, double* ms) {
#if defined(MOE_ROUTING_HAVE_CUDA)
    DeviceCopies copies;
    TensorView dg, dr, dout;
    MOE_ROUTING_RETURN_IF_ERROR(copies.copy(g, true, &dg));
    MOE_ROUTING_RETURN_IF_ERROR(copies.copy(r, true, &dr));
    MOE_ROUTING_RETURN_IF_ERROR(copies.copy(o, true, &dout));  // the poison travels too
    MOE_ROUTING_RETURN_IF_ERROR(
        time_device_runs([&] { return moe_init_routing_grad(dg, dr, attrs, dout); }, ms));
    return copies.download(dout, o);
#else
    static_cast<void>(g), static_cast<void>(r), static_cast<void>(attrs), static_cast<void>(o),
        static_cast<void>(ms);
    return internal_error("moe-routing: demo: no CUDA in this build, got a GPU run");
#endif
  }

  int64_t threads_ = 0, seed_ = 1, runs_ = 5;
  std::string dtype_ = "bf16", order_ = "tree", device_ = "cpu";
};

}  // namespace

std::unique_ptr<Command> make_demo_command() { return std::make_unique<DemoCommand>(); }

}  // namespace moe_routing::cli
