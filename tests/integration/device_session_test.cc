// DeviceSession against the real server (CPU backend, host plane) over the generated C++ stub:
// this test plays the engine through its own mappings of the host shm buffers (write logits,
// params and batch; ring with a release store; spin on done with a 5 s bound; reset it), and
// checks every token against unary Sample of the same logits, parameters, seed and position
// (the server's CPU backend is the oracle, the host plane's fast sampler the subject). Also the
// call's lifetime: close, half-close, cancel, a second open, drain (SIGTERM), bad opens.
#include "proto/samplerd/v1/device_session.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "tests/core/shm_test_util.h"
#include "tests/integration/integration_fixture.h"

namespace samplerd::integration {
namespace {

using Stream = grpc::ClientReaderWriter<v1::DeviceSessionRequest, v1::DeviceSessionResponse>;

constexpr uint32_t kM = 8;    // max_batch
constexpr uint32_t kV = 512;  // vocab
constexpr auto kStepBound = std::chrono::seconds(5);

// One row's parameters as the engine writes them (device_session.h).
struct RowParams {
  uint64_t seed = 0;
  uint64_t position = 0;
  float temperature = 0.0f;
  int32_t top_k = 0;
  float top_p = 1.0f;
  float min_p = 0.0f;
  int32_t top_p_mode = 0;
};

// The same parameters for unary Sample.
v1::SamplingParams ToSamplingParams(const RowParams& p) {
  v1::SamplingParams out;
  out.set_temperature(p.temperature);
  out.set_top_k(p.top_k);
  out.set_top_p(p.top_p);
  out.set_min_p(p.min_p);
  out.set_top_p_mode(p.top_p_mode == 2 ? v1::TOP_P_MODE_JOINT : v1::TOP_P_MODE_TOP_K_FIRST);
  out.set_seed(p.seed);
  out.set_position(p.position);
  return out;
}

// The buffers of one fp32 [kM, kV] session, packed in one host shm object (each at a multiple
// of 64 bytes) and registered under `name`; the engine's side of the step protocol.
class SessionBuffers {
 public:
  static constexpr uint64_t kControl = 0;
  static constexpr uint64_t kLogits = 256;
  static constexpr uint64_t kParams = kLogits + uint64_t{kM} * kV * 4;
  static constexpr uint64_t kTokens = kParams + (36 * kM + 63) / 64 * 64;
  static constexpr uint64_t kStatus = kTokens + 64;
  static constexpr uint64_t kLogprobs = kStatus + 64;
  static constexpr uint64_t kBytes = kLogprobs + 64;
  static_assert(4 * kM <= 64, "outputs fit their 64-byte slots");

  SessionBuffers(Client* client, const std::string& name) : shm_(kBytes, 0600, name), name_(name) {
    if (!shm_.ok()) return;
    std::memset(shm_.data(), 0, kBytes);
    registered_ = client->RegisterHostShm(name, shm_.key(), 0, kBytes).ok();
  }

  bool ok() const { return shm_.ok() && registered_; }

  v1::DeviceSessionOpen Open() const {
    v1::DeviceSessionOpen open;
    open.set_dtype(v1::DTYPE_FP32);
    open.set_max_batch(kM);
    open.set_vocab(kV);
    Slice(open.mutable_control(), kControl);
    Slice(open.mutable_logits(), kLogits);
    Slice(open.mutable_params(), kParams);
    Slice(open.mutable_token_ids(), kTokens);
    Slice(open.mutable_row_status(), kStatus);
    Slice(open.mutable_sampled_logprobs(), kLogprobs);
    return open;
  }

  float* logits_row(uint32_t row) { return At<float>(kLogits) + uint64_t{row} * kV; }

  void SetParams(uint32_t row, const RowParams& p) {
    uint8_t* params = shm_.data() + kParams;
    std::memcpy(params + samplerd_params_seed_offset(kM) + 8 * row, &p.seed, 8);
    std::memcpy(params + samplerd_params_position_offset(kM) + 8 * row, &p.position, 8);
    std::memcpy(params + samplerd_params_temperature_offset(kM) + 4 * row, &p.temperature, 4);
    std::memcpy(params + samplerd_params_top_k_offset(kM) + 4 * row, &p.top_k, 4);
    std::memcpy(params + samplerd_params_top_p_offset(kM) + 4 * row, &p.top_p, 4);
    std::memcpy(params + samplerd_params_min_p_offset(kM) + 4 * row, &p.min_p, 4);
    std::memcpy(params + samplerd_params_top_p_mode_offset(kM) + 4 * row, &p.top_p_mode, 4);
  }

  // One step of `batch` rows: ring, wait for done (bounded), reset it. Returns the step
  // status, or -1 when done did not come within kStepBound.
  int Step(uint32_t batch) {
    __atomic_store_n(Word(SAMPLERD_CONTROL_BATCH), batch, __ATOMIC_RELAXED);
    __atomic_store_n(Word(SAMPLERD_CONTROL_DOORBELL), SAMPLERD_RING, __ATOMIC_RELEASE);
    if (!WaitDone()) return -1;
    __atomic_store_n(Word(SAMPLERD_CONTROL_DONE), 0u, __ATOMIC_RELAXED);
    return static_cast<int>(StepStatus());
  }

  // Waits (bounded) until done == SAMPLERD_DONE, without resetting it.
  bool WaitDone() {
    const auto deadline = std::chrono::steady_clock::now() + kStepBound;
    while (__atomic_load_n(Word(SAMPLERD_CONTROL_DONE), __ATOMIC_ACQUIRE) != SAMPLERD_DONE) {
      if (std::chrono::steady_clock::now() > deadline) return false;
      std::this_thread::yield();
    }
    return true;
  }

  uint32_t Done() { return __atomic_load_n(Word(SAMPLERD_CONTROL_DONE), __ATOMIC_ACQUIRE); }
  uint32_t StepStatus() {
    return __atomic_load_n(Word(SAMPLERD_CONTROL_STEP_STATUS), __ATOMIC_ACQUIRE);
  }
  int32_t token(uint32_t row) { return At<int32_t>(kTokens)[row]; }
  int32_t status(uint32_t row) { return At<int32_t>(kStatus)[row]; }
  float logprob(uint32_t row) { return At<float>(kLogprobs)[row]; }

 private:
  template <typename T>
  T* At(uint64_t offset) {
    return reinterpret_cast<T*>(shm_.data() + offset);
  }
  uint32_t* Word(uint32_t offset) { return At<uint32_t>(kControl + offset); }
  void Slice(v1::RegionSlice* slice, uint64_t offset) const {
    slice->set_region(name_);
    slice->set_offset(offset);
  }

  core::TestShm shm_;
  std::string name_;
  bool registered_ = false;
};

// A DeviceSession call: opened, or ended with `status`.
struct Call {
  grpc::ClientContext context;
  std::unique_ptr<Stream> stream;
  v1::DeviceSessionOpened opened;
  bool is_open = false;
  grpc::Status status;  // when !is_open: how the call ended
};

// Sends `open` and reads the answer.
std::unique_ptr<Call> OpenSession(Client* client, const v1::DeviceSessionOpen& open) {
  auto call = std::make_unique<Call>();
  call->stream = client->stub()->DeviceSession(&call->context);
  v1::DeviceSessionRequest request;
  *request.mutable_open() = open;
  v1::DeviceSessionResponse response;
  if (call->stream->Write(request) && call->stream->Read(&response) && response.has_opened()) {
    call->opened = response.opened();
    call->is_open = true;
    return call;
  }
  call->status = call->stream->Finish();
  return call;
}

// Sends close; returns the `closed` step count (or -1) and the call's status in *status.
int64_t CloseSession(Call* call, grpc::Status* status) {
  v1::DeviceSessionRequest request;
  request.mutable_close();
  v1::DeviceSessionResponse response;
  int64_t steps = -1;
  if (call->stream->Write(request) && call->stream->Read(&response) && response.has_closed()) {
    steps = static_cast<int64_t>(response.closed().steps());
  }
  call->stream->WritesDone();
  *status = call->stream->Finish();
  return steps;
}

class DeviceSessions : public ServerSuite {
 protected:
  static void SetUpTestSuite() {
    ServerProcess::Options options = CpuServerOptions();
    options.extra_args.push_back("--max_device_sessions=2");
    options.extra_args.push_back("--host_plane_threads=1");
    StartServer(options);
  }

  int32_t OpenSessions() {
    v1::GetServerInfoResponse info;
    if (!client_->GetServerInfo(&info).ok()) return -1;
    return info.device_sessions().open_sessions();
  }

  // Polls GetServerInfo until no session is open (bounded: 5 s); the server ends a session
  // asynchronously after the call's end reaches it.
  bool WaitForNoSessions() {
    const auto deadline = std::chrono::steady_clock::now() + kStepBound;
    while (std::chrono::steady_clock::now() < deadline) {
      if (OpenSessions() == 0) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }

  void TearDown() override {
    EXPECT_TRUE(WaitForNoSessions()) << "a session outlived its test";
    ServerSuite::TearDown();
  }
};

TEST_F(DeviceSessions, ServerInfoReportsTheHostPlaneAndTheSessionLimit) {
  v1::GetServerInfoResponse info;
  ASSERT_TRUE(client_->GetServerInfo(&info).ok());
  EXPECT_TRUE(info.device_sessions().host_plane());
  EXPECT_FALSE(info.device_sessions().gpu_plane());
  EXPECT_EQ(info.device_sessions().open_sessions(), 0);
  EXPECT_EQ(info.limits().max_device_sessions(), 2);
}

TEST_F(DeviceSessions, HostPlaneStepsGiveTheTokensOfUnarySample) {
  SessionBuffers buffers(client_.get(), "steps");
  ASSERT_TRUE(buffers.ok());
  std::unique_ptr<Call> call = OpenSession(client_.get(), buffers.Open());
  ASSERT_TRUE(call->is_open) << call->status.error_message();
  EXPECT_EQ(call->opened.plane(), v1::DEVICE_PLANE_HOST);
  EXPECT_EQ(call->opened.device(), "");
  EXPECT_FALSE(call->opened.session_id().empty());
  EXPECT_EQ(OpenSessions(), 1);

  constexpr int kSteps = 300;
  int greedy_rows = 0;
  int seeded_rows = 0;
  int seeded_mismatches = 0;
  for (int step = 0; step < kSteps; ++step) {
    const uint32_t batch = 1 + static_cast<uint32_t>(step * 5 + step / 7) % kM;
    const Logits logits = RandomLogits(batch, kV, 1000 + static_cast<uint32_t>(step));
    std::vector<v1::SamplingParams> oracle_params;
    for (uint32_t row = 0; row < batch; ++row) {
      std::memcpy(buffers.logits_row(row), logits.values.data() + uint64_t{row} * kV, kV * 4);
      RowParams p;
      p.seed = 0x5eed0000u + static_cast<uint64_t>(step) * 131 + row;
      p.position = static_cast<uint64_t>(step);
      switch ((static_cast<uint32_t>(step) + row) % 5) {
        case 0:  // greedy
          p.temperature = 0.0f;
          break;
        case 1:  // plain seeded draw
          p.temperature = 1.0f;
          break;
        case 2:  // the benchmark setting
          p.temperature = 0.8f;
          p.top_k = 50;
          p.top_p = 0.9f;
          break;
        case 3:
          p.temperature = 1.2f;
          p.min_p = 0.05f;
          p.top_k = -1;
          break;
        default:  // joint top-p
          p.temperature = 0.7f;
          p.top_p = 0.5f;
          p.top_p_mode = 2;
          break;
      }
      buffers.SetParams(row, p);
      oracle_params.push_back(ToSamplingParams(p));
    }
    ASSERT_EQ(buffers.Step(batch), static_cast<int>(SAMPLERD_STEP_OK)) << "step " << step;

    v1::SampleRequest request = logits.Request(oracle_params);
    request.mutable_logprobs()->set_top_n(0);
    v1::SampleResponse expected;
    ASSERT_TRUE(client_->Sample(request, &expected).ok());
    for (uint32_t row = 0; row < batch; ++row) {
      ASSERT_EQ(buffers.status(row), SAMPLERD_ROW_OK) << "step " << step << " row " << row;
      const bool greedy = oracle_params[row].temperature() == 0.0f;
      if (greedy) {
        ++greedy_rows;
        ASSERT_EQ(buffers.token(row), expected.token_ids(static_cast<int>(row)))
            << "greedy, step " << step << " row " << row;
      } else {
        ++seeded_rows;
        if (buffers.token(row) != expected.token_ids(static_cast<int>(row))) {
          ++seeded_mismatches;
          std::cerr << "note: seeded token differs from unary Sample at step " << step << " row "
                    << row << " (allowed on near-ties, at most 0.1% of rows)\n";
          continue;
        }
      }
      // The sampled token's raw logprob, as unary Sample computes it.
      EXPECT_NEAR(buffers.logprob(row), expected.logprobs(static_cast<int>(row)).sampled_logprob(),
                  1e-3)
          << "step " << step << " row " << row;
    }
  }
  EXPECT_GT(greedy_rows, 100);
  EXPECT_GT(seeded_rows, 500);
  // Under 0.1% of the seeded rows may differ (fast sampler vs oracle on near-ties).
  EXPECT_LE(seeded_mismatches * 1000, seeded_rows);

  grpc::Status status;
  EXPECT_EQ(CloseSession(call.get(), &status), kSteps);
  EXPECT_TRUE(status.ok()) << status.error_message();
  // The server's last word on the control block: the session ended.
  EXPECT_EQ(buffers.Done(), SAMPLERD_DONE);
  EXPECT_EQ(buffers.StepStatus(), SAMPLERD_STEP_ABORTED);
}

TEST_F(DeviceSessions, AnInvalidParamsRowGetsItsOwnStatusAndLeavesItsNeighbours) {
  SessionBuffers buffers(client_.get(), "invalid");
  ASSERT_TRUE(buffers.ok());
  std::unique_ptr<Call> call = OpenSession(client_.get(), buffers.Open());
  ASSERT_TRUE(call->is_open) << call->status.error_message();

  constexpr uint32_t kBatch = 7;
  const Logits logits = RandomLogits(kBatch, kV, 77);
  std::vector<RowParams> rows(kBatch);
  for (uint32_t row = 0; row < kBatch; ++row) {
    std::memcpy(buffers.logits_row(row), logits.values.data() + uint64_t{row} * kV, kV * 4);
    rows[row].temperature = row % 2 == 0 ? 0.0f : 1.0f;
    rows[row].seed = 99 + row;
  }
  rows[1].temperature = -1.0f;  // each bad row breaks one range of SamplingParams
  rows[3].top_k = -2;
  rows[4].top_p = 0.0f;
  rows[5].min_p = 1.5f;
  rows[6].top_p_mode = 3;
  for (uint32_t row = 0; row < kBatch; ++row) buffers.SetParams(row, rows[row]);
  ASSERT_EQ(buffers.Step(kBatch), static_cast<int>(SAMPLERD_STEP_OK));

  for (uint32_t row : {1u, 3u, 4u, 5u, 6u}) {
    EXPECT_EQ(buffers.status(row), SAMPLERD_ROW_INVALID_PARAMS) << "row " << row;
    EXPECT_EQ(buffers.token(row), -1) << "row " << row;
    EXPECT_EQ(buffers.logprob(row), -std::numeric_limits<float>::infinity()) << "row " << row;
  }
  // Rows 0 and 2 (greedy) are what unary Sample says.
  v1::SampleResponse expected;
  ASSERT_TRUE(client_->Sample(logits.Request({Greedy()}), &expected).ok());
  for (uint32_t row : {0u, 2u}) {
    EXPECT_EQ(buffers.status(row), SAMPLERD_ROW_OK) << "row " << row;
    EXPECT_EQ(buffers.token(row), expected.token_ids(static_cast<int>(row))) << "row " << row;
  }
  grpc::Status status;
  EXPECT_EQ(CloseSession(call.get(), &status), 1);
  EXPECT_TRUE(status.ok());
}

TEST_F(DeviceSessions, ABatchOfZeroOrOverMaxBatchIsABadBatchStepAndTheSessionGoesOn) {
  SessionBuffers buffers(client_.get(), "badbatch");
  ASSERT_TRUE(buffers.ok());
  std::unique_ptr<Call> call = OpenSession(client_.get(), buffers.Open());
  ASSERT_TRUE(call->is_open) << call->status.error_message();
  EXPECT_EQ(buffers.Step(0), static_cast<int>(SAMPLERD_STEP_BAD_BATCH));
  EXPECT_EQ(buffers.Step(kM + 1), static_cast<int>(SAMPLERD_STEP_BAD_BATCH));
  // A good step afterwards.
  const Logits logits = RandomLogits(1, kV, 5);
  std::memcpy(buffers.logits_row(0), logits.values.data(), kV * 4);
  buffers.SetParams(0, RowParams{});
  ASSERT_EQ(buffers.Step(1), static_cast<int>(SAMPLERD_STEP_OK));
  v1::SampleResponse expected;
  ASSERT_TRUE(client_->Sample(logits.Request({Greedy()}), &expected).ok());
  EXPECT_EQ(buffers.token(0), expected.token_ids(0));
  grpc::Status status;
  EXPECT_EQ(CloseSession(call.get(), &status), 3);
  EXPECT_TRUE(status.ok());
}

TEST_F(DeviceSessions, ASecondOpenOnTheSameControlBlockIsAlreadyExists) {
  SessionBuffers buffers(client_.get(), "twice");
  ASSERT_TRUE(buffers.ok());
  std::unique_ptr<Call> first = OpenSession(client_.get(), buffers.Open());
  ASSERT_TRUE(first->is_open) << first->status.error_message();
  std::unique_ptr<Call> second = OpenSession(client_.get(), buffers.Open());
  ASSERT_FALSE(second->is_open);
  EXPECT_EQ(second->status.error_code(), grpc::StatusCode::ALREADY_EXISTS);
  EXPECT_TRUE(MentionsAny(second->status.error_message(), {"control block"}));
  grpc::Status status;
  EXPECT_EQ(CloseSession(first.get(), &status), 0);
  EXPECT_TRUE(status.ok());
}

TEST_F(DeviceSessions, OneOpenOverMaxDeviceSessionsIsResourceExhausted) {
  SessionBuffers a(client_.get(), "limit-a");
  SessionBuffers b(client_.get(), "limit-b");
  SessionBuffers c(client_.get(), "limit-c");
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  std::unique_ptr<Call> first = OpenSession(client_.get(), a.Open());
  std::unique_ptr<Call> second = OpenSession(client_.get(), b.Open());
  ASSERT_TRUE(first->is_open && second->is_open);
  std::unique_ptr<Call> third = OpenSession(client_.get(), c.Open());
  ASSERT_FALSE(third->is_open);
  EXPECT_EQ(third->status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_TRUE(MentionsAny(third->status.error_message(), {"--max_device_sessions"}));
  grpc::Status status;
  CloseSession(first.get(), &status);
  EXPECT_TRUE(status.ok());
  // A slot is free again.
  std::unique_ptr<Call> again = OpenSession(client_.get(), c.Open());
  EXPECT_TRUE(again->is_open) << again->status.error_message();
  if (again->is_open) CloseSession(again.get(), &status);
  CloseSession(second.get(), &status);
}

TEST_F(DeviceSessions, HalfClosingEndsTheSessionWithClosedAndOk) {
  SessionBuffers buffers(client_.get(), "halfclose");
  ASSERT_TRUE(buffers.ok());
  std::unique_ptr<Call> call = OpenSession(client_.get(), buffers.Open());
  ASSERT_TRUE(call->is_open) << call->status.error_message();
  ASSERT_EQ(buffers.Step(0), static_cast<int>(SAMPLERD_STEP_BAD_BATCH));  // one (empty) step
  call->stream->WritesDone();
  v1::DeviceSessionResponse response;
  ASSERT_TRUE(call->stream->Read(&response));
  ASSERT_TRUE(response.has_closed());
  EXPECT_EQ(response.closed().steps(), 1u);
  EXPECT_TRUE(call->stream->Finish().ok());
  EXPECT_EQ(buffers.StepStatus(), SAMPLERD_STEP_ABORTED);
}

TEST_F(DeviceSessions, CancellingTheCallEndsTheSessionAndReleasesTheEngineWait) {
  SessionBuffers buffers(client_.get(), "cancel");
  ASSERT_TRUE(buffers.ok());
  std::unique_ptr<Call> call = OpenSession(client_.get(), buffers.Open());
  ASSERT_TRUE(call->is_open) << call->status.error_message();
  ASSERT_EQ(OpenSessions(), 1);
  call->context.TryCancel();
  EXPECT_EQ(call->stream->Finish().error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_TRUE(WaitForNoSessions());
  // The wait an engine would have pending completes, with ABORTED.
  EXPECT_TRUE(buffers.WaitDone());
  EXPECT_EQ(buffers.StepStatus(), SAMPLERD_STEP_ABORTED);
}

TEST_F(DeviceSessions, ASecondOpenOnTheCallEndsItInvalidArgument) {
  SessionBuffers buffers(client_.get(), "reopen");
  ASSERT_TRUE(buffers.ok());
  std::unique_ptr<Call> call = OpenSession(client_.get(), buffers.Open());
  ASSERT_TRUE(call->is_open) << call->status.error_message();
  v1::DeviceSessionRequest request;
  *request.mutable_open() = buffers.Open();
  ASSERT_TRUE(call->stream->Write(request));
  v1::DeviceSessionResponse response;
  EXPECT_FALSE(call->stream->Read(&response));
  const grpc::Status status = call->stream->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(MentionsAny(status.error_message(), {"second open"}));
  EXPECT_EQ(OpenSessions(), 0);  // closed before the call ended
}

TEST_F(DeviceSessions, TheFirstMessageMustBeOpen) {
  grpc::ClientContext context;
  std::unique_ptr<Stream> stream = client_->stub()->DeviceSession(&context);
  v1::DeviceSessionRequest request;
  request.mutable_close();
  ASSERT_TRUE(stream->Write(request));
  v1::DeviceSessionResponse response;
  EXPECT_FALSE(stream->Read(&response));
  const grpc::Status status = stream->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(status.error_message(),
            "expected the first DeviceSession message to set open, got close");
}

TEST_F(DeviceSessions, TheGpuPlaneOnThisCpuServerIsFailedPrecondition) {
  SessionBuffers buffers(client_.get(), "gpuplane");
  ASSERT_TRUE(buffers.ok());
  v1::DeviceSessionOpen open = buffers.Open();
  open.set_plane(v1::DEVICE_PLANE_GPU);
  std::unique_ptr<Call> call = OpenSession(client_.get(), open);
  ASSERT_FALSE(call->is_open);
  EXPECT_EQ(call->status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_TRUE(MentionsAny(call->status.error_message(), {"samples on the CPU"}));
}

TEST_F(DeviceSessions, ASliceTooSmallIsOutOfRangeAndAnUnknownRegionNotFound) {
  SessionBuffers buffers(client_.get(), "small");
  ASSERT_TRUE(buffers.ok());
  v1::DeviceSessionOpen open = buffers.Open();
  open.set_max_batch(kM * 4);  // the logits slice is far too small now
  std::unique_ptr<Call> call = OpenSession(client_.get(), open);
  ASSERT_FALSE(call->is_open);
  EXPECT_EQ(call->status.error_code(), grpc::StatusCode::OUT_OF_RANGE);
  EXPECT_TRUE(MentionsAny(call->status.error_message(), {"DeviceSessionOpen.logits"}));
  open = buffers.Open();
  open.mutable_params()->set_region("unknown");
  call = OpenSession(client_.get(), open);
  ASSERT_FALSE(call->is_open);
  EXPECT_EQ(call->status.error_code(), grpc::StatusCode::NOT_FOUND);
}

// ---- With a server of their own --------------------------------------------------------------

TEST(DeviceSessionDrain, SigtermEndsAnOpenSessionUnavailableAndAbortsTheEngineWait) {
  std::string error;
  std::unique_ptr<ServerProcess> server = ServerProcess::Start(CpuServerOptions(), &error);
  ASSERT_NE(server, nullptr) << error;
  auto client = std::make_unique<Client>(server->target());
  SessionBuffers buffers(client.get(), "drain");
  ASSERT_TRUE(buffers.ok());
  std::unique_ptr<Call> call = OpenSession(client.get(), buffers.Open());
  ASSERT_TRUE(call->is_open) << call->status.error_message();
  ASSERT_EQ(buffers.Step(0), static_cast<int>(SAMPLERD_STEP_BAD_BATCH));  // done is 0 again

  ASSERT_EQ(kill(server->pid(), SIGTERM), 0);
  v1::DeviceSessionResponse response;
  EXPECT_FALSE(call->stream->Read(&response));  // the call ends: no `closed`
  const grpc::Status status = call->stream->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
  EXPECT_TRUE(buffers.WaitDone());
  EXPECT_EQ(buffers.StepStatus(), SAMPLERD_STEP_ABORTED);
  // The client goes first: a sync client notices the server's GOAWAY only within 5 s.
  call.reset();
  client.reset();
  EXPECT_EQ(server->Stop(), 0) << server->Log();
}

TEST(DeviceSessionPeers, OverTcpWithoutAllowRemoteRegionsItIsPermissionDenied) {
  const int port = PickFreeTcpPort();
  ASSERT_GT(port, 0);
  ServerProcess::Options options = CpuServerOptions();
  options.listen = "127.0.0.1:" + std::to_string(port);
  std::string error;
  std::unique_ptr<ServerProcess> server = ServerProcess::Start(options, &error);
  ASSERT_NE(server, nullptr) << error;
  {
    Client client(server->target());
    v1::DeviceSessionOpen open;
    open.set_dtype(v1::DTYPE_FP32);
    std::unique_ptr<Call> call = OpenSession(&client, open);
    ASSERT_FALSE(call->is_open);
    EXPECT_EQ(call->status.error_code(), grpc::StatusCode::PERMISSION_DENIED);
    EXPECT_TRUE(MentionsAny(call->status.error_message(), {"allow_remote_regions"}));
  }
  EXPECT_EQ(server->Stop(), 0) << server->Log();
}

}  // namespace
}  // namespace samplerd::integration
