// Logits processors end to end through the real samplerd (CPU backend): the error table of
// malformed bias lists, token histories, bitmasks and penalties (exact code and message, unary
// and streamed, the server serving on), the row status of a row with nothing allowed, and a
// bitmask, bias lists and token histories in a host shm region. (Every rule in detail:
// tests/kernels and tests/core.)
#include <unistd.h>

#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "samplerd/host_shm_buffer.h"
#include "tests/integration/integration_fixture.h"

namespace samplerd::integration {
namespace {

using C = grpc::StatusCode;

constexpr int64_t kBatch = 2;
constexpr int64_t kVocab = 40;  // 2 words a row

// A valid fp32 [2, 40] request, greedy. Every case breaks one thing of it.
v1::SampleRequest GoodRequest() {
  return RandomLogits(kBatch, kVocab, /*seed=*/51).Request({Greedy()});
}

void SetOffsets(google::protobuf::RepeatedField<uint32_t>* field, std::vector<uint32_t> values) {
  field->Assign(values.begin(), values.end());
}

// Row 0: token 3 biased by 1; row 1: tokens 5 and 9 by 2 and -inf.
void AddBias(v1::SampleRequest* r) {
  v1::LogitBias* bias = r->mutable_logit_bias();
  SetOffsets(bias->mutable_row_offsets(), {0, 1, 3});
  for (int32_t t : {3, 5, 9}) bias->add_token_ids(t);
  for (float b : {1.0f, 2.0f, -std::numeric_limits<float>::infinity()}) bias->add_biases(b);
}

// Row 0: token 7 seen twice in the output; row 1: token 8 in the prompt.
void AddHistory(v1::SampleRequest* r) {
  v1::TokenHistory* history = r->mutable_token_history();
  SetOffsets(history->mutable_row_offsets(), {0, 1, 2});
  history->add_token_ids(7);
  history->add_output_counts(2);
  history->add_in_prompt(false);
  history->add_token_ids(8);
  history->add_output_counts(0);
  history->add_in_prompt(true);
}

// Words allowing token allowed[r] alone in row r (-1: nothing).
std::string OneTokenWords(const std::vector<int32_t>& allowed) {
  std::vector<uint32_t> words(allowed.size() * 2, 0u);
  for (size_t r = 0; r < allowed.size(); ++r) {
    if (allowed[r] >= 0) words[r * 2 + allowed[r] / 32] |= 1u << (allowed[r] % 32);
  }
  return std::string(reinterpret_cast<const char*>(words.data()), words.size() * 4);
}

struct BadProcessors {
  std::string name;
  grpc::StatusCode code;
  std::string message;  // exact
  void (*mutate)(v1::SampleRequest* request);
};

void PrintTo(const BadProcessors& input, std::ostream* os) { *os << input.name; }

const std::vector<BadProcessors>& BadInputs() {
  static const std::vector<BadProcessors> cases = {
      {"BiasOffsetsNotBPlusOne", C::INVALID_ARGUMENT,
       "logit_bias.row_offsets: expected B + 1 = 3 entries, got 2 entries",
       [](v1::SampleRequest* r) {
         AddBias(r);
         SetOffsets(r->mutable_logit_bias()->mutable_row_offsets(), {0, 3});
       }},
      {"BiasOffsetsNotFromZero", C::INVALID_ARGUMENT,
       "logit_bias.row_offsets[0]: expected 0, got 1",
       [](v1::SampleRequest* r) {
         AddBias(r);
         SetOffsets(r->mutable_logit_bias()->mutable_row_offsets(), {1, 1, 3});
       }},
      {"BiasOffsetsDecreasing", C::INVALID_ARGUMENT,
       "logit_bias.row_offsets[2]: expected non-decreasing offsets, >= row_offsets[1] = 3, "
       "got 2",
       [](v1::SampleRequest* r) {
         AddBias(r);
         SetOffsets(r->mutable_logit_bias()->mutable_row_offsets(), {0, 3, 2});
       }},
      {"BiasOffsetsNotEndingAtTheLength", C::INVALID_ARGUMENT,
       "logit_bias.row_offsets[2]: expected the length of logit_bias.token_ids, 3, got 2",
       [](v1::SampleRequest* r) {
         AddBias(r);
         SetOffsets(r->mutable_logit_bias()->mutable_row_offsets(), {0, 1, 2});
       }},
      {"BiasesShorterThanTokenIds", C::INVALID_ARGUMENT,
       "logit_bias.biases: expected one entry per token id, 3 entries, got 2 entries",
       [](v1::SampleRequest* r) {
         AddBias(r);
         r->mutable_logit_bias()->mutable_biases()->RemoveLast();
       }},
      {"BiasTokenPastTheVocabulary", C::INVALID_ARGUMENT,
       "logit_bias.token_ids[2] (row 1): expected a token id in [0, 40), got 40",
       [](v1::SampleRequest* r) {
         AddBias(r);
         r->mutable_logit_bias()->set_token_ids(2, 40);
       }},
      {"BiasTokenNegative", C::INVALID_ARGUMENT,
       "logit_bias.token_ids[0] (row 0): expected a token id in [0, 40), got -3",
       [](v1::SampleRequest* r) {
         AddBias(r);
         r->mutable_logit_bias()->set_token_ids(0, -3);
       }},
      {"BiasTokenTwiceInARow", C::INVALID_ARGUMENT,
       "logit_bias.token_ids[2] (row 1): expected each token at most once within a row "
       "(duplicates are rejected, not summed), got token 5 again (first at token_ids[1])",
       [](v1::SampleRequest* r) {
         AddBias(r);
         r->mutable_logit_bias()->set_token_ids(2, 5);
       }},
      {"BiasNaN", C::INVALID_ARGUMENT,
       "logit_bias.biases[1] (row 1): expected a bias that is not NaN (+-inf allowed), got NaN",
       [](v1::SampleRequest* r) {
         AddBias(r);
         r->mutable_logit_bias()->set_biases(1, std::numeric_limits<float>::quiet_NaN());
       }},
      {"HistoryCountsShorterThanTokenIds", C::INVALID_ARGUMENT,
       "token_history.output_counts: expected one entry per token id, 2 entries, got 1 entries",
       [](v1::SampleRequest* r) {
         AddHistory(r);
         r->mutable_token_history()->mutable_output_counts()->RemoveLast();
       }},
      {"HistoryPromptFlagsLongerThanTokenIds", C::INVALID_ARGUMENT,
       "token_history.in_prompt: expected one entry per token id, 2 entries, got 3 entries",
       [](v1::SampleRequest* r) {
         AddHistory(r);
         r->mutable_token_history()->add_in_prompt(true);
       }},
      {"HistoryTokenPastTheVocabulary", C::INVALID_ARGUMENT,
       "token_history.token_ids[1] (row 1): expected a token id in [0, 40), got 1000",
       [](v1::SampleRequest* r) {
         AddHistory(r);
         r->mutable_token_history()->set_token_ids(1, 1000);
       }},
      {"HistoryTokenTwiceInARow", C::INVALID_ARGUMENT,
       "token_history.token_ids[1] (row 0): expected each token at most once within a row "
       "(duplicates are rejected, not summed), got token 7 again (first at token_ids[0])",
       [](v1::SampleRequest* r) {
         AddHistory(r);
         r->mutable_token_history()->set_token_ids(1, 7);
         SetOffsets(r->mutable_token_history()->mutable_row_offsets(), {0, 2, 2});
       }},
      {"BitmaskWithoutWords", C::INVALID_ARGUMENT,
       "token_bitmask: expected inline_words or region, got neither",
       [](v1::SampleRequest* r) { r->mutable_token_bitmask(); }},
      {"BitmaskOneWordShort", C::INVALID_ARGUMENT,
       "token_bitmask.inline_words: expected B * ceil(V / 32) * 4 = 16 bytes for shape [2, 40], "
       "got 12 bytes",
       [](v1::SampleRequest* r) {
         r->mutable_token_bitmask()->set_inline_words(std::string(12, '\xff'));
       }},
      {"BitmaskInAnUnknownRegion", C::NOT_FOUND, "",
       [](v1::SampleRequest* r) {
         r->mutable_token_bitmask()->mutable_region()->set_region("no-such-masks");
       }},
      {"BiasWithRegionAndLists", C::INVALID_ARGUMENT,
       "logit_bias: expected one source (the repeated fields or region), got both",
       [](v1::SampleRequest* r) {
         AddBias(r);
         r->mutable_logit_bias()->mutable_region()->set_region("lists");
       }},
      {"HistoryWithRegionAndLists", C::INVALID_ARGUMENT,
       "token_history: expected one source (the repeated fields or region), got both",
       [](v1::SampleRequest* r) {
         AddHistory(r);
         r->mutable_token_history()->mutable_region()->set_region("lists");
       }},
      {"BiasInAnUnknownRegion", C::NOT_FOUND,
       "logit_bias.region: expected a registered region, got \"no-such-lists\", which is not "
       "(ListRegions lists them)",
       [](v1::SampleRequest* r) {
         r->mutable_logit_bias()->mutable_region()->set_region("no-such-lists");
       }},
      {"HistoryInAnUnknownRegion", C::NOT_FOUND,
       "token_history.region: expected a registered region, got \"no-such-lists\", which is not "
       "(ListRegions lists them)",
       [](v1::SampleRequest* r) {
         r->mutable_token_history()->mutable_region()->set_region("no-such-lists");
       }},
      {"RepetitionPenaltyZero", C::INVALID_ARGUMENT,
       "expected params[0].repetition_penalty finite and > 0 (1 is off), got 0",
       [](v1::SampleRequest* r) { r->mutable_params(0)->set_repetition_penalty(0.0f); }},
      {"RepetitionPenaltyInfinite", C::INVALID_ARGUMENT,
       "expected params[0].repetition_penalty finite and > 0 (1 is off), got inf",
       [](v1::SampleRequest* r) {
         r->mutable_params(0)->set_repetition_penalty(std::numeric_limits<float>::infinity());
       }},
      {"PresencePenaltyAboveTwo", C::INVALID_ARGUMENT,
       "expected params[0].presence_penalty in [-2, 2], got 2.5",
       [](v1::SampleRequest* r) { r->mutable_params(0)->set_presence_penalty(2.5f); }},
      {"FrequencyPenaltyBelowMinusTwo", C::INVALID_ARGUMENT,
       "expected params[0].frequency_penalty in [-2, 2], got -3",
       [](v1::SampleRequest* r) { r->mutable_params(0)->set_frequency_penalty(-3.0f); }},
  };
  return cases;
}

class ProcessorErrorTable : public ServerSuite,
                            public ::testing::WithParamInterface<BadProcessors> {};

TEST_P(ProcessorErrorTable, AnswersTheExactCodeAndMessageUnaryAndStreamed) {
  const BadProcessors& input = GetParam();
  v1::SampleRequest request = GoodRequest();
  input.mutate(&request);
  v1::SampleResponse response;
  const grpc::Status status = client_->Sample(request, &response);
  EXPECT_EQ(status.error_code(), input.code) << status.error_message();
  if (!input.message.empty()) {
    EXPECT_EQ(status.error_message(), input.message);
  } else {
    EXPECT_TRUE(MentionsAny(status.error_message(), {"token_bitmask.region: expected"}));
  }
  std::unique_ptr<SampleSession> session = client_->OpenStream();
  const grpc::Status step = session->Step(request, &response);
  EXPECT_EQ(step.error_code(), input.code);
  EXPECT_EQ(step.error_message(), status.error_message());
  EXPECT_TRUE(session->open());
  EXPECT_TRUE(session->Close().ok());
  ASSERT_TRUE(client_->Sample(GoodRequest(), &response).ok());
}

INSTANTIATE_TEST_SUITE_P(BadInputs, ProcessorErrorTable, ::testing::ValuesIn(BadInputs()),
                         [](const ::testing::TestParamInfo<BadProcessors>& info) {
                           return info.param.name;
                         });

// ---- Semantics over the wire --------------------------------------------------------------------

using ProcessorsOverTheWire = ServerSuite;

TEST_F(ProcessorsOverTheWire, AMaskDecidesTheTokenAndAnEmptyOneIsInvalidNoAllowed) {
  v1::SampleRequest request = RandomLogits(kBatch, kVocab, 52).Request({Seeded(3)});
  request.mutable_token_bitmask()->set_inline_words(OneTokenWords({33, -1}));
  v1::SampleResponse response;
  const grpc::Status status = client_->Sample(request, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(Tokens(response), (std::vector<int32_t>{33, -1}));
  EXPECT_EQ(response.row_status(0), v1::ROW_STATUS_OK);
  EXPECT_EQ(response.row_status(1), v1::ROW_STATUS_INVALID_NO_ALLOWED);
}

TEST_F(ProcessorsOverTheWire, BiasAndPenaltiesMoveTheGreedyToken) {
  Logits logits{1, 4, {1.0f, 3.0f, 2.0f, 0.0f}};
  v1::SampleRequest request = logits.Request({Greedy()});
  v1::SampleResponse response;
  ASSERT_TRUE(client_->Sample(request, &response).ok());
  EXPECT_EQ(Tokens(response), (std::vector<int32_t>{1}));
  // Repetition 2 on token 1 (seen in the prompt): 3 / 2 = 1.5 < 2.
  request.mutable_params(0)->set_repetition_penalty(2.0f);
  v1::TokenHistory* history = request.mutable_token_history();
  SetOffsets(history->mutable_row_offsets(), {0, 1});
  history->add_token_ids(1);
  history->add_output_counts(0);
  history->add_in_prompt(true);
  ASSERT_TRUE(client_->Sample(request, &response).ok());
  EXPECT_EQ(Tokens(response), (std::vector<int32_t>{2}));
  // A +inf bias forces token 3.
  v1::LogitBias* bias = request.mutable_logit_bias();
  SetOffsets(bias->mutable_row_offsets(), {0, 1});
  bias->add_token_ids(3);
  bias->add_biases(std::numeric_limits<float>::infinity());
  ASSERT_TRUE(client_->Sample(request, &response).ok());
  EXPECT_EQ(Tokens(response), (std::vector<int32_t>{3}));
}

TEST_F(ProcessorsOverTheWire, AHostShmBitmaskRegionWorksLikeInlineWords) {
  std::string error;
  std::unique_ptr<HostShmBuffer> shm =
      HostShmBuffer::Create("/samplerd-it-" + std::to_string(getpid()) + "-masks", 4096, &error);
  ASSERT_NE(shm, nullptr) << error;
  const std::string words = OneTokenWords({-1, 17});
  std::memcpy(static_cast<char*>(shm->data()) + 64, words.data(), words.size());
  ASSERT_TRUE(client_->RegisterHostShm("masks", shm->key(), 0, 4096).ok());
  v1::SampleRequest request = RandomLogits(kBatch, kVocab, 53).Request({Seeded(4)});
  v1::RegionSlice* slice = request.mutable_token_bitmask()->mutable_region();
  slice->set_region("masks");
  slice->set_offset(64);
  v1::SampleResponse response;
  const grpc::Status status = client_->Sample(request, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(Tokens(response), (std::vector<int32_t>{-1, 17}));
  EXPECT_EQ(response.row_status(0), v1::ROW_STATUS_INVALID_NO_ALLOWED);
  slice->set_offset(66);
  const grpc::Status unaligned = client_->Sample(request, &response);
  EXPECT_EQ(unaligned.error_code(), C::INVALID_ARGUMENT);
  EXPECT_EQ(unaligned.error_message(),
            "token_bitmask.region: expected a slice aligned to 4 bytes (int32 words), got one at "
            "2 bytes past a multiple of 4 (offset 66)");
  EXPECT_TRUE(client_->Unregister("masks").ok());
}

// The packed layouts of processors.proto (LogitBias.region, TokenHistory.region) of a
// request's inline lists.
std::string PackedBias(const v1::LogitBias& bias) {
  std::string out;
  auto put = [&out](const void* p, size_t bytes) {
    out.append(static_cast<const char*>(p), bytes);
  };
  put(bias.row_offsets().data(), bias.row_offsets_size() * 4);
  put(bias.token_ids().data(), bias.token_ids_size() * 4);
  put(bias.biases().data(), bias.biases_size() * 4);
  return out;
}

std::string PackedHistory(const v1::TokenHistory& history) {
  std::string out;
  auto put = [&out](const void* p, size_t bytes) {
    out.append(static_cast<const char*>(p), bytes);
  };
  put(history.row_offsets().data(), history.row_offsets_size() * 4);
  put(history.token_ids().data(), history.token_ids_size() * 4);
  put(history.output_counts().data(), history.output_counts_size() * 4);
  for (bool b : history.in_prompt()) out.push_back(b ? 1 : 0);
  return out;
}

TEST_F(ProcessorsOverTheWire, BiasAndHistoryInAHostShmRegionWorkLikeInlineLists) {
  std::string error;
  std::unique_ptr<HostShmBuffer> shm =
      HostShmBuffer::Create("/samplerd-it-" + std::to_string(getpid()) + "-lists", 4096, &error);
  ASSERT_NE(shm, nullptr) << error;
  ASSERT_TRUE(client_->RegisterHostShm("lists", shm->key(), 0, 4096).ok());
  v1::SampleRequest inline_request = RandomLogits(kBatch, kVocab, 54).Request({Seeded(5)});
  inline_request.mutable_params(0)->set_frequency_penalty(1.5f);
  inline_request.mutable_params(0)->set_repetition_penalty(1.7f);
  inline_request.mutable_logprobs()->set_top_n(4);
  inline_request.mutable_logprobs()->set_source(v1::LOGPROB_SOURCE_PROCESSED);
  AddBias(&inline_request);
  AddHistory(&inline_request);
  v1::SampleResponse want;
  ASSERT_TRUE(client_->Sample(inline_request, &want).ok());

  const std::string bias = PackedBias(inline_request.logit_bias());
  const std::string history = PackedHistory(inline_request.token_history());
  char* base = static_cast<char*>(shm->data());
  std::memcpy(base + 128, bias.data(), bias.size());
  std::memcpy(base + 1024, history.data(), history.size());
  v1::SampleRequest request = inline_request;
  request.mutable_logit_bias()->Clear();
  request.mutable_logit_bias()->mutable_region()->set_region("lists");
  request.mutable_logit_bias()->mutable_region()->set_offset(128);
  request.mutable_token_history()->Clear();
  request.mutable_token_history()->mutable_region()->set_region("lists");
  request.mutable_token_history()->mutable_region()->set_offset(1024);
  v1::SampleResponse got;
  const grpc::Status status = client_->Sample(request, &got);
  ASSERT_TRUE(status.ok()) << status.error_message();
  got.clear_timings();
  want.clear_timings();
  EXPECT_EQ(got.SerializeAsString(), want.SerializeAsString());  // tokens and logprobs, bit for bit
  std::unique_ptr<SampleSession> session = client_->OpenStream();
  ASSERT_TRUE(session->Step(request, &got).ok());
  got.clear_timings();
  EXPECT_EQ(got.SerializeAsString(), want.SerializeAsString());
  EXPECT_TRUE(session->Close().ok());

  // A token past the vocabulary in the region, then a slice the region cannot hold.
  const int32_t past = static_cast<int32_t>(kVocab);
  std::memcpy(base + 128 + 3 * 4, &past, 4);  // token_ids[0], after 3 offsets
  grpc::Status bad = client_->Sample(request, &got);
  EXPECT_EQ(bad.error_code(), C::INVALID_ARGUMENT);
  EXPECT_EQ(bad.error_message(),
            "logit_bias.region.token_ids[0] (row 0): expected a token id in [0, 40), got 40");
  request.mutable_logit_bias()->mutable_region()->set_offset(4096 - 12);  // offsets 0, 1, 3
  std::memcpy(base + 4096 - 12, bias.data(), 12);
  bad = client_->Sample(request, &got);
  EXPECT_EQ(bad.error_code(), C::OUT_OF_RANGE);
  EXPECT_EQ(bad.error_message(),
            "logit_bias.region: expected 36 bytes at offset 4084, got a region of 4096 bytes (B = "
            "2, N = row_offsets[B] = 3: (B + 1 + 2N) * 4 bytes)");
  ASSERT_TRUE(client_->Sample(GoodRequest(), &got).ok());
  EXPECT_TRUE(client_->Unregister("lists").ok());
}

TEST_F(ProcessorsOverTheWire, AGpuIpcBitmaskRegionIsRefusedByTheCpuServer) {
  // A CPU server registers no GPU IPC region (the same refusal as for GPU IPC logits), so a
  // bitmask can never name one; BindSampleIo's own check is in tests/core/regions_test.cc.
  const grpc::Status registered =
      client_->RegisterGpuIpc("gpu-masks", std::string(64, 'h'), 0, 4096, "0000:3b:00.0");
  EXPECT_EQ(registered.error_code(), C::FAILED_PRECONDITION) << registered.error_message();
  v1::SampleRequest request = GoodRequest();
  request.mutable_token_bitmask()->mutable_region()->set_region("gpu-masks");
  v1::SampleResponse response;
  EXPECT_EQ(client_->Sample(request, &response).error_code(), C::NOT_FOUND);
}

}  // namespace
}  // namespace samplerd::integration
