// The AVX2 + F16C vector Ops every AVX2 kernel shares (grad_kernel_avx2.cpp,
// finalize_kernel_avx2.cpp), and the narrowing primitives the exhaustive narrowing test checks
// against the hardware conversions (tests/cpp/narrowing_avx2_kernel_copy.cpp). Only for
// translation units compiled with -mavx2 -mf16c that define MOE_ROUTING_CPU_ISA as avx2 first:
// everything lands in moe_routing::cpu::avx2 (docs/ARCHITECTURE.md, "Per-ISA code").
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <type_traits>

#include "cpu/scalar_ops.h"

namespace moe_routing::cpu::avx2 {

/// 16 columns per vector, as two registers of 8 floats. Which columns sit in which lane is up to
/// each load/store pair, since every operation in between is per column: float32 and float16
/// hold columns 0-7 in `lo` and 8-15 in `hi`; bfloat16 holds the even columns in `lo` and the
/// odd ones in `hi`, because a bfloat16 is the top half of a float32: one 32-byte load gives the
/// odd columns by masking off the low halves and the even ones by shifting them up, with no
/// widening loads or shuffles (fewer instructions per byte read lets the core keep more loads in
/// flight), and the store puts the rounded halves back in place the same way. Float buffers hold
/// a vector as lo then hi, written and read back by the same pair.
struct Avx2Ops {
  struct V {
    __m256 lo, hi;
  };
  static constexpr int W = 16;
  /// The alignment (bytes) a destination of the Stream stores needs.
  static constexpr int kStreamAlign = 32;

  static V zero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
  static V add(V a, V b) { return {_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)}; }
  static V mul(V a, V b) { return {_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)}; }
  static V broadcast(float s) { return {_mm256_set1_ps(s), _mm256_set1_ps(s)}; }
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

  static __m256 nan_mask(__m256 v) { return _mm256_cmp_ps(v, v, _CMP_UNORD_Q); }
  /// float32: NaN becomes the canonical NaN.
  static __m256 canonical_fp32(__m256 v) {
    const __m256 canonical = _mm256_castsi256_ps(_mm256_set1_epi32(int(kCanonicalNanFloat32)));
    return _mm256_blendv_ps(v, canonical, nan_mask(v));
  }
  /// float16, round to nearest even (the immediate mode, whatever MXCSR.RC says); NaN becomes
  /// the canonical NaN.
  static __m128i narrow_fp16(__m256 v) {
    const __m128i converted = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m256i nan_wide = _mm256_castps_si256(nan_mask(v));
    const __m128i nan16 =
        _mm_packs_epi32(_mm256_castsi256_si128(nan_wide), _mm256_extracti128_si256(nan_wide, 1));
    return _mm_blendv_epi8(converted, _mm_set1_epi16(short(kCanonicalNanFloat16)), nan16);
  }
  /// Rounds each float to bfloat16, left in the top half of its 32-bit lane (the low half is then
  /// meaningless): nearest even (u + 0x7fff + lsb), or with HalfAway ties away from zero
  /// (u + 0x8000); NaN becomes the canonical NaN.
  template <bool HalfAway = false>
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

  /// float16 / bfloat16 round trips (round-to-nearest-even whatever MXCSR says).
  static __m256 round_fp16(__m256 v) {
    return _mm256_cvtph_ps(_mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  static V round_fp16(V v) { return {round_fp16(v.lo), round_fp16(v.hi)}; }
  static __m256 round_bf16(__m256 v) {
    return _mm256_castsi256_ps(
        _mm256_and_si256(round_bf16_high(v), _mm256_set1_epi32(int(0xffff0000u))));
  }
  /// v rounded to Tag's type and widened back.
  template <class Tag>
  static V round_to(V v) {
    if constexpr (std::is_same_v<Tag, Fp32Tag>)
      return v;
    else if constexpr (std::is_same_v<Tag, Fp16Tag>)
      return round_fp16(v);
    else
      return {round_bf16(v.lo), round_bf16(v.hi)};
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
  /// 16 bfloat16 columns (even ones in lo, odd ones in hi) rounded and stored in place. Nearest
  /// even works in the 16-bit lanes of the result (13 operations where rounding each half in its
  /// 32-bit lanes and merging takes 15): T = the truncated results (lo's top halves moved down,
  /// hi's in place), L = the low halves they drop; a result rounds up when L + lsb(T) > 0x8000,
  /// which is bit 15 of avg(L, 0x7ffe | lsb) = (L + lsb + 0x7fff) >> 1 (vpavgw adds in 17 bits);
  /// a carry into the exponent gives inf where it must. NaN lanes (either half's own mask, merged
  /// the same way) become the canonical NaN.
  template <bool Stream, bool HalfAway = false>
  static void store_bf16(uint16_t* dst, V v) {
    if constexpr (HalfAway) {
      const __m256i even = _mm256_srli_epi32(round_bf16_high<true>(v.lo), 16);
      const __m256i odd =
          _mm256_and_si256(round_bf16_high<true>(v.hi), _mm256_set1_epi32(int(0xffff0000u)));
      store256<Stream>(dst, _mm256_or_si256(even, odd));
    } else {
      const __m256i lo = _mm256_castps_si256(v.lo), hi = _mm256_castps_si256(v.hi);
      const __m256i truncated = _mm256_blend_epi16(_mm256_srli_epi32(lo, 16), hi, 0xaa);
      const __m256i dropped = _mm256_blend_epi16(lo, _mm256_slli_epi32(hi, 16), 0xaa);
      const __m256i bias = _mm256_or_si256(_mm256_and_si256(truncated, _mm256_set1_epi16(1)),
                                           _mm256_set1_epi16(0x7ffe));
      const __m256i up = _mm256_srli_epi16(_mm256_avg_epu16(dropped, bias), 15);
      const __m256i nan = _mm256_blend_epi16(_mm256_castps_si256(nan_mask(v.lo)),
                                             _mm256_castps_si256(nan_mask(v.hi)), 0xaa);
      store256<Stream>(dst,
                       _mm256_blendv_epi8(_mm256_add_epi16(truncated, up),
                                          _mm256_set1_epi16(short(kCanonicalNanBfloat16)), nan));
    }
  }
  /// Narrows once (round-to-nearest-even) and stores, streaming past the caches with Stream
  /// (then dst must be 32-byte aligned); NaN becomes the canonical NaN.
  template <class Tag, bool Stream = false>
  static void store(typename Tag::storage* dst, V v) {
    if constexpr (std::is_same_v<Tag, Fp32Tag>) {
      store256<Stream>(dst, _mm256_castps_si256(canonical_fp32(v.lo)));
      store256<Stream>(dst + 8, _mm256_castps_si256(canonical_fp32(v.hi)));
    } else if constexpr (std::is_same_v<Tag, Fp16Tag>) {
      store128<Stream>(dst, narrow_fp16(v.lo));
      store128<Stream>(dst + 8, narrow_fp16(v.hi));
    } else {
      store_bf16<Stream>(dst, v);
    }
  }
  static void stream_fence() { _mm_sfence(); }
};

}  // namespace moe_routing::cpu::avx2
