// AVX2 + F16C (compiled with -mavx2 -mf16c; chosen at run time only where the CPU has both).
#include <immintrin.h>

#define MOE_ROUTING_CPU_ISA avx2
#include "cpu/grad_kernel_impl.h"

namespace moe_routing::cpu::avx2 {
namespace {

template <bool Stream>
inline void store128(uint16_t* dst, __m128i v) {
  if constexpr (Stream)
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst), v);
  else
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), v);
}
template <bool Stream>
inline void store256(void* dst, __m256i v) {
  if constexpr (Stream)
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst), v);
  else
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), v);
}

/// 16 columns per vector, as two registers of 8 floats. Which columns sit in which lane is up to
/// each load/store pair, since every operation in between is per column: float32 and float16
/// hold columns 0-7 in `lo` and 8-15 in `hi`; bfloat16 holds the even columns in `lo` and the
/// odd ones in `hi`, because a bfloat16 is the top half of a float32: one 32-byte load gives the
/// odd columns by masking off the low halves and the even ones by shifting them up, with no
/// widening loads or shuffles (fewer instructions per byte read lets the core keep more loads in
/// flight), and the store puts the rounded halves back in place the same way. The float bins
/// of the L1 path hold a vector as lo then hi, written and read back by the same pair.
struct Avx2Ops {
  struct V {
    __m256 lo, hi;
  };
  static constexpr int W = 16;

  static V zero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
  static V add(V a, V b) { return {_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)}; }
  static V load_float(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
  static void store_float(float* p, V v) {
    _mm256_storeu_ps(p, v.lo);
    _mm256_storeu_ps(p + 8, v.hi);
  }

  template <class Tag>
  static V load(const typename Tag::storage* src) {
    if constexpr (std::is_same_v<Tag, Fp32Tag>) {
      return {_mm256_loadu_ps(src), _mm256_loadu_ps(src + 8)};
    } else if constexpr (std::is_same_v<Tag, Fp16Tag>) {
      return {_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src))),
              _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 8)))};
    } else {
      const __m256i pairs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src));
      return {_mm256_castsi256_ps(_mm256_slli_epi32(pairs, 16)),
              _mm256_castsi256_ps(_mm256_and_si256(pairs, _mm256_set1_epi32(int(0xffff0000u))))};
    }
  }

  static void stream_fence() { _mm_sfence(); }

  /// float32: NaN becomes the canonical NaN.
  static __m256 canonical_fp32(__m256 v) {
    const __m256 canonical = _mm256_castsi256_ps(_mm256_set1_epi32(int(kCanonicalNanFloat32)));
    return _mm256_blendv_ps(v, canonical, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  }
  /// float16, round to nearest even (the immediate mode, whatever MXCSR.RC says); NaN becomes
  /// the canonical NaN.
  static __m128i narrow_fp16(__m256 v) {
    const __m128i converted = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m256i nan_wide = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    const __m128i nan_mask =
        _mm_packs_epi32(_mm256_castsi256_si128(nan_wide), _mm256_extracti128_si256(nan_wide, 1));
    return _mm_blendv_epi8(converted, _mm_set1_epi16(short(kCanonicalNanFloat16)), nan_mask);
  }
  /// Rounds each float to bfloat16 (nearest even: u + 0x7fff + lsb), left in the top half of its
  /// 32-bit lane (the low half is then meaningless); NaN becomes the canonical NaN.
  static __m256i round_bf16_high(__m256 v) {
    const __m256i u = _mm256_castps_si256(v);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    const __m256i rounded = _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb);
    return _mm256_blendv_epi8(rounded,
                              _mm256_set1_epi32(int(uint32_t(kCanonicalNanBfloat16) << 16)),
                              _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
  }

  template <class Tag, bool Stream = false>
  static void store(typename Tag::storage* dst, V v) {
    if constexpr (std::is_same_v<Tag, Fp32Tag>) {
      store256<Stream>(dst, _mm256_castps_si256(canonical_fp32(v.lo)));
      store256<Stream>(dst + 8, _mm256_castps_si256(canonical_fp32(v.hi)));
    } else if constexpr (std::is_same_v<Tag, Fp16Tag>) {
      store128<Stream>(dst, narrow_fp16(v.lo));
      store128<Stream>(dst + 8, narrow_fp16(v.hi));
    } else {
      const __m256i even = _mm256_srli_epi32(round_bf16_high(v.lo), 16);
      const __m256i odd =
          _mm256_and_si256(round_bf16_high(v.hi), _mm256_set1_epi32(int(0xffff0000u)));
      store256<Stream>(dst, _mm256_or_si256(even, odd));
    }
  }
};

}  // namespace

void grad_kernel(const GradKernelArgs& args, int64_t unit_begin, int64_t unit_end) {
  grad_dispatch_dtype<Avx2Ops>(args, unit_begin, unit_end);
}

}  // namespace moe_routing::cpu::avx2
