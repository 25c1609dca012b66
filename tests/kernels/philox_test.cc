// Philox4x32-10 against Random123's known answers, the counter/key mapping of
// kernels/common/philox.h, and the uniform and Gumbel transforms built on it.
#include "kernels/common/philox.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <set>

namespace samplerd::kernels {
namespace {

struct KnownAnswer {
  PhiloxCounter counter;
  PhiloxKey key;
  PhiloxCounter expected;
};

// Random123 tests/kat_vectors, the three "philox4x32 10" lines (counter, key, expected output).
constexpr KnownAnswer kRandom123Vectors[] = {
    {{{0x00000000, 0x00000000, 0x00000000, 0x00000000}},
     {{0x00000000, 0x00000000}},
     {{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}}},
    {{{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}},
     {{0xffffffff, 0xffffffff}},
     {{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}}},
    {{{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}},
     {{0xa4093822, 0x299f31d0}},
     {{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}}},
};

TEST(Philox, MatchesRandom123KnownAnswers) {
  for (const KnownAnswer& kat : kRandom123Vectors) {
    const PhiloxCounter out = Philox4x32x10(kat.counter, kat.key);
    for (int w = 0; w < 4; ++w) {
      EXPECT_EQ(out.word[w], kat.expected.word[w])
          << "word " << w << " of counter " << kat.counter.word[0];
    }
  }
}

TEST(Philox, SeedZeroPositionZeroReadsTheZeroVector) {
  // seed 0, position 0, tokens 0..3 share counter {0,0,0,0}: the first known answer, in order.
  EXPECT_EQ(PhiloxBits(0, 0, 0), 0x6627e8d5u);
  EXPECT_EQ(PhiloxBits(0, 0, 1), 0xe169c58du);
  EXPECT_EQ(PhiloxBits(0, 0, 2), 0xbc57ac4cu);
  EXPECT_EQ(PhiloxBits(0, 0, 3), 0x9b00dbd8u);
}

TEST(Philox, MapsSeedPositionAndTokenToKeyAndCounterWords) {
  const uint64_t seed = 0x0123456789abcdefull;
  const uint64_t position = 0xfedcba9876543210ull;
  const uint64_t block = 0x0000000500000002ull;  // token >> 2
  const PhiloxKey key{{0x89abcdefu, 0x01234567u}};
  const PhiloxCounter counter{{0x00000002u, 0x00000005u, 0x76543210u, 0xfedcba98u}};
  const PhiloxCounter out = Philox4x32x10(counter, key);
  for (uint64_t w = 0; w < 4; ++w) {
    EXPECT_EQ(PhiloxBits(seed, position, block * 4 + w), out.word[w]) << "token word " << w;
  }
}

TEST(Philox, EveryInputWordChangesTheBits) {
  const uint32_t base = PhiloxBits(7, 11, 13);
  EXPECT_NE(PhiloxBits(7 + (1ull << 32), 11, 13), base);  // hi32(seed)
  EXPECT_NE(PhiloxBits(8, 11, 13), base);                 // lo32(seed)
  EXPECT_NE(PhiloxBits(7, 11 + (1ull << 32), 13), base);  // hi32(position)
  EXPECT_NE(PhiloxBits(7, 12, 13), base);                 // lo32(position)
  EXPECT_NE(PhiloxBits(7, 11, 13 + (1ull << 34)), base);  // hi32(token >> 2)
  EXPECT_NE(PhiloxBits(7, 11, 13 + 4), base);             // lo32(token >> 2)
}

TEST(Philox, UniformIsTheCentreOfOneOf2To23Bins) {
  EXPECT_EQ(UniformFromBits(0u), std::ldexp(1.0f, -24));
  EXPECT_EQ(UniformFromBits(0x1ffu), std::ldexp(1.0f, -24));  // the low 9 bits are unused
  EXPECT_EQ(UniformFromBits(0x200u), 3.0f * std::ldexp(1.0f, -24));
  EXPECT_EQ(UniformFromBits(0xffffffffu), 1.0f - std::ldexp(1.0f, -24));
  // Exact: the fp32 result equals the real value (2 * (bits >> 9) + 1) / 2^24 for every bin.
  for (uint32_t bin = 0; bin < (1u << 23); bin += 4099) {
    const uint32_t bits = (bin << 9) | (bin & 0x1ffu);
    EXPECT_EQ(static_cast<double>(UniformFromBits(bits)), (2.0 * bin + 1.0) / 16777216.0);
  }
}

TEST(Philox, UniformIsStrictlyInsideTheUnitIntervalWithUniformMoments) {
  double sum = 0.0;
  double sum_sq = 0.0;
  const int kDraws = 1 << 18;
  for (int i = 0; i < kDraws; ++i) {
    const float u = PhiloxUniform(0x5eedull + static_cast<uint64_t>(i % 7), i / 7, i);
    ASSERT_GT(u, 0.0f);
    ASSERT_LT(u, 1.0f);
    sum += u;
    sum_sq += static_cast<double>(u) * u;
  }
  const double mean = sum / kDraws;
  const double variance = sum_sq / kDraws - mean * mean;
  // Standard error of the mean is sqrt(1/12 / 2^18) ~ 5.6e-4; allow about 7 of them.
  EXPECT_NEAR(mean, 0.5, 4e-3);
  EXPECT_NEAR(variance, 1.0 / 12.0, 2e-3);
}

TEST(Philox, GumbelIsMinusLogMinusLogOfTheUniform) {
  for (uint64_t j = 0; j < 64; ++j) {
    const float u = PhiloxUniform(42, 3, j);
    EXPECT_EQ(GumbelNoise(42, 3, j), -logf(-logf(u)));
  }
  // The extreme bins stay finite: no token can get +inf noise.
  EXPECT_TRUE(std::isfinite(GumbelFromUniform(UniformFromBits(0u))));
  EXPECT_TRUE(std::isfinite(GumbelFromUniform(UniformFromBits(0xffffffffu))));
  EXPECT_GT(GumbelFromUniform(UniformFromBits(0xffffffffu)), 16.0f);
}

TEST(Philox, GumbelNoiseHasTheEulerMascheroniMean) {
  const int kDraws = 1 << 18;
  double sum = 0.0;
  for (int i = 0; i < kDraws; ++i) sum += GumbelNoise(99, i >> 8, i & 255);
  // Gumbel mean = 0.5772..., sd = pi / sqrt(6) ~ 1.28, standard error ~ 2.5e-3.
  EXPECT_NEAR(sum / kDraws, 0.5772156649, 0.015);
}

TEST(Philox, StreamsOfDifferentSeedsAndPositionsDoNotCollide) {
  std::set<uint32_t> seen;
  int draws = 0;
  for (uint64_t seed = 0; seed < 16; ++seed) {
    for (uint64_t position = 0; position < 16; ++position) {
      for (uint64_t token = 0; token < 16; ++token) {
        seen.insert(PhiloxBits(seed, position, token));
        ++draws;
      }
    }
  }
  // 4096 draws of 32 bits: a collision has probability ~2e-3; allow a couple.
  EXPECT_GE(static_cast<int>(seen.size()), draws - 2);
}

}  // namespace
}  // namespace samplerd::kernels
