// samplerd::DeviceSession (C++ client) against the real samplerd binary (CPU backend), host
// plane, stepping from the host: tokens equal to unary Sample's over 200 steps of varying B,
// seeded draws, an invalid parameter row, the client's own checks, close, and a server killed
// mid-session (the pending wait ends with ABORTED, no hang).
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "samplerd/device_session.h"
#include "tests/integration/integration_fixture.h"

namespace samplerd::integration {
namespace {

using C = grpc::StatusCode;

constexpr uint32_t kMaxBatch = 8;
constexpr uint32_t kVocab = 1000;

DeviceSessionOptions HostOptions() {
  DeviceSessionOptions options;
  options.max_batch = kMaxBatch;
  options.vocab = kVocab;
  options.dtype = v1::DTYPE_FP32;
  options.plane = SessionPlane::kHost;
  return options;
}

// Writes one step's rows into the session: logits and each row's parameters.
void Fill(DeviceSession* session, const Logits& logits,
          const std::vector<v1::SamplingParams>& params) {
  std::memcpy(session->logits(), logits.values.data(), logits.values.size() * sizeof(float));
  const DeviceSessionParams p = session->params();
  for (int64_t r = 0; r < logits.batch; ++r) {
    const v1::SamplingParams& row = params[static_cast<size_t>(r)];
    p.seed[r] = row.seed();
    p.position[r] = row.position();
    p.temperature[r] = row.has_temperature() ? row.temperature() : 1.0f;
    p.top_k[r] = row.top_k();
    p.top_p[r] = row.has_top_p() ? row.top_p() : 1.0f;
    p.min_p[r] = row.min_p();
    p.top_p_mode[r] = row.top_p_mode();
  }
}

std::vector<int32_t> SessionTokens(const DeviceSession& session, int64_t batch) {
  return {session.token_ids(), session.token_ids() + batch};
}

class CppDeviceSession : public ServerSuite {
 protected:
  void SetUp() override {
    ServerSuite::SetUp();
    const grpc::Status status = DeviceSession::Open(client_.get(), HostOptions(), &session_);
    ASSERT_TRUE(status.ok()) << status.error_code() << ": " << status.error_message();
  }

  void TearDown() override {
    if (session_ != nullptr) session_->Close().ok();
    ServerSuite::TearDown();
  }

  std::unique_ptr<DeviceSession> session_;
};

TEST_F(CppDeviceSession, GreedyTokensEqualUnarySampleOver200Steps) {
  for (int step = 0; step < 200; ++step) {
    const int64_t batch = 1 + (step * 5) % kMaxBatch;  // every B in [1, 8]
    const Logits logits = RandomLogits(batch, kVocab, /*seed=*/1000 + step);
    const std::vector<v1::SamplingParams> params(static_cast<size_t>(batch), Greedy());
    Fill(session_.get(), logits, params);
    const grpc::Status status = session_->StepOnHost(static_cast<int>(batch));
    ASSERT_TRUE(status.ok()) << "step " << step << ": " << status.error_message();

    v1::SampleResponse unary;
    ASSERT_TRUE(client_->Sample(logits.Request({Greedy()}), &unary).ok());
    ASSERT_EQ(SessionTokens(*session_, batch), Tokens(unary)) << "step " << step;
    for (int64_t r = 0; r < batch; ++r) {
      ASSERT_EQ(session_->row_status()[r], SAMPLERD_ROW_OK) << "step " << step << " row " << r;
    }
    EXPECT_EQ(session_->step_status(), SAMPLERD_STEP_OK);
  }
  EXPECT_EQ(session_->control()->steps_done, 200u);
  const grpc::Status closed = session_->Close();
  EXPECT_TRUE(closed.ok()) << closed.error_message();
  EXPECT_FALSE(session_->open());
}

TEST_F(CppDeviceSession, SeededFilteredTokensEqualUnarySample) {
  for (int step = 0; step < 20; ++step) {
    const int64_t batch = kMaxBatch;
    const Logits logits = RandomLogits(batch, kVocab, /*seed=*/7000 + step);
    std::vector<v1::SamplingParams> params;
    for (int64_t r = 0; r < batch; ++r) {
      v1::SamplingParams row = TopKTopP(/*seed=*/100 + r);
      row.set_position(static_cast<uint64_t>(step));
      if (r % 3 == 1) row.set_min_p(0.05f);
      if (r % 4 == 2) row.set_top_p_mode(v1::TOP_P_MODE_JOINT);
      params.push_back(row);
    }
    Fill(session_.get(), logits, params);
    ASSERT_TRUE(session_->StepOnHost(static_cast<int>(batch)).ok()) << "step " << step;

    v1::SampleResponse unary;
    ASSERT_TRUE(client_->Sample(logits.Request(params), &unary).ok());
    ASSERT_EQ(SessionTokens(*session_, batch), Tokens(unary)) << "step " << step;
  }
}

TEST_F(CppDeviceSession, InvalidParameterRowGetsItsOwnStatus) {
  const Logits logits = RandomLogits(3, kVocab, /*seed=*/5);
  std::vector<v1::SamplingParams> params(3, Greedy());
  params[1].set_top_p(2.0f);  // out of (0, 1]
  Fill(session_.get(), logits, params);
  ASSERT_TRUE(session_->StepOnHost(3).ok());

  v1::SampleResponse unary;
  ASSERT_TRUE(client_->Sample(logits.Request({Greedy()}), &unary).ok());
  EXPECT_EQ(session_->row_status()[0], SAMPLERD_ROW_OK);
  EXPECT_EQ(session_->row_status()[1], SAMPLERD_ROW_INVALID_PARAMS);
  EXPECT_EQ(session_->row_status()[2], SAMPLERD_ROW_OK);
  EXPECT_EQ(session_->token_ids()[0], unary.token_ids(0));
  EXPECT_EQ(session_->token_ids()[1], -1);
  EXPECT_EQ(session_->token_ids()[2], unary.token_ids(2));
}

TEST_F(CppDeviceSession, BatchOutsideOneToMaxBatchIsRejectedWithoutRinging) {
  EXPECT_EQ(session_->StepOnHost(0).error_code(), C::INVALID_ARGUMENT);
  EXPECT_EQ(session_->StepOnHost(kMaxBatch + 1).error_code(), C::INVALID_ARGUMENT);
  EXPECT_EQ(session_->control()->doorbell, 0u);
  EXPECT_TRUE(session_->open());
}

TEST_F(CppDeviceSession, StepAfterCloseIsAbortedAndCloseIsIdempotent) {
  ASSERT_TRUE(session_->Close().ok());
  EXPECT_EQ(session_->StepOnHost(1).error_code(), C::ABORTED);
  EXPECT_TRUE(session_->Close().ok());
}

TEST_F(CppDeviceSession, EnqueueStepWithoutAGpuContextFailsCleanly) {
  // No GPU runtime here, or one with no current context on this thread: either way the
  // client refuses before enqueueing anything, and the session stays usable.
  const grpc::Status status = session_->EnqueueStep(nullptr, 1);
  EXPECT_EQ(status.error_code(), C::FAILED_PRECONDITION) << status.error_message();
  EXPECT_TRUE(session_->open());
}

TEST_F(CppDeviceSession, OpenWithZeroMaxBatchIsRejectedByTheClient) {
  DeviceSessionOptions options = HostOptions();
  options.max_batch = 0;
  std::unique_ptr<DeviceSession> session;
  const grpc::Status status = DeviceSession::Open(client_.get(), options, &session);
  EXPECT_EQ(status.error_code(), C::INVALID_ARGUMENT);
  EXPECT_TRUE(MentionsAny(status.error_message(), {"max_batch"}));
  EXPECT_EQ(session, nullptr);
}

// Options the server would refuse at open are refused before the session sizes its shm object
// by them (max_batch 100,000 x V 151,936 fp32 would be a 60 GB object, zeroed whole). A
// directory under the session's key makes any attempt to create the object fail, so the
// message shows which check came first.
TEST_F(CppDeviceSession, OptionsOverTheServerLimitsAreRefusedBeforeAnythingIsAllocated) {
  v1::GetServerInfoResponse info;
  ASSERT_TRUE(client_->GetServerInfo(&info).ok());
  const int64_t max_batch = info.limits().max_batch(), max_vocab = info.limits().max_vocab();
  const std::string key = "/samplerd-cpp-ds-limits-" + std::to_string(getpid());
  ASSERT_EQ(mkdir(("/dev/shm" + key).c_str(), 0700), 0) << std::strerror(errno);
  struct Case {
    uint32_t max_batch, vocab;
    uint64_t row_stride;
    C code;
    std::string message;
    uint32_t capacity = 0;  // of both processor lists (a processors buffer when not 0)
  };
  const Case cases[] = {
      {static_cast<uint32_t>(max_batch + 1), kVocab, 0, C::RESOURCE_EXHAUSTED,
       "expected max_batch <= " + std::to_string(max_batch) + " (server limit), got " +
           std::to_string(max_batch + 1)},
      {kMaxBatch, static_cast<uint32_t>(max_vocab + 1), 0, C::RESOURCE_EXHAUSTED,
       "expected vocabulary size V <= " + std::to_string(max_vocab) + " (server limit), got " +
           std::to_string(max_vocab + 1)},
      {kMaxBatch, kVocab, uint64_t{1} << 60, C::INVALID_ARGUMENT,
       "expected row_stride <= " + std::to_string(max_vocab * 16) + ", got " +
           std::to_string(uint64_t{1} << 60)},
      // 2 x 2^30 list entries: a 19 GB processors buffer.
      {4096, 1 << 18, 0, C::INVALID_ARGUMENT,
       "expected logit_bias_capacity + token_history_capacity <= 2147483647, got 2147483648",
       1u << 30},
  };
  for (const Case& c : cases) {
    DeviceSessionOptions options = HostOptions();
    options.max_batch = c.max_batch;
    options.vocab = c.vocab;
    options.row_stride = c.row_stride;
    options.shm_key = key;
    options.processors = c.capacity != 0;
    options.logit_bias_capacity = options.token_history_capacity = c.capacity;
    std::unique_ptr<DeviceSession> session;
    const grpc::Status status = DeviceSession::Open(client_.get(), options, &session);
    EXPECT_EQ(status.error_code(), c.code) << status.error_message();
    EXPECT_EQ(status.error_message(), c.message);
    EXPECT_EQ(session, nullptr);
  }
  EXPECT_EQ(rmdir(("/dev/shm" + key).c_str()), 0) << std::strerror(errno);
}

// Its own server, killed mid-session.
TEST(CppDeviceSessionFaults, ServerKilledMidSessionAbortsThePendingWait) {
  std::string error;
  std::unique_ptr<ServerProcess> server = ServerProcess::Start(CpuServerOptions(), &error);
  ASSERT_NE(server, nullptr) << error;
  Client client(server->target());
  std::unique_ptr<DeviceSession> session;
  ASSERT_TRUE(DeviceSession::Open(&client, HostOptions(), &session).ok()) << server->Log();
  const Logits logits = RandomLogits(1, kVocab, /*seed=*/3);
  Fill(session.get(), logits, {Greedy()});
  ASSERT_TRUE(session->StepOnHost(1).ok());

  ASSERT_EQ(kill(server->pid(), SIGKILL), 0);
  // The watcher sees the stream end and releases the wait: StepOnHost returns instead of
  // spinning forever (ctest's timeout would catch a hang).
  const auto start = std::chrono::steady_clock::now();
  const grpc::Status status = session->StepOnHost(1);
  EXPECT_EQ(status.error_code(), C::ABORTED) << status.error_message();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
  EXPECT_FALSE(session->open());
  server->Stop();
}

}  // namespace
}  // namespace samplerd::integration
