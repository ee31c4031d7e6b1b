// Element types and the exact conversions every backend shares.
//
// fp16 and bf16 are storage types: kernels widen them to float32 exactly, compute in float32, and
// narrow once at the store with round-to-nearest-even (RNE). Denormals are kept, overflow to fp16
// gives +-inf, and every NaN result is stored as the canonical quiet NaN (fp32 0x7fc00000, fp16
// 0x7e00, bf16 0x7fc0): which NaN an addition returns (sign, payload) varies between CPUs, SIMD
// widths, compilers and GPUs, so canonical NaNs are what makes results bitwise identical across
// backends. These scalar helpers are the definition; SIMD paths must produce the same bits.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace moe_routing {

enum class DType : int32_t {
  float32 = 0,
  float16 = 1,
  bfloat16 = 2,
  int8 = 3,
  int32 = 4,
  int64 = 5,
};

/// "float32", "float16", "bfloat16", "int8", "int32", "int64" ("unknown" otherwise).
const char* dtype_name(DType dtype);
/// Size of one element in bytes (0 for an unknown value).
size_t dtype_size(DType dtype);
/// True for float32, float16 and bfloat16.
bool is_floating(DType dtype);
/// True when `value` is one of the enumerators (for values that cross an ABI).
bool is_valid_dtype(int32_t value);

inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

inline float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

/// bf16 -> float32, exact.
inline float bf16_to_float(uint16_t bits) { return bits_float(uint32_t(bits) << 16); }

constexpr uint32_t kCanonicalNanFloat32 = 0x7fc00000u;
constexpr uint16_t kCanonicalNanFloat16 = 0x7e00u;
constexpr uint16_t kCanonicalNanBfloat16 = 0x7fc0u;

/// v, or the canonical quiet NaN if v is any NaN.
inline float canonicalize_nan(float v) { return v != v ? bits_float(kCanonicalNanFloat32) : v; }

/// float32 -> bf16 with round-to-nearest-even; any NaN becomes the canonical NaN 0x7fc0.
inline uint16_t float_to_bf16(float f) {
  uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return kCanonicalNanBfloat16;
  uint32_t lsb = (u >> 16) & 1u;
  return uint16_t((u + 0x7fffu + lsb) >> 16);
}

/// IEEE binary16 -> float32, exact (subnormals included).
inline float fp16_to_float(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exponent = (h >> 10) & 0x1fu;
  uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0) {
    // Zero or subnormal: mantissa * 2^-24, exact in float32.
    float magnitude = float(mantissa) * 5.9604644775390625e-08f;
    return bits_float(float_bits(magnitude) | sign);
  }
  if (exponent == 31) return bits_float(sign | 0x7f800000u | (mantissa << 13));
  return bits_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

/// float32 -> IEEE binary16 with round-to-nearest-even; overflow gives +-inf, subnormal results
/// are rounded correctly (no flush), any NaN becomes the canonical NaN 0x7e00.
inline uint16_t float_to_fp16(float f) {
  uint32_t u = float_bits(f);
  uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return kCanonicalNanFloat16;
  if (a >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // >= 65520 rounds to inf
  if (a < 0x38800000u) {                                  // below 2^-14: fp16 subnormal or zero
    uint32_t exponent = a >> 23;
    if (exponent < 102) return sign;  // below 2^-25: rounds to zero
    uint32_t mantissa = (a & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126u - exponent;  // 14..24
    uint32_t q = mantissa >> shift;
    uint32_t rest = mantissa & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1u);
    if (rest > half || (rest == half && (q & 1u))) ++q;
    return uint16_t(sign | q);
  }
  uint32_t h = (a >> 13) - (112u << 10);
  uint32_t rest = a & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
  return uint16_t(sign | h);
}

/// Element of a floating tensor at flat index i, widened exactly to float32.
inline float load_as_float(const void* data, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::float16: return fp16_to_float(static_cast<const uint16_t*>(data)[i]);
    case DType::bfloat16: return bf16_to_float(static_cast<const uint16_t*>(data)[i]);
    default: return static_cast<const float*>(data)[i];
  }
}

/// Stores float32 v at flat index i of a floating tensor, narrowing once with RNE (NaN canonical).
inline void store_from_float(void* data, DType dtype, int64_t i, float v) {
  switch (dtype) {
    case DType::float16: static_cast<uint16_t*>(data)[i] = float_to_fp16(v); break;
    case DType::bfloat16: static_cast<uint16_t*>(data)[i] = float_to_bf16(v); break;
    default: static_cast<float*>(data)[i] = canonicalize_nan(v); break;
  }
}

}  // namespace moe_routing
