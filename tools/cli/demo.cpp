// `moe-routing demo`: a seeded synthetic MoE batch through the backward in all three scenarios,
// timed on the CPU kernels and verified bit for bit against the reference backend.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <sstream>
#include <thread>

#include "commands.h"
#include "moe_routing/moe_routing.hpp"
#include "rng.h"
#include "synthetic.h"

namespace moe_routing::cli {
namespace {

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

/// Fills `count` elements with gradient-like values (uniform in +-2^-e, e in 0..7) in parallel.
/// Chunk c always gets the generator seeded with (seed, c), so the data never depends on threads.
void fill_random(void* data, DType dtype, int64_t count, uint64_t seed) {
  constexpr int64_t kChunk = int64_t(1) << 20;
  const int64_t chunks = (count + kChunk - 1) / kChunk;
  const unsigned threads = std::max(1u, std::min(std::thread::hardware_concurrency(), 16u));
  auto worker = [&](unsigned w) {
    for (int64_t c = w; c < chunks; c += threads) {
      SplitMix64 rng(seed * 0x9e3779b97f4a7c15ull + uint64_t(c));
      const int64_t end = std::min(count, (c + 1) * kChunk);
      for (int64_t i = c * kChunk; i < end; ++i) {
        const uint64_t bits = rng.next();
        const float unit = float(int64_t(bits >> 40) - (int64_t(1) << 23)) * (1.0f / 8388608.0f);
        store_from_float(data, dtype, i, unit * (1.0f / float(1u << (bits & 7))));
      }
    }
  };
  std::vector<std::thread> pool;
  for (unsigned w = 1; w < threads; ++w) pool.emplace_back(worker, w);
  worker(0);
  for (std::thread& t : pool) t.join();
}

struct Row {
  std::string scenario;
  double ms = 0, gb_per_s = 0;
  bool verified = false;
};

class DemoCommand : public Command {
 public:
  CommandInfo info() const override {
    return {
        "demo", "synthetic MoE batch: time the CPU backward, verify it bit for bit",
        R"(Builds a seeded synthetic MoE batch: each of N tokens picks top_k distinct experts
out of E, skewed toward low expert ids as real routers are. It derives expanded_row_idx exactly
as CANN's forward would (stable sort of the pairs by expert) for the three scenarios: dropless;
active with active_num = 3/4 of N*top_k; drop-pad with expert_capacity = ceil(N*top_k / E),
dropping each expert's pairs beyond its capacity. Then it runs moe_init_routing_grad on the CPU
kernels (median of --runs timed runs after a warm-up), checks every output bit against the
reference backend, and prints one row per scenario: time, GB/s (bytes that must move: grad rows
read, indices, grad_x written) and whether the result verified.

Exits with status 1 if any scenario fails verification. Progress goes to stderr, the table to
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
    p.add_choice("--dtype", "dtype of grad_expanded_x and grad_x", {"bf16", "fp16", "fp32"},
                 &dtype_);
    p.add_choice("--order",
                 "float32 accumulation order: tree (Atlas A2/A3 kernel) or sequential (Ascend 950 "
                 "kernel)",
                 {"tree", "sequential"}, &order_);
    p.add_int("--threads", "T",
              "CPU threads; 0 = library default (MOE_ROUTING_NUM_THREADS or every core)", &threads_,
              0, 4096);
    p.add_int("--seed", "S", "seed of the routing and the gradient values", &seed_, 0,
              std::numeric_limits<int64_t>::max());
    p.add_int("--runs", "R", "timed runs per scenario (the median is reported)", &runs_, 1, 1000);
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

    // Storage: one grad_expanded_x big enough for every scenario, and two outputs.
    const int64_t capacity = (n * k + e - 1) / e;
    const int64_t max_rows = std::max(n * k, e * capacity);
    const double needed = double(max_rows * h + 2 * n * h) * double(element);
    const double physical = double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGESIZE));
    if (physical > 0 && needed > 0.8 * physical)
      return report_error(invalid_argument(command, "the arrays must fit in 80% of memory (",
                                           gib(physical), "), got ", gib(needed),
                                           " (lower --tokens, --top-k or --hidden)"));

    const int threads = threads_ > 0 ? int(threads_) : get_num_threads();
    progress("routing " + std::to_string(n) + " tokens to top-" + std::to_string(k) + " of " +
             std::to_string(e) + " experts (seed " + std::to_string(seed_) + ")");
    const std::vector<int32_t> expert_idx = random_expert_idx(n, k, e, uint64_t(seed_));
    const std::vector<GradProblem> problems = grad_problems(expert_idx, n, k, e, h);

    progress("filling grad_expanded_x: " + std::to_string(max_rows) + " x " + std::to_string(h) +
             " " + dtype_name(dtype) + " (" + gib(double(max_rows * h) * double(element)) + ")");
    std::vector<uint8_t> grad(size_t(max_rows * h) * element);
    fill_random(grad.data(), dtype, max_rows * h, uint64_t(seed_));
    std::vector<uint8_t> out(size_t(n * h) * element), expected(out.size());

    std::vector<Row> rows;
    bool all_verified = true;
    for (const GradProblem& problem : problems) {
      const std::string name = grad_scenario_name(problem.scenario);
      MoeInitRoutingGradAttrs attrs = problem.attrs;
      attrs.order = order;
      TensorView g(grad.data(), dtype, int(problem.grad_shape.size()), problem.grad_shape.data());
      TensorView r(problem.expanded_row_idx.data(), DType::int32,
                   {int64_t(problem.expanded_row_idx.size())});
      TensorView o(out.data(), dtype, {n, h});
      TensorView x(expected.data(), dtype, {n, h});
      ExecConfig cpu;
      cpu.backend = Backend::cpu;
      cpu.num_threads = threads;
      ExecConfig reference;
      reference.backend = Backend::reference;

      int64_t present = 0;
      for (int32_t index : problem.expanded_row_idx)
        present += index != -1 &&
                   (attrs.active_num == 0 || attrs.drop_pad_mode == 1 || index < attrs.active_num);
      std::ostringstream detail;
      if (problem.scenario == GradScenario::active) detail << ", active_num " << attrs.active_num;
      if (problem.scenario == GradScenario::drop_pad)
        detail << ", expert_capacity " << problem.expert_capacity << ", " << (n * k - present)
               << " of " << n * k << " pairs dropped";
      progress(name + ": CPU kernels (" + cpu_isa_name(best_cpu_isa()) + ", " +
               threads_text(threads) + ")" + detail.str());

      std::memset(out.data(), 0xff, out.size());  // pre-touch the pages; unwritten output shows
      Status s = moe_init_routing_grad(g, r, attrs, o, cpu);  // warm-up
      if (!s.is_ok()) return report_error(s);
      std::vector<double> times;
      for (int64_t run = 0; run < runs_; ++run) {
        const Clock::time_point start = Clock::now();
        s = moe_init_routing_grad(g, r, attrs, o, cpu);
        times.push_back(milliseconds_since(start));
        if (!s.is_ok()) return report_error(s);
      }

      progress(name + ": verifying against the reference backend");
      std::memset(expected.data(), 0x7f, expected.size());  // a different poison than `out`
      const Clock::time_point reference_start = Clock::now();
      s = moe_init_routing_grad(g, r, attrs, x, reference);
      if (!s.is_ok()) return report_error(s);
      const bool verified = report_mismatch(name, dtype, out, expected);
      char took[64];
      std::snprintf(took, sizeof took, " (reference took %.0f ms)",
                    milliseconds_since(reference_start));
      progress(name + (verified ? ": bitwise identical" : ": MISMATCH") + took);
      all_verified = all_verified && verified;

      const double bytes = double(present * h) * double(element) +
                           double(problem.expanded_row_idx.size() * sizeof(int32_t)) +
                           double(n * h) * double(element);
      Row row;
      row.scenario = name;
      row.ms = median(times);
      row.gb_per_s = bytes / (row.ms * 1e-3) / 1e9;
      row.verified = verified;
      rows.push_back(row);
    }

    std::printf("moe_init_routing_grad on the CPU kernels (%s, %s), median of %lld runs\n",
                cpu_isa_name(best_cpu_isa()), threads_text(threads).c_str(),
                static_cast<long long>(runs_));
    std::printf("%-9s %-9s %-11s %7s %5s %6s %9s %7s  %s\n", "scenario", "dtype", "order", "N", "K",
                "H", "ms", "GB/s", "verified");
    for (const Row& row : rows)
      std::printf("%-9s %-9s %-11s %7lld %5lld %6lld %9.3f %7.2f  %s\n", row.scenario.c_str(),
                  dtype_name(dtype), order_.c_str(), static_cast<long long>(n),
                  static_cast<long long>(k), static_cast<long long>(h), row.ms, row.gb_per_s,
                  row.verified ? "yes" : "NO");
    std::fflush(stdout);
    if (!all_verified) {
      std::cerr << "moe-routing: demo: every scenario must match the reference bit for bit, got a "
                   "mismatch (see above)"
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

  /// True when equal; otherwise prints the first differing element and the count to stderr.
  static bool report_mismatch(const std::string& name, DType dtype, const std::vector<uint8_t>& got,
                              const std::vector<uint8_t>& expected) {
    if (std::memcmp(got.data(), expected.data(), got.size()) == 0) return true;
    const size_t element = dtype_size(dtype);
    const int64_t count = int64_t(got.size() / element);
    int64_t differing = 0, first = -1;
    for (int64_t i = 0; i < count; ++i)
      if (std::memcmp(got.data() + i * element, expected.data() + i * element, element) != 0) {
        if (first < 0) first = i;
        ++differing;
      }
    std::cerr << "moe-routing: demo: " << name << ": " << differing << " of " << count
              << " elements differ from the reference; first at flat index " << first
              << ": expected " << load_as_float(expected.data(), dtype, first) << ", got "
              << load_as_float(got.data(), dtype, first) << std::endl;
    return false;
  }

  int64_t tokens_ = 4096, hidden_ = 4096, experts_ = 64, top_k_ = 8;
  int64_t threads_ = 0, seed_ = 1, runs_ = 5;
  std::string dtype_ = "bf16", order_ = "tree";
};

}  // namespace

std::unique_ptr<Command> make_demo_command() { return std::make_unique<DemoCommand>(); }

}  // namespace moe_routing::cli
