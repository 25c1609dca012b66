// SmallestXReaching (kernels/common/temperature_threshold.h): the GPU passes compare x with it
// instead of computing z = x / T per token, so it must split the floats exactly where x / T
// crosses c, for every temperature and threshold a row can have.
#include "kernels/common/temperature_threshold.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

namespace samplerd::kernels {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

float FromBits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// x / t >= c  <=>  x >= SmallestXReaching(c, t), checked on the floats around the answer (where
// rounding decides) and on random floats of every magnitude.
void ExpectSplits(float c, float t, std::mt19937& rng) {
  const float y = SmallestXReaching(c, t);
  ASSERT_FALSE(std::isnan(y)) << "c " << c << " t " << t;
  ASSERT_GE(y / t, c) << "the answer must reach c: c " << c << " t " << t << " y " << y;
  std::vector<float> xs = {y, -kInf, kInf, 0.0f, -0.0f, c, c * t};
  float up = y, down = y;
  for (int i = 0; i < 300; ++i) {
    up = std::nextafter(up, kInf);
    down = std::nextafter(down, -kInf);
    xs.push_back(up);
    xs.push_back(down);
  }
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 2000; ++i) {
    const float x = FromBits(bits(rng));
    if (!std::isnan(x)) xs.push_back(x);
  }
  for (const float x : xs) {
    ASSERT_EQ(x / t >= c, x >= y) << "c " << c << " t " << t << " x " << x << " y " << y;
  }
}

TEST(SmallestXReachingTest, UnitTemperatureIsTheThresholdItself) {
  for (const float c : {-3.5f, 0.0f, 1e-30f, 7.25f, kInf}) EXPECT_EQ(SmallestXReaching(c, 1.0f), c);
}

TEST(SmallestXReachingTest, SplitsExactlyWhereTheQuotientCrosses) {
  std::mt19937 rng(7);
  const float temperatures[] = {0.8f,  0.7f,       1.3f,       0.5f,   2.0f, 1e-5f,
                                3e-5f, 1.0000001f, 0.9999999f, 100.0f, 1e6f};
  const float thresholds[] = {0.0f,    -0.0f,    4.125f, -4.125f, 12.0f,   1e-40f, -1e-40f,
                              3.0e38f, -3.0e38f, kInf,   1e-3f,   -2.5e5f, 0.3f,   -0.7f};
  for (const float t : temperatures) {
    for (const float c : thresholds) ExpectSplits(c, t, rng);
    std::uniform_real_distribution<float> any(-40.0f, 40.0f);
    for (int i = 0; i < 50; ++i) ExpectSplits(any(rng), t, rng);
  }
}

TEST(SmallestXReachingTest, OverflowingQuotientsStillSplit) {
  // x / 1e-5 overflows to +inf above ~3.4e33: every such x reaches any finite c.
  const float y = SmallestXReaching(3.0e38f, 1e-5f);
  EXPECT_LE(y, 3.0e33f);
  EXPECT_GE(y / 1e-5f, 3.0e38f);
  EXPECT_LT(std::nextafter(y, -kInf) / 1e-5f, 3.0e38f);
}

// The bracketed search must give what a search over every key gives.
float FullSearch(float c, float t) {
  uint32_t lo = 0x007fffffu, hi = 0xff800000u;
  while (hi - lo > 1) {
    const uint32_t mid = lo + (hi - lo) / 2;
    (FloatFromOrderKey(mid) / t >= c ? hi : lo) = mid;
  }
  return FloatFromOrderKey(hi);
}

TEST(SmallestXReachingTest, TheBracketGivesWhatTheFullSearchGives) {
  std::mt19937 rng(11);
  std::uniform_int_distribution<uint32_t> bits;
  std::uniform_real_distribution<float> temperature(1e-3f, 4.0f);
  int compared = 0;
  for (int i = 0; i < 200000; ++i) {
    const float c = FromBits(bits(rng));
    if (std::isnan(c) || c == -kInf) continue;
    const float t = i % 2 ? temperature(rng) : FromBits(bits(rng) & 0x7fffffffu);
    if (!(t > 0.0f) || std::isinf(t)) continue;
    const float y = SmallestXReaching(c, t);
    const float full = FullSearch(c, t);
    ASSERT_EQ(std::memcmp(&y, &full, sizeof y), 0) << "c " << c << " t " << t;
    ++compared;
  }
  EXPECT_GT(compared, 100000);
}

TEST(FloatFromOrderKeyTest, KeysRunInFloatOrder) {
  float previous = -kInf;
  for (uint32_t key = 0x007fffffu + 1; key < 0xff800000u; key += 0x10001u) {
    const float f = FloatFromOrderKey(key);
    ASSERT_FALSE(std::isnan(f)) << key;
    ASSERT_LE(previous, f) << key;
    previous = f;
  }
  EXPECT_EQ(FloatFromOrderKey(0x007fffffu), -kInf);
  EXPECT_EQ(FloatFromOrderKey(0xff800000u), kInf);
  for (const float f : {-kInf, -3.5f, -0.0f, 0.0f, 1e-45f, 7.0f, kInf}) {
    const float back = FloatFromOrderKey(OrderKeyOfFloat(f));
    EXPECT_EQ(std::memcmp(&back, &f, sizeof f), 0) << f;
  }
}

}  // namespace
}  // namespace samplerd::kernels
