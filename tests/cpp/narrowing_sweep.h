// Shared by the exhaustive narrowing tests (test_narrowing_exhaustive*.cpp): a sweep over every
// float32 bit pattern on every core, the x86 hardware conversions used as references, and an
// exact model of bfloat16 rounding for inputs the hardware does not convert as IEEE does.
//
// The contract (docs/decisions.md §4): float32 -> float16 / bfloat16 is round-to-nearest-even,
// denormals kept (inputs and results), float16 overflow gives +-inf, and every NaN becomes the
// canonical quiet NaN (float16 0x7e00, bfloat16 0x7fc0, float32 0x7fc00000).
#pragma once

#include <cpuid.h>
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace moe_routing::testing {

constexpr uint16_t kExpectedNanFloat16 = 0x7e00u;
constexpr uint16_t kExpectedNanBfloat16 = 0x7fc0u;
constexpr uint32_t kExpectedNanFloat32 = 0x7fc00000u;
/// float32 NaN bit patterns: exponent all ones, mantissa not zero, either sign.
constexpr uint64_t kNanPatterns = 2 * ((uint64_t(1) << 23) - 1);
constexpr uint64_t kAllPatterns = uint64_t(1) << 32;

inline bool is_nan_pattern(uint32_t bits) { return (bits & 0x7fffffffu) > 0x7f800000u; }
inline bool is_denormal_pattern(uint32_t bits) {
  return (bits & 0x7f800000u) == 0 && (bits & 0x007fffffu) != 0;
}
inline float pattern_float(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

/// Blocks of this many consecutive bit patterns are handed to the threads one at a time. A block
/// shares its top 16 bits, so every pattern of a block has the same exponent (and sign).
constexpr int64_t kSweepBlock = int64_t(1) << 16;
constexpr size_t kSweepBlockSize = size_t(kSweepBlock);

/// Whether a block (kSweepBlock patterns from `first`) holds NaN or denormal patterns: only the
/// blocks of exponent 0xff or 0 do, so the other 99% skip the per-element special cases.
inline bool block_has_nans(uint32_t first) { return (first & 0x7f800000u) == 0x7f800000u; }
inline bool block_has_denormals(uint32_t first) { return (first & 0x7f800000u) == 0; }

/// One conversion's tally over a sweep: inputs compared (NaN and non-NaN apart), and the
/// mismatches with the smallest mismatching input pattern (so reports do not depend on timing).
struct Tally {
  uint64_t compared = 0, nans = 0, mismatches = 0;
  uint32_t first_input = 0, first_got = 0, first_expected = 0;

  /// Adds a block: got[i] and expected[i] are the results for input pattern first + i.
  template <class T>
  void add_block(uint32_t first, const T* got, const T* expected, int64_t n) {
    int64_t block_nans = 0;
    if (block_has_nans(first))
      for (int64_t i = 0; i < n; ++i) block_nans += is_nan_pattern(first + uint32_t(i)) ? 1 : 0;
    nans += uint64_t(block_nans);
    compared += uint64_t(n - block_nans);
    int64_t bad = 0;  // a loop the compiler vectorises; the details only for a failing block
    for (int64_t i = 0; i < n; ++i) bad += got[i] != expected[i] ? 1 : 0;
    if (bad == 0) return;
    for (int64_t i = 0; i < n; ++i)
      if (got[i] != expected[i]) {
        record(first + uint32_t(i), got[i], expected[i], uint64_t(bad));
        return;
      }
  }
  /// Whether the tally saw each of the 2^32 patterns exactly once.
  bool covers_every_pattern() const {
    return compared == kAllPatterns - kNanPatterns && nans == kNanPatterns;
  }
  void merge(const Tally& other) {
    compared += other.compared;
    nans += other.nans;
    if (other.mismatches > 0)
      record(other.first_input, other.first_got, other.first_expected, other.mismatches);
  }

 private:
  void record(uint32_t input, uint32_t got, uint32_t expected, uint64_t count) {
    if (mismatches == 0 || input < first_input) {
      first_input = input;
      first_got = got;
      first_expected = expected;
    }
    mismatches += count;
  }
};

/// "<what>: <count> mismatches, first at input 0x...: got 0x..., expected 0x..." for a failure.
inline std::string describe(const char* what, const Tally& t) {
  char text[200];
  std::snprintf(text, sizeof text,
                "%s: %llu mismatches, first at input 0x%08x: got 0x%x, expected 0x%x", what,
                static_cast<unsigned long long>(t.mismatches), t.first_input, t.first_got,
                t.first_expected);
  return text;
}

/// Calls check(first_pattern, inputs, count, tallies) for every block of consecutive float32 bit
/// patterns covering all 2^32 of them, on every hardware thread, and returns the merged tallies
/// (`checks` of them; check adds to tallies[0 .. checks)). count is kSweepBlock, a multiple of 16.
template <class Check>
std::vector<Tally> sweep_every_float32(int checks, const Check& check) {
  const int64_t blocks = int64_t(kAllPatterns / uint64_t(kSweepBlock));
  const int threads = int(std::max(1u, std::min(64u, std::thread::hardware_concurrency())));
  std::atomic<int64_t> next_block{0};
  std::vector<std::vector<Tally>> per_thread(static_cast<size_t>(threads),
                                             std::vector<Tally>(static_cast<size_t>(checks)));
  auto work = [&](int t) {
    std::vector<float> inputs(static_cast<size_t>(kSweepBlock));
    for (int64_t b = next_block.fetch_add(1); b < blocks; b = next_block.fetch_add(1)) {
      const uint32_t first = uint32_t(b * kSweepBlock);
      for (int64_t i = 0; i < kSweepBlock; ++i)
        inputs[size_t(i)] = pattern_float(first + uint32_t(i));
      check(first, inputs.data(), kSweepBlock, per_thread[size_t(t)].data());
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(work, t);
  work(0);
  for (std::thread& thread : pool) thread.join();
  std::vector<Tally> total(static_cast<size_t>(checks));
  for (const std::vector<Tally>& tallies : per_thread)
    for (int c = 0; c < checks; ++c) total[size_t(c)].merge(tallies[size_t(c)]);
  return total;
}

// --- hardware references -----------------------------------------------------------------------

/// F16C (CPUID.1:ECX bit 29) with the AVX register state it needs. (clang's
/// __builtin_cpu_supports does not know "f16c".)
inline bool cpu_has_f16c() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid(1, &eax, &ebx, &ecx, &edx) == 0) return false;
  return (ecx & bit_F16C) != 0 && __builtin_cpu_supports("avx");
}

/// AVX512_BF16 (CPUID.(EAX=7, ECX=1):EAX bit 5) with the AVX-512 register state it needs.
inline bool cpu_has_avx512_bf16() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) == 0) return false;
  return (eax & (1u << 5)) != 0 && __builtin_cpu_supports("avx512f");
}

/// VCVTPS2PH with the round-to-nearest-even immediate (MXCSR's rounding mode is not consulted).
/// n is a multiple of 8.
__attribute__((target("avx,f16c"))) inline void hardware_float16(const float* in, int64_t n,
                                                                 uint16_t* out) {
  for (int64_t i = 0; i < n; i += 8)
    _mm_storeu_si128(
        reinterpret_cast<__m128i*>(out + i),
        _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

/// VCVTNEPS2BF16: round-to-nearest-even, but denormal inputs are read as zero (whatever MXCSR
/// says), so it is the reference only for inputs that are not denormal. n is a multiple of 16.
__attribute__((target("avx512f,avx512bf16"))) inline void hardware_bfloat16(const float* in,
                                                                            int64_t n,
                                                                            uint16_t* out) {
  for (int64_t i = 0; i < n; i += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i),
                        reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(_mm512_loadu_ps(in + i))));
}

/// bfloat16 rounding by distance, an exact model independent of the carry trick the library uses:
/// the two bfloat16 neighbours of x (truncated, and one unit further from zero; 2^128 past the
/// largest finite value, i.e. infinity), their distances to x computed exactly in double (every
/// float32 has 24 significant bits, so these differences are exact), the nearer one, and on a tie
/// the one with an even last bit. For non-NaN inputs.
inline uint16_t model_bfloat16(uint32_t bits) {
  if ((bits & 0x7fffffffu) == 0x7f800000u) return uint16_t(bits >> 16);  // +-inf
  const uint32_t below = bits & 0xffff0000u, above = below + 0x10000u;
  const double x = std::fabs(double(pattern_float(bits)));
  const double x_below = std::fabs(double(pattern_float(below)));
  const double x_above = (above & 0x7fffffffu) == 0x7f800000u
                             ? std::ldexp(1.0, 128)
                             : std::fabs(double(pattern_float(above)));
  const double to_below = x - x_below, to_above = x_above - x;
  if (to_below < to_above) return uint16_t(below >> 16);
  if (to_above < to_below) return uint16_t(above >> 16);
  return ((below >> 16) & 1u) ? uint16_t(above >> 16) : uint16_t(below >> 16);
}

/// The bfloat16 reference for a block: the hardware conversion where the CPU has one (denormal
/// inputs: the model), else the model for every input; NaN: the canonical NaN.
inline void reference_bfloat16(uint32_t first, const float* in, int64_t n, bool use_hardware,
                               uint16_t* out) {
  if (use_hardware) {
    hardware_bfloat16(in, n, out);
    if (!block_has_nans(first) && !block_has_denormals(first)) return;
  }
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t bits = first + uint32_t(i);
    if (is_nan_pattern(bits))
      out[i] = kExpectedNanBfloat16;
    else if (!use_hardware || is_denormal_pattern(bits))
      out[i] = model_bfloat16(bits);
  }
}

/// Which bfloat16 reference a sweep uses, for the test's log.
inline const char* bfloat16_reference_name(bool use_hardware) {
  return use_hardware ? "AVX512_BF16 (VCVTNEPS2BF16), the exact model for denormal inputs"
                      : "the exact rounding-by-distance model (this CPU has no AVX512_BF16)";
}

/// The float16 reference for a block: F16C; NaN: the canonical NaN.
inline void reference_float16(uint32_t first, const float* in, int64_t n, uint16_t* out) {
  hardware_float16(in, n, out);
  if (!block_has_nans(first)) return;
  for (int64_t i = 0; i < n; ++i)
    if (is_nan_pattern(first + uint32_t(i))) out[i] = kExpectedNanFloat16;
}

/// The AVX2 kernels' own narrowing primitives (narrowing_avx2_kernel_copy.cpp) applied to n
/// floats (a multiple of 16): float16, bfloat16 (round_bf16_high, and the 16-column store_bf16,
/// results in input order) and the canonical-NaN float32 store.
void avx2_kernel_narrowing(const float* in, int64_t n, uint16_t* float16, uint16_t* bfloat16,
                           uint16_t* bfloat16_store, uint32_t* float32);
/// The same for the AVX-512 kernels (narrowing_avx512_kernel_copy.cpp; n a multiple of 32,
/// store_bf16 over 32 columns).
void avx512_kernel_narrowing(const float* in, int64_t n, uint16_t* float16, uint16_t* bfloat16,
                             uint16_t* bfloat16_store, uint32_t* float32);

}  // namespace moe_routing::testing
