// CpuSampleRows: greedy, temperature, min-p, top-k and top-p rules of docs/DESIGN.md.
//
// Each rule test states the allowed set worked out by hand from the spec, checks that the test
// reference (sampler_test_util.h) agrees, then draws at many positions: every token must be the
// reference Gumbel-max draw, and the tokens seen must be exactly the allowed set.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/common/sampling_types.h"
#include "tests/kernels/sampler_test_util.h"

namespace samplerd::kernels {
namespace {

using ::samplerd::kernels::testing::DrawTokens;
using ::samplerd::kernels::testing::kInf;
using ::samplerd::kernels::testing::Params;
using ::samplerd::kernels::testing::RandomLogits;
using ::samplerd::kernels::testing::ReferenceDraw;
using ::samplerd::kernels::testing::ReferenceSupport;
using ::samplerd::kernels::testing::Seen;

// Draws `draws` positions of `x` under `p` and checks them against the hand-derived `allowed`.
void ExpectDrawsCover(const std::vector<float>& x, const RowParams& p,
                      const std::vector<int>& allowed, int draws = 400) {
  std::vector<bool> want(x.size(), false);
  for (int j : allowed) want[j] = true;
  ASSERT_EQ(ReferenceSupport(x, p), want) << "the test reference disagrees with the hand set";
  const std::vector<int32_t> tokens = DrawTokens(x, p, draws);
  for (int i = 0; i < draws; ++i) {
    RowParams at = p;
    at.position = static_cast<uint64_t>(i);
    ASSERT_EQ(tokens[i], ReferenceDraw(x, at)) << "position " << i;
  }
  EXPECT_EQ(Seen(tokens, x.size()), want);
}

// logf of each probability: logits whose softmax is (proportional to) `probs`.
std::vector<float> LogitsOf(const std::vector<double>& probs) {
  std::vector<float> x;
  for (double q : probs) x.push_back(static_cast<float>(std::log(q)));
  return x;
}

TEST(CpuSampler, GreedyPicksTheLowestIndexAmongTiedMaxima) {
  const std::vector<float> x = {1.0f, 3.0f, 0.5f, 3.0f, 2.0f};
  for (uint64_t position = 0; position < 32; ++position) {
    EXPECT_EQ(DrawTokens(x, Params(0.0f, position * 7919), 1)[0], 1);
  }
}

TEST(CpuSampler, GreedyCountsPositiveInfinityAsTheMaximum) {
  EXPECT_EQ(DrawTokens({1.0f, kInf, 5.0f, kInf}, Params(0.0f), 1)[0], 1);
  EXPECT_EQ(DrawTokens({-kInf, -kInf, -3.0f, -kInf}, Params(0.0f), 1)[0], 2);
  EXPECT_EQ(DrawTokens({-kInf, 3e38f, -3e38f}, Params(0.0f), 1)[0], 1);
}

TEST(CpuSampler, GreedyIgnoresFiltersSeedAndPosition) {
  RowParams p = Params(0.0f, 12345);
  p.top_k = 1;
  p.top_p = 0.01f;
  p.min_p = 1.0f;
  const std::vector<int32_t> tokens = DrawTokens({0.0f, -1.0f, 4.0f, 4.0f, 1.0f}, p, 64);
  for (int32_t t : tokens) EXPECT_EQ(t, 2);
}

TEST(CpuSampler, TemperatureJustBelowTheThresholdIsGreedy) {
  // Tied maxima tell the modes apart: greedy always takes index 0, sampling takes either.
  const std::vector<float> x = {1.0f, 1.0f, 0.0f};
  const float below = std::nextafter(kGreedyTemperature, 0.0f);
  for (int32_t t : DrawTokens(x, Params(below, 3), 200)) EXPECT_EQ(t, 0);
}

TEST(CpuSampler, TemperatureAtOrJustAboveTheThresholdSamples) {
  // Token 2 sits 1e5 below the tied pair after scaling: allowed in principle, never drawn.
  const std::vector<float> x = {1.0f, 1.0f, 0.0f};
  for (float t : {kGreedyTemperature, std::nextafter(kGreedyTemperature, 1.0f)}) {
    const std::vector<int32_t> tokens = DrawTokens(x, Params(t, 3), 200);
    for (int i = 0; i < 200; ++i) ASSERT_EQ(tokens[i], ReferenceDraw(x, Params(t, 3, i)));
    EXPECT_EQ(Seen(tokens, 3), (std::vector<bool>{true, true, false})) << "T " << t;
  }
}

TEST(CpuSampler, TemperatureScalesLogitsBeforeTheDraw) {
  const std::vector<float> x = RandomLogits(20, 7);
  for (float t : {0.25f, 0.5f, 1.0f, 2.0f, 8.0f}) {
    const std::vector<int32_t> tokens = DrawTokens(x, Params(t, 99), 200);
    for (int i = 0; i < 200; ++i) {
      ASSERT_EQ(tokens[i], ReferenceDraw(x, Params(t, 99, i))) << "T " << t << " position " << i;
    }
  }
}

TEST(CpuSampler, TopKOneKeepsOnlyTheMaximumAndItsTies) {
  RowParams p = Params(1.0f, 5);
  p.top_k = 1;
  ExpectDrawsCover({2.0f, 5.0f, 5.0f, 1.0f}, p, {1, 2});
  ExpectDrawsCover({2.0f, 5.0f, 4.0f, 1.0f}, p, {1});
}

TEST(CpuSampler, TopKKeepsTiesWithKthValue) {
  RowParams p = Params(1.0f, 6);
  p.top_k = 2;
  ExpectDrawsCover({5.0f, 4.0f, 4.0f, 4.0f, 1.0f, 0.0f}, p, {0, 1, 2, 3});
}

TEST(CpuSampler, TopKCountsDuplicatesTowardK) {
  // The 3rd largest counting duplicates is 2 (not the 3rd distinct value, 1).
  RowParams p = Params(1.0f, 8);
  p.top_k = 3;
  ExpectDrawsCover({3.0f, 3.0f, 2.0f, 1.0f}, p, {0, 1, 2});
}

TEST(CpuSampler, TopKAtOrAboveVocabOrNonPositiveDisablesTheFilter) {
  const std::vector<float> x = {0.0f, 0.5f, -0.5f, 0.25f, 0.0f};
  for (int32_t k : {0, -1, 5, 6, 1 << 30}) {
    RowParams p = Params(1.0f, 9);
    p.top_k = k;
    ExpectDrawsCover(x, p, {0, 1, 2, 3, 4});
  }
}

TEST(CpuSampler, TopPNearZeroKeepsOnlyTheTopTokenAndItsTies) {
  RowParams p = Params(1.0f, 10);
  p.top_p = 1e-6f;
  ExpectDrawsCover({1.0f, 3.0f, 3.0f, 2.9f}, p, {1, 2});
  ExpectDrawsCover({1.0f, 3.0f, 2.99f, 2.9f}, p, {1});
}

TEST(CpuSampler, TopPOneDisablesTheFilter) {
  RowParams p = Params(1.0f, 11);
  p.top_p = 1.0f;
  ExpectDrawsCover({0.0f, 0.0f, -1.0f, -2.0f}, p, {0, 1, 2, 3});
}

TEST(CpuSampler, TopPKeepsTheBoundaryToken) {
  const std::vector<float> x = LogitsOf({0.5, 0.3, 0.15, 0.05});
  RowParams p = Params(1.0f, 12);
  p.top_p = 0.6f;  // mass above token 1 is 0.5 < 0.6: kept; above token 2 is 0.8: dropped
  ExpectDrawsCover(x, p, {0, 1});
  p.top_p = 0.81f;  // mass above token 2 is 0.8 < 0.81: kept; above token 3 is 0.95: dropped
  ExpectDrawsCover(x, p, {0, 1, 2}, 1000);
}

TEST(CpuSampler, TopPDropsATokenWhoseMassAboveEqualsPExactly) {
  // exp(-1e-20) is 1.0 in double, so the masses are exactly {1, 1}: token 1 has mass 1 above it
  // and p * total = 0.5 * 2 = 1, which is not < 1. The two logits differ, so they are not tied.
  RowParams p = Params(1.0f, 18);
  p.top_p = 0.5f;
  ExpectDrawsCover({0.0f, -1e-20f}, p, {0});
  p.top_p = std::nextafter(0.5f, 1.0f);
  ExpectDrawsCover({0.0f, -1e-20f}, p, {0, 1});
}

TEST(CpuSampler, TopPKeepsTokensTiedWithAKeptToken) {
  // Tokens 1-3 all have mass 0.4 strictly above them: a cumulative cut would drop 2 and 3.
  RowParams p = Params(1.0f, 13);
  p.top_p = 0.5f;
  ExpectDrawsCover(LogitsOf({0.4, 0.2, 0.2, 0.2}), p, {0, 1, 2, 3});
}

TEST(CpuSampler, TopPRenormalisesOverTopKSurvivorsByDefault) {
  // top-k 2 leaves e = {1, e^-1}; renormalised, token 1 has mass 0.73 above it >= 0.6.
  RowParams p = Params(1.0f, 14);
  p.top_k = 2;
  p.top_p = 0.6f;
  ExpectDrawsCover({3.0f, 2.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f}, p, {0});
}

TEST(CpuSampler, JointTopPComparesAgainstTheFullRowMass) {
  // Same row as above: the full row's mass is 1 + e^-1 + 6e^-2 = 2.18, so token 1 has
  // 1 / 2.18 = 0.46 < 0.6 above it and stays.
  RowParams p = Params(1.0f, 14);
  p.top_k = 2;
  p.top_p = 0.6f;
  p.top_p_mode = TopPMode::kJoint;
  ExpectDrawsCover({3.0f, 2.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f}, p, {0, 1});
}

TEST(CpuSampler, MinPKeepsTokensWithinAFactorOfTheMaximum) {
  // Probabilities relative to the max: 1, 0.61, 0.37, 0.14.
  const std::vector<float> x = {0.0f, -0.5f, -1.0f, -2.0f};
  RowParams p = Params(1.0f, 15);
  p.min_p = 0.5f;
  ExpectDrawsCover(x, p, {0, 1});
  p.min_p = 0.3f;
  ExpectDrawsCover(x, p, {0, 1, 2});
  p.min_p = 0.0f;
  ExpectDrawsCover(x, p, {0, 1, 2, 3});
}

TEST(CpuSampler, MinPAppliesToTemperatureScaledLogits) {
  // At T = 0.5 the relative probabilities become 1, 0.37, 0.14, 0.02.
  RowParams p = Params(0.5f, 16);
  p.min_p = 0.3f;
  ExpectDrawsCover({0.0f, -0.5f, -1.0f, -2.0f}, p, {0, 1});
}

TEST(CpuSampler, MinPOneKeepsOnlyTheMaximumAndItsTies) {
  RowParams p = Params(1.0f, 17);
  p.min_p = 1.0f;
  ExpectDrawsCover({1.0f, 2.0f, 2.0f, 1.999f}, p, {1, 2});
}

TEST(CpuSampler, CombinedFiltersMatchTheReferenceOnRandomRows) {
  for (uint32_t trial = 0; trial < 40; ++trial) {
    const std::vector<float> x = RandomLogits(37 + trial, 1000 + trial, -6.0f, 6.0f);
    RowParams p = Params(0.3f + 0.05f * static_cast<float>(trial), 77 + trial);
    p.top_k = static_cast<int32_t>(trial % 12);
    p.top_p = trial % 3 == 0 ? 1.0f : 0.5f + 0.012f * static_cast<float>(trial);
    p.min_p = trial % 4 == 0 ? 0.0f : 0.002f * static_cast<float>(trial);
    p.top_p_mode = trial % 2 == 0 ? TopPMode::kTopKFirst : TopPMode::kJoint;
    const std::vector<int32_t> tokens = DrawTokens(x, p, 50);
    for (int i = 0; i < 50; ++i) {
      RowParams at = p;
      at.position = static_cast<uint64_t>(i);
      ASSERT_EQ(tokens[i], ReferenceDraw(x, at)) << "trial " << trial << " position " << i;
    }
  }
}

}  // namespace
}  // namespace samplerd::kernels
