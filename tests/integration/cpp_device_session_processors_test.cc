// samplerd::DeviceSession (C++ client) with logits processors, host plane, against the real
// samplerd binary (CPU backend): every token and row status equals unary Sample's with the same
// processors set by samplerd/processors.h (a mask with one allowed token, one with none, bias to
// -inf, the three penalties), a processors buffer broken in one row gives that row status 4 and
// leaves the others equal, and PackSessionProcessors refuses what the client can check.
#include <cmath>
#include <cstring>
#include <vector>

#include "samplerd/device_session.h"
#include "samplerd/processors.h"
#include "tests/integration/integration_fixture.h"

namespace samplerd::integration {
namespace {

using C = grpc::StatusCode;

constexpr uint32_t kMaxBatch = 6;
constexpr uint32_t kVocab = 700;
constexpr int64_t kWords = (kVocab + 31) / 32;

DeviceSessionOptions ProcessorOptions() {
  DeviceSessionOptions options;
  options.max_batch = kMaxBatch;
  options.vocab = kVocab;
  options.plane = SessionPlane::kHost;
  options.token_bitmask = true;
  options.processors = true;
  options.logit_bias_capacity = 64;
  options.token_history_capacity = 256;
  return options;
}

// One step's processors: row 0 allows one token, row 1 none, the rest random masks; bias with
// -inf; penalties; histories.
struct Step {
  std::vector<int32_t> mask;
  SessionProcessorRows rows;
};

Step RandomStep(int64_t batch, std::mt19937& rng) {
  Step s;
  s.mask.assign(static_cast<size_t>(batch * kWords), 0);
  for (int64_t r = 0; r < batch; ++r) {
    int32_t* words = s.mask.data() + r * kWords;
    if (r == 0) {
      const uint32_t only = rng() % kVocab;
      words[only / 32] = static_cast<int32_t>(1u << (only % 32));
    } else if (r != 1) {
      for (uint32_t t = 0; t < kVocab; ++t) {
        if (rng() % 3 != 0) words[t / 32] |= static_cast<int32_t>(1u << (t % 32));
      }
    }
    TokenBias bias;
    for (int i = 0; i < 5; ++i) {
      bias[static_cast<int32_t>(rng() % kVocab)] = i == 0 ? -INFINITY : (rng() % 600) / 100.0f - 3;
    }
    s.rows.logit_bias.push_back(bias);
    std::vector<int32_t> prompt, output;
    for (int i = 0; i < 12; ++i) prompt.push_back(static_cast<int32_t>(rng() % kVocab));
    for (int i = 0; i < 12; ++i) output.push_back(static_cast<int32_t>(rng() % kVocab));
    s.rows.prompt_token_ids.push_back(prompt);
    s.rows.output_token_ids.push_back(output);
    s.rows.repetition_penalty.push_back(0.6f + (rng() % 100) / 70.0f);
    s.rows.presence_penalty.push_back((rng() % 200) / 100.0f - 1.0f);
    s.rows.frequency_penalty.push_back((rng() % 200) / 100.0f - 1.0f);
  }
  return s;
}

// The unary request of the same step.
v1::SampleRequest UnaryRequest(const Logits& logits, const std::vector<v1::SamplingParams>& params,
                               const Step& s) {
  std::vector<v1::SamplingParams> rows = params;
  for (size_t r = 0; r < rows.size(); ++r) {
    rows[r].set_repetition_penalty(s.rows.repetition_penalty[r]);
    rows[r].set_presence_penalty(s.rows.presence_penalty[r]);
    rows[r].set_frequency_penalty(s.rows.frequency_penalty[r]);
  }
  v1::SampleRequest request = logits.Request(rows);
  SetTokenBitmask(s.mask.data(), logits.batch, kVocab, &request);
  EXPECT_TRUE(SetLogitBias(s.rows.logit_bias, &request).ok());
  EXPECT_TRUE(SetTokenHistory(s.rows.prompt_token_ids, s.rows.output_token_ids, &request).ok());
  return request;
}

// Writes the step into the session (logits, params, bitmask, processors) and steps it.
grpc::Status RunStep(DeviceSession* session, const Logits& logits,
                     const std::vector<v1::SamplingParams>& params, const Step& s,
                     std::vector<uint8_t>* packed) {
  std::memcpy(session->logits(), logits.values.data(), logits.values.size() * sizeof(float));
  const DeviceSessionParams p = session->params();
  for (size_t r = 0; r < params.size(); ++r) {
    p.seed[r] = params[r].seed();
    p.position[r] = params[r].position();
    p.temperature[r] = params[r].has_temperature() ? params[r].temperature() : 1.0f;
    p.top_k[r] = params[r].top_k();
    p.top_p[r] = params[r].has_top_p() ? params[r].top_p() : 1.0f;
    p.min_p[r] = 0.0f;
    p.top_p_mode[r] = 0;
  }
  std::memcpy(session->token_bitmask(), s.mask.data(), s.mask.size() * 4);
  std::memcpy(session->processors(), packed->data(), packed->size());
  return session->StepOnHost(static_cast<int>(logits.batch));
}

class CppDeviceSessionProcessors : public ServerSuite {
 protected:
  void SetUp() override {
    ServerSuite::SetUp();
    const grpc::Status status = DeviceSession::Open(client_.get(), ProcessorOptions(), &session_);
    ASSERT_TRUE(status.ok()) << status.error_code() << ": " << status.error_message();
  }
  void TearDown() override {
    if (session_ != nullptr) session_->Close().ok();
    ServerSuite::TearDown();
  }
  std::unique_ptr<DeviceSession> session_;
};

TEST_F(CppDeviceSessionProcessors, TokensAndStatusesEqualUnarySampleWithTheSameProcessors) {
  std::mt19937 rng(17);
  int no_allowed = 0;
  for (int step = 0; step < 60; ++step) {
    const int64_t batch = 1 + step % kMaxBatch;
    const Logits logits = RandomLogits(batch, kVocab, /*seed=*/300 + step);
    std::vector<v1::SamplingParams> params;
    for (int64_t r = 0; r < batch; ++r) {
      params.push_back(step % 2 == 0 ? Greedy() : TopKTopP(/*seed=*/40 + r));
      params.back().set_position(static_cast<uint64_t>(step));
    }
    const Step s = RandomStep(batch, rng);
    std::vector<uint8_t> packed;
    ASSERT_TRUE(
        PackSessionProcessors(ProcessorOptions(), static_cast<int>(batch), s.rows, &packed).ok());
    ASSERT_TRUE(RunStep(session_.get(), logits, params, s, &packed).ok()) << "step " << step;
    v1::SampleResponse unary;
    ASSERT_TRUE(client_->Sample(UnaryRequest(logits, params, s), &unary).ok());
    for (int64_t r = 0; r < batch; ++r) {
      EXPECT_EQ(session_->token_ids()[r], unary.token_ids(static_cast<int>(r)))
          << "step " << step << " row " << r;
      EXPECT_EQ(session_->row_status()[r], unary.row_status(static_cast<int>(r)))
          << "step " << step << " row " << r;
    }
    if (batch >= 2) {
      EXPECT_EQ(session_->row_status()[1], SAMPLERD_ROW_INVALID_NO_ALLOWED) << "step " << step;
      no_allowed += 1;
    }
  }
  EXPECT_GT(no_allowed, 40);
}

TEST_F(CppDeviceSessionProcessors, ARowWithUnsortedBiasGetsStatusFourAndItsNeighboursAreSampled) {
  std::mt19937 rng(5);
  const Logits logits = RandomLogits(4, kVocab, /*seed=*/9);
  const std::vector<v1::SamplingParams> params(4, Greedy());
  Step s = RandomStep(4, rng);
  for (auto& bias : s.rows.logit_bias) bias = {{3, 1.0f}, {8, -1.0f}};  // entries [2r, 2r + 2)
  std::vector<uint8_t> packed;
  ASSERT_TRUE(PackSessionProcessors(ProcessorOptions(), 4, s.rows, &packed).ok());
  const int32_t unsorted = 2;  // row 2's second token below its first
  std::memcpy(packed.data() + samplerd_processors_bias_tokens_offset(kMaxBatch) + 4 * 5, &unsorted,
              4);
  ASSERT_TRUE(RunStep(session_.get(), logits, params, s, &packed).ok());
  v1::SampleResponse unary;
  ASSERT_TRUE(client_->Sample(UnaryRequest(logits, params, s), &unary).ok());
  for (int r = 0; r < 4; ++r) {
    if (r == 2) {
      EXPECT_EQ(session_->row_status()[r], SAMPLERD_ROW_INVALID_PARAMS);
      EXPECT_EQ(session_->token_ids()[r], -1);
    } else {
      EXPECT_EQ(session_->row_status()[r], unary.row_status(r)) << "row " << r;
      EXPECT_EQ(session_->token_ids()[r], unary.token_ids(r)) << "row " << r;
    }
  }
}

TEST_F(CppDeviceSessionProcessors, TheBuffersStartAsNoProcessorsAndPackingChecksSizes) {
  const Logits logits = RandomLogits(2, kVocab, /*seed=*/1);
  std::memcpy(session_->logits(), logits.values.data(), logits.values.size() * sizeof(float));
  for (int r = 0; r < 2; ++r) session_->params().temperature[r] = 0.0f;
  ASSERT_TRUE(session_->StepOnHost(2).ok());
  v1::SampleResponse unary;
  ASSERT_TRUE(client_->Sample(logits.Request({Greedy()}), &unary).ok());
  EXPECT_EQ(session_->token_ids()[0], unary.token_ids(0));
  EXPECT_EQ(session_->token_ids()[1], unary.token_ids(1));

  std::vector<uint8_t> packed;
  SessionProcessorRows rows;
  rows.repetition_penalty = {1.1f};  // one row for a batch of 2
  EXPECT_EQ(PackSessionProcessors(ProcessorOptions(), 2, rows, &packed).error_code(),
            C::INVALID_ARGUMENT);
  // Histories whose prompts and outputs disagree with the batch are refused, not padded with
  // rows of no tokens.
  rows = {};
  rows.prompt_token_ids = {{1}, {2}};
  rows.output_token_ids = {{3}};
  grpc::Status status = PackSessionProcessors(ProcessorOptions(), 2, rows, &packed);
  EXPECT_EQ(status.error_code(), C::INVALID_ARGUMENT);
  EXPECT_EQ(status.error_message(),
            "expected SessionProcessorRows.output_token_ids empty or of B = 2 rows, got 1");
  rows.output_token_ids = {};
  status = PackSessionProcessors(ProcessorOptions(), 3, rows, &packed);
  EXPECT_EQ(status.error_message(),
            "expected SessionProcessorRows.prompt_token_ids empty or of B = 3 rows, got 2");
  EXPECT_TRUE(PackSessionProcessors(ProcessorOptions(), 2, rows, &packed).ok());
  rows = {};
  TokenBias many;
  for (int32_t t = 0; t < 40; ++t) many[t] = 1.0f;
  rows.logit_bias = {many, many};  // 80 entries, capacity 64
  const grpc::Status over = PackSessionProcessors(ProcessorOptions(), 2, rows, &packed);
  EXPECT_EQ(over.error_code(), C::INVALID_ARGUMENT);
  EXPECT_TRUE(MentionsAny(over.error_message(), {"at most 64 logit_bias entries"}));
  DeviceSessionOptions bad = ProcessorOptions();
  bad.processors = false;
  std::unique_ptr<DeviceSession> session;
  EXPECT_EQ(DeviceSession::Open(client_.get(), bad, &session).error_code(), C::INVALID_ARGUMENT);
}

}  // namespace
}  // namespace samplerd::integration
