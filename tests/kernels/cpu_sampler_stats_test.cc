// Statistical and invariance properties of CpuSampleRows (docs/DESIGN.md "Testing"):
// support never violated, chi-square fit to the exact renormalised distribution, reproducibility
// by seed and position, and batch invariance. Fixed seeds throughout, so results are stable.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <set>
#include <vector>

#include "kernels/common/sampling_types.h"
#include "tests/kernels/chi_square.h"
#include "tests/kernels/processors_test_util.h"
#include "tests/kernels/sampler_test_util.h"

namespace samplerd::kernels {
namespace {

using ::samplerd::kernels::testing::Bias;
using ::samplerd::kernels::testing::ChiSquare;
using ::samplerd::kernels::testing::ChiSquareCritical;
using ::samplerd::kernels::testing::DrawTokens;
using ::samplerd::kernels::testing::ExpectedProcessed;
using ::samplerd::kernels::testing::kInf;
using ::samplerd::kernels::testing::kNaN;
using ::samplerd::kernels::testing::MaskAllowing;
using ::samplerd::kernels::testing::NormalUpperQuantile;
using ::samplerd::kernels::testing::Params;
using ::samplerd::kernels::testing::Pearson;
using ::samplerd::kernels::testing::Penalised;
using ::samplerd::kernels::testing::RandomLogits;
using ::samplerd::kernels::testing::ReferenceDistribution;
using ::samplerd::kernels::testing::ReferenceSupport;
using ::samplerd::kernels::testing::RowResult;
using ::samplerd::kernels::testing::SampleBatch;
using ::samplerd::kernels::testing::SampleProcessed;

constexpr double kAlpha = 1e-6;  // false-alarm rate per chi-square test
constexpr int kDraws = 20000;

// Draws kDraws tokens and compares their histogram with the exact distribution.
void ExpectFitsTheReferenceDistribution(const std::vector<float>& x, const RowParams& p,
                                        int draws = kDraws) {
  const std::vector<double> prob = ReferenceDistribution(x, p);
  std::vector<int64_t> counts(x.size(), 0);
  for (int32_t t : DrawTokens(x, p, draws)) {
    ASSERT_TRUE(t >= 0 && prob[t] > 0.0) << "drew token " << t << " outside the support";
    ++counts[t];
  }
  const ChiSquare chi = Pearson(counts, prob, draws);
  ASSERT_GE(chi.df, 2) << "setting too concentrated to test";
  EXPECT_LT(chi.statistic, ChiSquareCritical(chi.df, kAlpha)) << "df " << chi.df;
}

// Draws kDraws rows of x under these processors and `p` (positions 0, 1, ...) and checks the
// counts against `prob` with Pearson's chi-square.
void ExpectProcessedDrawsFit(const std::vector<float>& x, const std::vector<TokenAdjust>& adjusts,
                             const std::vector<uint32_t>& mask, const RowParams& p,
                             const std::vector<double>& prob) {
  testing::BatchProcessors proc;
  proc.adjusts.assign(kDraws, adjusts);
  proc.masks.assign(kDraws, mask);
  std::vector<RowParams> params(kDraws, p);
  for (int i = 0; i < kDraws; ++i) params[i].position = static_cast<uint64_t>(i);
  std::vector<int64_t> counts(x.size(), 0);
  for (const RowResult& r :
       SampleProcessed(std::vector<std::vector<float>>(kDraws, x), params, proc)) {
    ASSERT_TRUE(r.token >= 0 && prob[r.token] > 0.0)
        << "drew token " << r.token << " outside the support";
    ++counts[r.token];
  }
  const ChiSquare chi = Pearson(counts, prob, kDraws);
  ASSERT_GE(chi.df, 2) << "setting too concentrated to test";
  EXPECT_LT(chi.statistic, ChiSquareCritical(chi.df, kAlpha)) << "df " << chi.df;
}

TEST(CpuSamplerStats, ChiSquareCriticalValuesMatchClosedForms) {
  // df 1 is a squared normal (two tails); df 2 is an exponential with mean 2.
  const double z = NormalUpperQuantile(0.5e-6);
  EXPECT_NEAR(ChiSquareCritical(1, 1e-6), z * z, 1e-6);
  EXPECT_NEAR(ChiSquareCritical(2, 1e-6), -2.0 * std::log(1e-6), 1e-6);
  EXPECT_NEAR(NormalUpperQuantile(1e-6), 4.753424, 1e-6);
  EXPECT_LT(ChiSquareCritical(10, 1e-6), ChiSquareCritical(11, 1e-6));
}

TEST(CpuSamplerStats, PlainSamplingFitsSoftmax) {
  ExpectFitsTheReferenceDistribution(RandomLogits(50, 100, -3.0f, 3.0f), Params(1.0f, 101));
}

TEST(CpuSamplerStats, TemperatureSamplingFitsSoftmaxOfScaledLogits) {
  ExpectFitsTheReferenceDistribution(RandomLogits(50, 102, -3.0f, 3.0f), Params(0.7f, 103));
}

// Plain-temperature rows (temperature alone) are drawn by inverse CDF, the others by Gumbel-max
// (DESIGN.md step 6): the tests above and these cover the first.
TEST(CpuSamplerStats, PlainRowsFitSoftmaxAtLowAndHighTemperature) {
  ExpectFitsTheReferenceDistribution(RandomLogits(200, 120, -2.0f, 2.0f), Params(0.3f, 121));
  ExpectFitsTheReferenceDistribution(RandomLogits(1000, 122, -3.0f, 3.0f), Params(2.5f, 123));
}

TEST(CpuSamplerStats, PlainRowWithTiesAndMinusInfinityFitsSoftmax) {
  std::vector<float> x = RandomLogits(300, 124, -3.0f, 3.0f);
  for (size_t j = 0; j < x.size(); ++j) x[j] = std::round(x[j] * 2.0f) / 2.0f;  // ties
  for (size_t j = 5; j < x.size(); j += 7) x[j] = -kInf;
  ExpectFitsTheReferenceDistribution(x, Params(0.8f, 125));
}

TEST(CpuSamplerStats, TopKSamplingFitsTheRenormalisedTopK) {
  RowParams p = Params(1.0f, 104);
  p.top_k = 10;
  ExpectFitsTheReferenceDistribution(RandomLogits(50, 105, -3.0f, 3.0f), p);
}

TEST(CpuSamplerStats, TopPSamplingFitsTheRenormalisedNucleus) {
  RowParams p = Params(1.0f, 106);
  p.top_p = 0.8f;
  ExpectFitsTheReferenceDistribution(RandomLogits(50, 107, -3.0f, 3.0f), p);
}

// Top-p alone is drawn by the chunked inverse CDF (kernels/common/inverse_cdf.h): a nucleus
// spread over two chunks, with tokens on both sides of chunk and segment edges, ties and a
// lone token in its segment, follows the renormalised softmax.
TEST(CpuSamplerStats, TopPAloneFitsTheNucleusAcrossChunksAndSegments) {
  std::vector<float> x(8448, -kInf);
  const std::vector<float> spread = RandomLogits(64, 121, -2.5f, 2.5f);
  const int edges[] = {0, 1, 31, 32, 33, 63, 64, 4095, 8190, 8191, 8192, 8193, 8223, 8224, 8447};
  int k = 0;
  for (int j : edges) x[j] = spread[k++];
  for (int j = 100; k < 60; j += 181) x[j] = spread[k++];
  x[8000] = x[8300] = x[8191];  // a tie across chunks
  for (float top_p : {0.9f, 0.6f}) {
    RowParams p = Params(0.8f, 122);
    p.top_p = top_p;
    ExpectFitsTheReferenceDistribution(x, p, /*draws=*/6000);  // a long row: fewer draws
  }
}

// Logits processors: draws follow softmax of the processed row (bias, penalties, mask), after
// temperature and the filters, renormalised over the survivors.
TEST(CpuSamplerStats, ProcessedSamplingFitsTheRenormalisedProcessedDistribution) {
  const std::vector<float> x = RandomLogits(60, 110, -3.0f, 3.0f);
  std::vector<TokenAdjust> adjusts = {Bias(2, 1.5f), Penalised(7, 1.4f, 0.6f),
                                      Penalised(12, 0.7f, -0.3f), Bias(20, -kInf), Bias(33, -2.0f)};
  adjusts[1].bias = 0.5f;
  std::vector<int32_t> allowed;
  for (int32_t t = 0; t < 60; ++t) {
    if (t % 4 != 1) allowed.push_back(t);
  }
  const std::vector<uint32_t> mask = MaskAllowing(60, allowed);
  RowParams p = Params(0.9f, 111);
  p.top_k = 30;
  p.min_p = 0.01f;
  const std::vector<double> prob = ReferenceDistribution(ExpectedProcessed(x, adjusts, mask), p);
  ExpectProcessedDrawsFit(x, adjusts, mask, p, prob);
}

TEST(CpuSamplerStats, ProcessedPlainRowFitsSoftmaxOfTheProcessedRow) {
  const std::vector<float> x = RandomLogits(80, 126, -3.0f, 3.0f);
  const std::vector<TokenAdjust> adjusts = {Bias(4, 2.5f), Penalised(9, 1.3f, 0.4f),
                                            Bias(30, -kInf), Bias(61, -1.5f)};
  std::vector<int32_t> allowed;
  for (int32_t t = 0; t < 80; ++t) {
    if (t % 5 != 2) allowed.push_back(t);
  }
  const std::vector<uint32_t> mask = MaskAllowing(80, allowed);
  const RowParams p = Params(1.1f, 127);
  const std::vector<double> prob = ReferenceDistribution(ExpectedProcessed(x, adjusts, mask), p);
  ExpectProcessedDrawsFit(x, adjusts, mask, p, prob);
}

TEST(CpuSamplerStats, MinPSamplingFitsTheRenormalisedSurvivors) {
  RowParams p = Params(1.0f, 108);
  p.min_p = 0.1f;
  ExpectFitsTheReferenceDistribution(RandomLogits(50, 109, -3.0f, 3.0f), p);
}

TEST(CpuSamplerStats, CombinedFiltersFitInBothTopPModes) {
  for (TopPMode mode : {TopPMode::kTopKFirst, TopPMode::kJoint}) {
    RowParams p = Params(0.8f, 110);
    p.top_k = 20;
    p.top_p = 0.9f;
    p.min_p = 0.02f;
    p.top_p_mode = mode;
    ExpectFitsTheReferenceDistribution(RandomLogits(50, 111, -3.0f, 3.0f), p);
  }
}

TEST(CpuSamplerStats, MaskedRowFitsSoftmaxOverTheUnmaskedTokens) {
  std::vector<float> x = RandomLogits(200, 112, -2.0f, 2.0f);
  for (size_t j = 0; j < x.size(); ++j) {
    if (j % 10 != 7) x[j] = -kInf;
  }
  ExpectFitsTheReferenceDistribution(x, Params(1.2f, 113));
}

TEST(CpuSamplerStats, PositiveInfinityRowIsUniformOverItsInfiniteEntries) {
  std::vector<float> x = RandomLogits(40, 114);
  for (size_t j : {3u, 9u, 10u, 31u}) x[j] = kInf;
  ExpectFitsTheReferenceDistribution(x, Params(1.0f, 115));
}

TEST(CpuSamplerStats, DrawsNeverLeaveTheSupport) {
  for (uint32_t trial = 0; trial < 60; ++trial) {
    std::vector<float> x = RandomLogits(64, 200 + trial, -6.0f, 6.0f);
    for (size_t j = trial % 5; j < x.size(); j += 5 + trial % 7) x[j] = -kInf;
    for (size_t j = 1; j < x.size(); j += 9) x[j] = x[j - 1];  // ties
    RowParams p = Params(0.2f + 0.05f * static_cast<float>(trial), 300 + trial);
    p.top_k = static_cast<int32_t>(trial % 9) * 3;
    p.top_p = trial % 4 == 0 ? 1.0f : 0.3f + 0.01f * static_cast<float>(trial);
    p.min_p = trial % 3 == 0 ? 0.0f : 0.01f * static_cast<float>(trial % 10);
    p.top_p_mode = trial % 2 == 0 ? TopPMode::kTopKFirst : TopPMode::kJoint;
    const std::vector<bool> support = ReferenceSupport(x, p);
    const std::vector<double> prob = ReferenceDistribution(x, p);
    for (int32_t t : DrawTokens(x, p, 300)) {
      ASSERT_TRUE(t >= 0 && support[t] && prob[t] > 0.0) << "trial " << trial << " token " << t;
    }
  }
}

TEST(CpuSamplerStats, SameSeedAndPositionGiveTheSameToken) {
  const std::vector<float> x = RandomLogits(100, 400, -1.0f, 1.0f);
  for (uint64_t position = 0; position < 50; ++position) {
    const RowParams p = Params(1.0f, 401, position * 1000003);
    const int32_t first = SampleBatch({x}, {p})[0].token;
    EXPECT_EQ(SampleBatch({x}, {p})[0].token, first);
  }
}

TEST(CpuSamplerStats, DifferentPositionsAndSeedsGiveDifferentTokensOften) {
  const std::vector<float> flat(100, 0.0f);  // uniform: consecutive draws collide 1% of the time
  const std::vector<int32_t> by_position = DrawTokens(flat, Params(1.0f, 402), 1000);
  int repeats = 0;
  for (size_t i = 1; i < by_position.size(); ++i) repeats += by_position[i] == by_position[i - 1];
  EXPECT_LT(repeats, 40);  // Binomial(999, 0.01): mean 10
  EXPECT_GT(std::set<int32_t>(by_position.begin(), by_position.end()).size(), 95u);

  std::vector<RowParams> by_seed(1000, Params(1.0f, 0, 7));
  for (size_t i = 0; i < by_seed.size(); ++i) by_seed[i].seed = 0x9e3779b97f4a7c15ull * (i + 1);
  const std::vector<RowResult> seeded =
      SampleBatch(std::vector<std::vector<float>>(by_seed.size(), flat), by_seed);
  repeats = 0;
  for (size_t i = 1; i < seeded.size(); ++i) repeats += seeded[i].token == seeded[i - 1].token;
  EXPECT_LT(repeats, 40);
}

// Row `r` of a batch of `size` random rows, random parameters and a few invalid rows.
std::vector<RowResult> SampleInsideBatch(const std::vector<float>& target, const RowParams& p,
                                         int size, int index, uint32_t salt) {
  std::vector<std::vector<float>> rows;
  std::vector<RowParams> params;
  for (int r = 0; r < size; ++r) {
    const uint32_t seed = salt * 131 + static_cast<uint32_t>(r);
    rows.push_back(RandomLogits(target.size(), seed, -8.0f, 8.0f));
    if (r % 4 == 1) rows.back()[seed % target.size()] = kNaN;
    RowParams other = Params(r % 3 == 0 ? 0.0f : 0.5f + static_cast<float>(r % 5), seed);
    other.top_k = static_cast<int32_t>(r % 7);
    other.top_p = r % 2 == 0 ? 1.0f : 0.7f;
    params.push_back(other);
  }
  rows[index] = target;
  params[index] = p;
  return SampleBatch(rows, params, 5, LogprobSource::kProcessed);
}

TEST(CpuSamplerStats, BatchInvarianceAcrossBatchSizesAndRowIndices) {
  for (uint32_t trial = 0; trial < 8; ++trial) {
    const std::vector<float> x = RandomLogits(64, 500 + trial, -4.0f, 4.0f);
    RowParams p = Params(0.9f, 501 + trial, trial * 17);
    p.top_k = 30;
    p.top_p = 0.95f;
    p.min_p = 0.01f;
    const RowResult alone = SampleBatch({x}, {p}, 5, LogprobSource::kProcessed)[0];
    for (int size : {2, 7, 16}) {
      for (int index : {0, size / 2, size - 1}) {
        const RowResult r = SampleInsideBatch(x, p, size, index, trial * 1000 + size)[index];
        EXPECT_EQ(r.token, alone.token) << "size " << size << " index " << index;
        EXPECT_EQ(r.status, alone.status);
        EXPECT_EQ(r.logprob, alone.logprob);
        EXPECT_EQ(r.rank, alone.rank);
        EXPECT_EQ(r.top_ids, alone.top_ids);
        EXPECT_EQ(r.top_values, alone.top_values);
      }
    }
  }
}

}  // namespace
}  // namespace samplerd::kernels
