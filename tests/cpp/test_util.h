// Helpers shared by the C++ tests: typed buffers, poisoning, bitwise comparison with a useful
// report (worst element, expected, got, how many differ), and the list of backends to run.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/memory_hints.h"
#include "moe_routing/moe_routing.hpp"

namespace moe_routing::testing {

/// Raw bytes of a floating tensor plus its dtype.
struct FloatBuffer {
  DType dtype = DType::float32;
  std::vector<uint8_t> bytes;

  FloatBuffer() = default;
  FloatBuffer(DType dtype_, int64_t count)
      : dtype(dtype_), bytes(size_t(count) * dtype_size(dtype_)) {}
  static FloatBuffer from_floats(DType dtype, const std::vector<float>& values) {
    FloatBuffer b(dtype, int64_t(values.size()));
    for (size_t i = 0; i < values.size(); ++i)
      store_from_float(b.data(), dtype, int64_t(i), values[i]);
    return b;
  }
  int64_t count() const { return int64_t(bytes.size() / dtype_size(dtype)); }
  void* data() { return bytes.data(); }
  const void* data() const { return bytes.data(); }
  float at(int64_t i) const { return load_as_float(bytes.data(), dtype, i); }
  /// The stored bit pattern of element i (16 or 32 bits).
  uint32_t bits(int64_t i) const {
    if (dtype == DType::float32) return float_bits(static_cast<const float*>(data())[i]);
    return static_cast<const uint16_t*>(data())[i];
  }
  /// Fills with a recognisable NaN pattern so unwritten elements show.
  void poison() {
    if (!bytes.empty()) std::memset(bytes.data(), 0x7f, bytes.size());
  }
};

/// Compares bit patterns; on mismatch reports the first differing element and the count.
inline ::testing::AssertionResult bitwise_equal(const FloatBuffer& expected,
                                                const FloatBuffer& got) {
  if (expected.dtype != got.dtype || expected.bytes.size() != got.bytes.size())
    return ::testing::AssertionFailure()
           << "dtype/size differ: " << dtype_name(expected.dtype) << " x " << expected.count()
           << " vs " << dtype_name(got.dtype) << " x " << got.count();
  int64_t differing = 0, first = -1;
  for (int64_t i = 0; i < expected.count(); ++i) {
    if (expected.bits(i) != got.bits(i)) {
      if (first < 0) first = i;
      ++differing;
    }
  }
  if (differing == 0) return ::testing::AssertionSuccess();
  std::ostringstream out;
  out << differing << " of " << expected.count() << " elements differ; first at flat index "
      << first << ": expected " << expected.at(first) << " (0x" << std::hex << expected.bits(first)
      << "), got " << std::dec << got.at(first) << " (0x" << std::hex << got.bits(first) << ")";
  return ::testing::AssertionFailure() << out.str();
}

/// Forces the non-temporal store threshold (core/memory_hints.h) for a scope, so that tests reach
/// the streaming paths with outputs of a few MiB whatever this machine's cache size is.
class StreamingThresholdOverride {
 public:
  explicit StreamingThresholdOverride(int64_t bytes) {
    detail::set_streaming_store_threshold_for_testing(bytes);
  }
  ~StreamingThresholdOverride() { detail::set_streaming_store_threshold_for_testing(0); }
  StreamingThresholdOverride(const StreamingThresholdOverride&) = delete;
  StreamingThresholdOverride& operator=(const StreamingThresholdOverride&) = delete;
};

/// One way of running an operator: a backend, an ISA and a thread count; for the forward
/// operators on the CPU backend, with a caller workspace (ExecConfig::workspace, exactly the
/// reported size, misaligned on purpose: AddressSanitizer checks the size bound) or without.
struct Runner {
  Backend backend;
  CpuIsa isa;
  int threads;
  bool caller_workspace = false;
  std::string name() const {
    if (backend == Backend::reference) return "reference";
    return std::string("cpu-") + cpu_isa_name(isa) + "-t" + std::to_string(threads) +
           (caller_workspace ? "-ws" : "");
  }
  ExecConfig config() const {
    ExecConfig c;
    c.backend = backend;
    c.isa = isa;
    c.num_threads = threads;
    return c;
  }
};

/// The reference plus every CPU ISA this machine can run, at 1, 2, 3 and 8 threads (1 and 3 with
/// a caller workspace).
inline std::vector<Runner> all_runners() {
  std::vector<Runner> runners{{Backend::reference, CpuIsa::automatic, 1}};
  for (CpuIsa isa : {CpuIsa::baseline, CpuIsa::avx2}) {
    if (!cpu_isa_available(isa)) continue;
    for (int threads : {1, 2, 3, 8})
      runners.push_back({Backend::cpu, isa, threads, threads == 1 || threads == 3});
  }
  return runners;
}

/// Deterministic random numbers (own distributions: identical on every standard library).
class Random {
 public:
  explicit Random(uint64_t seed) : engine_(seed) {}
  uint64_t next() { return engine_(); }
  /// Uniform integer in [lo, hi].
  int64_t integer(int64_t lo, int64_t hi) { return lo + int64_t(next() % uint64_t(hi - lo + 1)); }
  /// Uniform float in [-1, 1) with 24 random bits, times 2^scale_exponent.
  float uniform(int scale_exponent = 0) {
    float u = float(int64_t(next() >> 40) - (int64_t(1) << 23)) / float(1 << 23);
    return std::ldexp(u, scale_exponent);
  }

 private:
  std::mt19937_64 engine_;
};

/// Signed zeros, NaN, +-Inf, subnormals of every type (float32's, float16's, bfloat16's), and
/// values whose sums and products overflow float16, bfloat16 and float32.
inline std::vector<float> special_floats() {
  const float inf = std::numeric_limits<float>::infinity();
  return {0.0f,
          -0.0f,
          inf,
          -inf,
          std::nanf(""),
          -std::nanf(""),
          std::numeric_limits<float>::denorm_min(),
          -std::ldexp(1.0f, -130),
          std::ldexp(1.0f, -24),
          -std::ldexp(1.0f, -133),
          65504.0f,
          60000.0f,
          -65504.0f,
          -60000.0f,
          3.38e38f,
          3.4e38f,
          -3.4e38f,
          1.0f,
          -1.0f};
}

}  // namespace moe_routing::testing
