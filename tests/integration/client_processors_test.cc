// The C++ client's logits processors (samplerd/processors.h): the messages it builds, then what
// a bitmask, a logit bias and the penalties do against the real server (CPU backend).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "samplerd/host_shm_buffer.h"
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
  ASSERT_TRUE(SetLogitBias({{{1, 0.5f}}, {}, {{3, -3.0f}, {2, 2.0f}}}, &request).ok());
  const v1::LogitBias& bias = request.logit_bias();
  EXPECT_EQ(std::vector<uint32_t>(bias.row_offsets().begin(), bias.row_offsets().end()),
            (std::vector<uint32_t>{0, 1, 1, 3}));
  EXPECT_EQ(std::vector<int32_t>(bias.token_ids().begin(), bias.token_ids().end()),
            (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(std::vector<float>(bias.biases().begin(), bias.biases().end()),
            (std::vector<float>{0.5f, 2.0f, -3.0f}));
  ASSERT_TRUE(SetLogitBias(TokenBias{{7, kInf}}, 3, &request).ok());  // replaces the earlier bias
  EXPECT_EQ(request.logit_bias().row_offsets_size(), 4);
  EXPECT_EQ(request.logit_bias().token_ids_size(), 3);
}

TEST(ClientProcessors, TokenHistoryHoldsDistinctTokensWithOutputCountsAndPromptFlags) {
  v1::SampleRequest request;
  ASSERT_TRUE(SetTokenHistory({{1, 2}, {}, {5}}, {{2, 2, 3}, {8}, {}}, &request).ok());
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

// Little-endian bytes of 4-byte words, then single bytes: processors.proto's region layouts
// spelled out by hand.
std::vector<uint8_t> Le(const std::vector<uint32_t>& words, const std::vector<uint8_t>& tail = {}) {
  std::vector<uint8_t> out;
  for (const uint32_t w : words) {
    for (int shift = 0; shift < 32; shift += 8) out.push_back(static_cast<uint8_t>(w >> shift));
  }
  out.insert(out.end(), tail.begin(), tail.end());
  return out;
}

TEST(ClientProcessors, PackLogitBiasLaysOutOffsetsIdsAndBiases) {
  const std::vector<uint8_t> got =
      PackLogitBias({{{1, 0.5f}}, {}, {{300, -3.0f}, {2, 2.0f}, {7, -kInf}}, {}});
  // clang-format off
  const std::vector<uint8_t> want = {
      0, 0, 0, 0,  1, 0, 0, 0,  1, 0, 0, 0,  4, 0, 0, 0,  4, 0, 0, 0,  // row_offsets 0 1 1 4 4
      1, 0, 0, 0,  2, 0, 0, 0,  7, 0, 0, 0,  0x2c, 1, 0, 0,            // token_ids 1 2 7 300
      0, 0, 0, 0x3f,  0, 0, 0, 0x40,  0, 0, 0x80, 0xff,  0, 0, 0x40, 0xc0,  // 0.5 2 -inf -3
  };
  // clang-format on
  EXPECT_EQ(got, want);
  EXPECT_EQ(PackLogitBias({}), Le({0}));
  EXPECT_EQ(PackLogitBias({{}, {}}), Le({0, 0, 0}));
}

TEST(ClientProcessors, PackTokenHistoryLaysOutDistinctTokensCountsAndPromptFlags) {
  // Row 0: 2 twice in the prompt and twice in the output; row 1 empty; row 2 prompt only.
  std::vector<uint8_t> got;
  ASSERT_TRUE(PackTokenHistory({{2, 1, 2}, {}, {5, 5}}, {{2, 3, 2}, {}, {}}, &got).ok());
  EXPECT_EQ(got.size(), (4u + 2 * 4) * 4 + 4);
  EXPECT_EQ(got, Le({0, 3, 3, 4,     // row_offsets
                     1, 2, 3, 5,     // token_ids
                     0, 2, 1, 0},    // output_counts
                    {1, 1, 0, 1}));  // in_prompt
  ASSERT_TRUE(PackTokenHistory({}, {{9, 9, 9}}, &got).ok());
  EXPECT_EQ(got, Le({0, 1, 9, 3}, {0}));
  ASSERT_TRUE(PackTokenHistory({}, {}, &got).ok());
  EXPECT_EQ(got, Le({0}));
}

TEST(ClientProcessors, PackedListsAreTheInlineListsOfTheSameInputs) {
  const std::vector<TokenBias> rows = {{{4, 1.0f}, {3, -1.0f}}, {}, {{0, 0.25f}}};
  const std::vector<std::vector<int32_t>> prompt = {{1, 1}, {}, {7}}, output = {{7, 1}, {2, 2}, {}};
  v1::SampleRequest request;
  ASSERT_TRUE(SetLogitBias(rows, &request).ok());
  ASSERT_TRUE(SetTokenHistory(prompt, output, &request).ok());
  EXPECT_EQ(PackLogitBias(rows), PackLists(request.logit_bias()));
  std::vector<uint8_t> packed;
  ASSERT_TRUE(PackTokenHistory(prompt, output, &packed).ok());
  EXPECT_EQ(packed, PackLists(request.token_history()));
}

// Regression: a prompt or output vector with fewer rows than the batch was padded with rows of
// no tokens (the longer vector set the row count), so a request the server cannot tell from a
// correct one went out with the wrong rows penalised. Now nothing is set and nothing packed.
TEST(ClientProcessors, TokenHistoryWithAnotherNumberOfRowsIsRefusedAndLeavesTheRequest) {
  const std::vector<float> values(3 * 4, 0.0f);
  v1::SampleRequest request = MakeFp32Request(values.data(), 3, 4, {Greedy()});
  ASSERT_TRUE(SetTokenHistory({{1}, {}, {2}}, {}, &request).ok());
  const std::string before = request.SerializeAsString();
  grpc::Status status = SetTokenHistory({{1}, {2}}, {}, &request);  // 2 prompts for B = 3
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(status.error_message(), "expected prompt token ids for B = 3 rows, got 2");
  status = SetTokenHistory({{1}, {}, {2}}, {{3}, {3}, {3}, {3}}, &request);  // 4 outputs
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(status.error_message(), "expected output token ids for B = 3 rows, got 4");
  status = SetTokenHistory({{1}, {}, {2}}, {{3}}, &request);  // the shorter one, not padded
  EXPECT_EQ(status.error_message(), "expected output token ids for B = 3 rows, got 1");
  EXPECT_EQ(request.SerializeAsString(), before);

  // Without logits (e.g. lists for a region) the two vectors must agree with each other.
  v1::SampleRequest bare;
  status = SetTokenHistory({{1}, {2}, {3}}, {{4}, {5}}, &bare);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(status.error_message(),
            "expected prompt and output token ids for the same number of rows, got 3 and 2");
  EXPECT_FALSE(bare.has_token_history());
  std::vector<uint8_t> packed = {7};
  status = PackTokenHistory({{1}}, {{4}, {5}}, &packed);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(status.error_message(),
            "expected prompt and output token ids for the same number of rows, got 1 and 2");
  EXPECT_EQ(packed, std::vector<uint8_t>{7});
}

// Regression (outside tester): SetLogitBias took any number of rows, so a bias for rows past
// the batch (or a broadcast over another `batch`, or a negative one) built a request with the
// wrong row_offsets and only the server's answer said so. Now it is refused like a token history
// of the wrong length, and the request is left as it was.
TEST(ClientProcessors, LogitBiasForAnotherNumberOfRowsIsRefusedAndLeavesTheRequest) {
  const std::vector<float> values(3 * 4, 0.0f);
  v1::SampleRequest request = MakeFp32Request(values.data(), 3, 4, {Greedy()});
  ASSERT_TRUE(SetLogitBias({{{1, 1.0f}}, {}, {{2, -1.0f}}}, &request).ok());
  const std::string before = request.SerializeAsString();
  grpc::Status status = SetLogitBias({{}, {}, {}, {{3, 2.0f}}}, &request);  // row 3 of B = 3
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(status.error_message(), "expected logit bias for B = 3 rows, got 4");
  status = SetLogitBias({{{1, 1.0f}}}, &request);  // fewer rows
  EXPECT_EQ(status.error_message(), "expected logit bias for B = 3 rows, got 1");
  status = SetLogitBias(TokenBias{{1, 1.0f}}, 4, &request);  // broadcast over another batch
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(status.error_message(), "expected logit bias for B = 3 rows, got 4");
  EXPECT_EQ(request.SerializeAsString(), before);
  ASSERT_TRUE(SetLogitBias(TokenBias{{1, 1.0f}}, 3, &request).ok());
  EXPECT_EQ(request.logit_bias().row_offsets_size(), 4);

  // Without logits (e.g. lists for a region) any number of rows is taken, but never fewer than 0.
  v1::SampleRequest bare;
  EXPECT_TRUE(SetLogitBias({{}, {{3, 1.0f}}}, &bare).ok());
  EXPECT_EQ(bare.logit_bias().row_offsets_size(), 3);
  status = SetLogitBias(TokenBias{{1, 1.0f}}, -1, &bare);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(status.error_message(), "expected logit bias for B >= 0 rows, got -1");
  EXPECT_EQ(bare.logit_bias().row_offsets_size(), 3);
}

TEST(ClientProcessors, ListRegionsNameTheSliceAndReplaceInlineLists) {
  v1::SampleRequest request;
  ASSERT_TRUE(SetLogitBias(TokenBias{{1, 1.0f}}, 2, &request).ok());
  ASSERT_TRUE(SetTokenHistory({}, {{1}, {2}}, &request).ok());
  SetLogitBiasRegion("lists", 8, &request);
  SetTokenHistoryRegion("lists", 1024, &request);
  EXPECT_EQ(request.logit_bias().region().region(), "lists");
  EXPECT_EQ(request.logit_bias().region().offset(), 8u);
  EXPECT_EQ(request.logit_bias().row_offsets_size() + request.logit_bias().token_ids_size() +
                request.logit_bias().biases_size(),
            0);
  EXPECT_EQ(request.token_history().region().offset(), 1024u);
  EXPECT_EQ(request.token_history().row_offsets_size() + request.token_history().token_ids_size() +
                request.token_history().output_counts_size() +
                request.token_history().in_prompt_size(),
            0);
  // Inline lists after a region drop the region.
  ASSERT_TRUE(SetLogitBias({{}, {{3, 1.0f}}}, &request).ok());
  ASSERT_TRUE(SetTokenHistory({{5}, {}}, {}, &request).ok());
  EXPECT_FALSE(request.logit_bias().has_region());
  EXPECT_EQ(request.logit_bias().token_ids_size(), 1);
  EXPECT_FALSE(request.token_history().has_region());
  EXPECT_EQ(request.token_history().token_ids_size(), 1);
}

using ClientProcessorsOverUds = ServerSuite;

TEST_F(ClientProcessorsOverUds, ListsInAHostShmRegionGiveTheInlineTokensAndLogprobs) {
  std::string error;
  std::unique_ptr<HostShmBuffer> shm = HostShmBuffer::Create(
      "/samplerd-cpp-client-" + std::to_string(getpid()) + "-lists", 4096, &error);
  ASSERT_NE(shm, nullptr) << error;
  ASSERT_TRUE(client_->RegisterHostShm("cpp-lists", shm->key(), 0, 4096).ok());
  Logits logits = RandomLogits(3, 500, 31);
  // Row 1's history holds its two largest logits, the first in the output, the second in the
  // prompt only, so that the penalties and the prompt flags change its distribution.
  std::vector<int32_t> order(500);
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + 2, order.end(), [&logits](int32_t a, int32_t b) {
    return logits.row(1)[a] > logits.row(1)[b];
  });
  const std::vector<TokenBias> bias = {{{7, 30.0f}, {8, -kInf}}, {}, {{499, 2.5f}}};
  const std::vector<std::vector<int32_t>> prompt = {{1, 2}, {order[1]}, {}},
                                          output = {{2, 2}, {order[0], order[0]}, {9}};
  v1::SamplingParams params = TopKTopP(1);
  params.set_repetition_penalty(1.4f);
  params.set_frequency_penalty(0.3f);
  v1::SampleRequest inline_request = logits.Request({params});
  inline_request.mutable_logprobs()->set_top_n(3);
  inline_request.mutable_logprobs()->set_source(v1::LOGPROB_SOURCE_PROCESSED);
  v1::SampleRequest plain = inline_request;
  ASSERT_TRUE(SetLogitBias(bias, &inline_request).ok());
  ASSERT_TRUE(SetTokenHistory(prompt, output, &inline_request).ok());
  v1::SampleResponse want;
  grpc::Status status = client_->Sample(inline_request, &want);
  ASSERT_TRUE(status.ok()) << status.error_message();
  want.clear_timings();

  char* base = static_cast<char*>(shm->data());
  const std::vector<uint8_t> packed_bias = PackLogitBias(bias);
  std::vector<uint8_t> packed_history;
  ASSERT_TRUE(PackTokenHistory(prompt, output, &packed_history).ok());
  std::memcpy(base, packed_bias.data(), packed_bias.size());
  std::memcpy(base + 1024, packed_history.data(), packed_history.size());
  v1::SampleRequest request = inline_request;
  SetLogitBiasRegion("cpp-lists", 0, &request);
  SetTokenHistoryRegion("cpp-lists", 1024, &request);
  v1::SampleResponse got;
  status = client_->Sample(request, &got);
  ASSERT_TRUE(status.ok()) << status.error_message();
  got.clear_timings();
  EXPECT_EQ(got.SerializeAsString(), want.SerializeAsString());  // tokens and logprobs, bit for bit
  std::unique_ptr<SampleSession> session = client_->OpenStream();
  ASSERT_TRUE(session->Step(request, &got).ok());
  got.clear_timings();
  EXPECT_EQ(got.SerializeAsString(), want.SerializeAsString());
  EXPECT_TRUE(session->Close().ok());
  // The lists matter: without them row 0 (bias) and row 1 (penalties) are drawn otherwise.
  ASSERT_TRUE(client_->Sample(plain, &got).ok());
  EXPECT_EQ(want.token_ids(0), 7);
  EXPECT_NE(got.token_ids(0), 7);
  EXPECT_NE(got.logprobs(1).SerializeAsString(), want.logprobs(1).SerializeAsString());

  // Offsets that fit at the region's end, lists that do not: the server's OUT_OF_RANGE.
  std::memcpy(base + 4080, packed_bias.data(), 16);
  SetLogitBiasRegion("cpp-lists", 4080, &request);
  status = client_->Sample(request, &got);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::OUT_OF_RANGE);
  EXPECT_EQ(status.error_message(),
            "logit_bias.region: expected 40 bytes at offset 4080, got a region of 4096 bytes (B = "
            "3, N = row_offsets[B] = 3: (B + 1 + 2N) * 4 bytes)");
  std::memcpy(base + 4080, packed_history.data(), 16);
  SetLogitBiasRegion("cpp-lists", 0, &request);
  SetTokenHistoryRegion("cpp-lists", 4080, &request);
  status = client_->Sample(request, &got);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::OUT_OF_RANGE);
  EXPECT_EQ(status.error_message(),
            "token_history.region: expected 61 bytes at offset 4080, got a region of 4096 bytes "
            "(B = 3, N = row_offsets[B] = 5: (B + 1 + 2N) * 4 + N bytes)");
  EXPECT_TRUE(client_->Unregister("cpp-lists").ok());
}

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
  ASSERT_TRUE(SetLogitBias({{{0, kInf}}, {{1, -kInf}}}, &request).ok());
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
  ASSERT_TRUE(SetTokenHistory({{0}, {0}, {}}, {{}, {}, {0, 0}}, &request).ok());
  v1::SampleResponse response;
  const grpc::Status status = client_->Sample(request, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(Tokens(response), (std::vector<int32_t>{1, 1, 1}));
}

}  // namespace
}  // namespace samplerd::integration
