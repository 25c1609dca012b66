// The logits processors of CpuSampleRows (docs/DESIGN.md "Logits processors"): the bitmask
// (one allowed token, none, bits past V), logit bias (finite, +inf, -inf), repetition on
// positive and negative logits, presence / frequency, the row statuses, the interaction with
// greedy, top-k, top-p and min-p, and raw vs processed logprobs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/common/sampling_types.h"
#include "tests/kernels/processors_test_util.h"
#include "tests/kernels/sampler_test_util.h"

namespace samplerd::kernels {
namespace {

using ::samplerd::kernels::testing::Bias;
using ::samplerd::kernels::testing::ExpectedProcessed;
using ::samplerd::kernels::testing::kInf;
using ::samplerd::kernels::testing::kNaN;
using ::samplerd::kernels::testing::MaskAllowing;
using ::samplerd::kernels::testing::Params;
using ::samplerd::kernels::testing::Penalised;
using ::samplerd::kernels::testing::RandomLogits;
using ::samplerd::kernels::testing::ReferenceDraw;
using ::samplerd::kernels::testing::RowResult;
using ::samplerd::kernels::testing::SampleOne;
using ::samplerd::kernels::testing::SampleOneProcessed;
using ::samplerd::kernels::testing::SampleProcessed;

constexpr auto kProcessed = LogprobSource::kProcessed;
constexpr auto kRaw = LogprobSource::kRaw;

// log_softmax of the values above -inf, in long double; -inf stays -inf.
std::vector<double> LogSoftmaxOf(const std::vector<float>& values) {
  long double sum = 0;
  for (float v : values) {
    if (v != -kInf) sum += std::exp(static_cast<long double>(v));
  }
  std::vector<double> out;
  for (float v : values) {
    out.push_back(v == -kInf ? -kInf : static_cast<double>(v - std::log(sum)));
  }
  return out;
}

// The processed logprob of every token of a one-row batch (T = 1, no filters), by token id.
std::vector<double> ProcessedLogprobs(const std::vector<float>& x,
                                      const std::vector<TokenAdjust>& adjusts,
                                      const std::vector<uint32_t>& mask = {}) {
  const int32_t v = static_cast<int32_t>(x.size());
  const RowResult r = SampleOneProcessed(x, Params(1.0f, 5), adjusts, mask, v, kProcessed);
  std::vector<double> by_token(x.size(), 0.0);
  for (int32_t i = 0; i < v; ++i) by_token[r.top_ids[i]] = r.top_values[i];
  return by_token;
}

void ExpectLogprobsNear(const std::vector<double>& got, const std::vector<double>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t t = 0; t < want.size(); ++t) {
    if (std::isinf(want[t])) {
      EXPECT_EQ(got[t], want[t]) << "token " << t;
    } else {
      EXPECT_NEAR(got[t], want[t], 1e-5) << "token " << t;
    }
  }
}

// ---- Bitmask --------------------------------------------------------------------------------

TEST(CpuSamplerProcessors, AMaskWithOneAllowedTokenAlwaysGivesIt) {
  const std::vector<float> x = RandomLogits(100, 1);
  const std::vector<uint32_t> mask = MaskAllowing(100, {77});
  for (uint64_t pos = 0; pos < 20; ++pos) {
    EXPECT_EQ(SampleOneProcessed(x, Params(1.0f, 3, pos), {}, mask).token, 77);
  }
  EXPECT_EQ(SampleOneProcessed(x, Params(0.0f), {}, mask).token, 77);
}

TEST(CpuSamplerProcessors, AMaskThatAllowsNothingIsNoAllowedAndSparesItsNeighbours) {
  const std::vector<float> x = {1.0f, 2.0f, 3.0f};
  testing::BatchProcessors proc;
  proc.masks = {MaskAllowing(3, {0}), MaskAllowing(3, {}), MaskAllowing(3, {2})};
  const std::vector<RowResult> r = SampleProcessed({x, x, x}, {Params(0.0f)}, proc, 2);
  EXPECT_EQ(r[0].token, 0);
  EXPECT_EQ(r[0].status, RowStatus::kOk);
  EXPECT_EQ(r[1].token, -1);
  EXPECT_EQ(r[1].status, RowStatus::kNoAllowed);
  EXPECT_EQ(r[2].token, 2);
  EXPECT_EQ(r[2].status, RowStatus::kOk);
}

TEST(CpuSamplerProcessors, AllowingOnlyMinusInfTokensIsNoAllowed) {
  const std::vector<float> x = {-kInf, 1.0f, -kInf};
  const RowResult r = SampleOneProcessed(x, Params(1.0f, 1), {}, MaskAllowing(3, {0, 2}));
  EXPECT_EQ(r.token, -1);
  EXPECT_EQ(r.status, RowStatus::kNoAllowed);
}

TEST(CpuSamplerProcessors, BitsPastTheVocabularyAreIgnored) {
  const int64_t v = 40;  // two words, the second one 8 bits used
  const std::vector<float> x = RandomLogits(v, 2);
  std::vector<uint32_t> mask = MaskAllowing(v, {33});
  mask[1] |= 0xFFFFFF00u;  // tokens 40..63 do not exist
  for (uint64_t pos = 0; pos < 10; ++pos) {
    EXPECT_EQ(SampleOneProcessed(x, Params(1.0f, 9, pos), {}, mask).token, 33);
  }
  std::vector<uint32_t> only_past = MaskAllowing(v, {});
  only_past[1] = 0xFFFFFF00u;
  const RowResult none = SampleOneProcessed(x, Params(1.0f, 9), {}, only_past);
  EXPECT_EQ(none.status, RowStatus::kNoAllowed);
  EXPECT_EQ(none.token, -1);
}

TEST(CpuSamplerProcessors, BitThirtyOneOfAWordIsAToken) {
  const std::vector<float> x = RandomLogits(64, 3);
  EXPECT_EQ(SampleOneProcessed(x, Params(0.0f), {}, MaskAllowing(64, {31})).token, 31);
  EXPECT_EQ(SampleOneProcessed(x, Params(0.0f), {}, MaskAllowing(64, {63})).token, 63);
}

TEST(CpuSamplerProcessors, ARawNanIsNanEvenOnADisallowedToken) {
  const std::vector<float> x = {1.0f, kNaN, 2.0f};
  const RowResult r = SampleOneProcessed(x, Params(1.0f, 1), {}, MaskAllowing(3, {0}));
  EXPECT_EQ(r.status, RowStatus::kNan);
  EXPECT_EQ(r.token, -1);
}

TEST(CpuSamplerProcessors, ARawRowOfMinusInfIsNoFiniteWhateverTheBias) {
  const std::vector<float> x = {-kInf, -kInf, -kInf};
  const RowResult r = SampleOneProcessed(x, Params(1.0f, 1), {Bias(1, kInf)});
  EXPECT_EQ(r.status, RowStatus::kNoFinite);
  EXPECT_EQ(r.token, -1);
}

TEST(CpuSamplerProcessors, AMaskedPlusInfNoLongerTakesTheMass) {
  const std::vector<float> x = {1.0f, kInf, 2.0f, kInf};
  // Both +inf tokens disallowed: the row is sampled from its finite logits.
  const std::vector<uint32_t> finite_only = MaskAllowing(4, {0, 2});
  EXPECT_EQ(SampleOneProcessed(x, Params(0.0f), {}, finite_only).token, 2);
  bool seen[3] = {false, false, false};
  for (uint64_t pos = 0; pos < 64; ++pos) {
    const int32_t t = SampleOneProcessed(x, Params(1.0f, 7, pos), {}, finite_only).token;
    ASSERT_TRUE(t == 0 || t == 2) << t;
    seen[t] = true;
  }
  EXPECT_TRUE(seen[0] && seen[2]);
  // One +inf token allowed: it takes all the mass.
  EXPECT_EQ(SampleOneProcessed(x, Params(1.0f, 7), {}, MaskAllowing(4, {0, 2, 3})).token, 3);
}

// ---- Logit bias -----------------------------------------------------------------------------

TEST(CpuSamplerProcessors, APlusInfBiasForcesTheToken) {
  const std::vector<float> x = RandomLogits(50, 4);
  for (uint64_t pos = 0; pos < 20; ++pos) {
    EXPECT_EQ(SampleOneProcessed(x, Params(1.0f, 2, pos), {Bias(13, kInf)}).token, 13);
  }
  EXPECT_EQ(SampleOneProcessed(x, Params(0.0f), {Bias(13, kInf)}).token, 13);
  // Two forced tokens: greedy takes the lower id, sampling draws both.
  const std::vector<TokenAdjust> two = {Bias(8, kInf), Bias(40, kInf)};
  EXPECT_EQ(SampleOneProcessed(x, Params(0.0f), two).token, 8);
  bool seen[2] = {false, false};
  for (uint64_t pos = 0; pos < 64; ++pos) {
    const int32_t t = SampleOneProcessed(x, Params(1.0f, 6, pos), two).token;
    ASSERT_TRUE(t == 8 || t == 40) << t;
    seen[t == 40] = true;
  }
  EXPECT_TRUE(seen[0] && seen[1]);
}

TEST(CpuSamplerProcessors, AMinusInfBiasBansTheTokenAndBanningAllIsNoAllowed) {
  const std::vector<float> x = {5.0f, 1.0f, 0.0f};
  EXPECT_EQ(SampleOneProcessed(x, Params(0.0f), {Bias(0, -kInf)}).token, 1);
  for (uint64_t pos = 0; pos < 50; ++pos) {
    EXPECT_NE(SampleOneProcessed(x, Params(1.0f, 1, pos), {Bias(0, -kInf)}).token, 0);
  }
  const RowResult r =
      SampleOneProcessed(x, Params(1.0f, 1), {Bias(0, -kInf), Bias(1, -kInf), Bias(2, -kInf)});
  EXPECT_EQ(r.status, RowStatus::kNoAllowed);
  EXPECT_EQ(r.token, -1);
}

TEST(CpuSamplerProcessors, AFiniteBiasIsAddedToTheLogit) {
  const std::vector<float> x = {1.0f, 2.0f, -3.0f, 0.5f};
  const std::vector<TokenAdjust> adjusts = {Bias(0, 2.5f), Bias(2, -1.0f)};
  ExpectLogprobsNear(ProcessedLogprobs(x, adjusts), LogSoftmaxOf({3.5f, 2.0f, -4.0f, 0.5f}));
  EXPECT_EQ(SampleOneProcessed(x, Params(0.0f), adjusts).token, 0);
}

// ---- Penalties ------------------------------------------------------------------------------

TEST(CpuSamplerProcessors, RepetitionDividesPositiveLogitsAndMultipliesNegativeOnes) {
  const std::vector<float> x = {4.0f, -2.0f, 0.0f, 1.0f};
  const std::vector<TokenAdjust> adjusts = {Penalised(0, 2.0f, 0.0f), Penalised(1, 2.0f, 0.0f),
                                            Penalised(2, 2.0f, 0.0f)};
  ExpectLogprobsNear(ProcessedLogprobs(x, adjusts), LogSoftmaxOf({2.0f, -4.0f, 0.0f, 1.0f}));
  // A repetition below 1 rewards instead.
  ExpectLogprobsNear(ProcessedLogprobs(x, {Penalised(0, 0.5f, 0.0f), Penalised(1, 0.5f, 0.0f)}),
                     LogSoftmaxOf({8.0f, -1.0f, 0.0f, 1.0f}));
}

TEST(CpuSamplerProcessors, PresenceAndFrequencyAreSubtractedAfterRepetition) {
  const std::vector<float> x = {3.0f, -1.0f, 2.0f};
  // The host merges frequency * count + presence * (count > 0) into `penalty`:
  // token 0: r = 1.5, count 2, frequency 0.5, presence 0.25 -> 3 / 1.5 - 1.25 = 0.75;
  // token 1: r = 1.5, count 0 (prompt only) -> -1 * 1.5 = -1.5.
  const std::vector<TokenAdjust> adjusts = {Penalised(0, 1.5f, 0.5f * 2.0f + 0.25f),
                                            Penalised(1, 1.5f, 0.0f)};
  ExpectLogprobsNear(ProcessedLogprobs(x, adjusts), LogSoftmaxOf({0.75f, -1.5f, 2.0f}));
  // A negative penalty (negative presence / frequency) raises the logit.
  ExpectLogprobsNear(ProcessedLogprobs(x, {Penalised(1, 1.0f, -4.0f)}),
                     LogSoftmaxOf({3.0f, 3.0f, 2.0f}));
}

TEST(CpuSamplerProcessors, BiasComesBeforeRepetitionAndTheMaskComesLast) {
  const std::vector<float> x = {-2.0f, 2.0f, 0.0f, 1.0f};
  TokenAdjust a = Penalised(0, 2.0f, 0.5f);
  a.bias = 3.0f;  // (-2 + 3) / 2 - 0.5 = 0; repetition first would give -2 * 2 + 3 - 0.5
  const std::vector<uint32_t> mask = MaskAllowing(4, {0, 2, 3});
  const std::vector<float> want = ExpectedProcessed(x, {a}, mask);
  ASSERT_EQ(want[0], 0.0f);
  ExpectLogprobsNear(ProcessedLogprobs(x, {a}, mask), LogSoftmaxOf(want));
}

// ---- Filters and greedy see the processed logits ---------------------------------------------

TEST(CpuSamplerProcessors, GreedyTakesTheProcessedMaximum) {
  const std::vector<float> x = {5.0f, 4.0f, 3.0f};
  EXPECT_EQ(SampleOneProcessed(x, Params(0.0f), {Penalised(0, 2.0f, 0.0f)}).token, 1);
  EXPECT_EQ(SampleOneProcessed(x, Params(0.0f), {}, MaskAllowing(3, {1, 2})).token, 1);
}

TEST(CpuSamplerProcessors, TopKCountsTheProcessedLogits) {
  const std::vector<float> x = {5.0f, 4.0f, 3.0f, 2.0f, 1.0f};
  RowParams p = Params(1.0f, 8);
  p.top_k = 1;
  for (uint64_t pos = 0; pos < 20; ++pos) {
    p.position = pos;
    EXPECT_EQ(SampleOneProcessed(x, p, {Bias(4, 10.0f)}).token, 4);
    // The mask removes the top two; top-k 1 keeps the best allowed one.
    EXPECT_EQ(SampleOneProcessed(x, p, {}, MaskAllowing(5, {2, 3, 4})).token, 2);
  }
}

TEST(CpuSamplerProcessors, TopPAndMinPMeasureTheProcessedDistribution) {
  const std::vector<float> x = {10.0f, 0.0f, 0.0f, -20.0f};
  RowParams p = Params(1.0f, 4);
  p.top_p = 0.5f;
  RowParams m = Params(1.0f, 4);
  m.min_p = 0.5f;
  // Banning token 0 leaves tokens 1 and 2 tied at the top: both survive either filter, and
  // token 3 (e^-20 of them) survives neither.
  bool seen[3] = {false, false, false};
  for (uint64_t pos = 0; pos < 64; ++pos) {
    p.position = m.position = pos;
    for (const RowParams& params : {p, m}) {
      const int32_t t = SampleOneProcessed(x, params, {Bias(0, -kInf)}).token;
      ASSERT_TRUE(t == 1 || t == 2) << t;
      seen[t] = true;
    }
  }
  EXPECT_TRUE(seen[1] && seen[2]);
}

TEST(CpuSamplerProcessors, ASeededDrawIsTheReferenceDrawOfTheProcessedRow) {
  const std::vector<float> x = RandomLogits(300, 11);
  const std::vector<TokenAdjust> adjusts = {Bias(3, 2.0f), Penalised(12, 1.3f, 0.7f),
                                            Penalised(201, 0.8f, -0.5f), Bias(299, -kInf)};
  std::vector<int32_t> allowed;
  for (int32_t t = 0; t < 300; t += 3) allowed.push_back(t);
  const std::vector<uint32_t> mask = MaskAllowing(300, allowed);
  const std::vector<float> processed = ExpectedProcessed(x, adjusts, mask);
  RowParams p = Params(0.8f, 12);
  p.top_k = 40;
  p.top_p = 0.9f;
  for (uint64_t pos = 0; pos < 50; ++pos) {
    p.position = pos;
    EXPECT_EQ(SampleOneProcessed(x, p, adjusts, mask).token, ReferenceDraw(processed, p));
  }
}

// ---- Logprobs -------------------------------------------------------------------------------

TEST(CpuSamplerProcessors, RawLogprobsIgnoreTheProcessorsAndProcessedOnesFollowThem) {
  const std::vector<float> x = {1.0f, 2.0f, 3.0f, 0.0f};
  const std::vector<TokenAdjust> adjusts = {Bias(0, 4.0f)};
  const std::vector<uint32_t> mask = MaskAllowing(4, {0, 1, 3});
  const std::vector<double> raw = LogSoftmaxOf(x);
  RowParams p = Params(1.0f, 2);
  p.top_k = 2;  // processed: {5, 2, -inf, 0} -> top-2 keeps tokens 0 and 1
  const std::vector<double> processed = LogSoftmaxOf({5.0f, 2.0f, -kInf, -kInf});
  for (uint64_t pos = 0; pos < 30; ++pos) {
    p.position = pos;
    const RowResult r = SampleOneProcessed(x, p, adjusts, mask, 4, kRaw);
    ASSERT_TRUE(r.token == 0 || r.token == 1) << r.token;
    EXPECT_NEAR(r.logprob, raw[r.token], 1e-6);
    EXPECT_EQ(r.top_ids[0], 2);  // the raw top token, though it cannot be drawn
    const RowResult q = SampleOneProcessed(x, p, adjusts, mask, 4, kProcessed);
    EXPECT_EQ(q.token, r.token);
    EXPECT_NEAR(q.logprob, processed[q.token], 1e-6);
    EXPECT_EQ(q.top_ids[0], 0);
  }
}

TEST(CpuSamplerProcessors, ANoAllowedRowGetsTheInvalidRowLogprobs) {
  const std::vector<float> x = {1.0f, 2.0f};
  const RowResult bad = SampleOneProcessed(x, Params(1.0f, 1), {}, MaskAllowing(2, {}), 2, kRaw);
  const RowResult nan = SampleOne({kNaN, 1.0f}, Params(1.0f, 1), 2, kRaw);
  EXPECT_EQ(bad.status, RowStatus::kNoAllowed);
  EXPECT_EQ(bad.rank, nan.rank);
  EXPECT_EQ(bad.top_ids, nan.top_ids);
  EXPECT_TRUE(bad.logprob == nan.logprob || (std::isnan(bad.logprob) && std::isnan(nan.logprob)));
}

TEST(CpuSamplerProcessors, ARowWithoutEntriesIsUntouchedNextToOneWithThem) {
  const std::vector<float> x = RandomLogits(64, 21);
  testing::BatchProcessors proc;
  proc.adjusts = {{}, {Bias(5, kInf)}, {}};
  const std::vector<RowParams> params = {Params(1.0f, 1), Params(1.0f, 2), Params(1.0f, 3)};
  const std::vector<RowResult> r = SampleProcessed({x, x, x}, params, proc);
  EXPECT_EQ(r[0].token, SampleOne(x, params[0]).token);
  EXPECT_EQ(r[1].token, 5);
  EXPECT_EQ(r[2].token, SampleOne(x, params[2]).token);
}

}  // namespace
}  // namespace samplerd::kernels
