// The int8 quantisation of the forward, element by element (docs/spec/moe_init_routing.md §3.3).
// These scalar functions are the definition shared by the reference and the CPU kernels; every step
// is one IEEE float32 operation (or an exact conversion), so the results do not depend on the
// compiler or the CPU.
#pragma once

#include <cmath>
#include <cstdint>

#include "moe_routing/dtype.h"
#include "moe_routing/numerics.h"

namespace moe_routing::quantize {

/// float32(1/127): the 950 kernel multiplies by this rounded reciprocal instead of dividing.
constexpr float kReciprocal127 = 0.007874015718698502f;

/// True for any NaN (a bit test: no floating-point comparison, so loops using it vectorise).
inline bool is_nan_bits(float v) { return (float_bits(v) & 0x7fffffffu) > 0x7f800000u; }

/// q rounded to an integer with ties away from zero and saturated to [-128, 127]; NaN gives 0.
/// Exact, in 16.16 fixed point: s = min(|q| * 2^16, 128.5 * 2^16) is exact (a power-of-two
/// scaling, then a clamp that commutes with the rounding), and for s >= 0
/// floor((trunc(s) + 2^15) / 2^16) = floor(|q| + 1/2), the half-away rounding of |q|; the sign is
/// put back, the result clamped. No float "+ 0.5" (which would round 0.49999997 up). Written
/// without data-dependent floating-point branches so that the CPU loops vectorise.
inline int8_t int8_round_half_away(float q) {
  float scaled = std::fabs(q) * 65536.0f;
  scaled = scaled < 8421376.0f ? scaled : 8421376.0f;  // 128.5 * 2^16; NaN -> the bound
  int32_t r = (int32_t(scaled) + 32768) >> 16;
  const int32_t sign = int32_t(float_bits(q)) >> 31;  // 0 or -1
  r = (r ^ sign) - sign;
  r = r < -128 ? -128 : (r > 127 ? 127 : r);
  return int8_t(is_nan_bits(q) ? 0 : r);
}

/// q rounded to an integer with ties to even and saturated to [-128, 127]; NaN gives 0.
inline int8_t int8_round_half_even(float q) {
  q = q != q ? 0.0f : q;
  q = q < -128.0f ? -128.0f : (q > 127.0f ? 127.0f : q);
  const int32_t whole = int32_t(q);
  const float fraction = q - float(whole);
  const bool odd = (whole & 1) != 0;
  const int32_t up = int32_t(fraction > 0.5f || (fraction == 0.5f && odd));
  const int32_t down = int32_t(fraction < -0.5f || (fraction == -0.5f && odd));
  return int8_t(whole + up - down);
}

/// float32 -> float16 -> float32 with round-to-nearest-even (the 950 kernel's fp16 registers).
inline float round_to_fp16(float v) { return fp16_to_float(float_to_fp16(v)); }

/// Static quantisation parameters, prepared once per call.
struct StaticParams {
  Numerics numerics = Numerics::atlas_a2;
  float scale = 1.0f;   // atlas_a2: scale[0]; ascend_950: fp16(scale[0])
  float offset = 0.0f;  // atlas_a2: offset[0] (0 when absent); ascend_950: fp16(offset[0])
};

inline StaticParams static_params(Numerics numerics, const float* scale, const float* offset) {
  StaticParams params;
  params.numerics = numerics;
  params.scale = scale[0];
  params.offset = offset != nullptr ? offset[0] : 0.0f;
  if (numerics == Numerics::ascend_950) {
    params.scale = round_to_fp16(params.scale);
    params.offset = round_to_fp16(params.offset);
  }
  return params;
}

/// quant_mode 0. atlas_a2: t = x * scale + offset in float32 (two roundings);
/// ascend_950: h = fp16(x), h = fp16(h * scale16), h = fp16(h + offset16). Then ties-to-even
/// rounding and int8 saturation. `x` is the input element widened exactly to float32. (A product
/// of two fp16 values is exact in float32, and float32 has more than 2*11+2 bits, so one fp16 op
/// evaluated in float32 and rounded to fp16 is the correctly rounded fp16 op.)
inline int8_t static_quantize(float x, const StaticParams& params) {
  float t;
  if (params.numerics == Numerics::ascend_950) {
    t = round_to_fp16(x);
    t = round_to_fp16(t * params.scale);
    t = round_to_fp16(t + params.offset);
  } else {
    t = x * params.scale;
    t = t + params.offset;
  }
  return int8_round_half_even(t);
}

/// max |f_j| accumulation step, from running = +0.0; a NaN, once seen, stays (the row then
/// quantises to zeros). The maximum of the non-NaN values does not depend on the order in which
/// they are visited, so a kernel may reduce in lanes and apply the NaN afterwards.
inline float abs_max_step(float running, float v) {
  const float a = std::fabs(v);
  return (a > running || a != a) ? a : running;
}

/// quant_mode 1 scale from the row's max |f|: m / 127 (atlas_a2) or m * float32(1/127) (950).
inline float dynamic_scale(float abs_max, Numerics numerics) {
  return numerics == Numerics::ascend_950 ? abs_max * kReciprocal127 : abs_max / 127.0f;
}

/// quant_mode 1 element: f / sc (float32 division), ties away from zero, int8 saturation. The
/// kernel's fp16 truncation before the rounding cannot change the result (every n + 0.5 with
/// |n| <= 127 is an fp16 value). A NaN quotient (0/0 for an all-zero row, or a NaN input) gives 0.
inline int8_t dynamic_quantize(float f, float sc) { return int8_round_half_away(f / sc); }

}  // namespace moe_routing::quantize
