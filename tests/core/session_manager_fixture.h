// The shared fixture of the SessionManager tests (session_manager_host_test.cc,
// session_manager_gpu_test.cc): fake runners that record the spec they get, a packed layout of a
// session's buffers, opens over it, a status matcher, and HostSessions, a manager over a real
// RegionRegistry holding a host shm region "host" (and, for GpuSessions, a fake GpuIpc).
#ifndef SAMPLERD_TESTS_CORE_SESSION_MANAGER_FIXTURE_H_
#define SAMPLERD_TESTS_CORE_SESSION_MANAGER_FIXTURE_H_

#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/samplerd/v1/device_session.h"
#include "service/core/session/session_manager.h"
#include "tests/core/fake_gpu_ipc.h"
#include "tests/core/shm_test_util.h"

namespace samplerd::core {

inline const DeviceInfo kCpu{0, "", "cpu", "CPU", false, false};
inline const DeviceInfo kGpu{0, "0000:3b:00.0", "GPU-0b5c6a1e", "Fake GPU", true, true};

// What the fake runners saw and did, shared with the test.
struct Recorder {
  std::atomic<int> started{0};
  std::atomic<int> stops{0};
  std::atomic<int> destroyed{0};
  SessionSpec last;                     // the last spec's fields (not its leases)
  PlaneRunner::FaultCallback on_fault;  // the last runner's
  absl::Status fail_start;              // returned by the factory when not OK
};

class FakeRunner : public PlaneRunner {
 public:
  explicit FakeRunner(Recorder* recorder, SessionSpec spec)
      : recorder_(recorder), spec_(std::move(spec)) {}
  ~FakeRunner() override { ++recorder_->destroyed; }
  void Stop() override {
    if (!stopped_.exchange(true)) ++recorder_->stops;
  }
  uint64_t steps() const override { return 42; }

 private:
  Recorder* recorder_;
  SessionSpec spec_;  // holds the leases, as a real runner does
  std::atomic<bool> stopped_{false};
};

inline RunnerFactory FakeFactory(Recorder* recorder) {
  return [recorder](
             SessionSpec spec,
             PlaneRunner::FaultCallback on_fault) -> absl::StatusOr<std::unique_ptr<PlaneRunner>> {
    if (!recorder->fail_start.ok()) return recorder->fail_start;
    ++recorder->started;
    SessionSpec& last = recorder->last;
    last.id = spec.id;
    last.plane = spec.plane;
    last.device_ordinal = spec.device_ordinal;
    last.dtype = spec.dtype;
    last.max_batch = spec.max_batch;
    last.vocab = spec.vocab;
    last.row_stride = spec.row_stride;
    last.logprob_source = spec.logprob_source;
    last.control = spec.control;
    last.logits = spec.logits;
    last.params = spec.params;
    last.token_ids = spec.token_ids;
    last.row_status = spec.row_status;
    last.sampled_logprobs = spec.sampled_logprobs;
    last.token_bitmask = spec.token_bitmask;
    last.processors = spec.processors;
    last.logit_bias_capacity = spec.logit_bias_capacity;
    last.token_history_capacity = spec.token_history_capacity;
    recorder->on_fault = std::move(on_fault);
    return std::make_unique<FakeRunner>(recorder, std::move(spec));
  };
}

// Entries of the processors buffer of the packed layout (logit bias, token history).
inline constexpr uint32_t kBiasCapacity = 16;
inline constexpr uint32_t kHistoryCapacity = 24;

// Byte offsets of a session's buffers packed in one region, each aligned to 64 (the optional
// token_bitmask and processors last, for WithProcessors).
struct Layout {
  uint64_t control, logits, params, token_ids, row_status, logprobs, bitmask, processors, total;
};

inline Layout Pack(uint32_t m, uint64_t stride, uint64_t elem) {
  uint64_t at = 0;
  const auto take = [&](uint64_t bytes) {
    at = (at + 63) / 64 * 64;
    const uint64_t offset = at;
    at += bytes;
    return offset;
  };
  Layout l;
  l.control = take(256);
  l.logits = take(m * stride * elem);
  l.params = take(36ull * m);
  l.token_ids = take(4ull * m);
  l.row_status = take(4ull * m);
  l.logprobs = take(4ull * m);
  l.bitmask = take(samplerd_bitmask_bytes(m, static_cast<uint32_t>(stride)));
  l.processors = take(samplerd_processors_bytes(m, kBiasCapacity, kHistoryCapacity));
  l.total = (at + 63) / 64 * 64;  // a second layout may follow at total + 64
  return l;
}

inline constexpr uint32_t kM = 8;
inline constexpr uint32_t kV = 100;
// The bytes a host-plane session of OpenIn's shape reserves (HostSessionBytes): kM x kV fp32.
inline constexpr int64_t kHostBytes = int64_t{kM} * kV * 4;

// An fp32 open of [kM, kV] whose buffers are packed in `region` (at `base` within it).
inline SessionOpen OpenIn(const std::string& region, uint64_t base = 0) {
  const Layout l = Pack(kM, kV, 4);
  SessionOpen open;
  open.dtype = 1;
  open.max_batch = kM;
  open.vocab = kV;
  open.control = {region, base + l.control};
  open.logits = {region, base + l.logits};
  open.params = {region, base + l.params};
  open.token_ids = {region, base + l.token_ids};
  open.row_status = {region, base + l.row_status};
  open.sampled_logprobs = {region, base + l.logprobs};
  return open;
}

// `open` (made by OpenIn(region, base)) with the packed token_bitmask and processors buffers.
inline SessionOpen WithProcessors(SessionOpen open, uint64_t base = 0) {
  const Layout l = Pack(kM, kV, 4);
  open.token_bitmask = {open.logits.region, base + l.bitmask};
  open.processors = {open.logits.region, base + l.processors};
  open.logit_bias_capacity = kBiasCapacity;
  open.token_history_capacity = kHistoryCapacity;
  return open;
}

// Success when `result` failed with `code` and a message containing `substring`.
template <typename T>
::testing::AssertionResult HasStatus(const absl::StatusOr<T>& result, absl::StatusCode code,
                                     absl::string_view substring) {
  if (!result.ok() && result.status().code() == code &&
      result.status().message().find(substring) != absl::string_view::npos) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure()
         << "expected code " << absl::StatusCodeToString(code) << " and a message containing \""
         << substring << "\", got " << (result.ok() ? "OK" : result.status().ToString());
}

// A SessionManager on a CPU server (at most 2 sessions, fake runners) over a registry holding
// the host shm region "host", room for two packed layouts.
class HostSessions : public ::testing::Test {
 protected:
  HostSessions() : shm_(2 * Pack(kM, kV, 4).total + 4096) {}

  void SetUp() override {
    ASSERT_TRUE(shm_.ok());
    ASSERT_TRUE(regions_.RegisterHostShm("host", shm_.key(), 0, shm_.size()).ok());
    manager_ = MakeManager(kCpu, BackendKind::kCpu, 2);
  }

  // `max_list_bytes`: Limits::max_region_list_bytes (--max_message_bytes), which bounds the
  // processors buffer. `max_host_bytes`: DeviceSessionOptions::max_host_session_bytes
  // (--max_host_session_bytes).
  std::unique_ptr<SessionManager> MakeManager(
      const DeviceInfo& device, BackendKind backend, int max_sessions,
      int64_t max_list_bytes = Limits{}.max_region_list_bytes,
      int64_t max_host_bytes = DeviceSessionOptions{}.max_host_session_bytes) {
    Limits limits;
    limits.max_batch = 64;
    limits.max_vocab = 1000;
    limits.max_region_list_bytes = max_list_bytes;
    DeviceSessionOptions options;
    options.max_sessions = max_sessions;
    options.max_host_session_bytes = max_host_bytes;
    return std::make_unique<SessionManager>(&regions_, backend, device, limits, options,
                                            FakeFactory(&recorder_));
  }

  absl::StatusOr<OpenedSession> Open(const SessionOpen& open) {
    return manager_->Open(open, nullptr);
  }

  TestShm shm_;
  // GPU IPC regions (GpuSessions): fake device memory of "gpu" (device 0) and "other_gpu"
  // (device 1), exported through a fake GpuIpc.
  std::vector<uint8_t> memory_[2];
  FakeGpuIpc ipc_;
  RegionRegistry regions_{
      RegionOptions{},
      &ipc_,
      {IpcDevice{0, "0000:3b:00.0", "GPU-0b5c6a1e"}, IpcDevice{1, "0000:5e:00.0", "GPU-5e5e5e5e"}}};
  Recorder recorder_;
  std::unique_ptr<SessionManager> manager_;
};

}  // namespace samplerd::core

#endif  // SAMPLERD_TESTS_CORE_SESSION_MANAGER_FIXTURE_H_
