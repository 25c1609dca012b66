// CpuSampleRows logprob outputs: raw and processed distributions, sampled rank, top-N lists.
//
// Expected values come from log-probabilities worked out here in long double (or from the test
// reference distribution), never from the sampler's own helpers.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/common/sampling_types.h"
#include "kernels/cpu/cpu_sampler.h"
#include "tests/kernels/sampler_test_util.h"

namespace samplerd::kernels {
namespace {

using ::samplerd::kernels::testing::kInf;
using ::samplerd::kernels::testing::Params;
using ::samplerd::kernels::testing::RandomLogits;
using ::samplerd::kernels::testing::ReferenceDistribution;
using ::samplerd::kernels::testing::RowResult;
using ::samplerd::kernels::testing::SampleBatch;
using ::samplerd::kernels::testing::SampleOne;

constexpr auto kRaw = LogprobSource::kRaw;
constexpr auto kProcessed = LogprobSource::kProcessed;

// log_softmax(values) in long double, finite values only.
std::vector<double> LogSoftmaxOf(const std::vector<float>& values) {
  long double sum = 0;
  for (float v : values) sum += std::exp(static_cast<long double>(v));
  std::vector<double> out;
  for (float v : values) out.push_back(static_cast<double>(v - std::log(sum)));
  return out;
}

// 1 + number of entries strictly greater than values[token].
int64_t RankOf(const std::vector<double>& values, int32_t token) {
  int64_t rank = 1;
  for (double v : values) rank += v > values[token];
  return rank;
}

// Samples `x` at positions 0..n-1 with logprobs.
std::vector<RowResult> SampleAtPositions(const std::vector<float>& x, const RowParams& p, int n,
                                         int32_t top_n, LogprobSource source) {
  std::vector<RowParams> params(n, p);
  for (int i = 0; i < n; ++i) params[i].position = static_cast<uint64_t>(i);
  return SampleBatch(std::vector<std::vector<float>>(n, x), params, top_n, source);
}

TEST(CpuSamplerLogprobs, RawLogprobsAreLogSoftmaxOfTheRawLogits) {
  const std::vector<float> x = {1.0f, 2.0f, 3.0f, 0.0f};
  const std::vector<double> want = LogSoftmaxOf(x);
  RowParams p = Params(0.5f, 3);  // temperature and filters do not touch raw logprobs
  p.top_k = 2;
  for (const RowResult& r : SampleAtPositions(x, p, 50, 2, kRaw)) {
    ASSERT_TRUE(r.token == 1 || r.token == 2);
    EXPECT_NEAR(r.logprob, want[r.token], 1e-6);
    EXPECT_EQ(r.rank, RankOf(want, r.token));
    EXPECT_EQ(r.top_ids, (std::vector<int32_t>{2, 1}));
    EXPECT_NEAR(r.top_values[0], want[2], 1e-6);
    EXPECT_NEAR(r.top_values[1], want[1], 1e-6);
  }
}

TEST(CpuSamplerLogprobs, ProcessedLogprobsRenormaliseOverTheSurvivors) {
  // T = 0.5 gives z = {2, 4, 6, 0}; top-k 2 leaves tokens 2 and 1 with masses 1 and e^-2.
  const std::vector<float> x = {1.0f, 2.0f, 3.0f, 0.0f};
  RowParams p = Params(0.5f, 4);
  p.top_k = 2;
  const double log_total = std::log1p(std::exp(-2.0));
  const std::vector<double> want = {-kInf, -2.0 - log_total, -log_total, -kInf};
  bool saw_second = false;
  for (const RowResult& r : SampleAtPositions(x, p, 200, 4, kProcessed)) {
    ASSERT_TRUE(r.token == 1 || r.token == 2);
    saw_second = saw_second || r.token == 1;
    EXPECT_NEAR(r.logprob, want[r.token], 1e-6);
    EXPECT_EQ(r.rank, r.token == 2 ? 1 : 2);
    EXPECT_EQ(r.top_ids, (std::vector<int32_t>{2, 1, 0, 3}));
    EXPECT_NEAR(r.top_values[0], want[2], 1e-6);
    EXPECT_NEAR(r.top_values[1], want[1], 1e-6);
    EXPECT_EQ(r.top_values[2], -kInf);
    EXPECT_EQ(r.top_values[3], -kInf);
  }
  EXPECT_TRUE(saw_second);  // probability 0.12 per draw
}

TEST(CpuSamplerLogprobs, ProcessedLogprobsOfGreedyRowsAreAPointMass) {
  const RowResult r = SampleOne({1.0f, 5.0f, 5.0f, 0.0f}, Params(0.0f), 3, kProcessed);
  EXPECT_EQ(r.token, 1);
  EXPECT_EQ(r.logprob, 0.0f);
  EXPECT_EQ(r.rank, 1);
  EXPECT_EQ(r.top_ids, (std::vector<int32_t>{1, 0, 2}));
  EXPECT_EQ(r.top_values, (std::vector<float>{0.0f, -kInf, -kInf}));
}

TEST(CpuSamplerLogprobs, RawLogprobsOfGreedyRowsAreLogSoftmax) {
  const std::vector<float> x = {1.0f, 5.0f, 5.0f, 0.0f};
  const std::vector<double> want = LogSoftmaxOf(x);
  const RowResult r = SampleOne(x, Params(0.0f), 3, kRaw);
  EXPECT_EQ(r.token, 1);
  EXPECT_NEAR(r.logprob, want[1], 1e-6);
  EXPECT_EQ(r.rank, 1);  // token 2 ties with it: not strictly greater
  EXPECT_EQ(r.top_ids, (std::vector<int32_t>{1, 2, 0}));
}

TEST(CpuSamplerLogprobs, SampledRankCountsStrictlyGreaterLogprobs) {
  const std::vector<float> x = {2.0f, 2.0f, 1.0f, 1.0f, 0.0f};
  const int64_t want_rank[] = {1, 1, 3, 3, 5};
  std::vector<bool> seen(5, false);
  for (LogprobSource source : {kRaw, kProcessed}) {
    for (const RowResult& r : SampleAtPositions(x, Params(1.0f, 5), 300, 0, source)) {
      ASSERT_GE(r.token, 0);
      seen[r.token] = true;
      EXPECT_EQ(r.rank, want_rank[r.token]) << "token " << r.token;
    }
  }
  EXPECT_EQ(seen, std::vector<bool>(5, true));
}

TEST(CpuSamplerLogprobs, TopLogprobsBreakTiesByLowestId) {
  const RowResult r = SampleOne({1.0f, 3.0f, 3.0f, 0.0f, 3.0f}, Params(1.0f, 6), 4, kRaw);
  EXPECT_EQ(r.top_ids, (std::vector<int32_t>{1, 2, 4, 0}));
  EXPECT_EQ(r.top_values[0], r.top_values[1]);
  EXPECT_EQ(r.top_values[1], r.top_values[2]);
}

TEST(CpuSamplerLogprobs, TopLogprobsBeyondTheVocabArePadded) {
  const std::vector<float> x = {0.0f, 1.0f, -kInf};
  const std::vector<double> want = LogSoftmaxOf({0.0f, 1.0f});
  const RowResult r = SampleOne(x, Params(1.0f, 7), 5, kRaw);
  EXPECT_EQ(r.top_ids, (std::vector<int32_t>{1, 0, 2, -1, -1}));
  EXPECT_NEAR(r.top_values[0], want[1], 1e-6);
  EXPECT_NEAR(r.top_values[1], want[0], 1e-6);
  for (int i = 2; i < 5; ++i) EXPECT_EQ(r.top_values[i], -kInf);
}

TEST(CpuSamplerLogprobs, VocabOfOneHasLogprobZero) {
  for (LogprobSource source : {kRaw, kProcessed}) {
    const RowResult r = SampleOne({-3.0f}, Params(0.8f, 8), 3, source);
    EXPECT_EQ(r.token, 0);
    EXPECT_EQ(r.logprob, 0.0f);
    EXPECT_EQ(r.rank, 1);
    EXPECT_EQ(r.top_ids, (std::vector<int32_t>{0, -1, -1}));
    EXPECT_EQ(r.top_values, (std::vector<float>{0.0f, -kInf, -kInf}));
  }
}

TEST(CpuSamplerLogprobs, PositiveInfinityRowsSplitTheMassOverTheInfiniteEntries) {
  const float half = static_cast<float>(std::log(0.5));
  for (LogprobSource source : {kRaw, kProcessed}) {
    const RowResult r = SampleOne({kInf, 0.0f, kInf}, Params(1.0f, 9), 3, source);
    EXPECT_TRUE(r.token == 0 || r.token == 2);
    EXPECT_EQ(r.logprob, half);
    EXPECT_EQ(r.rank, 1);
    EXPECT_EQ(r.top_ids, (std::vector<int32_t>{0, 2, 1}));
    EXPECT_EQ(r.top_values, (std::vector<float>{half, half, -kInf}));
  }
}

TEST(CpuSamplerLogprobs, ProcessedLogprobsMatchTheReferenceDistribution) {
  for (uint32_t trial = 0; trial < 12; ++trial) {
    const std::vector<float> x = RandomLogits(23, 60 + trial, -5.0f, 5.0f);
    RowParams p = Params(0.5f + 0.1f * static_cast<float>(trial), 61);
    p.top_k = static_cast<int32_t>(trial % 4) * 5;
    p.top_p = trial % 3 == 1 ? 0.85f : 1.0f;
    p.min_p = trial % 3 == 2 ? 0.05f : 0.0f;
    p.top_p_mode = trial % 2 == 0 ? TopPMode::kTopKFirst : TopPMode::kJoint;
    const std::vector<double> prob = ReferenceDistribution(x, p);
    const RowResult r = SampleOne(x, p, 23, kProcessed);
    ASSERT_GT(prob[r.token], 0.0) << "trial " << trial;
    EXPECT_NEAR(r.logprob, std::log(prob[r.token]), 1e-5);
    for (int i = 0; i < 23; ++i) {
      const int32_t id = r.top_ids[i];
      ASSERT_GE(id, 0);
      if (prob[id] == 0.0) {
        EXPECT_EQ(r.top_values[i], -kInf) << "trial " << trial << " id " << id;
      } else {
        EXPECT_NEAR(r.top_values[i], std::log(prob[id]), 1e-5) << "trial " << trial;
      }
      if (i > 0) {
        EXPECT_GE(r.top_values[i - 1], r.top_values[i]);
      }
    }
  }
}

TEST(CpuSamplerLogprobs, ZeroTopLogprobsReportsOnlyTheSampledToken) {
  const std::vector<float> x = {0.5f, 0.0f};
  std::vector<int32_t> token(1);
  std::vector<RowStatus> status(1);
  float logprob = 99.0f;
  int64_t rank = -1;
  const RowParams p = Params(0.0f);
  SampleArgs args;
  args.logits = x.data();
  args.batch = 1;
  args.vocab = 2;
  args.row_stride = 2;
  args.params = &p;
  args.params_count = 1;
  args.token_ids = token.data();
  args.status = status.data();
  args.top_logprobs = 0;
  args.sampled_logprob = &logprob;
  args.sampled_rank = &rank;  // top_ids and top_values stay null
  CpuSampleRows(args, 0, 1);
  EXPECT_EQ(token[0], 0);
  EXPECT_NEAR(logprob, LogSoftmaxOf(x)[0], 1e-6);
  EXPECT_EQ(rank, 1);
}

TEST(CpuSamplerLogprobs, NegativeTopLogprobsWritesNoLogprobs) {
  const RowResult r = SampleOne({0.0f, 1.0f}, Params(1.0f), -1);
  EXPECT_EQ(r.logprob, 99.0f);  // SampleBatch's fill value
  EXPECT_EQ(r.rank, -99);
}

}  // namespace
}  // namespace samplerd::kernels
