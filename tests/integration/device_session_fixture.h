// The shared part of the DeviceSession integration tests (device_session_test.cc: the host
// plane's steps; device_session_lifetime_test.cc: the call's lifetime and bad opens): the engine's
// side of the step protocol over one host shm object (SessionBuffers), opening and closing a call
// over the generated stub, and the DeviceSessions suite (one CPU server with
// --max_device_sessions=2). The fixture lives in a named namespace so that both files' tests are
// one suite.
#ifndef SAMPLERD_TESTS_INTEGRATION_DEVICE_SESSION_FIXTURE_H_
#define SAMPLERD_TESTS_INTEGRATION_DEVICE_SESSION_FIXTURE_H_

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <thread>

#include "proto/samplerd/v1/device_session.h"
#include "tests/core/shm_test_util.h"
#include "tests/integration/integration_fixture.h"

namespace samplerd::integration {

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
inline v1::SamplingParams ToSamplingParams(const RowParams& p) {
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
inline std::unique_ptr<Call> OpenSession(Client* client, const v1::DeviceSessionOpen& open) {
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
inline int64_t CloseSession(Call* call, grpc::Status* status) {
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

}  // namespace samplerd::integration

#endif  // SAMPLERD_TESTS_INTEGRATION_DEVICE_SESSION_FIXTURE_H_
