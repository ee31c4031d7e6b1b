// The exact float32 arithmetic and conversions of the CUDA kernels, as __host__ __device__
// functions: on the device every operation is one IEEE instruction with an explicit rounding mode
// (__fadd_rn, __fmul_rn, __fdiv_rn: nvcc never contracts them into FMAs or reassociates them,
// whatever -fmad says), and the narrowing conversions are the hardware's round-to-nearest-even
// ones with NaN made canonical; on the host (where the logic is unit-tested without a GPU) they
// are the core's definitions in moe_routing/dtype.h and the same float32 operations.
//
// The kernels are also built with -fmad=false -ftz=false -prec-div=true -prec-sqrt=true (no
// contraction anywhere, denormals kept, IEEE division), so even plain operators in them are exact.
#pragma once

#include <cstdint>
#include <cstring>

#include "moe_routing/dtype.h"

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#define MOE_HD __host__ __device__ __forceinline__
#else
#define MOE_HD inline
#endif
// Unrolling for the device pass only (host compilers warn about an unknown pragma).
#if defined(__CUDA_ARCH__)
#define MOE_UNROLL _Pragma("unroll")
#else
#define MOE_UNROLL
#endif

namespace moe_routing::cuda::num {

MOE_HD uint32_t bits_of(float v) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(v);
#else
  uint32_t u;
  std::memcpy(&u, &v, sizeof u);
  return u;
#endif
}

MOE_HD float float_of(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float v;
  std::memcpy(&v, &u, sizeof v);
  return v;
#endif
}

/// A read-only load: through the read-only data cache on the device (__ldg), plain on the host.
template <class T>
MOE_HD T ldg(const T* p) {
#if defined(__CUDA_ARCH__)
  return __ldg(p);
#else
  return *p;
#endif
}

MOE_HD bool is_nan(float v) { return (bits_of(v) & 0x7fffffffu) > 0x7f800000u; }

/// One float32 addition, round-to-nearest-even, never fused.
MOE_HD float add(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

MOE_HD float mul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

MOE_HD float div(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

MOE_HD float abs(float v) { return float_of(bits_of(v) & 0x7fffffffu); }

/// v, or the canonical quiet NaN 0x7fc00000 for any NaN.
MOE_HD float canonical(float v) { return is_nan(v) ? float_of(kCanonicalNanFloat32) : v; }

MOE_HD float bf16_to_float(uint16_t h) { return float_of(uint32_t(h) << 16); }

MOE_HD float fp16_to_float(uint16_t h) {
#if defined(__CUDA_ARCH__)
  return __half2float(__ushort_as_half(h));  // exact, subnormals included
#else
  return moe_routing::fp16_to_float(h);
#endif
}

/// RNE; NaN -> 0x7fc0.
MOE_HD uint16_t float_to_bf16(float v) {
#if defined(__CUDA_ARCH__)
  if (is_nan(v)) return kCanonicalNanBfloat16;
  return __bfloat16_as_ushort(__float2bfloat16_rn(v));
#else
  return moe_routing::float_to_bf16(v);
#endif
}

/// RNE, overflow to +-inf, subnormals rounded correctly; NaN -> 0x7e00.
MOE_HD uint16_t float_to_fp16(float v) {
#if defined(__CUDA_ARCH__)
  if (is_nan(v)) return kCanonicalNanFloat16;
  return __half_as_ushort(__float2half_rn(v));
#else
  return moe_routing::float_to_fp16(v);
#endif
}

/// float32 -> fp16 -> float32 with RNE (the 950 kernels' fp16 registers).
MOE_HD float round_to_fp16(float v) { return fp16_to_float(float_to_fp16(v)); }

// ---- the element types: storage, exact widening, one RNE narrowing with canonical NaN ----------

struct Float32 {
  using Storage = float;
  MOE_HD static float widen(float v) { return v; }
  MOE_HD static float narrow(float v) { return canonical(v); }
};
struct Float16 {
  using Storage = uint16_t;
  MOE_HD static float widen(uint16_t v) { return fp16_to_float(v); }
  MOE_HD static uint16_t narrow(float v) { return float_to_fp16(v); }
};
struct Bfloat16 {
  using Storage = uint16_t;
  MOE_HD static float widen(uint16_t v) { return bf16_to_float(v); }
  MOE_HD static uint16_t narrow(float v) { return float_to_bf16(v); }
};

// ---- int8 quantisation (the definitions of src/params/quantize.h) ------------------------------

/// float32(1/127), the 950 kernel's reciprocal.
constexpr float kReciprocal127 = 0.007874015718698502f;

/// Ties away from zero, saturated to [-128, 127], NaN -> 0; exact in 16.16 fixed point (see
/// quantize::int8_round_half_away for why).
MOE_HD int8_t int8_round_half_away(float q) {
  float scaled = mul(abs(q), 65536.0f);
  scaled = scaled < 8421376.0f ? scaled : 8421376.0f;  // 128.5 * 2^16; NaN -> the bound
  int32_t r = (int32_t(scaled) + 32768) >> 16;         // scaled >= 0: truncation = floor
  const int32_t sign = int32_t(bits_of(q)) >> 31;
  r = (r ^ sign) - sign;
  r = r < -128 ? -128 : (r > 127 ? 127 : r);
  return int8_t(is_nan(q) ? 0 : r);
}

/// Ties to even, saturated to [-128, 127], NaN -> 0 (quantize::int8_round_half_even).
MOE_HD int8_t int8_round_half_even(float q) {
  q = is_nan(q) ? 0.0f : q;
  q = q < -128.0f ? -128.0f : (q > 127.0f ? 127.0f : q);
  const int32_t whole = int32_t(q);              // toward zero; |q| <= 128 so exact
  const float fraction = add(q, -float(whole));  // exact
  const bool odd = (whole & 1) != 0;
  const int32_t up = int32_t(fraction > 0.5f || (fraction == 0.5f && odd));
  const int32_t down = int32_t(fraction < -0.5f || (fraction == -0.5f && odd));
  return int8_t(whole + up - down);
}

/// quant_mode 0 of one element (quantize::static_quantize); scale and offset already prepared
/// (fp16-rounded for the ascend_950 numerics).
MOE_HD int8_t static_quantize(float x, float scale, float offset, bool ascend_950) {
  float t;
  if (ascend_950) {
    t = round_to_fp16(x);
    t = round_to_fp16(mul(t, scale));
    t = round_to_fp16(add(t, offset));
  } else {
    t = add(mul(x, scale), offset);
  }
  return int8_round_half_even(t);
}

/// quant_mode 1 scale from max |f| (quantize::dynamic_scale).
MOE_HD float dynamic_scale(float abs_max, bool ascend_950) {
  return ascend_950 ? mul(abs_max, kReciprocal127) : div(abs_max, 127.0f);
}

}  // namespace moe_routing::cuda::num
