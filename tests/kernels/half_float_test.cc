// fp16 and bf16 decoding of kernels/cpu/half_float.h, against values from the IEEE 754 binary16
// layout and the bfloat16 definition (the top 16 bits of an fp32).
#include "kernels/cpu/half_float.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>

namespace samplerd::kernels {
namespace {

uint32_t BitsOf(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

TEST(HalfFloat, DecodesFp16NormalsAndExtremes) {
  EXPECT_EQ(HalfBitsToFloat(0x3c00), 1.0f);
  EXPECT_EQ(HalfBitsToFloat(0xc000), -2.0f);
  EXPECT_EQ(HalfBitsToFloat(0x3555), 0x1.554p-2f);            // 0.333251953125
  EXPECT_EQ(HalfBitsToFloat(0x7bff), 65504.0f);               // largest finite
  EXPECT_EQ(HalfBitsToFloat(0x0400), std::ldexp(1.0f, -14));  // smallest normal
}

TEST(HalfFloat, DecodesFp16SubnormalsAndSignedZeros) {
  EXPECT_EQ(HalfBitsToFloat(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(HalfBitsToFloat(0x0002), std::ldexp(1.0f, -23));
  EXPECT_EQ(HalfBitsToFloat(0x03ff), 1023.0f * std::ldexp(1.0f, -24));
  EXPECT_EQ(HalfBitsToFloat(0x8001), -std::ldexp(1.0f, -24));
  EXPECT_EQ(BitsOf(HalfBitsToFloat(0x0000)), 0x00000000u);
  EXPECT_EQ(BitsOf(HalfBitsToFloat(0x8000)), 0x80000000u);
}

TEST(HalfFloat, DecodesFp16InfinitiesAndNaN) {
  EXPECT_EQ(HalfBitsToFloat(0x7c00), INFINITY);
  EXPECT_EQ(HalfBitsToFloat(0xfc00), -INFINITY);
  EXPECT_TRUE(std::isnan(HalfBitsToFloat(0x7e00)));
  EXPECT_TRUE(std::isnan(HalfBitsToFloat(0x7c01)));  // signalling payload stays a NaN
  EXPECT_TRUE(std::isnan(HalfBitsToFloat(0xfe00)));
}

TEST(HalfFloat, DecodesEveryFp16PatternMonotonically) {
  // Positive patterns 0x0000..0x7c00 are ordered like their values; so are negatives reversed.
  for (uint32_t h = 1; h <= 0x7c00; ++h) {
    ASSERT_LT(HalfBitsToFloat(static_cast<uint16_t>(h - 1)),
              HalfBitsToFloat(static_cast<uint16_t>(h)))
        << std::hex << h;
    ASSERT_EQ(HalfBitsToFloat(static_cast<uint16_t>(h | 0x8000)),
              -HalfBitsToFloat(static_cast<uint16_t>(h)));
  }
}

TEST(HalfFloat, DecodesBf16AsTheTopHalfOfFp32) {
  EXPECT_EQ(Bf16BitsToFloat(0x3f80), 1.0f);
  EXPECT_EQ(Bf16BitsToFloat(0xc0a0), -5.0f);
  EXPECT_EQ(Bf16BitsToFloat(0x7f80), INFINITY);
  EXPECT_EQ(Bf16BitsToFloat(0xff80), -INFINITY);
  EXPECT_TRUE(std::isnan(Bf16BitsToFloat(0x7fc0)));
  EXPECT_EQ(Bf16BitsToFloat(0x0001), std::ldexp(1.0f, -133));  // smallest subnormal
  EXPECT_EQ(Bf16BitsToFloat(0x0080), std::ldexp(1.0f, -126));  // smallest normal
  EXPECT_EQ(BitsOf(Bf16BitsToFloat(0x8000)), 0x80000000u);
}

}  // namespace
}  // namespace samplerd::kernels
