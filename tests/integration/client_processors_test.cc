// The C++ client's logits processors (samplerd/processors.h): the messages it builds, then what
// a bitmask, a logit bias and the penalties do against the real server (CPU backend).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "samplerd/processors.h"
#include "tests/integration/integration_fixture.h"

namespace samplerd::integration {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// Bitmask words [rows.size(), BitmaskWords(vocab)] allowing the token ids of each row.
std::vector<int32_t> AllowOnly(int64_t vocab, const std::vector<std::vector<int32_t>>& rows) {
  const int64_t words = BitmaskWords(vocab);
  std::vector<int32_t> mask(rows.size() * static_cast<size_t>(words), 0);
  for (size_t r = 0; r < rows.size(); ++r) {
    for (const int32_t t : rows[r]) {
      mask[r * static_cast<size_t>(words) + static_cast<size_t>(t / 32)] |=
          static_cast<int32_t>(1u << (t % 32));
    }
  }
  return mask;
}

TEST(ClientProcessors, BitmaskWordsAreCopiedInlineAsLittleEndianBytes) {
  const std::vector<int32_t> words = {1, -1, 0x10, 0};
  v1::SampleRequest request;
  SetTokenBitmask(words.data(), 2, 40, &request);  // V = 40: 2 words a row
  const std::string& data = request.token_bitmask().inline_words();
  ASSERT_EQ(data.size(), 16u);
  EXPECT_EQ(static_cast<uint8_t>(data[0]), 1);
  EXPECT_EQ(static_cast<uint8_t>(data[4]), 0xff);
  EXPECT_EQ(static_cast<uint8_t>(data[8]), 0x10);
  SetTokenBitmaskRegion("masks", 64, &request);
  EXPECT_EQ(request.token_bitmask().region().region(), "masks");
  EXPECT_EQ(request.token_bitmask().region().offset(), 64u);
}

TEST(ClientProcessors, LogitBiasIsPackedPerRowInTokenOrder) {
  v1::SampleRequest request;
  SetLogitBias({{{1, 0.5f}}, {}, {{3, -3.0f}, {2, 2.0f}}}, &request);
  const v1::LogitBias& bias = request.logit_bias();
  EXPECT_EQ(std::vector<uint32_t>(bias.row_offsets().begin(), bias.row_offsets().end()),
            (std::vector<uint32_t>{0, 1, 1, 3}));
  EXPECT_EQ(std::vector<int32_t>(bias.token_ids().begin(), bias.token_ids().end()),
            (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(std::vector<float>(bias.biases().begin(), bias.biases().end()),
            (std::vector<float>{0.5f, 2.0f, -3.0f}));
  SetLogitBias(TokenBias{{7, kInf}}, 3, &request);  // replaces the earlier bias
  EXPECT_EQ(request.logit_bias().row_offsets_size(), 4);
  EXPECT_EQ(request.logit_bias().token_ids_size(), 3);
}

TEST(ClientProcessors, TokenHistoryHoldsDistinctTokensWithOutputCountsAndPromptFlags) {
  v1::SampleRequest request;
  SetTokenHistory({{1, 2}, {}, {5}}, {{2, 2, 3}, {8}}, &request);
  const v1::TokenHistory& h = request.token_history();
  EXPECT_EQ(std::vector<uint32_t>(h.row_offsets().begin(), h.row_offsets().end()),
            (std::vector<uint32_t>{0, 3, 4, 5}));
  EXPECT_EQ(std::vector<int32_t>(h.token_ids().begin(), h.token_ids().end()),
            (std::vector<int32_t>{1, 2, 3, 8, 5}));
  EXPECT_EQ(std::vector<uint32_t>(h.output_counts().begin(), h.output_counts().end()),
            (std::vector<uint32_t>{0, 2, 1, 1, 0}));
  EXPECT_EQ(std::vector<bool>(h.in_prompt().begin(), h.in_prompt().end()),
            (std::vector<bool>{true, true, false, false, true}));
}

using ClientProcessorsOverUds = ServerSuite;

TEST_F(ClientProcessorsOverUds, BitmaskAllowingOneTokenAlwaysGivesThatToken) {
  const Logits logits = RandomLogits(3, 300, 21);
  const std::vector<int32_t> mask = AllowOnly(300, {{7}, {299}, {}});
  for (uint64_t seed = 0; seed < 4; ++seed) {
    v1::SampleRequest request = logits.Request({TopKTopP(seed)});
    SetTokenBitmask(mask.data(), 3, 300, &request);
    v1::SampleResponse response;
    const grpc::Status status = client_->Sample(request, &response);
    ASSERT_TRUE(status.ok()) << status.error_message();
    EXPECT_EQ(Tokens(response), (std::vector<int32_t>{7, 299, -1}));
    EXPECT_EQ(response.row_status(2), v1::ROW_STATUS_INVALID_NO_ALLOWED);
    EXPECT_EQ(response.row_status(0), v1::ROW_STATUS_OK);
  }
}

TEST_F(ClientProcessorsOverUds, InfiniteBiasForcesAndBansTokens) {
  const std::vector<float> values = {0, 3, 1, 0, 3, 1};
  v1::SampleRequest request = MakeFp32Request(values.data(), 2, 3, {Greedy()});
  SetLogitBias({{{0, kInf}}, {{1, -kInf}}}, &request);
  v1::SampleResponse response;
  const grpc::Status status = client_->Sample(request, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(Tokens(response), (std::vector<int32_t>{0, 2}));
}

TEST_F(ClientProcessorsOverUds, PenaltiesMoveTheArgmax) {
  // Repetition 2 on token 0: 2 / 2 = 1 < 1.5 and -1 * 2 = -2 < -1.5; then frequency 0.6 on two
  // outputs of token 0 in row 2: 2 - 1.2 < 1.5.
  const std::vector<float> values = {2, 1.5f, -5, -1, -1.5f, -5, 2, 1.5f, -5};
  v1::SamplingParams repetition = Greedy(), frequency = Greedy();
  repetition.set_repetition_penalty(2.0f);
  frequency.set_frequency_penalty(0.6f);
  v1::SampleRequest request =
      MakeFp32Request(values.data(), 3, 3, {repetition, repetition, frequency});
  SetTokenHistory({{0}, {0}, {}}, {{}, {}, {0, 0}}, &request);
  v1::SampleResponse response;
  const grpc::Status status = client_->Sample(request, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(Tokens(response), (std::vector<int32_t>{1, 1, 1}));
}

}  // namespace
}  // namespace samplerd::integration
