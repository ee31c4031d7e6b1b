// AVX2 + F16C (compiled with -mavx2 -mf16c; chosen at run time only where the CPU has both).
#include <immintrin.h>

#include "cpu/grad_kernel_impl.h"

namespace moe_routing::cpu {
namespace {

template <bool Stream>
inline void store128(uint16_t* dst, __m128i v) {
  if constexpr (Stream)
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst), v);
  else
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), v);
}

struct Avx2Ops {
  using V = __m256;
  static constexpr int W = 8;

  static V zero() { return _mm256_setzero_ps(); }
  static V add(V a, V b) { return _mm256_add_ps(a, b); }
  static V load_float(const float* p) { return _mm256_loadu_ps(p); }
  static void store_float(float* p, V v) { _mm256_storeu_ps(p, v); }

  template <class Tag>
  static V load(const typename Tag::storage* src) {
    if constexpr (std::is_same_v<Tag, Fp32Tag>) {
      return _mm256_loadu_ps(src);
    } else if constexpr (std::is_same_v<Tag, Fp16Tag>) {
      return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src)));
    } else {
      __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src)));
      return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
    }
  }

  static void stream_fence() { _mm_sfence(); }

  template <class Tag, bool Stream = false>
  static void store(typename Tag::storage* dst, V v) {
    const __m256 is_nan_ps = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
    if constexpr (std::is_same_v<Tag, Fp32Tag>) {
      const __m256 canonical = _mm256_castsi256_ps(_mm256_set1_epi32(int(kCanonicalNanFloat32)));
      const __m256 result = _mm256_blendv_ps(v, canonical, is_nan_ps);
      if constexpr (Stream)
        _mm256_stream_ps(dst, result);
      else
        _mm256_storeu_ps(dst, result);
    } else if constexpr (std::is_same_v<Tag, Fp16Tag>) {
      // Immediate rounding mode: round-to-nearest-even, independent of MXCSR.RC.
      const __m128i converted = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      const __m256i nan_wide = _mm256_castps_si256(is_nan_ps);
      const __m128i nan_mask = _mm_packs_epi32(_mm256_castsi256_si128(nan_wide),
                                               _mm256_extracti128_si256(nan_wide, 1));
      const __m128i result =
          _mm_blendv_epi8(converted, _mm_set1_epi16(short(kCanonicalNanFloat16)), nan_mask);
      store128<Stream>(dst, result);
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
      store128<Stream>(dst, packed);
    }
  }
};

}  // namespace

void grad_kernel_avx2(const GradKernelArgs& args, int64_t unit_begin, int64_t unit_end) {
  grad_dispatch_dtype<Avx2Ops>(args, unit_begin, unit_end);
}

}  // namespace moe_routing::cpu
