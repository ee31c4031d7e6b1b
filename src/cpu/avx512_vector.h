// The AVX-512 vector Ops (AVX512F + BW + VL, with AVX2 and F16C) of the combine's kernels
// (finalize_kernel_avx512.cpp), and the narrowing primitives the exhaustive narrowing test checks
// against the hardware conversions (tests/cpp/narrowing_avx512_kernel_copy.cpp). Only for
// translation units compiled with -mavx512f -mavx512bw -mavx512vl -mavx2 -mf16c that define
// MOE_ROUTING_CPU_ISA as avx512 first: everything lands in moe_routing::cpu::avx512
// (docs/ARCHITECTURE.md, "Per-ISA code").
//
// The same operations as Avx2Ops (cpu/avx2_vector.h) on registers twice as wide: every lane
// does exactly what the scalar Ops does to its column, so the results are those of the AVX2 and
// baseline kernels, bit for bit.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <type_traits>

#include "cpu/scalar_ops.h"

namespace moe_routing::cpu::avx512 {

/// 32 columns per vector, as two registers of 16 floats: float32 and float16 hold columns 0-15
/// in `lo` and 16-31 in `hi`; bfloat16 the even columns in `lo` and the odd ones in `hi` (one
/// 64-byte load gives both by masking and shifting, as Avx2Ops does with 32 bytes). Float
/// buffers hold a vector as lo then hi, written and read back by the same pair.
struct Avx512Ops {
  struct V {
    __m512 lo, hi;
  };
  static constexpr int W = 32;
  /// The alignment (bytes) a destination of the Stream stores needs: a 64-byte store is one line.
  static constexpr int kStreamAlign = 64;

  static V zero() { return {_mm512_setzero_ps(), _mm512_setzero_ps()}; }
  static V add(V a, V b) { return {_mm512_add_ps(a.lo, b.lo), _mm512_add_ps(a.hi, b.hi)}; }
  static V mul(V a, V b) { return {_mm512_mul_ps(a.lo, b.lo), _mm512_mul_ps(a.hi, b.hi)}; }
  static V broadcast(float s) { return {_mm512_set1_ps(s), _mm512_set1_ps(s)}; }
  static V load_float(const float* p) { return {_mm512_loadu_ps(p), _mm512_loadu_ps(p + 16)}; }
  static void store_float(float* p, V v) {
    _mm512_storeu_ps(p, v.lo);
    _mm512_storeu_ps(p + 16, v.hi);
  }

  /// float16 <-> float32, round to nearest even (the immediate mode, whatever MXCSR.RC says).
  static __m512 widen_fp16(__m256i h) { return _mm512_cvtph_ps(h); }
  static __m256i convert_fp16(__m512 v) {
    return _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }

  template <class Tag>
  static V load(const typename Tag::storage* src) {
    if constexpr (std::is_same_v<Tag, Fp32Tag>) {
      return {_mm512_loadu_ps(src), _mm512_loadu_ps(src + 16)};
    } else if constexpr (std::is_same_v<Tag, Fp16Tag>) {
      return {widen_fp16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src))),
              widen_fp16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 16)))};
    } else {
      const __m512i pairs = _mm512_loadu_si512(src);
      return {_mm512_castsi512_ps(_mm512_slli_epi32(pairs, 16)),
              _mm512_castsi512_ps(_mm512_and_si512(pairs, _mm512_set1_epi32(int(0xffff0000u))))};
    }
  }

  static __mmask16 nan_mask(__m512 v) { return _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q); }
  /// float32: NaN becomes the canonical NaN.
  static __m512 canonical_fp32(__m512 v) {
    return _mm512_mask_blend_ps(nan_mask(v), v,
                                _mm512_castsi512_ps(_mm512_set1_epi32(int(kCanonicalNanFloat32))));
  }
  /// float16, round to nearest even (the immediate mode, whatever MXCSR.RC says); NaN becomes
  /// the canonical NaN.
  static __m256i narrow_fp16(__m512 v) {
    return _mm256_mask_blend_epi16(nan_mask(v), convert_fp16(v),
                                   _mm256_set1_epi16(short(kCanonicalNanFloat16)));
  }
  /// Rounds each float to bfloat16, left in the top half of its 32-bit lane (the low half is then
  /// meaningless): nearest even (u + 0x7fff + lsb), or with HalfAway ties away from zero
  /// (u + 0x8000); NaN becomes the canonical NaN.
  template <bool HalfAway = false>
  static __m512i round_bf16_high(__m512 v) {
    const __m512i u = _mm512_castps_si512(v);
    __m512i rounded;
    if constexpr (HalfAway) {
      rounded = _mm512_add_epi32(u, _mm512_set1_epi32(0x8000));
    } else {
      const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
      rounded = _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb);
    }
    return _mm512_mask_blend_epi32(nan_mask(v), rounded,
                                   _mm512_set1_epi32(int(uint32_t(kCanonicalNanBfloat16) << 16)));
  }

  /// float16 / bfloat16 round trips (round-to-nearest-even whatever MXCSR says).
  static __m512 round_fp16(__m512 v) { return widen_fp16(convert_fp16(v)); }
  static V round_fp16(V v) { return {round_fp16(v.lo), round_fp16(v.hi)}; }
  static __m512 round_bf16(__m512 v) {
    return _mm512_castsi512_ps(
        _mm512_and_si512(round_bf16_high(v), _mm512_set1_epi32(int(0xffff0000u))));
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
  static void store256(void* dst, __m256i v) {
    if constexpr (Stream)
      _mm256_stream_si256(static_cast<__m256i*>(dst), v);
    else
      _mm256_storeu_si256(static_cast<__m256i*>(dst), v);
  }
  template <bool Stream>
  static void store512(void* dst, __m512i v) {
    if constexpr (Stream)
      _mm512_stream_si512(static_cast<__m512i*>(dst), v);
    else
      _mm512_storeu_si512(dst, v);
  }
  /// 32 bfloat16 columns (even ones in lo, odd ones in hi) rounded and stored in place, nearest
  /// even in the 16-bit lanes of the result as Avx2Ops::store_bf16 does (T = the truncated
  /// results, L = the low halves they drop; up = bit 15 of avg(L, 0x7ffe | lsb(T))). A NaN
  /// column (its own float's mask) becomes the canonical NaN: one masked ternary-logic operation
  /// per half of the 32-bit lanes sets (lane & keep) | canonical.
  template <bool Stream, bool HalfAway = false>
  static void store_bf16(uint16_t* dst, V v) {
    if constexpr (HalfAway) {
      const __m512i even = _mm512_srli_epi32(round_bf16_high<true>(v.lo), 16);
      const __m512i odd =
          _mm512_and_si512(round_bf16_high<true>(v.hi), _mm512_set1_epi32(int(0xffff0000u)));
      store512<Stream>(dst, _mm512_or_si512(even, odd));
    } else {
      constexpr __mmask32 kOdd = 0xaaaaaaaau;
      const __m512i lo = _mm512_castps_si512(v.lo), hi = _mm512_castps_si512(v.hi);
      const __m512i truncated = _mm512_mask_blend_epi16(kOdd, _mm512_srli_epi32(lo, 16), hi);
      const __m512i dropped = _mm512_mask_blend_epi16(kOdd, lo, _mm512_slli_epi32(hi, 16));
      const __m512i bias = _mm512_or_si512(_mm512_and_si512(truncated, _mm512_set1_epi16(1)),
                                           _mm512_set1_epi16(0x7ffe));
      const __m512i up = _mm512_srli_epi16(_mm512_avg_epu16(dropped, bias), 15);
      __m512i result = _mm512_add_epi16(truncated, up);
      // (A & B) | C is the ternary-logic table 0xea.
      const uint32_t canonical = kCanonicalNanBfloat16;
      result = _mm512_mask_ternarylogic_epi32(result, nan_mask(v.lo),
                                              _mm512_set1_epi32(int(0xffff0000u)),
                                              _mm512_set1_epi32(int(canonical)), 0xea);
      result = _mm512_mask_ternarylogic_epi32(result, nan_mask(v.hi), _mm512_set1_epi32(0xffff),
                                              _mm512_set1_epi32(int(canonical << 16)), 0xea);
      store512<Stream>(dst, result);
    }
  }
  /// Narrows once (round-to-nearest-even) and stores, streaming past the caches with Stream
  /// (then dst must be kStreamAlign-aligned); NaN becomes the canonical NaN.
  template <class Tag, bool Stream = false>
  static void store(typename Tag::storage* dst, V v) {
    if constexpr (std::is_same_v<Tag, Fp32Tag>) {
      store512<Stream>(dst, _mm512_castps_si512(canonical_fp32(v.lo)));
      store512<Stream>(dst + 16, _mm512_castps_si512(canonical_fp32(v.hi)));
    } else if constexpr (std::is_same_v<Tag, Fp16Tag>) {
      store256<Stream>(dst, narrow_fp16(v.lo));
      store256<Stream>(dst + 16, narrow_fp16(v.hi));
    } else {
      store_bf16<Stream>(dst, v);
    }
  }
  static void stream_fence() { _mm_sfence(); }
};

}  // namespace moe_routing::cpu::avx512
