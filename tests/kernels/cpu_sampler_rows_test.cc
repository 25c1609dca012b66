// CpuSampleRows: row handling — invalid rows, -inf masks, +inf rows, vocab sizes, dtypes, row
// stride, parameter broadcast and batch invariance.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/common/sampling_types.h"
#include "kernels/cpu/cpu_sampler.h"
#include "kernels/cpu/half_float.h"
#include "tests/kernels/sampler_test_util.h"

namespace samplerd::kernels {
namespace {

using ::samplerd::kernels::testing::DrawTokens;
using ::samplerd::kernels::testing::kInf;
using ::samplerd::kernels::testing::kNaN;
using ::samplerd::kernels::testing::Params;
using ::samplerd::kernels::testing::RandomLogits;
using ::samplerd::kernels::testing::ReferenceDraw;
using ::samplerd::kernels::testing::ReferenceGumbelDraw;
using ::samplerd::kernels::testing::RowResult;
using ::samplerd::kernels::testing::SampleBatch;
using ::samplerd::kernels::testing::SampleOne;
using ::samplerd::kernels::testing::Seen;

// Tokens and statuses of a raw batch [batch, stride] of `dtype` (only `vocab` columns read).
struct RawResult {
  std::vector<int32_t> tokens;
  std::vector<RowStatus> status;
};

RawResult SampleRaw(const void* logits, DType dtype, int64_t batch, int64_t vocab, int64_t stride,
                    const std::vector<RowParams>& params) {
  RawResult out{std::vector<int32_t>(batch, -2), std::vector<RowStatus>(batch)};
  SampleArgs args;
  args.logits = logits;
  args.dtype = dtype;
  args.batch = batch;
  args.vocab = vocab;
  args.row_stride = stride;
  args.params = params.data();
  args.params_count = static_cast<int64_t>(params.size());
  args.token_ids = out.tokens.data();
  args.status = out.status.data();
  CpuSampleRows(args, 0, batch);
  return out;
}

// Positions 0..n-1 with otherwise equal parameters.
std::vector<RowParams> Positions(const RowParams& p, int n) {
  std::vector<RowParams> params(n, p);
  for (int i = 0; i < n; ++i) params[i].position = static_cast<uint64_t>(i);
  return params;
}

// IEEE binary16 bits of `v`, which must be 0, +-inf or a normal fp16 value with <= 11 bits.
uint16_t HalfBitsExact(float v) {
  if (std::isinf(v)) return v > 0 ? 0x7c00 : 0xfc00;
  if (v == 0.0f) return std::signbit(v) ? 0x8000 : 0x0000;
  int exponent;
  const float mantissa = std::frexp(std::fabs(v), &exponent);  // |v| = mantissa * 2^exponent
  const uint32_t fraction = static_cast<uint32_t>((mantissa * 2.0f - 1.0f) * 1024.0f);
  const uint32_t biased = static_cast<uint32_t>(exponent - 1 + 15);
  return static_cast<uint16_t>((std::signbit(v) ? 0x8000u : 0u) | (biased << 10) | fraction);
}

uint16_t Bf16BitsExact(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof(bits));
  return static_cast<uint16_t>(bits >> 16);
}

TEST(CpuSampler, NanRowIsInvalidAndLeavesNeighboursUntouched) {
  const std::vector<float> a = RandomLogits(16, 1);
  std::vector<float> bad = RandomLogits(16, 2);
  bad[11] = kNaN;
  const std::vector<float> c = RandomLogits(16, 3);
  const std::vector<RowParams> params = {Params(1.0f, 4)};
  const std::vector<RowResult> batch = SampleBatch({a, bad, c}, params, 3);
  EXPECT_EQ(batch[1].status, RowStatus::kNan);
  EXPECT_EQ(batch[1].token, -1);
  EXPECT_EQ(batch[1].logprob, -kInf);
  EXPECT_EQ(batch[1].rank, 0);
  EXPECT_EQ(batch[1].top_ids, (std::vector<int32_t>{-1, -1, -1}));
  EXPECT_EQ(batch[1].top_values, (std::vector<float>{-kInf, -kInf, -kInf}));
  EXPECT_EQ(batch[0].status, RowStatus::kOk);
  EXPECT_EQ(batch[0].token, SampleOne(a, params[0]).token);
  EXPECT_EQ(batch[2].token, SampleOne(c, params[0]).token);
}

TEST(CpuSampler, NanRowIsInvalidEvenWhenGreedyOrMasked) {
  EXPECT_EQ(SampleOne({1.0f, kNaN, 3.0f}, Params(0.0f)).status, RowStatus::kNan);
  EXPECT_EQ(SampleOne({-kInf, kNaN}, Params(1.0f)).status, RowStatus::kNan);
  EXPECT_EQ(SampleOne({kInf, -kNaN}, Params(1.0f)).status, RowStatus::kNan);
}

TEST(CpuSampler, AllNegativeInfinityRowHasNoFiniteLogit) {
  for (float t : {0.0f, 1.0f}) {
    const RowResult r = SampleOne({-kInf, -kInf, -kInf}, Params(t), 2);
    EXPECT_EQ(r.status, RowStatus::kNoFinite);
    EXPECT_EQ(r.token, -1);
    EXPECT_EQ(r.logprob, -kInf);
    EXPECT_EQ(r.rank, 0);
    EXPECT_EQ(r.top_ids, (std::vector<int32_t>{-1, -1}));
  }
}

TEST(CpuSampler, MostlyMaskedRowNeverDrawsAMaskedToken) {
  std::vector<float> x = RandomLogits(200, 5);
  for (size_t j = 0; j < x.size(); ++j) {
    if (j % 10 != 3) x[j] = -kInf;  // 90% masked, like a grammar constraint
  }
  RowParams p = Params(1.0f, 6);
  for (int32_t k : {0, 5}) {
    p.top_k = k;
    const std::vector<int32_t> tokens = DrawTokens(x, p, 500);
    for (int i = 0; i < 500; ++i) {
      ASSERT_EQ(tokens[i] % 10, 3) << "drew masked token " << tokens[i];
      RowParams at = p;
      at.position = static_cast<uint64_t>(i);
      ASSERT_EQ(tokens[i], ReferenceDraw(x, at));
    }
  }
}

TEST(CpuSampler, PositiveInfinityRowIsUniformOverTheInfiniteEntriesAndSkipsFilters) {
  const std::vector<float> x = {1.0f, kInf, 3.0f, kInf, -kInf};
  RowParams p = Params(1.0f, 7);
  p.top_k = 1;
  p.top_p = 0.1f;
  p.min_p = 1.0f;
  const std::vector<int32_t> tokens = DrawTokens(x, p, 400);
  int ones = 0;
  for (int i = 0; i < 400; ++i) {
    RowParams at = p;
    at.position = static_cast<uint64_t>(i);
    ASSERT_EQ(tokens[i], ReferenceDraw(x, at));
    ones += tokens[i] == 1;
  }
  EXPECT_EQ(Seen(tokens, 5), (std::vector<bool>{false, true, false, true, false}));
  EXPECT_NEAR(ones, 200, 50);  // Binomial(400, 1/2): sd 10
}

TEST(CpuSampler, LogitsThatOverflowUnderTemperatureDrawTheMaxLogit) {
  // 3e38 / 0.5 and 2.9e38 / 0.5 both overflow to +inf in fp32, but in exact arithmetic token 0
  // is 2e37 above token 1: the answer is token 0 every time (issue 12, item 3), not 50/50.
  for (int32_t t : DrawTokens({3e38f, 2.9e38f, 0.0f}, Params(0.5f, 8), 200)) EXPECT_EQ(t, 0);
  // The same at a tiny temperature: 1e34 / 2e-5 overflows, and 1e34 - 9e33 = 1e33 decides.
  for (int32_t t : DrawTokens({1e34f, 9e33f}, Params(2e-5f, 3), 200)) EXPECT_EQ(t, 0);
  // At FLT_MAX itself, one ulp (2^104) apart: still decisive at T = 0.5.
  const float top = std::numeric_limits<float>::max();
  const float below = std::nextafter(top, 0.0f);
  for (int32_t t : DrawTokens({below, top, below}, Params(0.5f, 4), 200)) EXPECT_EQ(t, 1);
  // Every filter keeps the max; the token does not change.
  RowParams filtered = Params(0.5f, 8);
  filtered.top_k = 1;
  filtered.top_p = 0.1f;
  filtered.min_p = 0.5f;
  for (int32_t t : DrawTokens({3e38f, 2.9e38f, 0.0f}, filtered, 100)) EXPECT_EQ(t, 0);
}

TEST(CpuSampler, OverflowingLogitsTiedAtTheMaxDrawUniformlyAmongThem) {
  const std::vector<float> x = {3e38f, 1.0f, 3e38f, 2.9e38f};
  const std::vector<int32_t> tokens = DrawTokens(x, Params(0.1f, 8), 400);
  int zeros = 0;
  for (int32_t t : tokens) zeros += t == 0;
  EXPECT_EQ(Seen(tokens, 4), (std::vector<bool>{true, false, true, false}));
  EXPECT_NEAR(zeros, 200, 50);  // Binomial(400, 1/2): sd 10
  // Processed logprobs: log(1/2) on the two, -inf elsewhere; the drawn token ranks first.
  const RowResult r = SampleOne(x, Params(0.1f, 8), 3, LogprobSource::kProcessed);
  EXPECT_EQ(r.status, RowStatus::kOk);
  EXPECT_EQ(r.logprob, static_cast<float>(-std::log(2.0)));
  EXPECT_EQ(r.rank, 1);
  EXPECT_EQ(r.top_ids, (std::vector<int32_t>{0, 2, 1}));
  EXPECT_EQ(r.top_values[2], -kInf);
}

TEST(CpuSampler, LogitsThatAllUnderflowToMinusInfinityDrawTheMaxLogit) {
  // -3e38 / 0.5 and -2e38 / 0.5 are both -inf in fp32, though the row has finite logits; in
  // exact arithmetic token 1 is 2e38 above token 0, so it is drawn every time.
  const std::vector<float> x = {-3e38f, -2e38f, -kInf};
  for (int32_t t : DrawTokens(x, Params(0.5f, 8), 50)) EXPECT_EQ(t, 1);
  const RowResult r = SampleOne(x, Params(0.5f, 8), 2, LogprobSource::kProcessed);
  EXPECT_EQ(r.status, RowStatus::kOk);
  EXPECT_EQ(r.logprob, 0.0f);
  EXPECT_EQ(r.top_ids, (std::vector<int32_t>{1, 0}));
  // Tied at the max: uniform among them (the lowest index every time before issue 12, item 3).
  EXPECT_EQ(Seen(DrawTokens({-3e38f, -3.2e38f, -3e38f}, Params(0.5f, 2), 200), 3),
            (std::vector<bool>{true, false, true}));
}

TEST(CpuSampler, VocabOfOneAlwaysReturnsTokenZero) {
  RowParams filtered = Params(0.7f, 9);
  filtered.top_k = 1;
  filtered.top_p = 1e-6f;
  filtered.min_p = 1.0f;
  for (const RowParams& p : {Params(0.0f), Params(1.0f, 9), filtered}) {
    for (int32_t t : DrawTokens({-5.0f}, p, 20)) EXPECT_EQ(t, 0);
  }
}

TEST(CpuSampler, VocabOf111MatchesTheReferenceIncludingTheTail) {
  std::vector<float> x = RandomLogits(111, 10);
  RowParams p = Params(0.9f, 11);
  p.top_k = 40;
  p.top_p = 0.9f;
  const std::vector<int32_t> tokens = DrawTokens(x, p, 300);
  for (int i = 0; i < 300; ++i) ASSERT_EQ(tokens[i], ReferenceDraw(x, Positions(p, 300)[i]));
  x[110] = 100.0f;  // the last token, past every multiple of 4, 8 or 16
  EXPECT_EQ(SampleOne(x, Params(0.0f)).token, 110);
  EXPECT_EQ(SampleOne(x, Params(1.0f, 12)).token, 110);
}

TEST(CpuSampler, Fp32Bf16AndFp16AgreeOnExactlyRepresentableLogits) {
  // Multiples of 1/4 in [-10, 10] fit fp16's 11 and bf16's 8 significant bits exactly.
  std::vector<float> x = RandomLogits(64, 13, -10.0f, 10.0f);
  for (float& v : x) v = std::round(v * 4.0f) / 4.0f;
  x[5] = -kInf;
  // The same row 100 times, at positions 0..99.
  std::vector<float> fp32_rows;
  std::vector<uint16_t> fp16_rows, bf16_rows;
  for (int r = 0; r < 100; ++r) {
    for (float v : x) {
      fp32_rows.push_back(v);
      fp16_rows.push_back(HalfBitsExact(v));
      bf16_rows.push_back(Bf16BitsExact(v));
      ASSERT_EQ(HalfBitsToFloat(fp16_rows.back()), v);
      ASSERT_EQ(Bf16BitsToFloat(bf16_rows.back()), v);
    }
  }
  RowParams p = Params(0.8f, 14);
  p.top_k = 20;
  const std::vector<RowParams> params = Positions(p, 100);
  const RawResult fp32 = SampleRaw(fp32_rows.data(), DType::kFp32, 100, 64, 64, params);
  const RawResult fp16 = SampleRaw(fp16_rows.data(), DType::kFp16, 100, 64, 64, params);
  const RawResult bf = SampleRaw(bf16_rows.data(), DType::kBf16, 100, 64, 64, params);
  EXPECT_EQ(fp16.tokens, fp32.tokens);
  EXPECT_EQ(bf.tokens, fp32.tokens);
  for (int i = 0; i < 100; ++i) ASSERT_EQ(fp32.tokens[i], ReferenceDraw(x, params[i]));
}

TEST(CpuSampler, HalfPrecisionRowsReadSubnormalsInfinitiesAndNaN) {
  const std::vector<RowParams> greedy = {Params(0.0f)};
  const uint16_t subnormals[] = {0x0001, 0x0003, 0x0002, 0xfc00};
  EXPECT_EQ(SampleRaw(subnormals, DType::kFp16, 1, 4, 4, greedy).tokens[0], 1);
  const uint16_t with_inf[] = {0x7bff, 0x3c00, 0x7c00, 0x0000};
  EXPECT_EQ(SampleRaw(with_inf, DType::kFp16, 1, 4, 4, greedy).tokens[0], 2);
  const uint16_t masked[] = {0xfc00, 0xfc00};
  EXPECT_EQ(SampleRaw(masked, DType::kFp16, 1, 2, 2, greedy).status[0], RowStatus::kNoFinite);
  const uint16_t bf16_nan[] = {0x3f80, 0x7fc1, 0x4000};
  const RawResult nan = SampleRaw(bf16_nan, DType::kBf16, 1, 3, 3, greedy);
  EXPECT_EQ(nan.status[0], RowStatus::kNan);
  EXPECT_EQ(nan.tokens[0], -1);
  const uint16_t bf16_subnormals[] = {0x0001, 0x8001, 0x0002};
  EXPECT_EQ(SampleRaw(bf16_subnormals, DType::kBf16, 1, 3, 3, greedy).tokens[0], 2);
}

TEST(CpuSampler, RowStrideSkipsThePaddingBetweenRows) {
  const int64_t vocab = 5, stride = 8, batch = 3;
  std::vector<float> padded(batch * stride, kNaN);
  std::vector<std::vector<float>> rows;
  for (int64_t r = 0; r < batch; ++r) {
    rows.push_back(RandomLogits(vocab, 20 + static_cast<uint32_t>(r)));
    for (int64_t j = 0; j < vocab; ++j) padded[r * stride + j] = rows[r][j];
    padded[r * stride + vocab] = kInf;  // would win every draw if it were read
  }
  const std::vector<RowParams> params = Positions(Params(1.0f, 21), batch);
  const RawResult strided = SampleRaw(padded.data(), DType::kFp32, batch, vocab, stride, params);
  const std::vector<RowResult> dense = SampleBatch(rows, params);
  for (int64_t r = 0; r < batch; ++r) {
    EXPECT_EQ(strided.status[r], RowStatus::kOk);
    EXPECT_EQ(strided.tokens[r], dense[r].token);
  }
}

TEST(CpuSampler, BroadcastParamsEqualPerRowCopies) {
  std::vector<std::vector<float>> rows;
  for (uint32_t r = 0; r < 6; ++r) rows.push_back(RandomLogits(30, 30 + r));
  RowParams p = Params(0.9f, 31, 5);
  p.top_p = 0.8f;
  const std::vector<RowResult> broadcast = SampleBatch(rows, {p});
  const std::vector<RowResult> copies = SampleBatch(rows, std::vector<RowParams>(6, p));
  for (size_t r = 0; r < rows.size(); ++r) {
    EXPECT_EQ(broadcast[r].token, copies[r].token);
    EXPECT_EQ(broadcast[r].token, ReferenceDraw(rows[r], p));
  }
}

TEST(CpuSampler, PerRowParamsApplyToTheirOwnRow) {
  const std::vector<float> x = {0.0f, 1.0f, 2.0f, 3.0f};
  RowParams top1 = Params(1.0f, 40);
  top1.top_k = 1;
  RowParams uniform_ish = Params(1000.0f, 41);
  const std::vector<RowParams> params = {Params(0.0f), top1, uniform_ish};
  const std::vector<RowResult> out = SampleBatch({x, {3.0f, 2.0f, 1.0f, 0.0f}, x}, params);
  EXPECT_EQ(out[0].token, 3);
  EXPECT_EQ(out[1].token, 0);
  EXPECT_EQ(out[2].token, ReferenceDraw(x, uniform_ish));
}

TEST(CpuSampler, OutOfContractParametersNeverCrashOrEmptyARow) {
  // Validation rejects these before they get here; the sampler must still stay well defined.
  const std::vector<float> x = {0.0f, 2.0f, 1.0f};
  RowParams zero_p = Params(1.0f, 60);
  zero_p.top_p = 0.0f;
  RowParams negative_k = Params(1.0f, 61);
  negative_k.top_k = -5;
  for (const RowParams& p : {zero_p, negative_k}) {
    EXPECT_EQ(SampleOne(x, p).status, RowStatus::kOk);
  }
  // Both filters are off. k = -5 leaves a plain-temperature row (the inverse-CDF draw); p = 0
  // is not plain (IsPlainTemperature), so its row keeps the Gumbel-max draw over every token.
  EXPECT_EQ(SampleOne(x, negative_k).token, ReferenceDraw(x, Params(1.0f, negative_k.seed)));
  EXPECT_EQ(SampleOne(x, zero_p).token, ReferenceGumbelDraw(x, Params(1.0f, zero_p.seed)));
  EXPECT_EQ(SampleOne(x, Params(-1.0f)).token, 1);  // negative temperature: greedy
  const RowResult nan_t = SampleOne(x, Params(kNaN), 1);
  EXPECT_EQ(nan_t.status, RowStatus::kNan);
  EXPECT_EQ(nan_t.token, -1);
  EXPECT_EQ(nan_t.rank, 0);
}

TEST(CpuSampler, DisjointRowRangesWriteOnlyTheirRows) {
  std::vector<float> logits = RandomLogits(4 * 10, 50);
  const std::vector<RowParams> params = {Params(1.0f, 51)};
  std::vector<int32_t> whole(4, -7), split(4, -7);
  std::vector<RowStatus> status(4);
  SampleArgs args;
  args.logits = logits.data();
  args.batch = 4;
  args.vocab = 10;
  args.row_stride = 10;
  args.params = params.data();
  args.params_count = 1;
  args.status = status.data();
  args.token_ids = whole.data();
  CpuSampleRows(args, 0, 4);
  args.token_ids = split.data();
  CpuSampleRows(args, 1, 3);
  EXPECT_EQ(split[0], -7);
  EXPECT_EQ(split[3], -7);
  CpuSampleRows(args, 3, 4);
  CpuSampleRows(args, 0, 1);
  EXPECT_EQ(split, whole);
}

}  // namespace
}  // namespace samplerd::kernels
