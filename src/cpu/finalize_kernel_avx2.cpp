// AVX2 + F16C (compiled with -mavx2 -mf16c; chosen at run time only where the CPU has both).
#define MOE_ROUTING_CPU_ISA avx2
#include "cpu/avx2_vector.h"
#include "cpu/finalize_kernel_impl.h"

namespace moe_routing::cpu::avx2 {
namespace {

/// The shared AVX2 Ops (cpu/avx2_vector.h) and what only these kernels need. grad_scales' trees
/// need lanes in column order: products() widens in natural order and tree() reduces it.
struct FinalizeAvx2Ops : Avx2Ops {
  template <bool Stream>
  static void store_bf16_half_away(uint16_t* dst, V v) {
    store_bf16<Stream, true>(dst, v);
  }

  /// 8 consecutive elements widened in column order.
  template <class Tag>
  static __m256 load8(const typename Tag::storage* src) {
    if constexpr (std::is_same_v<Tag, Fp32Tag>) {
      return _mm256_loadu_ps(src);
    } else if constexpr (std::is_same_v<Tag, Fp16Tag>) {
      return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src)));
    } else {
      const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src));
      return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
  }
  template <class Tag>
  static void products(const typename Tag::storage* x, const typename Tag::storage* bias,
                       const typename Tag::storage* gy, int64_t n, float* dst) {
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {
      __m256 v = load8<Tag>(x + j);
      if (bias != nullptr) v = _mm256_add_ps(v, load8<Tag>(bias + j));
      _mm256_storeu_ps(dst + j, _mm256_mul_ps(v, load8<Tag>(gy + j)));
    }
    FinalizeScalarOps::products<Tag>(x + j, bias != nullptr ? bias + j : nullptr, gy + j, n - j,
                                     dst + j);
  }
  /// Lane k of the result is the adjacent-pair tree ((v0 + v1) + (v2 + v3)) + ((v4 + v5) +
  /// (v6 + v7)) of vector k's lanes, for 8 vectors: two rounds of hadd sum adjacent pairs within
  /// 128-bit halves, the third adds the halves.
  static __m256 tree8(const __m256* v) {
    const __m256 a = _mm256_hadd_ps(_mm256_hadd_ps(v[0], v[1]), _mm256_hadd_ps(v[2], v[3]));
    const __m256 b = _mm256_hadd_ps(_mm256_hadd_ps(v[4], v[5]), _mm256_hadd_ps(v[6], v[7]));
    // a = [t0 t1 t2 t3 | u0 u1 u2 u3] (t: lanes 0-3 of v0..v3, u: lanes 4-7), b likewise for
    // v4..v7.
    return _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
  }
  /// The adjacent-pair tree over `count` lanes (64 or 512: 8 or 64 vectors).
  static float tree(const float* lanes, int64_t count) {
    __m256 level[detail::kGradScalesGroup / 8];
    int64_t vectors = count / 8;
    for (int64_t k = 0; k < vectors; ++k) level[k] = _mm256_loadu_ps(lanes + 8 * k);
    for (; vectors > 1; vectors /= 8)
      for (int64_t k = 0; k < vectors / 8; ++k) level[k] = tree8(level + 8 * k);
    alignas(32) float last[8];
    _mm256_store_ps(last, level[0]);
    return ((last[0] + last[1]) + (last[2] + last[3])) +
           ((last[4] + last[5]) + (last[6] + last[7]));
  }
};

}  // namespace

void finalize_kernel(const FinalizeKernelArgs& args, int64_t unit_begin, int64_t unit_end) {
  finalize_dispatch<FinalizeAvx2Ops>(args, unit_begin, unit_end);
}

void finalize_grad_rows(const FinalizeGradKernelArgs& args, int64_t row_begin, int64_t row_end) {
  grad_rows_dispatch<FinalizeAvx2Ops>(args, row_begin, row_end);
}

void finalize_grad_bias(const FinalizeGradKernelArgs& args, int64_t unit_begin, int64_t unit_end) {
  grad_bias_dispatch<FinalizeAvx2Ops>(args, unit_begin, unit_end);
}

}  // namespace moe_routing::cpu::avx2
