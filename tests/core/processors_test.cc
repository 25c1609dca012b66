// The logits processors of a request (service/core/processors.h, through
// ValidateSampleRequest): every malformed bias list, token history, bitmask and penalty is
// INVALID_ARGUMENT with its exact message, and valid ones merge into sorted TokenAdjust rows.
#include "service/core/processors.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "service/core/validation.h"

namespace samplerd::core {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

LogitBiasSpec BiasList(std::vector<uint32_t> offsets, std::vector<int32_t> tokens,
                       std::vector<float> biases) {
  LogitBiasSpec spec;
  spec.row_offsets = std::move(offsets);
  spec.token_ids = std::move(tokens);
  spec.biases = std::move(biases);
  return spec;
}

TokenHistorySpec History(std::vector<uint32_t> offsets, std::vector<int32_t> tokens,
                         std::vector<uint32_t> counts, std::vector<uint8_t> in_prompt) {
  TokenHistorySpec spec;
  spec.row_offsets = std::move(offsets);
  spec.token_ids = std::move(tokens);
  spec.output_counts = std::move(counts);
  spec.in_prompt = std::move(in_prompt);
  return spec;
}

class ProcessorsTest : public ::testing::Test {
 protected:
  // A valid fp32 [batch, vocab] request with inline zero logits.
  SampleRequest Request(int64_t batch, int64_t vocab) {
    bytes_.assign(batch * vocab * 4, '\0');
    SampleRequest r;
    r.dtype = kernels::DType::kFp32;
    r.shape = {batch, vocab};
    r.inline_data = bytes_;
    r.has_inline_data = true;
    return r;
  }
  absl::StatusOr<ValidatedBatch> Validate(const SampleRequest& r) {
    return ValidateSampleRequest(r, limits_, [] { return uint64_t{1}; });
  }
  // Expects INVALID_ARGUMENT with exactly `message`.
  void ExpectRefused(const SampleRequest& r, const std::string& message) {
    absl::StatusOr<ValidatedBatch> got = Validate(r);
    ASSERT_FALSE(got.ok()) << "accepted a request that should fail with: " << message;
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument) << got.status();
    EXPECT_EQ(got.status().message(), message);
  }

  Limits limits_;
  std::string bytes_;
};

// ---- Validation -------------------------------------------------------------------------------

TEST_F(ProcessorsTest, RefusesBiasOffsetsOfTheWrongCountStartOrOrder) {
  SampleRequest r = Request(2, 10);
  r.logit_bias = BiasList({0, 1}, {3}, {1.0f});
  ExpectRefused(r, "logit_bias.row_offsets: expected B + 1 = 3 entries, got 2 entries");
  r.logit_bias = BiasList({1, 1, 1}, {3}, {1.0f});
  ExpectRefused(r, "logit_bias.row_offsets[0]: expected 0, got 1");
  r.logit_bias = BiasList({0, 2, 1}, {3, 4}, {1.0f, 2.0f});
  ExpectRefused(r,
                "logit_bias.row_offsets[2]: expected non-decreasing offsets, >= row_offsets[1] = "
                "2, got 1");
  r.logit_bias = BiasList({0, 1, 3}, {3, 4}, {1.0f, 2.0f});
  ExpectRefused(r,
                "logit_bias.row_offsets[2]: expected the length of logit_bias.token_ids, 2, "
                "got 3");
}

TEST_F(ProcessorsTest, RefusesParallelListsOfDifferentLengths) {
  SampleRequest r = Request(1, 10);
  r.logit_bias = BiasList({0, 2}, {3, 4}, {1.0f});
  ExpectRefused(r, "logit_bias.biases: expected one entry per token id, 2 entries, got 1 entries");
  r.logit_bias.reset();
  r.token_history = History({0, 2}, {3, 4}, {1, 2, 3}, {0, 1});
  ExpectRefused(r,
                "token_history.output_counts: expected one entry per token id, 2 entries, got 3 "
                "entries");
  r.token_history = History({0, 2}, {3, 4}, {1, 2}, {0});
  ExpectRefused(r,
                "token_history.in_prompt: expected one entry per token id, 2 entries, got 1 "
                "entries");
  r.token_history = History({0, 1}, {3, 4}, {1, 2}, {0, 0});
  ExpectRefused(r,
                "token_history.row_offsets[1]: expected the length of token_history.token_ids, "
                "2, got 1");
}

TEST_F(ProcessorsTest, RefusesTokenIdsOutsideTheVocabularyNamingTheRow) {
  SampleRequest r = Request(2, 32000);
  r.logit_bias = BiasList({0, 1, 6}, {1, 2, 3, 4, 5, 40000}, {1, 1, 1, 1, 1, 1});
  ExpectRefused(r, "logit_bias.token_ids[5] (row 1): expected a token id in [0, 32000), got 40000");
  r.logit_bias = BiasList({0, 1, 1}, {-1}, {1});
  ExpectRefused(r, "logit_bias.token_ids[0] (row 0): expected a token id in [0, 32000), got -1");
  r.logit_bias.reset();
  r.token_history = History({0, 0, 1}, {32000}, {1}, {0});
  ExpectRefused(r,
                "token_history.token_ids[0] (row 1): expected a token id in [0, 32000), got "
                "32000");
}

TEST_F(ProcessorsTest, RefusesATokenTwiceWithinARowButNotAcrossRows) {
  SampleRequest r = Request(2, 10);
  r.logit_bias = BiasList({0, 1, 4}, {7, 5, 7, 5}, {1, 1, 1, 1});
  ExpectRefused(r,
                "logit_bias.token_ids[3] (row 1): expected each token at most once within a row "
                "(duplicates are rejected, not summed), got token 5 again (first at "
                "token_ids[1])");
  r.logit_bias = BiasList({0, 1, 2}, {7, 7}, {1, 1});
  EXPECT_TRUE(Validate(r).ok());
  r.logit_bias.reset();
  r.token_history = History({0, 3, 3}, {2, 9, 2}, {1, 1, 1}, {0, 0, 0});
  ExpectRefused(r,
                "token_history.token_ids[2] (row 0): expected each token at most once within a "
                "row (duplicates are rejected, not summed), got token 2 again (first at "
                "token_ids[0])");
}

TEST_F(ProcessorsTest, RefusesNanBiasesButTakesInfiniteOnes) {
  SampleRequest r = Request(1, 10);
  r.logit_bias = BiasList({0, 3}, {1, 2, 3}, {kInf, -kInf, kNaN});
  ExpectRefused(r,
                "logit_bias.biases[2] (row 0): expected a bias that is not NaN (+-inf allowed), "
                "got NaN");
  r.logit_bias = BiasList({0, 2}, {1, 2}, {kInf, -kInf});
  EXPECT_TRUE(Validate(r).ok());
}

TEST_F(ProcessorsTest, RefusesBitmasksWithNoSourceOrTwoOrTheWrongSize) {
  SampleRequest r = Request(2, 40);  // 2 words a row: 16 bytes
  r.token_bitmask.emplace();
  ExpectRefused(r, "token_bitmask: expected inline_words or region, got neither");
  r.token_bitmask->has_inline_words = true;
  r.token_bitmask->region = RegionRef{"masks", 0};
  ExpectRefused(r, "token_bitmask: expected one source (inline_words or region), got both");
  r.token_bitmask->region.reset();
  const std::string words(12, '\xff');
  r.token_bitmask->inline_words = words;
  ExpectRefused(r,
                "token_bitmask.inline_words: expected B * ceil(V / 32) * 4 = 16 bytes for shape "
                "[2, 40], got 12 bytes");
  const std::string right(16, '\xff');
  r.token_bitmask->inline_words = right;
  absl::StatusOr<ValidatedBatch> got = Validate(r);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->bitmask_words, 2);
  EXPECT_TRUE(got->adjusts.empty());
}

TEST_F(ProcessorsTest, RefusesPenaltiesOutOfRange) {
  SampleRequest r = Request(2, 10);
  ParamsSpec p;
  for (float bad : {0.0f, -1.0f, kInf, kNaN}) {
    p.repetition_penalty = bad;
    r.params = {p};
    absl::StatusOr<ValidatedBatch> got = Validate(r);
    ASSERT_FALSE(got.ok()) << bad;
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(got.status().message()),
                ::testing::StartsWith("expected params[0].repetition_penalty finite and > 0 (1 is "
                                      "off), got "));
  }
  p.repetition_penalty = 1e-3f;
  p.presence_penalty = 2.5f;
  r.params = {ParamsSpec{}, p};
  ExpectRefused(r, "expected params[1].presence_penalty in [-2, 2], got 2.5");
  p.presence_penalty = -2.0f;
  p.frequency_penalty = kNaN;
  r.params = {p};
  ExpectRefused(r, "expected params[0].frequency_penalty in [-2, 2], got NaN");
  p.frequency_penalty = 2.0f;
  r.params = {p};
  EXPECT_TRUE(Validate(r).ok());
}

// ---- Merge ------------------------------------------------------------------------------------

TEST_F(ProcessorsTest, MergesBiasAndHistoryPerRowSortedByToken) {
  SampleRequest r = Request(3, 10);
  ParamsSpec row0, row1, row2;
  row0.repetition_penalty = 1.5f;
  row0.presence_penalty = 0.25f;
  row0.frequency_penalty = 0.5f;
  row1.frequency_penalty = 1.0f;
  r.params = {row0, row1, row2};
  // Row 0: biases on 8 and 3, history of 3 (output x2), 5 (prompt only), 1 (nothing seen).
  // Row 1: history of 4 (output x3), no bias. Row 2: nothing.
  r.logit_bias = BiasList({0, 2, 2, 2}, {8, 3}, {-1.0f, 2.0f});
  r.token_history = History({0, 3, 4, 4}, {5, 3, 1, 4}, {0, 2, 0, 3}, {1, 0, 0, 0});
  absl::StatusOr<ValidatedBatch> got = Validate(r);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->adjust_offsets, (std::vector<uint32_t>{0, 3, 4, 4}));
  ASSERT_EQ(got->adjusts.size(), 4u);
  const kernels::TokenAdjust& t3 = got->adjusts[0];
  EXPECT_EQ(t3.token, 3);
  EXPECT_EQ(t3.bias, 2.0f);
  EXPECT_EQ(t3.repetition, 1.5f);
  EXPECT_EQ(t3.penalty, 0.5f * 2.0f + 0.25f);
  const kernels::TokenAdjust& t5 = got->adjusts[1];  // prompt only: repetition, no penalty
  EXPECT_EQ(t5.token, 5);
  EXPECT_EQ(t5.bias, 0.0f);
  EXPECT_EQ(t5.repetition, 1.5f);
  EXPECT_EQ(t5.penalty, 0.0f);
  EXPECT_EQ(got->adjusts[2].token, 8);  // bias only; token 1 (never seen) was a no-op
  EXPECT_EQ(got->adjusts[2].bias, -1.0f);
  EXPECT_EQ(got->adjusts[2].repetition, 1.0f);
  EXPECT_EQ(got->adjusts[3].token, 4);
  EXPECT_EQ(got->adjusts[3].repetition, 1.0f);  // row 1 has no repetition penalty
  EXPECT_EQ(got->adjusts[3].penalty, 3.0f);
  EXPECT_EQ(got->bitmask_words, 0);
}

TEST_F(ProcessorsTest, BroadcastPenaltiesApplyToEveryRow) {
  SampleRequest r = Request(2, 10);
  ParamsSpec p;
  p.presence_penalty = -0.5f;
  r.params = {p};
  r.token_history = History({0, 1, 2}, {6, 6}, {1, 4}, {0, 0});
  absl::StatusOr<ValidatedBatch> got = Validate(r);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->adjust_offsets, (std::vector<uint32_t>{0, 1, 2}));
  ASSERT_EQ(got->adjusts.size(), 2u);
  EXPECT_EQ(got->adjusts[0].penalty, -0.5f);
  EXPECT_EQ(got->adjusts[1].penalty, -0.5f);
}

TEST_F(ProcessorsTest, EntriesThatChangeNothingLeaveBothListsEmpty) {
  SampleRequest r = Request(2, 10);
  r.logit_bias = BiasList({0, 1, 1}, {2}, {0.0f});
  // Seen tokens, but no penalty is on (repetition 1, presence and frequency 0).
  r.token_history = History({0, 1, 2}, {3, 4}, {5, 0}, {0, 1});
  absl::StatusOr<ValidatedBatch> got = Validate(r);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(got->adjust_offsets.empty());
  EXPECT_TRUE(got->adjusts.empty());
}

TEST_F(ProcessorsTest, ThePenaltyIsComputedInFloat32AsWritten) {
  SampleRequest r = Request(1, 10);
  ParamsSpec p;
  p.frequency_penalty = 0.1f;
  p.presence_penalty = 0.3f;
  r.params = {p};
  r.token_history = History({0, 1}, {0}, {7}, {0});
  absl::StatusOr<ValidatedBatch> got = Validate(r);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->adjusts.size(), 1u);
  const float frequency = 0.1f * 7.0f;  // rounded to float before the sum
  EXPECT_EQ(got->adjusts[0].penalty, frequency + 0.3f);
}

}  // namespace
}  // namespace samplerd::core
