// AVX2 + F16C (compiled with -mavx2 -mf16c; chosen at run time only where the CPU has both).
#include <immintrin.h>

#define MOE_ROUTING_CPU_ISA avx2
#include "cpu/finalize_kernel_impl.h"

namespace moe_routing::cpu::avx2 {
namespace {

/// 16 columns per vector, as two registers of 8 floats. The elementwise kernels only need each
/// load/store pair to agree on which column sits in which lane: float32 and float16 hold columns
/// 0-7 in `lo` and 8-15 in `hi`; bfloat16 holds the even columns in `lo` and the odd ones in `hi`
/// (a bfloat16 is the top half of a float32: one 32-byte load gives the odd columns by masking and
/// the even ones by shifting, with no widening shuffles). grad_scales' trees need lanes in column
/// order: products() widens in natural order and tree() reduces it.
struct Avx2Ops {
  struct V {
    __m256 lo, hi;
  };
  static constexpr int W = 16;

  static V zero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
  static V add(V a, V b) { return {_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)}; }
  static V mul(V a, V b) { return {_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)}; }
  static V broadcast(float s) { return {_mm256_set1_ps(s), _mm256_set1_ps(s)}; }
  static V load_float(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
  static void store_float(float* p, V v) {
    _mm256_storeu_ps(p, v.lo);
    _mm256_storeu_ps(p + 8, v.hi);
  }

  static __m256 nan_mask(__m256 v) { return _mm256_cmp_ps(v, v, _CMP_UNORD_Q); }
  /// float16 round trip, round to nearest even whatever MXCSR says (exact emulation of an fp16
  /// operation when v is a float32 result of fp16 operands; see the file comment).
  static __m256 round_fp16(__m256 v) {
    return _mm256_cvtph_ps(_mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  static V round_fp16(V v) { return {round_fp16(v.lo), round_fp16(v.hi)}; }
  /// Each float rounded to bfloat16 in the top half of its lane (RNE: u + 0x7fff + lsb; HalfAway:
  /// u + 0x8000), the low half meaningless; NaN becomes the canonical NaN.
  template <bool HalfAway>
  static __m256i round_bf16_high(__m256 v) {
    const __m256i u = _mm256_castps_si256(v);
    __m256i rounded;
    if constexpr (HalfAway) {
      rounded = _mm256_add_epi32(u, _mm256_set1_epi32(0x8000));
    } else {
      const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
      rounded = _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb);
    }
    return _mm256_blendv_epi8(rounded,
                              _mm256_set1_epi32(int(uint32_t(kCanonicalNanBfloat16) << 16)),
                              _mm256_castps_si256(nan_mask(v)));
  }
  static __m256 round_bf16(__m256 v) {
    return _mm256_castsi256_ps(
        _mm256_and_si256(round_bf16_high<false>(v), _mm256_set1_epi32(int(0xffff0000u))));
  }
  template <class Tag>
  static V round_to(V v) {
    if constexpr (std::is_same_v<Tag, Fp32Tag>)
      return v;
    else if constexpr (std::is_same_v<Tag, Fp16Tag>)
      return round_fp16(v);
    else
      return {round_bf16(v.lo), round_bf16(v.hi)};
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

  template <bool Stream>
  static void store128(void* dst, __m128i v) {
    if constexpr (Stream)
      _mm_stream_si128(static_cast<__m128i*>(dst), v);
    else
      _mm_storeu_si128(static_cast<__m128i*>(dst), v);
  }
  template <bool Stream>
  static void store256(void* dst, __m256i v) {
    if constexpr (Stream)
      _mm256_stream_si256(static_cast<__m256i*>(dst), v);
    else
      _mm256_storeu_si256(static_cast<__m256i*>(dst), v);
  }
  static __m128i narrow_fp16(__m256 v) {
    const __m128i converted = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m256i nan_wide = _mm256_castps_si256(nan_mask(v));
    const __m128i nan16 =
        _mm_packs_epi32(_mm256_castsi256_si128(nan_wide), _mm256_extracti128_si256(nan_wide, 1));
    return _mm_blendv_epi8(converted, _mm_set1_epi16(short(kCanonicalNanFloat16)), nan16);
  }
  static __m256 canonical_fp32(__m256 v) {
    return _mm256_blendv_ps(v, _mm256_castsi256_ps(_mm256_set1_epi32(int(kCanonicalNanFloat32))),
                            nan_mask(v));
  }
  template <class Tag, bool HalfAway, bool Stream = false>
  static void store(typename Tag::storage* dst, V v) {
    if constexpr (std::is_same_v<Tag, Fp32Tag>) {
      store256<Stream>(dst, _mm256_castps_si256(canonical_fp32(v.lo)));
      store256<Stream>(dst + 8, _mm256_castps_si256(canonical_fp32(v.hi)));
    } else if constexpr (std::is_same_v<Tag, Fp16Tag>) {
      store128<Stream>(dst, narrow_fp16(v.lo));
      store128<Stream>(dst + 8, narrow_fp16(v.hi));
    } else {
      const __m256i even = _mm256_srli_epi32(round_bf16_high<HalfAway>(v.lo), 16);
      const __m256i odd =
          _mm256_and_si256(round_bf16_high<HalfAway>(v.hi), _mm256_set1_epi32(int(0xffff0000u)));
      store256<Stream>(dst, _mm256_or_si256(even, odd));
    }
  }
  static void stream_fence() { _mm_sfence(); }

  // ---- grad_scales: natural column order ----

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
    ScalarOps::products<Tag>(x + j, bias != nullptr ? bias + j : nullptr, gy + j, n - j, dst + j);
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
  finalize_dispatch<Avx2Ops>(args, unit_begin, unit_end);
}

void finalize_grad_rows(const FinalizeGradKernelArgs& args, int64_t row_begin, int64_t row_end) {
  grad_rows_dispatch<Avx2Ops>(args, row_begin, row_end);
}

void finalize_grad_bias(const FinalizeGradKernelArgs& args, int64_t unit_begin, int64_t unit_end) {
  grad_bias_dispatch<Avx2Ops>(args, unit_begin, unit_end);
}

}  // namespace moe_routing::cpu::avx2
