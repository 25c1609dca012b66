// The inverse-CDF draw of plain-temperature rows (kernels/common/inverse_cdf.h): its uniform,
// the oracle's InverseCdfDraw, and CpuSampleRows drawing plain rows with it (processed rows
// and logprobs included). Fixed seeds throughout.
#include "kernels/cpu/inverse_cdf_draw.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <set>
#include <vector>

#include "kernels/common/inverse_cdf.h"
#include "kernels/common/philox.h"
#include "kernels/common/sampling_types.h"
#include "tests/kernels/processors_test_util.h"
#include "tests/kernels/sampler_test_util.h"

namespace samplerd::kernels {
namespace {

using ::samplerd::kernels::testing::Bias;
using ::samplerd::kernels::testing::DrawTokens;
using ::samplerd::kernels::testing::ExpectedProcessed;
using ::samplerd::kernels::testing::kInf;
using ::samplerd::kernels::testing::MaskAllowing;
using ::samplerd::kernels::testing::Params;
using ::samplerd::kernels::testing::Penalised;
using ::samplerd::kernels::testing::RandomLogits;
using ::samplerd::kernels::testing::ReferenceDraw;
using ::samplerd::kernels::testing::ReferenceGumbelDraw;
using ::samplerd::kernels::testing::ReferenceInverseCdfDraw;
using ::samplerd::kernels::testing::RowResult;
using ::samplerd::kernels::testing::SampleOne;
using ::samplerd::kernels::testing::SampleOneProcessed;
using ::samplerd::kernels::testing::Seen;

int32_t Draw(const std::vector<float>& x, const RowParams& p) {
  return InverseCdfDraw(x.data(), static_cast<int64_t>(x.size()), p);
}

// ---- The uniform --------------------------------------------------------------------------

TEST(InverseCdfUniform, BitsMapExactlyOntoMultiplesOfTwoToTheMinus53) {
  EXPECT_EQ(UniformDoubleFromBits(0, 0), 0.0);
  EXPECT_EQ(UniformDoubleFromBits(0xFFFFFFFFu, 0xFFFFFFFFu), 1.0 - 0x1.0p-53);
  EXPECT_LT(UniformDoubleFromBits(0xFFFFFFFFu, 0xFFFFFFFFu), 1.0);
  EXPECT_EQ(UniformDoubleFromBits(0, 0x800u), 0x1.0p-53);  // the lowest bit used
  EXPECT_EQ(UniformDoubleFromBits(0, 0x7FFu), 0.0);        // the 11 bits dropped
  EXPECT_EQ(UniformDoubleFromBits(0x80000000u, 0), 0.5);   // the top bit
  EXPECT_EQ(UniformDoubleFromBits(1, 0), 0x1.0p-32);       // hi's lowest bit
  EXPECT_EQ(UniformDoubleFromBits(0, 0xFFFFF800u), 0x1.0p-32 - 0x1.0p-53);
}

TEST(InverseCdfUniform, TheChunkedDrawsUniformsAreTheRowsTwoBlocksWords) {
  EXPECT_EQ(UniformFromWord(0), 0x1.0p-33);
  EXPECT_EQ(UniformFromWord(0xFFFFFFFFu), 1.0 - 0x1.0p-33);
  for (uint64_t seed : {uint64_t{0}, uint64_t{42}, ~uint64_t{0}}) {
    for (uint64_t position : {uint64_t{0}, uint64_t{1} << 40}) {
      const PhiloxCounter out =
          Philox4x32x10(PhiloxCounterFor(position, kRowUniformToken), PhiloxKeyFromSeed(seed));
      const ChunkedUniforms u = RowChunkedUniforms(seed, position);
      const PhiloxCounter part =
          Philox4x32x10(PhiloxCounterFor(position, kRowPartToken), PhiloxKeyFromSeed(seed));
      EXPECT_EQ(u.u0, UniformFromWord(part.word[0]));
      EXPECT_EQ(u.u1, RowUniform(seed, position));
      EXPECT_EQ(u.u2, UniformFromWord(out.word[2]));
      EXPECT_EQ(u.u3, UniformFromWord(out.word[3]));
    }
  }
  // Level 0's block is the one before the row uniform's, beyond every token's block too.
  EXPECT_EQ(kRowPartToken >> 2, (uint64_t{1} << 62) - 2);
}

TEST(InverseCdfUniform, RowUniformIsWordsZeroAndOneOfTheRowsOwnPhiloxBlock) {
  for (uint64_t seed : {uint64_t{0}, uint64_t{42}, ~uint64_t{0}}) {
    for (uint64_t position : {uint64_t{0}, uint64_t{7}, uint64_t{1} << 40}) {
      const PhiloxCounter out =
          Philox4x32x10(PhiloxCounterFor(position, kRowUniformToken), PhiloxKeyFromSeed(seed));
      EXPECT_EQ(RowUniform(seed, position), UniformDoubleFromBits(out.word[0], out.word[1]));
    }
  }
  // Block 2^62 - 1: beyond every token's block (token < 2^31 gives block < 2^29).
  EXPECT_EQ(kRowUniformToken >> 2, (uint64_t{1} << 62) - 1);
}

TEST(InverseCdfUniform, RowUniformLiesInZeroOneAndLooksUniform) {
  constexpr int kDraws = 100000;
  double sum = 0.0;
  int below_tenth = 0;
  for (int i = 0; i < kDraws; ++i) {
    const double u = RowUniform(0x9E3779B97F4A7C15ull * static_cast<uint64_t>(i + 1), i);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
    below_tenth += u < 0.1;
  }
  EXPECT_NEAR(sum / kDraws, 0.5, 0.005);       // sd of the mean: 0.29 / sqrt(1e5) ~ 0.0009
  EXPECT_NEAR(below_tenth, kDraws / 10, 600);  // sd ~ 95
}

// ---- InverseCdfDraw -----------------------------------------------------------------------

TEST(InverseCdfDraw, EqualLogitsGiveTheTokenFloorOfNTimesU) {
  // Masses are all exactly 1, so every prefix is an exact integer: token = floor(n * u).
  const std::vector<float> x(37, 0.25f);
  for (uint64_t position = 0; position < 500; ++position) {
    const RowParams p = Params(0.7f, 5, position);
    const double u = RowUniform(p.seed, p.position);
    ASSERT_EQ(Draw(x, p), static_cast<int32_t>(std::floor(37.0 * u))) << "position " << position;
  }
}

TEST(InverseCdfDraw, ASingleFiniteTokenIsAlwaysDrawn) {
  const std::vector<float> x = {-kInf, -kInf, 2.0f, -kInf, -kInf};
  for (uint64_t position = 0; position < 200; ++position) {
    ASSERT_EQ(Draw(x, Params(1.3f, 6, position)), 2);
  }
  for (int32_t t : DrawTokens(x, Params(1.3f, 6), 200)) ASSERT_EQ(t, 2);
  EXPECT_EQ(Draw({-1e30f}, Params(1.0f, 1)), 0);  // V = 1
}

TEST(InverseCdfDraw, NegativeInfinityAndZeroMassTokensAreNeverDrawn) {
  // Tokens 1000 below the max at T = 1 have mass exp(-1000) = 0 in double; the row's last
  // token is one of them, so the "last token with mass" rule is exercised too.
  std::vector<float> x = RandomLogits(64, 7, -2.0f, 2.0f);
  for (size_t j = 0; j < x.size(); j += 3) x[j] = -kInf;
  for (size_t j = 1; j < x.size(); j += 5) x[j] = -1000.0f;
  x.back() = -1000.0f;
  const double x_max = 2.0;  // above every x: only ratios matter to the support
  for (size_t j = 0; j < x.size(); ++j) {
    if (x[j] == -1000.0f) {
      EXPECT_EQ(InverseCdfMass(x[j], x_max, 1.0), 0.0);
    }
  }
  std::vector<int64_t> counts(x.size(), 0);
  for (uint64_t position = 0; position < 5000; ++position) {
    const int32_t t = Draw(x, Params(1.0f, 8, position));
    ASSERT_TRUE(t >= 0 && x[t] != -kInf && x[t] != -1000.0f) << "drew token " << t;
    ++counts[t];
  }
  int drawn = 0;
  for (int64_t c : counts) drawn += c > 0;
  EXPECT_GT(drawn, 20);
}

TEST(InverseCdfDraw, MatchesTheReferenceOnRandomRowsWithTiesAndInfinities) {
  for (uint32_t trial = 0; trial < 200; ++trial) {
    std::vector<float> x = RandomLogits(1 + trial * 7 % 300, 100 + trial, -8.0f, 8.0f);
    if (trial % 3 == 0) {
      for (size_t j = 0; j < x.size(); ++j) x[j] = std::round(x[j]);  // ties
    }
    if (trial % 4 == 1) {
      for (size_t j = trial % 5; j < x.size(); j += 4) x[j] = -kInf;
    }
    x[trial % x.size()] = 9.0f;  // at least one finite token
    const float t = 0.05f + 0.1f * static_cast<float>(trial % 30);
    for (uint64_t position = 0; position < 20; ++position) {
      const RowParams p = Params(t, 900 + trial, position);
      ASSERT_EQ(Draw(x, p), ReferenceInverseCdfDraw(x, p)) << "trial " << trial;
    }
  }
}

TEST(InverseCdfDraw, ATinyTemperatureDrawsTheMaxAndSplitsItsTies) {
  // T = kGreedyTemperature itself samples: every token below the max is >= 1e5 logits below
  // it in z, so mass 0; tokens tied at the max have mass 1 each.
  const std::vector<float> one = {0.5f, 3.0f, 2.99f, -1.0f};
  for (int32_t t : DrawTokens(one, Params(kGreedyTemperature, 3), 200)) ASSERT_EQ(t, 1);
  const std::vector<float> tied = {3.0f, 1.0f, 3.0f, 2.9999f};
  const std::vector<int32_t> tokens = DrawTokens(tied, Params(kGreedyTemperature, 4), 400);
  int zeros = 0;
  for (int32_t t : tokens) zeros += t == 0;
  EXPECT_EQ(Seen(tokens, 4), (std::vector<bool>{true, false, true, false}));
  EXPECT_NEAR(zeros, 200, 50);  // Binomial(400, 1/2): sd 10
}

TEST(InverseCdfDraw, AHugeTemperatureIsNearlyUniform) {
  // T = 1e30: every mass is exp(-(~1e-30)) = 1 in double, so the draw is exactly floor(n * u),
  // as for equal logits.
  const std::vector<float> x = RandomLogits(50, 9, -5.0f, 5.0f);
  for (uint64_t position = 0; position < 300; ++position) {
    const RowParams p = Params(1e30f, 10, position);
    const double u = RowUniform(p.seed, p.position);
    ASSERT_EQ(Draw(x, p), static_cast<int32_t>(std::floor(50.0 * u)));
  }
  // T = 1000: every token is drawn, none far from 1 / 50 of the time.
  std::vector<int64_t> counts(x.size(), 0);
  for (int32_t t : DrawTokens(x, Params(1000.0f, 11), 10000)) ++counts[t];
  for (int64_t c : counts) EXPECT_NEAR(c, 200, 70);  // Binomial(1e4, 0.02): sd 14
}

TEST(InverseCdfDraw, SeedAndPositionChooseTheToken) {
  const std::vector<float> x(1000, 0.0f);
  std::set<int32_t> by_position, by_seed;
  for (uint64_t i = 0; i < 100; ++i) {
    by_position.insert(Draw(x, Params(1.0f, 12, i)));
    by_seed.insert(Draw(x, Params(1.0f, 1000 + i, 12)));
    EXPECT_EQ(Draw(x, Params(1.0f, 12, i)), Draw(x, Params(1.0f, 12, i)));
  }
  EXPECT_GT(by_position.size(), 90u);  // 100 draws from 1000: ~5 collisions expected
  EXPECT_GT(by_seed.size(), 90u);
}

// ---- CpuSampleRows on plain rows ------------------------------------------------------------

TEST(InverseCdfDraw, CpuSampleRowsDrawsPlainRowsByInverseCdf) {
  const std::vector<float> x = RandomLogits(500, 13, -4.0f, 4.0f);
  for (uint64_t position = 0; position < 100; ++position) {
    RowParams p = Params(0.9f, 14, position);
    EXPECT_EQ(SampleOne(x, p).token, Draw(x, p));
    p.top_k = 500;  // top-k >= V: still plain
    EXPECT_EQ(SampleOne(x, p).token, Draw(x, p));
  }
}

TEST(InverseCdfDraw, ProcessedPlainRowsDrawFromTheProcessedLogits) {
  const std::vector<float> x = RandomLogits(300, 15);
  const std::vector<TokenAdjust> adjusts = {Bias(3, 2.0f), Penalised(12, 1.3f, 0.7f),
                                            Bias(100, 6.0f), Bias(299, -kInf)};
  std::vector<int32_t> allowed;
  for (int32_t t = 0; t < 300; t += 3) allowed.push_back(t);
  const std::vector<uint32_t> mask = MaskAllowing(300, allowed);
  const std::vector<float> processed = ExpectedProcessed(x, adjusts, mask);
  for (uint64_t position = 0; position < 100; ++position) {
    const RowParams p = Params(0.8f, 16, position);
    const int32_t token = SampleOneProcessed(x, p, adjusts, mask).token;
    ASSERT_EQ(token, Draw(processed, p));
    ASSERT_EQ(token % 3, 0) << "drew masked token " << token;
    ASSERT_NE(token, 299);
  }
  // A bias of +inf makes max z infinite: the row leaves the inverse-CDF draw for the uniform
  // draw over its +inf tokens.
  for (uint64_t position = 0; position < 20; ++position) {
    EXPECT_EQ(SampleOneProcessed(x, Params(0.8f, 17, position), {Bias(42, kInf)}).token, 42);
  }
}

TEST(InverseCdfDraw, PlainRowsKeepTheirProcessedLogprobs) {
  // The draw changed, the distribution did not: processed logprobs are log softmax(z).
  const std::vector<float> x = {1.0f, 2.0f, -kInf, 0.5f};
  const RowResult r = SampleOne(x, Params(0.5f, 18, 3), 4, LogprobSource::kProcessed);
  const double e0 = std::exp(-2.0), e3 = std::exp(-3.0), sum = 1.0 + e0 + e3;
  EXPECT_EQ(r.top_ids, (std::vector<int32_t>{1, 0, 3, 2}));
  EXPECT_FLOAT_EQ(r.top_values[0], static_cast<float>(-std::log(sum)));
  EXPECT_FLOAT_EQ(r.top_values[1], static_cast<float>(-2.0 - std::log(sum)));
  EXPECT_FLOAT_EQ(r.top_values[2], static_cast<float>(-3.0 - std::log(sum)));
  EXPECT_EQ(r.top_values[3], -kInf);
  EXPECT_EQ(r.token, Draw(x, Params(0.5f, 18, 3)));
}

// ---- The chunked draw of top-p-alone rows -------------------------------------------------

TEST(ChunkedInverseCdfDraw, TheOracleIsTheReferenceOnRowsOfOneToSeveralChunks) {
  for (size_t n : {size_t{50}, size_t{8192}, size_t{8193}, size_t{8448}}) {
    const std::vector<float> x = RandomLogits(n, 131 + static_cast<uint32_t>(n), -3.0f, 3.0f);
    for (float top_p : {0.3f, 0.95f}) {
      for (uint64_t position = 0; position < 6; ++position) {
        RowParams p = Params(0.7f, 132, position);
        p.top_p = top_p;
        ASSERT_EQ(SampleOne(x, p).token, ReferenceDraw(x, p))
            << "n " << n << " top_p " << top_p << " position " << position;
      }
    }
  }
}

TEST(ChunkedInverseCdfDraw, LevelZeroDrawsTheTailExactlyWhenUZeroPassesTheHeadsShare) {
  // Three groups interleaved: z = 1 (bin 8), z = 0.51 (bin 4) and z = -5. Top-p 0.99 keeps the
  // first two (the mass above the third is 0.9985 of the total), so z_c = 0.51: the head is the
  // z = 1 group (W_H = 100), the tail the z = 0.51 group (W_T = 100 e^-0.49 = 61.3).
  std::vector<float> x(300);
  for (size_t j = 0; j < x.size(); ++j) x[j] = j % 3 == 0 ? 1.0f : (j % 3 == 1 ? 0.51f : -5.0f);
  double w_head = 0.0, w_tail = 0.0;
  for (float v : x) {
    if (v == 1.0f) w_head += KeptMass(v, 1.0);
    if (v == 0.51f) w_tail += KeptMass(v, 1.0);
  }
  int tails = 0;
  constexpr int kPositions = 400;
  for (uint64_t position = 0; position < kPositions; ++position) {
    RowParams p = Params(1.0f, 151, position);
    p.top_p = 0.99f;
    const int32_t token = SampleOne(x, p).token;
    ASSERT_EQ(token, ReferenceDraw(x, p)) << "position " << position;
    ASSERT_NE(x[token], -5.0f) << "position " << position;
    const bool tail = x[token] == 0.51f;
    ASSERT_EQ(tail, !HeadIsDrawn(w_head, w_tail, RowChunkedUniforms(p.seed, position).u0))
        << "position " << position;
    tails += tail;
  }
  // P(tail) = 61.3 / 161.3 = 0.38: sd over 400 draws ~0.024.
  EXPECT_NEAR(static_cast<double>(tails) / kPositions, w_tail / (w_head + w_tail), 0.1);
}

TEST(ChunkedInverseCdfDraw, ARowKeptInOneBinHasNoHead) {
  // Every kept z in one bin (8 z in [4, 5)): the head is empty, and the draw is levels 1-3 over
  // all of K, whatever u0 is; z = -0.49 is never kept at top-p 0.5.
  std::vector<float> x(100);
  for (size_t j = 0; j < x.size(); ++j) x[j] = j % 2 == 0 ? 0.6f : -0.49f;
  for (uint64_t position = 0; position < 50; ++position) {
    RowParams p = Params(1.0f, 152, position);
    p.top_p = 0.5f;
    const int32_t token = SampleOne(x, p).token;
    ASSERT_EQ(x[token], 0.6f) << "position " << position;
    ASSERT_EQ(token, ReferenceDraw(x, p)) << "position " << position;
  }
}

TEST(ChunkedInverseCdfDraw, ATopPRowWithAnotherFilterKeepsTheGumbelDraw) {
  const std::vector<float> x = RandomLogits(300, 141);
  RowParams p = Params(1.0f, 142);
  p.top_p = 0.9f;
  p.top_k = 100;
  for (uint64_t position = 0; position < 20; ++position) {
    p.position = position;
    EXPECT_EQ(SampleOne(x, p).token, ReferenceGumbelDraw(x, p));
  }
}

}  // namespace
}  // namespace samplerd::kernels
