// Exact conversions: widening is exact, narrowing is RNE with IEEE special cases.
#include <cmath>
#include <limits>

#include "test_util.h"

namespace moe_routing {
namespace {

TEST(Dtype, Fp16RoundTripsEveryPattern) {
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    float f = fp16_to_float(uint16_t(h));
    uint16_t back = float_to_fp16(f);
    if (std::isnan(f)) {
      EXPECT_EQ(back, kCanonicalNanFloat16);
    } else {
      ASSERT_EQ(back, h) << "pattern 0x" << std::hex << h;
    }
  }
}

TEST(Dtype, Fp16NarrowingRoundsHalfToEven) {
  EXPECT_EQ(float_to_fp16(1.0f + std::ldexp(1.0f, -11)), 0x3c00u);      // tie -> even (1.0)
  EXPECT_EQ(float_to_fp16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02u);  // tie -> even (up)
  EXPECT_EQ(float_to_fp16(1.0f + std::ldexp(1.0f, -11) + std::ldexp(1.0f, -20)), 0x3c01u);
  EXPECT_EQ(float_to_fp16(65504.0f), 0x7bffu);
  EXPECT_EQ(float_to_fp16(65519.99f), 0x7bffu);
  EXPECT_EQ(float_to_fp16(65520.0f), 0x7c00u);  // overflow -> inf
  EXPECT_EQ(float_to_fp16(-1e9f), 0xfc00u);
  EXPECT_EQ(float_to_fp16(std::ldexp(1.0f, -24)), 0x0001u);  // smallest subnormal
  EXPECT_EQ(float_to_fp16(std::ldexp(1.0f, -25)), 0x0000u);  // tie -> even (zero)
  EXPECT_EQ(float_to_fp16(std::ldexp(3.0f, -26)), 0x0001u);  // above the tie
  EXPECT_EQ(float_to_fp16(std::ldexp(3.0f, -25)), 0x0002u);  // 1.5 ulp tie -> even (2)
  EXPECT_EQ(float_to_fp16(-0.0f), 0x8000u);
  EXPECT_EQ(float_to_fp16(std::numeric_limits<float>::infinity()), 0x7c00u);
  EXPECT_EQ(float_to_fp16(-std::nanf("")), 0x7e00u);  // every NaN is canonical
}

TEST(Dtype, Bf16NarrowingRoundsHalfToEven) {
  EXPECT_EQ(float_to_bf16(1.00390625f), 0x3f80u);  // halfway between 1.0 and 1.0078125 -> 1.0
  EXPECT_EQ(float_to_bf16(1.01171875f), 0x3f82u);  // halfway, odd below -> up
  EXPECT_EQ(float_to_bf16(-0.0f), 0x8000u);
  EXPECT_EQ(float_to_bf16(bits_float(0x7f800001u)), 0x7fc0u);  // signalling NaN -> canonical
  EXPECT_EQ(float_to_bf16(bits_float(0xffc12345u)), 0x7fc0u);  // negative NaN -> canonical
  EXPECT_EQ(float_bits(canonicalize_nan(bits_float(0xff800001u))), 0x7fc00000u);
  EXPECT_EQ(float_to_bf16(bits_float(0xff7fffffu)), 0xff80u);  // rounds to -inf
  for (uint32_t b = 0; b < 0x10000u; ++b) {
    float f = bf16_to_float(uint16_t(b));
    if (!std::isnan(f)) {
      ASSERT_EQ(float_to_bf16(f), b);
    }
  }
}

TEST(Dtype, NamesAndSizes) {
  EXPECT_STREQ(dtype_name(DType::bfloat16), "bfloat16");
  EXPECT_EQ(dtype_size(DType::int64), 8u);
  EXPECT_EQ(dtype_size(DType::int8), 1u);
  EXPECT_TRUE(is_floating(DType::float16));
  EXPECT_FALSE(is_floating(DType::int32));
}

}  // namespace
}  // namespace moe_routing
