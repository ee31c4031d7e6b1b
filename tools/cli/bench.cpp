// `moe-routing bench`: time the CPU kernels of the operators (the dispatch, its backward, the
// combine and its backward) over realistic MoE shapes and report them against this machine's copy
// bandwidth, measured in the same run; --verify compares every row with the reference backend.
#include <fcntl.h>
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#include <immintrin.h>
#endif
#include <unistd.h>
#if defined(__linux__)
#include <sys/mman.h>
#endif

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <new>
#include <sstream>
#include <thread>

#include "cases/mappings.h"
#include "cases/model_shapes.h"
#include "cases/random.h"
#include "cases/synthetic.h"
#include "commands.h"
#include "core/memory_hints.h"
#include "core/output_cache.h"
#include "file_io.h"
#include "moe_routing/moe_routing.hpp"

namespace moe_routing::cli {
namespace {

using cases::forward_expanded_row_idx;
using cases::grad_problems;
using cases::GradProblem;
using cases::kModelShapes;
using cases::ModelShape;
using cases::random_expert_idx;
using cases::routing_scenarios;

/// The values of --shape: every shape of kModelShapes, or all of them.
std::vector<std::string> shape_choices() {
  std::vector<std::string> choices{"all"};
  for (const ModelShape& s : kModelShapes) choices.push_back(s.name);
  return choices;
}

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

/// The operators a sweep times (--op).
struct SweepOps {
  bool grad, forward, finalize, finalize_grad;
  /// The operators `--op` names ("all", "grad", "init-routing", "finalize", "finalize-grad").
  static SweepOps named(const std::string& op) {
    const bool all = op == "all";
    return {all || op == "grad", all || op == "init-routing", all || op == "finalize",
            all || op == "finalize-grad"};
  }
  /// Rows per shape and token count: the grad's three scenarios, the dispatch forward's two
  /// (dropless, drop-pad), one each for the combine and its backward.
  size_t rows() const {
    return (grad ? 3 : 0) + (forward ? 2 : 0) + (finalize ? 1 : 0) + (finalize_grad ? 1 : 0);
  }
};

/// The most memory one row of a sweep holds at once, in bytes (an upper bound): its inputs, its
/// outputs three times (the out= call's; the binding's fresh outputs, which stay in its output
/// cache while the allocator's fresh outputs are written) and, with --verify, a fourth copy; its
/// index arrays and the library's scratch, bounded by 32 bytes per pair; the largest over the
/// chosen operators. A drop-pad layout has E * ceil(N*K/E) <= N*K + E rows. The output cache's
/// idle buffers of earlier rows come on top (the caller adds its limit).
double largest_row_bytes(const ModelShape& shape, int64_t n, double element, const SweepOps& ops,
                         bool verify) {
  const double H = double(shape.hidden), K = double(shape.top_k), N = double(n);
  const double R = N * K, padded = R + double(shape.experts), ints = 32.0 * R;
  const double copies = verify ? 4.0 : 3.0;  // the outputs held at once
  double most = 0.0;
  auto row = [&](double inputs, double outputs) {
    most = std::max(most, inputs + copies * outputs);
  };
  if (ops.grad) row(padded * H * element + ints, N * H * element);
  if (ops.forward) row(N * H * element + ints, padded * H * element + 2.0 * ints);
  if (ops.finalize) row(R * H * element + 2.0 * ints, N * H * element);
  if (ops.finalize_grad)
    row(R * H * element + N * H * element + 2.0 * ints, R * H * element + ints);
  return most;
}

/// A "Name:  N kB" field of /proc/self/status in bytes (0 where there is none, e.g. not Linux).
int64_t proc_status_bytes(const char* field) {
  std::ifstream status("/proc/self/status");
  const std::string prefix = std::string(field) + ":";
  std::string line;
  while (std::getline(status, line))
    if (line.rfind(prefix, 0) == 0) return std::stoll(line.substr(prefix.size())) * 1024;
  return 0;
}
/// Resident-set high-water mark since the last reset, and the resident set now.
int64_t peak_rss_bytes() { return proc_status_bytes("VmHWM"); }
int64_t current_rss_bytes() { return proc_status_bytes("VmRSS"); }
/// Resets VmHWM to the current RSS (writing 5 to clear_refs); false if the kernel refuses.
bool reset_peak_rss() {
  int fd = ::open("/proc/self/clear_refs", O_WRONLY);
  if (fd < 0) return false;
  const bool ok = ::write(fd, "5", 1) == 1;
  ::close(fd);
  return ok;
}

/// Rows moving at least this many bytes pair every timed run with a bandwidth measurement (see
/// time_call).
constexpr double kPairEachRunBytes = 64.0 * (1 << 20);

/// Whether this CPU has CLZERO (AMD: zeroes a whole cache line without reading it or carrying
/// data from the core), used by `bench --machine` to tell the memory's write speed from the
/// cores' write path.
bool cpu_has_clzero() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid(0x80000000u, &eax, &ebx, &ecx, &edx) == 0 || eax < 0x80000008u) return false;
  if (__get_cpuid(0x80000008u, &eax, &ebx, &ecx, &edx) == 0) return false;
  return (ebx & 1u) != 0;
#else
  return false;
#endif
}

/// Reads [begin, begin + bytes) as `kReadStreams` interleaved streams and returns a sum of it.
/// Several concurrent streams read faster than one on the machines measured (the backward reads
/// its K rows this way); the AVX2 version reads a few percent faster than 8-byte loads.
constexpr int kReadStreams = 8;
uint64_t read_streams_scalar(const char* begin, size_t bytes) {
  const size_t per_stream = bytes / 8 / kReadStreams;  // words
  const uint64_t* words = reinterpret_cast<const uint64_t*>(begin);
  uint64_t sums[kReadStreams] = {};
  for (size_t w = 0; w + 2 <= per_stream; w += 2)
    for (int k = 0; k < kReadStreams; ++k) {
      const uint64_t* stream = words + size_t(k) * per_stream;
      sums[k] += stream[w] + stream[w + 1];
    }
  uint64_t total = 0;
  for (uint64_t v : sums) total += v;
  return total;
}
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define MOE_ROUTING_BENCH_AVX2_READ 1
__attribute__((target("avx2"))) uint64_t read_streams_avx2(const char* begin, size_t bytes) {
  const size_t per_stream = bytes / kReadStreams / 64 * 64;
  __m256i sums[kReadStreams];
  for (__m256i& v : sums) v = _mm256_setzero_si256();
  for (size_t i = 0; i < per_stream; i += 64)
    for (int k = 0; k < kReadStreams; ++k) {
      const char* line = begin + size_t(k) * per_stream + i;
      sums[k] =
          _mm256_add_epi64(sums[k], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(line)));
      sums[k] = _mm256_add_epi64(sums[k],
                                 _mm256_loadu_si256(reinterpret_cast<const __m256i*>(line + 32)));
    }
  __m256i total = sums[0];
  for (int k = 1; k < kReadStreams; ++k) total = _mm256_add_epi64(total, sums[k]);
  alignas(32) uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), total);
  return lanes[0] + lanes[1] + lanes[2] + lanes[3];
}
#endif

/// The first 64-byte boundary at or after p: where a buffer allocated 64 bytes longer than its
/// data keeps the data, as PyTorch's CPU allocator aligns tensors.
template <class T>
T* aligned_64(T* p) {
  static_assert(sizeof(T) == 1, "a byte pointer");
  return p + (64 - reinterpret_cast<uintptr_t>(p) % 64) % 64;
}

/// Writes `bytes` (a multiple of 64) at `dst` (64-byte aligned) with non-temporal stores, as the
/// kernels write their large outputs: no read for ownership. SSE2, which every x86-64 CPU has.
void write_streams(char* dst, size_t bytes) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  const __m128i value = _mm_set1_epi8(4);
  for (size_t at = 0; at + 64 <= bytes; at += 64)
    for (size_t v = 0; v < 64; v += 16)
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + at + v), value);
  _mm_sfence();
#else
  std::memset(dst, 4, bytes);
#endif
}

/// This machine's memory bandwidth over 512 MiB buffers, three ways: a copy (memcpy: bytes read
/// + bytes written per second) - the ceiling the issue's "% of copy" is measured against - and,
/// for the per-row limit, reading alone (a sum) and writing alone (the faster of memset and
/// non-temporal stores: glibc's memset streams on some versions and CPUs and not on others, and
/// the kernels stream their large outputs). The machines this runs on are often shared, and their
/// bandwidth drifts by tens of percent over seconds, so the bench measures it next to every row
/// instead of once. The buffers start on 64-byte boundaries, as the rows' tensors do (a vector's
/// large block starts 16 bytes past a page, where half of the read meter's 32-byte loads would
/// cross a cache line: measured 6-8 % slower with one thread).
class BandwidthMeter {
 public:
  struct Sample {
    double copy_s, read_s, write_s;  // write_s: the faster of memset_s and stream_s
    double memset_s, stream_s;
  };
  explicit BandwidthMeter(int threads)
      : threads_(threads), src_storage_(kBytes + 64, 1), dst_storage_(kBytes + 64, 2) {
    measure();  // faults the pages in
  }
  /// Seconds of one copy, one read and one write of the whole buffer, with the meter's threads
  /// or with `threads`.
  Sample measure() { return measure(threads_); }
  Sample measure(int threads) {
    Sample sample;
    sample.copy_s =
        run(threads, [this](size_t lo, size_t hi) { std::memcpy(dst_ + lo, src_ + lo, hi - lo); });
    sample.read_s = run(threads, [this](size_t lo, size_t hi) {
#if defined(MOE_ROUTING_BENCH_AVX2_READ)
      const uint64_t total =
          avx2_ ? read_streams_avx2(src_ + lo, hi - lo) : read_streams_scalar(src_ + lo, hi - lo);
#else
      const uint64_t total = read_streams_scalar(src_ + lo, hi - lo);
#endif
      sink_.fetch_add(total, std::memory_order_relaxed);
    });
    sample.memset_s =
        run(threads, [this](size_t lo, size_t hi) { std::memset(dst_ + lo, 3, hi - lo); });
    sample.stream_s =
        run(threads, [this](size_t lo, size_t hi) { write_streams(dst_ + lo, hi - lo); });
    sample.write_s = std::min(sample.memset_s, sample.stream_s);
    return sample;
  }
  /// Seconds to zero the whole buffer with CLZERO (cpu_has_clzero() must hold): a write of
  /// whole lines that carries no data from the core.
  double zero_lines_s(int threads) {
    const double seconds = run(threads, [this](size_t lo, size_t hi) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
      // CLZERO clears the aligned line that holds its address: only whole lines of the share.
      const uintptr_t base = reinterpret_cast<uintptr_t>(dst_);
      for (size_t at = ((base + lo + 63) & ~uintptr_t(63)) - base; at + 64 <= hi; at += 64)
        asm volatile(".byte 0x0f, 0x01, 0xfc" : : "a"(dst_ + at) : "memory");  // clzero [rax]
      asm volatile("sfence" : : : "memory");
#else
      (void)lo, (void)hi;
#endif
    });
    return seconds;
  }
  static constexpr size_t kBytes = size_t(512) << 20;
  /// Bytes per second from the median of some sample times (a copy counts read + written).
  static double copy_bandwidth(const std::vector<Sample>& samples) {
    return 2.0 * double(kBytes) / median_of(samples, &Sample::copy_s);
  }
  static double read_bandwidth(const std::vector<Sample>& samples) {
    return double(kBytes) / median_of(samples, &Sample::read_s);
  }
  /// The faster of memset and non-temporal stores, round by round.
  static double write_bandwidth(const std::vector<Sample>& samples) {
    return bandwidth(samples, &Sample::write_s);
  }
  /// Bytes per second of one of a sample's one-buffer passes (reads or writes).
  static double bandwidth(const std::vector<Sample>& samples, double Sample::*field) {
    return double(kBytes) / median_of(samples, field);
  }

 private:
  static double median_of(const std::vector<Sample>& samples, double Sample::*field) {
    std::vector<double> values;
    for (const Sample& s : samples) values.push_back(s.*field);
    return median(values);
  }
  /// Runs fn(lo, hi) over each thread's share of the buffer (shares start at multiples of 64
  /// bytes, so word reads stay aligned for any thread count); returns the seconds taken.
  template <class Fn>
  double run(int threads, const Fn& fn) {
    const auto start = Clock::now();
    std::vector<std::thread> pool;
    auto bound = [threads](int t) { return kBytes / 64 * size_t(t) / size_t(threads) * 64; };
    auto share = [&bound, &fn](int t) { fn(bound(t), bound(t + 1)); };
    for (int t = 1; t < threads; ++t) pool.emplace_back(share, t);
    share(0);
    for (auto& th : pool) th.join();
    return seconds_since(start);
  }
  int threads_;
#if defined(MOE_ROUTING_BENCH_AVX2_READ)
  bool avx2_ = cpu_isa_available(CpuIsa::avx2);  // the library's own detection
#endif
  std::vector<char> src_storage_, dst_storage_;
  char* src_ = aligned_64(src_storage_.data());
  char* dst_ = aligned_64(dst_storage_.data());
  std::atomic<uint64_t> sink_{0};
};

/// What the first touch of fresh memory costs: the page fault and the OS zeroing the page, per
/// MiB, with 4 KiB pages and with 2 MiB ones (transparent huge pages, asked for with
/// MADV_HUGEPAGE as the torch binding does). Every output a functional call allocates pays this
/// once per page, on top of the kernel that writes it.
class FirstTouchMeter {
 public:
  static constexpr size_t kBytes = size_t(256) << 20;
  struct Sample {
    double seconds = 0;
    double huge_fraction = 0;  // of the mapping backed by huge pages after the touch
  };
  /// Touches one byte of every 4 KiB of a fresh kBytes mapping, each thread its share (in
  /// order), and unmaps it; `huge`: with MADV_HUGEPAGE, else MADV_NOHUGEPAGE. Zero seconds
  /// where this is not Linux or the mapping fails.
  static Sample measure(int threads, bool huge) {
    Sample sample;
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    constexpr size_t kAlign = size_t(2) << 20;
    void* raw = ::mmap(nullptr, kBytes + kAlign, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) return sample;
    char* base = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(raw) + kAlign - 1) &
                                         ~uintptr_t(kAlign - 1));
    ::madvise(base, kBytes, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
    const auto start = Clock::now();
    std::vector<std::thread> pool;
    auto share = [base, threads](int t) {
      const size_t lo = kBytes / kAlign * size_t(t) / size_t(threads) * kAlign;
      const size_t hi = kBytes / kAlign * size_t(t + 1) / size_t(threads) * kAlign;
      for (size_t at = lo; at < hi; at += 4096) static_cast<volatile char*>(base)[at] = 1;
    };
    for (int t = 1; t < threads; ++t) pool.emplace_back(share, t);
    share(0);
    for (auto& th : pool) th.join();
    sample.seconds = seconds_since(start);
    sample.huge_fraction = double(anon_huge_bytes(base)) / double(kBytes);
    ::munmap(raw, kBytes + kAlign);
#else
    (void)threads, (void)huge;
#endif
    return sample;
  }
  /// The transparent-huge-page mode, the bracketed word of
  /// /sys/kernel/mm/transparent_hugepage/enabled ("always", "madvise", "never"); "n/a" without.
  static std::string thp_mode() {
    std::ifstream in("/sys/kernel/mm/transparent_hugepage/enabled");
    std::string text;
    std::getline(in, text);
    const size_t open = text.find('['), close = text.find(']');
    if (open == std::string::npos || close == std::string::npos || close < open) return "n/a";
    return text.substr(open + 1, close - open - 1);
  }

 private:
  /// AnonHugePages ("N kB") of the mapping that holds `address`, in bytes.
  static int64_t anon_huge_bytes(const void* address) {
    const std::string value = cases::smaps_field(address, "AnonHugePages");
    return value.empty() ? 0 : std::stoll(value) * 1024;
  }
};

/// The shortest time a kernel that reads `reads` bytes and writes `writes` bytes can take: the
/// longest of all bytes at the copy bandwidth, the reads at the read bandwidth and the writes at
/// the write bandwidth (bytes per second).
double limit_seconds(double reads, double writes, double copy_bw, double read_bw, double write_bw) {
  return std::max({(reads + writes) / copy_bw, reads / read_bw, writes / write_bw});
}
/// The highest fraction of the copy bandwidth such a kernel can reach (its bytes in the limit).
double ceiling_of_copy(double reads, double writes, double copy_bw, double read_bw,
                       double write_bw) {
  const double limit_s = limit_seconds(reads, writes, copy_bw, read_bw, write_bw);
  return std::min(1.0, (reads + writes) / limit_s / copy_bw);  // 1 where the copy term binds
}

/// A zeroed buffer whose `data` starts on a 64-byte boundary, as PyTorch's CPU allocator places
/// tensors. glibc puts a large block 16 bytes past a page boundary, so every row (a multiple of
/// 32 bytes long) of such a tensor starts 16 bytes off the 32-byte boundary that the streaming
/// stores need: the combine's kernels then write a few columns of every row through the cache
/// first, and the grad's one-pass path for one-pair rows is not taken. `bytes` (with the
/// padding, zero) is what --verify compares.
struct AlignedBuffer {
  std::vector<uint8_t> bytes;
  uint8_t* data = nullptr;
};
AlignedBuffer aligned_buffer(size_t size) {
  AlignedBuffer b;
  b.bytes.assign(size + 64, 0);
  b.data = aligned_64(b.bytes.data());
  return b;
}
/// aligned_buffer of `count` seeded random elements of `dtype`.
AlignedBuffer aligned_random_floats(int64_t count, DType dtype, uint64_t seed) {
  AlignedBuffer b = aligned_buffer(size_t(count) * dtype_size(dtype));
  cases::fill_random(b.data, dtype, count, seed);
  return b;
}

struct Row {
  std::string op, scenario, shape;
  int64_t tokens = 0, hidden = 0, experts = 0, top_k = 0;
  double ms = 0, read_bytes = 0, write_bytes = 0, bytes = 0, gbps = 0;
  double copy_gbps = 0, read_gbps = 0, write_gbps = 0;
  double fraction = 0;  // of the copy bandwidth
  double ceiling = 0;   // the highest fraction of the copy bandwidth these bytes allow
  /// Shortest possible time: the bytes at the copy bandwidth, the reads at the read bandwidth,
  /// the writes at the write bandwidth, whichever is longest.
  double limit_ms = 0;
  int64_t extra_memory = 0;
  /// The same call into outputs allocated for it (FreshOutputs), as a functional front end makes
  /// it: as the torch binding allocates (its output cache, huge pages) and from the allocator
  /// alone; each the median time and the median over the runs of its ratio to the out= call's
  /// time in the same run.
  double fresh_ms = 0, fresh_ratio = 0, fresh_small_pages_ms = 0, fresh_small_pages_ratio = 0;
  /// The fractions of the shortest time the out= call and the fresh-output call reach.
  double fraction_of_limit() const { return limit_ms / ms; }
  double fresh_fraction_of_limit() const { return limit_ms / fresh_ms; }
  bool verified = false;  // --verify: the CPU kernels' outputs equal the reference's, bit for bit
};

/// An output buffer time_call writes into: an AlignedBuffer's aligned bytes.
struct OutputBuffer {
  OutputBuffer(AlignedBuffer* b) : data(b->data), size(b->bytes.size() - 64) {}  // NOLINT
  uint8_t* data;
  size_t size;
};

/// Output buffers allocated for one call and freed after it, as a front end returning new
/// tensors has them. With `binding`, as the torch binding allocates its new CPU outputs: from the
/// output cache (detail::acquire_output, where it is on and the buffer is large enough for it),
/// else from the allocator with huge pages asked for (detail::advise_huge_pages). Without, from
/// the allocator alone (glibc maps a large one anew: the kernel's stores fault in 4 KiB pages).
class FreshOutputs {
 public:
  FreshOutputs(const std::vector<OutputBuffer>& like, bool binding) {
    for (const OutputBuffer& buffer : like) {
      const size_t bytes = buffer.size;
      if (binding && detail::output_cache_serves(int64_t(bytes))) {
        uint8_t* data = static_cast<uint8_t*>(detail::acquire_output(int64_t(bytes)));
        if (data == nullptr) throw std::bad_alloc();
        buffers_.emplace_back(data, Free{true});
        pointers_.push_back(data);
        continue;
      }
      // Uninitialised, so not touched, and 64-byte aligned as PyTorch's CPU allocator aligns;
      // buffers under a page come from the allocator's heap anyway and are zeroed, so that bytes
      // no kernel writes compare equal (equals).
      uint8_t* data = static_cast<uint8_t*>(std::aligned_alloc(64, (bytes + 63) / 64 * 64 + 64));
      if (data == nullptr) throw std::bad_alloc();
      if (bytes < 4096) std::memset(data, 0, bytes);
      buffers_.emplace_back(data, Free{false});
      if (binding) detail::advise_huge_pages(data, int64_t(bytes));
      pointers_.push_back(data);
    }
  }
  const std::vector<uint8_t*>& pointers() const { return pointers_; }
  /// Whether every buffer holds the bytes of its counterpart in `like`.
  bool equals(const std::vector<OutputBuffer>& like) const {
    for (size_t i = 0; i < like.size(); ++i)
      if (like[i].size != 0 && std::memcmp(pointers_[i], like[i].data, like[i].size) != 0)
        return false;
    return true;
  }

 private:
  struct Free {
    bool cached;
    void operator()(uint8_t* p) const {
      if (cached)
        detail::release_output(p);
      else
        std::free(p);
    }
  };
  std::vector<std::unique_ptr<uint8_t, Free>> buffers_;
  std::vector<uint8_t*> pointers_;
};

class BenchCommand : public Command {
 public:
  CommandInfo info() const override {
    return {
        "bench", "time the operators' CPU kernels on real MoE shapes against the copy bandwidth",
        "For each shape (hidden size, experts, top_k of a real model), token count, operator and\n"
        "scenario: builds a seeded synthetic batch, warms up, then reports the median time of\n"
        "--runs runs, the bytes that must move (each input read once, each output written once;\n"
        "for the backward only the gradient rows that are summed), GB/s, that as a fraction of\n"
        "this machine's copy bandwidth (memcpy of 512 MiB with the same thread count, measured\n"
        "right before each timed run of a row moving >= 64 MiB, around the runs of a smaller\n"
        "one: shared machines drift), the shortest time the bytes allow (the copy, read-only\n"
        "and write-only bandwidths, measured the same way, applied to all bytes, the reads and\n"
        "the writes: the longest of the three) and the fraction of it reached, the fraction of\n"
        "copy a kernel taking that shortest time would reach (max%copy: what this machine allows\n"
        "right now), and the peak memory the call used beyond its inputs and outputs.\n"
        "--machine measures only the memory: copy, read and write bandwidth with one thread and\n"
        "with --threads, the max%copy they allow each operator, and the first-touch cost of\n"
        "fresh pages (4 KiB and 2 MiB) with the OS's and a program's zeroing bandwidth.\n\n"
        "Operators: grad = moe_init_routing_grad in its three scenarios (dropless; active with\n"
        "active_num = 3/4 of N*K; drop-pad with capacity ceil(N*K/E)); init-routing =\n"
        "moe_init_routing (torch API / V4) dropless and drop-pad; finalize = moe_finalize_routing\n"
        "(V2, drop_pad_mode 2: the row layout the dispatch returns) of expanded_x with scales\n"
        "(float32 with bf16, else the data's dtype); finalize-grad = moe_finalize_routing_grad\n"
        "(dropless) with grad_expanded_x and grad_scales.\n\n"
        "Each row is timed into outputs allocated and touched beforehand (ms: the out= call; page\n"
        "faults not measured) and, in the same runs, into outputs allocated for the call and "
        "freed\n"
        "after it, as a functional front end returns new tensors (fresh ms: as the torch binding\n"
        "allocates them - from its output cache, MOE_ROUTING_OUTPUT_CACHE_MB, else with huge\n"
        "pages asked for unless MOE_ROUTING_HUGE_PAGES=0; 4K ms: from the allocator alone), each\n"
        "with the median of its per-run ratio to the out= call, and the fraction of the shortest\n"
        "time the fresh-output call reaches (fresh%lim: the call the torch binding makes; out=\n"
        "buffers on 4 KiB pages can take longer). --machine also measures what the first touch\n"
        "of fresh memory costs per MiB (page fault + the OS zeroing the page).\n"
        "--verify also runs every row once on the reference backend and compares the outputs bit\n"
        "for bit, and those of a call into fresh outputs with the out= call's (exit status 1 when\n"
        "one differs).",
        "moe-routing bench\n"
        "moe-routing bench --op grad --shape deepseek-v3 --tokens 4096 --threads 2\n"
        "moe-routing bench --tokens 1,8,64,512,4096 --csv bench.csv\n"
        "moe-routing bench --op finalize --shape qwen3-30b --tokens 1,128,1024 --verify\n"
        "moe-routing bench --machine"};
  }

  void declare(ArgParser& p) override {
    p.add_choice("--op", "operators to time",
                 {"all", "grad", "init-routing", "finalize", "finalize-grad"}, &op_);
    p.add_choice("--shape", "model shape (hidden/experts/top_k)", shape_choices(), &shape_);
    p.add_string("--tokens", "N,N,...", "token counts to sweep", &tokens_text_);
    p.add_choice("--dtype", "dtype of the float tensors", {"bf16", "fp16", "fp32"}, &dtype_text_);
    p.add_choice("--order", "backward accumulation order", {"tree", "sequential"}, &order_text_);
    add_numerics_flag(p, "selects the combine's arithmetic (finalize, finalize-grad rows)",
                      &numerics_);
    p.add_switch("--verify",
                 "also run every row once on the reference backend and compare the outputs bit "
                 "for bit",
                 &verify_);
    p.add_int("--threads", "T",
              "CPU threads; 0 = library default (MOE_ROUTING_NUM_THREADS or every core)", &threads_,
              0, kMaxNumThreads);
    p.add_choice("--isa", "CPU instruction set of the kernels (automatic: the best this CPU has)",
                 {"automatic", "baseline", "avx2", "avx512"}, &isa_text_);
    p.add_int("--runs", "R", "timed runs per measurement (the median is reported)", &runs_, 1,
              1000);
    p.add_string("--csv", "FILE",
                 "also write the table as CSV to FILE (checked before the sweep, replaced "
                 "atomically after it)",
                 &csv_);
    p.add_switch(
        "--machine",
        "only measure this machine's memory (copy, read, write; the first touch of fresh pages; 1 "
        "and --threads threads; --runs rounds) and the %copy ceilings it sets for every operator",
        &machine_);
  }

  int run(const ArgParser& parser) override {
    if (machine_)
      for (const char* flag : {"--op", "--shape", "--tokens", "--dtype", "--order", "--numerics",
                               "--csv", "--verify", "--isa"})
        if (parser.given(flag))
          return report_error(
              invalid_argument("moe-routing: bench: ", flag,
                               " cannot be combined with --machine (which measures only "
                               "the memory; only --threads and --runs apply), got ",
                               flag));
    std::vector<int64_t> token_counts;
    // Every comma-separated item, an empty one too ("1,", ",1", "1,,2" are errors).
    for (size_t begin = 0;;) {
      const size_t comma = std::min(tokens_text_.find(',', begin), tokens_text_.size());
      int64_t value = 0;
      Status s = parse_int(tokens_text_.substr(begin, comma - begin), 1, int64_t(1) << 24, "bench",
                           "--tokens", &value);
      if (!s.is_ok()) return report_error(s);
      token_counts.push_back(value);
      if (comma == tokens_text_.size()) break;
      begin = comma + 1;
    }
    const DType dtype = dtype_text_ == "fp32"   ? DType::float32
                        : dtype_text_ == "fp16" ? DType::float16
                                                : DType::bfloat16;
    const int threads = threads_ > 0 ? int(threads_) : get_num_threads();
    if (machine_) return run_machine(threads);
    ExecConfig config;
    config.backend = Backend::cpu;
    config.num_threads = threads;
    for (CpuIsa isa : kCpuIsas)
      if (isa_text_ == cpu_isa_name(isa)) config.isa = isa;
    if (config.isa != CpuIsa::automatic && !cpu_isa_available(config.isa))
      return report_error(
          not_supported("moe-routing: bench: ", "--isa must be one this CPU and build run (best: ",
                        cpu_isa_name(best_cpu_isa()), "), got ", isa_text_));
    const CpuIsa isa = config.isa == CpuIsa::automatic ? best_cpu_isa() : config.isa;
    // A --csv that can never be written fails now, not after the sweep.
    if (!csv_.empty()) {
      Status s = file_io::check_writable(csv_, file_io::label("--csv", csv_));
      if (!s.is_ok()) return report_error(s);
    }

    std::vector<ModelShape> shapes;
    for (const ModelShape& s : kModelShapes)
      if (shape_ == "all" || shape_ == s.name) shapes.push_back(s);
    const SweepOps ops = SweepOps::named(op_);
    // A sweep whose largest row cannot fit is refused before anything is allocated (past the
    // memory there is, the OS kills the process without a word, or the allocation throws).
    {
      double most = 0.0;
      const ModelShape* largest = nullptr;
      int64_t largest_n = 0;
      for (const ModelShape& shape : shapes)
        for (int64_t n : token_counts) {
          const double bytes = largest_row_bytes(shape, n, double(dtype_size(dtype)), ops, verify_);
          if (largest == nullptr || bytes > most) most = bytes, largest = &shape, largest_n = n;
        }
      most += 2.0 * double(BandwidthMeter::kBytes) + double(detail::output_cache_limit());
      Status s = file_io::check_memory(
          uint64_t(most), "bench",  // at most 2^24 tokens: some TB, far below 2^64
          std::string("the arrays of its largest row (--shape ") + largest->name + " --tokens " +
              std::to_string(largest_n) + ") and the bandwidth meter's buffers");
      if (!s.is_ok()) return report_error(s);
    }

    BandwidthMeter meter(threads);
    const bool can_measure_memory = reset_peak_rss();

    const size_t total = shapes.size() * token_counts.size() * ops.rows();
    Numerics numerics = Numerics::atlas_a2;
    parse_numerics(numerics_.c_str(), &numerics);  // the parser admitted only valid names
    ExecConfig reference;
    reference.backend = Backend::reference;
    int failed = 0;

    std::vector<Row> rows;
    // `call(config, buffers)` runs the row's operator into `buffers` (one per output it writes,
    // sized as the `outputs` time_call is given).
    using Buffers = std::vector<uint8_t*>;
    using Call = std::function<Status(const ExecConfig&, const Buffers&)>;
    auto time_call = [&](Row row, const Call& timed_call,
                         const std::vector<OutputBuffer>& outputs) -> Status {
      Buffers preallocated;
      for (const OutputBuffer& o : outputs) preallocated.push_back(o.data);
      auto call = [&] { return timed_call(config, preallocated); };
      // A functional call: outputs allocated for it, and freed after it (both timed).
      auto fresh_call = [&](bool huge_pages) {
        const FreshOutputs fresh(outputs, huge_pages);
        return timed_call(config, fresh.pointers());
      };
      std::fprintf(stderr, "[bench %zu/%zu] %s %s %s N=%lld\n", rows.size() + 1, total,
                   row.op.c_str(), row.scenario.c_str(), row.shape.c_str(), (long long)row.tokens);
      // Large rows: each timed run is paired with a copy measured just before it (and an untimed
      // call), so both see the same state of a shared machine. Rows that fit the caches run
      // back to back (a 512 MiB copy between them would evict their data and measure the
      // refill instead): the copies come right before and right after them. Each run also times
      // the call into fresh outputs, as the binding allocates them and from the allocator alone,
      // in a rotating order right after the out= call's untimed warm-up (which for the binding's
      // way puts the outputs' buffers in its cache, as a training loop's first step does).
      row.bytes = row.read_bytes + row.write_bytes;
      const bool per_run = row.bytes >= kPairEachRunBytes;
      std::vector<BandwidthMeter::Sample> samples;
      std::vector<double> times, fresh_times, small_times, fresh_ratios, small_ratios;
      if (!per_run)
        for (int c = 0; c < 3; ++c) samples.push_back(meter.measure());
      MOE_ROUTING_RETURN_IF_ERROR(call());  // warm-up
      MOE_ROUTING_RETURN_IF_ERROR(fresh_call(true));
      int64_t extra_memory = 0;
      for (int64_t r = 0; r < runs_; ++r) {
        if (per_run) {
          samples.push_back(meter.measure());
          MOE_ROUTING_RETURN_IF_ERROR(call());
        }
        double seconds[3] = {};
        for (int k = 0; k < 3; ++k) {
          const int which = int((k + r) % 3);  // 0: out=, 1: as the binding, 2: allocator alone
          // The peak memory beyond inputs and outputs, from the out= calls (VmHWM).
          const int64_t before = which == 0 ? current_rss_bytes() : 0;
          if (which == 0 && can_measure_memory) reset_peak_rss();
          const auto start = Clock::now();
          MOE_ROUTING_RETURN_IF_ERROR(which == 0 ? call() : fresh_call(which == 1));
          seconds[which] = seconds_since(start);
          if (which == 0 && can_measure_memory)
            extra_memory = std::max<int64_t>(extra_memory, peak_rss_bytes() - before);
        }
        times.push_back(seconds[0]);
        fresh_times.push_back(seconds[1]);
        small_times.push_back(seconds[2]);
        fresh_ratios.push_back(seconds[1] / seconds[0]);
        small_ratios.push_back(seconds[2] / seconds[0]);
      }
      if (!per_run)
        for (int c = 0; c < 3; ++c) samples.push_back(meter.measure());
      row.extra_memory = can_measure_memory ? extra_memory : -1;
      const double copy_bw = BandwidthMeter::copy_bandwidth(samples);
      const double read_bw = BandwidthMeter::read_bandwidth(samples);
      const double write_bw = BandwidthMeter::write_bandwidth(samples);
      row.copy_gbps = copy_bw / 1e9;
      row.read_gbps = read_bw / 1e9;
      row.write_gbps = write_bw / 1e9;
      row.ms = median(times) * 1e3;
      row.fresh_ms = median(fresh_times) * 1e3;
      row.fresh_ratio = median(fresh_ratios);
      row.fresh_small_pages_ms = median(small_times) * 1e3;
      row.fresh_small_pages_ratio = median(small_ratios);
      row.gbps = row.bytes / (row.ms * 1e-3) / 1e9;
      row.fraction = row.gbps / row.copy_gbps;
      row.limit_ms =
          1e3 * limit_seconds(row.read_bytes, row.write_bytes, copy_bw, read_bw, write_bw);
      row.ceiling = ceiling_of_copy(row.read_bytes, row.write_bytes, copy_bw, read_bw, write_bw);
      if (verify_) {
        // Fresh outputs (first written by the kernels, with the stores chosen for them) against
        // the out= call's, then the last timed run's outputs against the plain reference
        // backend's.
        MOE_ROUTING_RETURN_IF_ERROR(call());
        const FreshOutputs fresh(outputs, true);
        MOE_ROUTING_RETURN_IF_ERROR(timed_call(config, fresh.pointers()));
        row.verified = fresh.equals(outputs);
        std::vector<std::vector<uint8_t>> kernels;
        for (const OutputBuffer& o : outputs) kernels.emplace_back(o.data, o.data + o.size);
        MOE_ROUTING_RETURN_IF_ERROR(timed_call(reference, preallocated));
        for (size_t i = 0; i < outputs.size(); ++i)
          row.verified &= std::equal(kernels[i].begin(), kernels[i].end(), outputs[i].data);
        if (!row.verified) {
          ++failed;
          std::fprintf(stderr, "[bench] verify: %s %s %s N=%lld differs from the reference\n",
                       row.op.c_str(), row.scenario.c_str(), row.shape.c_str(),
                       (long long)row.tokens);
        }
      }
      rows.push_back(row);
      return Status::ok();
    };

    const double esize = double(dtype_size(dtype));
    for (const ModelShape& shape : shapes) {
      for (int64_t n : token_counts) {
        const int64_t H = shape.hidden, E = shape.experts, K = shape.top_k;
        const std::vector<int32_t> expert_idx = random_expert_idx(n, K, E, 1234 + uint64_t(n));
        Row base;
        base.shape = shape.name;
        base.tokens = n;
        base.hidden = H;
        base.experts = E;
        base.top_k = K;
        if (ops.grad) {
          for (GradProblem& problem : grad_problems(expert_idx, n, K, E, H)) {
            int64_t source_rows = 1;
            for (size_t d = 0; d + 1 < problem.grad_shape.size(); ++d)
              source_rows *= problem.grad_shape[d];
            // 64-byte aligned, as PyTorch's tensors (see AlignedBuffer).
            AlignedBuffer grad = aligned_random_floats(source_rows * H, dtype, 7);
            AlignedBuffer out = aligned_buffer(size_t(n * H) * size_t(esize));
            MoeInitRoutingGradAttrs attrs = problem.attrs;
            attrs.order = order_text_ == "sequential" ? AccumulationOrder::sequential
                                                      : AccumulationOrder::tree;
            int64_t present = 0;
            for (int32_t r : problem.expanded_row_idx)
              present += (r != -1 && (attrs.active_num == 0 || attrs.drop_pad_mode == 1 ||
                                      r < attrs.active_num));
            Row row = base;
            row.op = "grad";
            row.scenario = grad_scenario_name(problem.scenario);
            row.read_bytes = double(present) * double(H) * esize + double(n * K) * 4.0;
            row.write_bytes = double(n * H) * esize;
            const TensorView g(grad.data, dtype, int(problem.grad_shape.size()),
                               problem.grad_shape.data());
            const TensorView idx(problem.expanded_row_idx.data(), DType::int32, {n * K});
            Status s = time_call(
                row,
                [&](const ExecConfig& c, const Buffers& b) {
                  return moe_init_routing_grad(g, idx, attrs, TensorView(b[0], dtype, {n, H}), c);
                },
                {&out});
            if (!s.is_ok()) return report_error(s);
          }
        }
        if (ops.forward) {
          AlignedBuffer x = aligned_random_floats(n * H, dtype, 9);
          std::vector<int32_t> idx_copy = expert_idx;
          for (int drop_pad = 0; drop_pad < 2; ++drop_pad) {
            MoeInitRoutingAttrs attrs;
            attrs.expert_num = E;
            attrs.drop_pad_mode = drop_pad;
            attrs.expert_capacity = std::min<int64_t>(n, (n * K + E - 1) / E);
            attrs.expert_tokens_num_flag = true;
            attrs.expert_tokens_num_type = 1;
            const TensorView xv(x.data, dtype, {n, H});
            const TensorView iv(idx_copy.data(), DType::int32, {n, K});
            MoeInitRoutingPlan plan;
            Status s = infer_moe_init_routing(xv, iv, {}, {}, {}, attrs, &plan);
            if (!s.is_ok()) return report_error(s);
            // The outputs the call produces, each zeroed and 64-byte aligned (at least a byte,
            // for a pointer to give an empty output; every byte is written otherwise: fresh
            // outputs compare equal to these, see FreshOutputs). The others are not given (a
            // given one would be zero-filled: bytes the row does not count).
            const OutputSpec* specs[5] = {&plan.expanded_x, &plan.expanded_row_idx,
                                          &plan.expert_tokens_count_or_cumsum, &plan.expanded_scale,
                                          &plan.expanded_topk_weight};
            std::vector<AlignedBuffer> buffers;
            int slot[5];
            for (int k = 0; k < 5; ++k) {
              slot[k] = specs[k]->produced ? int(buffers.size()) : -1;
              if (specs[k]->produced)
                buffers.push_back(aligned_buffer(
                    std::max<size_t>(1, size_t(specs[k]->numel()) * dtype_size(specs[k]->dtype))));
            }
            std::vector<OutputBuffer> given;
            for (AlignedBuffer& buffer : buffers) given.emplace_back(&buffer);
            auto view = [&](const Buffers& b, int k) {
              const OutputSpec& spec = *specs[k];
              return slot[k] < 0
                         ? TensorView()
                         : TensorView(b[size_t(slot[k])], spec.dtype, spec.ndim, spec.shape);
            };
            Row row = base;
            row.op = "init-routing";
            row.scenario = drop_pad ? "drop_pad" : "dropless";
            row.read_bytes = double(n * H) * esize + double(n * K) * 4.0;
            row.write_bytes = double(plan.expanded_x.numel()) * esize + double(n * K) * 4.0 +
                              double(plan.expert_tokens_count_or_cumsum.numel()) * 8.0;
            s = time_call(
                row,
                [&](const ExecConfig& c, const Buffers& b) {
                  return moe_init_routing(xv, iv, {}, {}, {}, attrs, view(b, 0), view(b, 1),
                                          view(b, 2), view(b, 3), view(b, 4), c);
                },
                given);
            if (!s.is_ok()) return report_error(s);
          }
        }
        if (ops.finalize || ops.finalize_grad) {
          // The combine of the dispatch's dropless output: expanded_x [N*K, H] in the row layout
          // of moe_init_routing_v2 (expanded_row_idx maps pair p to its sorted row), float32
          // scales [N, K].
          const std::vector<int32_t> rows_of_pairs =
              forward_expanded_row_idx(expert_idx, K, routing_scenarios(n, K, E)[0]);
          // Every tensor 64-byte aligned, as PyTorch's (see AlignedBuffer).
          const int64_t R = n * K;
          AlignedBuffer expanded = aligned_random_floats(R * H, dtype, 11);
          // float32 scales with bfloat16 data (the mixed-precision case of real models), else
          // scales of the data's dtype (the only other kind the operator takes).
          const DType scales_dtype = dtype == DType::bfloat16 ? DType::float32 : dtype;
          const double ssize = double(dtype_size(scales_dtype));
          AlignedBuffer scales = aligned_random_floats(n * K, scales_dtype, 13);
          const TensorView ev(expanded.data, dtype, {R, H});
          const TensorView rv(const_cast<int32_t*>(rows_of_pairs.data()), DType::int32, {R});
          const TensorView sv(scales.data, scales_dtype, {n, K});
          if (ops.finalize) {
            MoeFinalizeRoutingInputs in;
            in.expanded_x = ev;
            in.expanded_row_idx = rv;
            in.scales = sv;
            MoeFinalizeRoutingAttrs attrs;
            attrs.drop_pad_mode = 2;
            attrs.numerics = numerics;
            AlignedBuffer out = aligned_buffer(size_t(n * H) * size_t(esize));
            Row row = base;
            row.op = "finalize";
            row.scenario = "dropless";
            row.read_bytes = double(R * H) * esize + double(R) * (4.0 + ssize);
            row.write_bytes = double(n * H) * esize;
            Status s = time_call(
                row,
                [&](const ExecConfig& c, const Buffers& b) {
                  return moe_finalize_routing(in, attrs, TensorView(b[0], dtype, {n, H}), c);
                },
                {&out});
            if (!s.is_ok()) return report_error(s);
          }
          if (ops.finalize_grad) {
            AlignedBuffer grad_y = aligned_random_floats(n * H, dtype, 17);
            MoeFinalizeRoutingGradInputs in;
            in.grad_y = TensorView(grad_y.data, dtype, {n, H});
            in.expanded_row_idx = rv;
            in.expanded_x = ev;
            in.scales = sv;
            MoeFinalizeRoutingGradAttrs attrs;
            attrs.numerics = numerics;
            AlignedBuffer grad_expanded = aligned_buffer(size_t(R * H) * size_t(esize));
            AlignedBuffer grad_scales = aligned_buffer(size_t(R) * size_t(ssize));
            MoeFinalizeRoutingGradPlan plan;
            Status s = infer_moe_finalize_routing_grad(in, attrs, &plan);
            if (!s.is_ok()) return report_error(s);
            // The pair lists in a workspace of the bench's own, as a C caller's (allocated once).
            std::vector<uint8_t> workspace(
                size_t(moe_finalize_routing_grad_workspace_size(plan, threads)));
            Row row = base;
            row.op = "finalize-grad";
            row.scenario = "dropless";
            // grad_y and expanded_x read once, the indices and scales once; grad_expanded_x and
            // grad_scales written once.
            row.read_bytes =
                double(n * H) * esize + double(R * H) * esize + double(R) * (4.0 + ssize);
            row.write_bytes = double(R * H) * esize + double(R) * ssize;
            s = time_call(row,
                          [&](const ExecConfig& c, const Buffers& b) {
                            ExecConfig with_workspace = c;
                            if (c.backend != Backend::reference) {
                              with_workspace.workspace = workspace.data();
                              with_workspace.workspace_bytes = workspace.size();
                            }
                            MoeFinalizeRoutingGradOutputs out;
                            out.grad_expanded_x = TensorView(b[0], dtype, {R, H});
                            out.grad_scales = TensorView(b[1], scales_dtype, {n, K});
                            return moe_finalize_routing_grad(in, attrs, out, with_workspace);
                          },
                          {&grad_expanded, &grad_scales});
            if (!s.is_ok()) return report_error(s);
          }
        }
      }
    }

    std::printf("moe-routing bench: %s, %d threads, CPU kernels (%s), median of %lld runs\n",
                dtype_name(dtype), threads, cpu_isa_name(isa), (long long)runs_);
    std::printf(
        "copy/read/write GB/s: 512 MiB memcpy (read+write) / sum / memset, measured next to each "
        "row;\n"
        "%%copy = GB/s / copy GB/s; limit ms = max(bytes / copy, reads / read, writes / write);\n"
        "%%limit = limit ms / ms, fresh%%lim = limit ms / fresh ms; max%%copy = the %%copy a "
        "kernel\ntaking limit ms would reach\n"
        "ms: into outputs that exist (out=); fresh ms: into outputs allocated for the call and "
        "freed after it,\nas the torch binding's functional operators allocate them (output "
        "cache %lld MiB, MOE_ROUTING_HUGE_PAGES=%s) and\nfrom the allocator alone (4K ms: 4 KiB "
        "pages unless THP is `always`); x: the median of the per-run ratios to the out= call\n",
        (long long)(detail::output_cache_limit() >> 20), detail::huge_pages_enabled() ? "1" : "0");
    std::printf(
        "%-13s %-9s %-12s %6s %5s %4s %3s %9s %9s %6s %9s %6s %9s %7s %16s %7s %8s %9s %7s %9s "
        "%8s\n",
        "op", "scenario", "shape", "N", "H", "E", "K", "ms", "fresh ms", "x", "4K ms", "x",
        "MB moved", "GB/s", "copy/read/write", "%copy", "max%copy", "limit ms", "%limit",
        "fresh%lim", "extra MB");
    for (const Row& r : rows) {
      char extra[32] = "n/a";
      if (r.extra_memory >= 0)
        std::snprintf(extra, sizeof extra, "%.2f", double(r.extra_memory) / 1e6);
      char bandwidths[48];
      std::snprintf(bandwidths, sizeof bandwidths, "%.0f/%.0f/%.0f", r.copy_gbps, r.read_gbps,
                    r.write_gbps);
      std::printf(
          "%-13s %-9s %-12s %6lld %5lld %4lld %3lld %9.3f %9.3f %5.2fx %9.3f %5.2fx %9.1f %7.2f "
          "%16s %6.1f%% %7.1f%% %9.3f %6.1f%% %8.1f%% %8s\n",
          r.op.c_str(), r.scenario.c_str(), r.shape.c_str(), (long long)r.tokens,
          (long long)r.hidden, (long long)r.experts, (long long)r.top_k, r.ms, r.fresh_ms,
          r.fresh_ratio, r.fresh_small_pages_ms, r.fresh_small_pages_ratio, r.bytes / 1e6, r.gbps,
          bandwidths, 100.0 * r.fraction, 100.0 * r.ceiling, r.limit_ms,
          100.0 * r.fraction_of_limit(), 100.0 * r.fresh_fraction_of_limit(), extra);
    }
    if (verify_)
      std::printf("verify: %zu of %zu rows bitwise equal to the reference backend\n",
                  rows.size() - size_t(failed), rows.size());
    if (!csv_.empty()) {
      std::ostringstream out;
      out << "op,scenario,shape,tokens,hidden,experts,top_k,dtype,threads,ms,bytes,gbps,copy_gbps,"
             "fraction_of_copy,"
             "read_bytes,write_bytes,read_gbps,write_gbps,limit_ms,fraction_of_limit,extra_memory_"
             "bytes,"
             "fresh_ms,fresh_over_out,fresh_4k_ms,fresh_4k_over_out,fresh_fraction_of_limit,"
             "ceiling_fraction_of_copy\n";
      for (const Row& r : rows)
        out << r.op << ',' << r.scenario << ',' << r.shape << ',' << r.tokens << ',' << r.hidden
            << ',' << r.experts << ',' << r.top_k << ',' << dtype_name(dtype) << ',' << threads
            << ',' << r.ms << ',' << r.bytes << ',' << r.gbps << ',' << r.copy_gbps << ','
            << r.fraction << ',' << r.read_bytes << ',' << r.write_bytes << ',' << r.read_gbps
            << ',' << r.write_gbps << ',' << r.limit_ms << ',' << r.fraction_of_limit() << ','
            << r.extra_memory << ',' << r.fresh_ms << ',' << r.fresh_ratio << ','
            << r.fresh_small_pages_ms << ',' << r.fresh_small_pages_ratio << ','
            << r.fresh_fraction_of_limit() << ',' << r.ceiling << '\n';
      // All or nothing, as the golden commands' outputs (file_io::write_all): a failed write
      // leaves no partial CSV and keeps a previous file.
      const std::string text = out.str();
      Status s =
          file_io::write_all({{csv_, file_io::label("--csv", csv_), {{text.data(), text.size()}}}});
      if (!s.is_ok()) return report_error(s);
      std::fprintf(stderr, "[bench] wrote %s\n", csv_.c_str());
    }
    return failed > 0 ? kExitVerificationFailed : kExitOk;
  }

 private:
  /// `--machine`: the memory bandwidths with one thread and with `threads`, round by round (so
  /// each round sees one phase of a shared machine), and the ceilings they set for kernels that
  /// move bytes in the two operators' proportions.
  int run_machine(int threads) {
    BandwidthMeter meter(threads);
    const bool clzero = cpu_has_clzero();
    std::vector<int> counts = {1};
    if (threads > 1) counts.push_back(threads);
    std::vector<std::vector<BandwidthMeter::Sample>> samples(counts.size());
    std::vector<std::vector<double>> zero_s(counts.size());
    const std::string thp = FirstTouchMeter::thp_mode();
    const bool try_huge = thp == "always" || thp == "madvise";
    std::vector<std::vector<double>> touch_small(counts.size()), touch_huge(counts.size());
    std::vector<std::vector<double>> huge_fraction(counts.size());
    for (int64_t r = 0; r < runs_; ++r) {
      std::fprintf(stderr, "[bench --machine %lld/%lld]\n", (long long)(r + 1), (long long)runs_);
      for (size_t c = 0; c < counts.size(); ++c) {
        samples[c].push_back(meter.measure(counts[c]));
        if (clzero) zero_s[c].push_back(meter.zero_lines_s(counts[c]));
        touch_small[c].push_back(FirstTouchMeter::measure(counts[c], false).seconds);
        if (try_huge) {
          const FirstTouchMeter::Sample sample = FirstTouchMeter::measure(counts[c], true);
          touch_huge[c].push_back(sample.seconds);
          huge_fraction[c].push_back(sample.huge_fraction);
        }
      }
    }
    const double bytes = double(BandwidthMeter::kBytes);
    std::printf(
        "moe-routing bench --machine: memory bandwidth over 512 MiB buffers, GB/s, median of %lld "
        "rounds\n",
        (long long)runs_);
    std::printf("%-58s", "");
    for (int count : counts)
      std::printf(" %17s", (std::to_string(count) + (count == 1 ? " thread" : " threads")).c_str());
    std::printf("\n");
    auto line = [&](const char* what, auto value_of) {
      std::printf("%-58s", what);
      for (size_t c = 0; c < counts.size(); ++c) std::printf(" %17.1f", value_of(c) / 1e9);
      std::printf("\n");
    };
    line("copy (memcpy; bytes read + bytes written)",
         [&](size_t c) { return BandwidthMeter::copy_bandwidth(samples[c]); });
    line("read alone (a sum over 8 streams per thread)",
         [&](size_t c) { return BandwidthMeter::read_bandwidth(samples[c]); });
    line("write alone (memset)", [&](size_t c) {
      return BandwidthMeter::bandwidth(samples[c], &BandwidthMeter::Sample::memset_s);
    });
    line("write alone (non-temporal stores)", [&](size_t c) {
      return BandwidthMeter::bandwidth(samples[c], &BandwidthMeter::Sample::stream_s);
    });
    if (clzero)
      line("write alone, zero lines (CLZERO: no data leaves the core)",
           [&](size_t c) { return bytes / median(zero_s[c]); });
    else
      std::printf("%-58s %17s\n", "write alone, zero lines (CLZERO)", "n/a: no CLZERO");
    // First touch: ms per MiB (a fresh output of B MiB costs B times this before its kernel).
    const double mib = double(FirstTouchMeter::kBytes) / double(1 << 20);
    std::printf(
        "\nFirst touch of fresh memory (page fault + the OS zeroing the page), %zu MiB mapping, "
        "median of %lld rounds; THP mode [%s]\n",
        FirstTouchMeter::kBytes >> 20, (long long)runs_, thp.c_str());
    auto touch_line = [&](const char* what, const std::vector<std::vector<double>>& seconds,
                          double scale, const char* format) {
      std::printf("%-58s", what);
      for (size_t c = 0; c < counts.size(); ++c) {
        char cell[32];
        std::snprintf(cell, sizeof cell, format, median(seconds[c]) * scale);
        std::printf(" %17s", cell);
      }
      std::printf("\n");
    };
    const double small_pages = double(FirstTouchMeter::kBytes) / 4096.0;
    touch_line("4 KiB pages: ms per MiB", touch_small, 1e3 / mib, "%.3f");
    touch_line("4 KiB pages: us per page fault", touch_small, 1e6 / small_pages, "%.2f");
    if (try_huge) {
      touch_line("2 MiB pages (MADV_HUGEPAGE): ms per MiB", touch_huge, 1e3 / mib, "%.3f");
      std::printf("%-58s", "2 MiB pages: share of the mapping the OS gave huge pages");
      for (size_t c = 0; c < counts.size(); ++c)
        std::printf(" %16.0f%%", 100.0 * median(huge_fraction[c]));
      std::printf("\n");
      // A 2 MiB fault is almost all zeroing: the rate at which the OS zeroes fresh pages.
      std::printf("%-58s", "zeroing by the OS (2 MiB first touch), GB/s");
      // Three significant digits: under memory pressure (compaction) the rate falls below
      // 0.05 GB/s, which one decimal printed as 0.0.
      for (size_t c = 0; c < counts.size(); ++c)
        std::printf(" %17.3g", double(FirstTouchMeter::kBytes) / median(touch_huge[c]) / 1e9);
      std::printf("\n");
    } else {
      std::printf("%-58s %17s\n", "2 MiB pages", ("n/a: THP " + thp).c_str());
    }
    line("zeroing by a program (memset of resident memory), GB/s",
         [&](size_t c) { return BandwidthMeter::write_bandwidth(samples[c]); });

    const size_t last = counts.size() - 1;
    const double copy_bw = BandwidthMeter::copy_bandwidth(samples[last]);
    const double read_bw = BandwidthMeter::read_bandwidth(samples[last]);
    const double write_bw = BandwidthMeter::write_bandwidth(samples[last]);
    std::printf(
        "\nWith %d thread%s these bandwidths let a kernel reach at most this fraction of the copy "
        "bandwidth:\n",
        counts[last], counts[last] == 1 ? "" : "s");
    for (int k : {2, 8}) {
      std::printf(
          "  top_k %d: forward (reads 1 byte per %d written) %5.1f%%, backward (reads %d per 1 "
          "written) %5.1f%%\n",
          k, k, 100.0 * ceiling_of_copy(1.0, double(k), copy_bw, read_bw, write_bw), k,
          100.0 * ceiling_of_copy(double(k), 1.0, copy_bw, read_bw, write_bw));
    }
    return kExitOk;
  }

  std::string op_ = "all", shape_ = "all", tokens_text_ = "1,128,1024,4096", dtype_text_ = "bf16";
  std::string isa_text_ = "automatic";
  std::string order_text_ = "tree", numerics_ = "atlas_a2", csv_;
  int64_t threads_ = 0, runs_ = 7;
  bool machine_ = false, verify_ = false;
};

}  // namespace

std::unique_ptr<Command> make_bench_command() { return std::make_unique<BenchCommand>(); }

}  // namespace moe_routing::cli
