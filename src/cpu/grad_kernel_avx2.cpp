// AVX2 + F16C (compiled with -mavx2 -mf16c; chosen at run time only where the CPU has both).
#include <immintrin.h>

#include "cpu/grad_kernel_impl.h"

namespace moe_routing::cpu {
namespace {

struct Avx2Ops {
  static constexpr int W = 8;

  template <class Tag>
  static __m256 widen(const typename Tag::storage* src) {
    if constexpr (std::is_same_v<Tag, Fp32Tag>) {
      return _mm256_loadu_ps(src);
    } else if constexpr (std::is_same_v<Tag, Fp16Tag>) {
      return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src)));
    } else {
      __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src)));
      return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
    }
  }
  template <class Tag>
  static void assign_widen(float* dst, const typename Tag::storage* src) {
    _mm256_storeu_ps(dst, widen<Tag>(src));
  }
  template <class Tag>
  static void add_widen(float* dst, const typename Tag::storage* src) {
    _mm256_storeu_ps(dst, _mm256_add_ps(_mm256_loadu_ps(dst), widen<Tag>(src)));
  }
  static void add(float* dst, const float* src) {
    _mm256_storeu_ps(dst, _mm256_add_ps(_mm256_loadu_ps(dst), _mm256_loadu_ps(src)));
  }
  static void zero(float* dst) { _mm256_storeu_ps(dst, _mm256_setzero_ps()); }
  template <class Tag>
  static void narrow(typename Tag::storage* dst, const float* src) {
    const __m256 v = _mm256_loadu_ps(src);
    const __m256 is_nan_ps = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
    if constexpr (std::is_same_v<Tag, Fp32Tag>) {
      const __m256 canonical = _mm256_castsi256_ps(_mm256_set1_epi32(int(kCanonicalNanFloat32)));
      _mm256_storeu_ps(dst, _mm256_blendv_ps(v, canonical, is_nan_ps));
    } else if constexpr (std::is_same_v<Tag, Fp16Tag>) {
      // Immediate rounding mode: round-to-nearest-even, independent of MXCSR.RC.
      const __m128i converted = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      const __m128i nan_mask = _mm_packs_epi32(_mm256_castsi256_si128(_mm256_castps_si256(is_nan_ps)),
                                               _mm256_extracti128_si256(_mm256_castps_si256(is_nan_ps), 1));
      const __m128i result =
          _mm_blendv_epi8(converted, _mm_set1_epi16(short(kCanonicalNanFloat16)), nan_mask);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), result);
    } else {
      // bf16 RNE: (u + 0x7fff + lsb) >> 16; NaN -> the canonical NaN.
      const __m256i u = _mm256_castps_si256(v);
      const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
      const __m256i rounded = _mm256_srli_epi32(
          _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb), 16);
      const __m256i result = _mm256_blendv_epi8(rounded, _mm256_set1_epi32(kCanonicalNanBfloat16),
                                                _mm256_castps_si256(is_nan_ps));
      const __m128i packed =
          _mm_packus_epi32(_mm256_castsi256_si128(result), _mm256_extracti128_si256(result, 1));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), packed);
    }
  }
};

}  // namespace

void grad_kernel_avx2(const GradKernelArgs& args, int64_t unit_begin, int64_t unit_end) {
  grad_dispatch_dtype<Avx2Ops>(args, unit_begin, unit_end);
}

}  // namespace moe_routing::cpu
