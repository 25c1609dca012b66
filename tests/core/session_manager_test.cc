// SessionManager: every bad open with its exact code and message, over a real RegionRegistry
// (host shm objects, and GPU IPC regions through a fake GpuIpc); the spec a runner gets; close,
// close all, the session count and a runner's fault, with a fake runner factory. Also UnderMps'
// pipe check.
#include "service/core/session/session_manager.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "service/core/mps.h"
#include "tests/core/fake_gpu_ipc.h"
#include "tests/core/shm_test_util.h"

namespace samplerd::core {
namespace {

const DeviceInfo kCpu{0, "", "cpu", "CPU", false, false};
const DeviceInfo kGpu{0, "0000:3b:00.0", "GPU-0b5c6a1e", "Fake GPU", true, true};

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

RunnerFactory FakeFactory(Recorder* recorder) {
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
    recorder->on_fault = std::move(on_fault);
    return std::make_unique<FakeRunner>(recorder, std::move(spec));
  };
}

// Byte offsets of a session's buffers packed in one region, each aligned to 64.
struct Layout {
  uint64_t control, logits, params, token_ids, row_status, logprobs, total;
};

Layout Pack(uint32_t m, uint64_t stride, uint64_t elem) {
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
  l.total = (at + 63) / 64 * 64;  // a second layout may follow at total + 64
  return l;
}

constexpr uint32_t kM = 8;
constexpr uint32_t kV = 100;

// An fp32 open of [kM, kV] whose buffers are packed in `region` (at `base` within it).
SessionOpen OpenIn(const std::string& region, uint64_t base = 0) {
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

// A GPU-plane open: the control block in host shm region "host" (both planes poll it on the
// host), the data buffers in GPU IPC region `region`.
SessionOpen GpuOpen(const std::string& region) {
  SessionOpen open = OpenIn(region);
  open.control = OpenIn("host").control;
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

// ---- Host plane, CPU backend --------------------------------------------------------------

class HostSessions : public ::testing::Test {
 protected:
  HostSessions() : shm_(2 * Pack(kM, kV, 4).total + 4096) {}

  void SetUp() override {
    ASSERT_TRUE(shm_.ok());
    ASSERT_TRUE(regions_.RegisterHostShm("host", shm_.key(), 0, shm_.size()).ok());
    manager_ = MakeManager(kCpu, BackendKind::kCpu, 2);
  }

  std::unique_ptr<SessionManager> MakeManager(const DeviceInfo& device, BackendKind backend,
                                              int max_sessions) {
    Limits limits;
    limits.max_batch = 64;
    limits.max_vocab = 1000;
    DeviceSessionOptions options;
    options.max_sessions = max_sessions;
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

TEST_F(HostSessions, AnOpenStartsAHostPlaneRunnerOnTheResolvedBuffers) {
  absl::StatusOr<OpenedSession> opened = Open(OpenIn("host"));
  ASSERT_TRUE(opened.ok()) << opened.status();
  EXPECT_EQ(opened->plane, SessionPlane::kHost);
  EXPECT_EQ(opened->device, "");
  EXPECT_FALSE(opened->id.empty());
  EXPECT_EQ(manager_->open_count(), 1);

  const Layout l = Pack(kM, kV, 4);
  const SessionSpec& spec = recorder_.last;
  // The registry's own mapping of the object.
  uint8_t* const base = regions_.Acquire("host", 0, 1)->view().data;
  EXPECT_EQ(spec.id, opened->id);
  EXPECT_EQ(spec.plane, SessionPlane::kHost);
  EXPECT_EQ(spec.dtype, kernels::DType::kFp32);
  EXPECT_EQ(spec.max_batch, kM);
  EXPECT_EQ(spec.vocab, kV);
  EXPECT_EQ(spec.row_stride, kV);  // 0 means V
  EXPECT_EQ(spec.logprob_source, kernels::LogprobSource::kRaw);
  EXPECT_EQ(spec.control, base + l.control);
  EXPECT_EQ(spec.logits, base + l.logits);
  EXPECT_EQ(spec.params, base + l.params);
  EXPECT_EQ(reinterpret_cast<uint8_t*>(spec.token_ids), base + l.token_ids);
  EXPECT_EQ(reinterpret_cast<uint8_t*>(spec.row_status), base + l.row_status);
  EXPECT_EQ(reinterpret_cast<uint8_t*>(spec.sampled_logprobs), base + l.logprobs);
}

TEST_F(HostSessions, SampledLogprobsAreOptionalAndTheSourceIsPassedOn) {
  SessionOpen open = OpenIn("host");
  open.sampled_logprobs = {};
  open.logprob_source = 2;
  ASSERT_TRUE(Open(open).ok());
  EXPECT_EQ(recorder_.last.sampled_logprobs, nullptr);
  EXPECT_EQ(recorder_.last.logprob_source, kernels::LogprobSource::kProcessed);
}

TEST_F(HostSessions, AnUnsetOrUnknownDtypeIsInvalidArgument) {
  SessionOpen open = OpenIn("host");
  open.dtype = 0;
  EXPECT_TRUE(HasStatus(Open(open), absl::StatusCode::kInvalidArgument,
                        "expected DeviceSessionOpen.dtype DTYPE_FP32, DTYPE_FP16 or "
                        "DTYPE_BF16, got DTYPE_UNSPECIFIED"));
  open.dtype = 9;
  EXPECT_TRUE(HasStatus(Open(open), absl::StatusCode::kInvalidArgument, "got the unknown value 9"));
  EXPECT_EQ(recorder_.started, 0);
}

TEST_F(HostSessions, ZeroMaxBatchOrVocabIsInvalidArgument) {
  SessionOpen open = OpenIn("host");
  open.max_batch = 0;
  EXPECT_TRUE(HasStatus(Open(open), absl::StatusCode::kInvalidArgument,
                        "expected DeviceSessionOpen.max_batch >= 1, got 0"));
  open = OpenIn("host");
  open.vocab = 0;
  EXPECT_TRUE(HasStatus(Open(open), absl::StatusCode::kInvalidArgument,
                        "expected DeviceSessionOpen.vocab >= 1, got 0"));
}

TEST_F(HostSessions, MaxBatchOrVocabOverTheLimitsIsResourceExhausted) {
  SessionOpen open = OpenIn("host");
  open.max_batch = 65;
  EXPECT_TRUE(HasStatus(Open(open), absl::StatusCode::kResourceExhausted,
                        "expected max_batch <= 64 (server limit), got 65"));
  open = OpenIn("host");
  open.vocab = 1001;
  EXPECT_TRUE(HasStatus(Open(open), absl::StatusCode::kResourceExhausted,
                        "expected vocabulary size V <= 1000 (server limit), got 1001"));
}

TEST_F(HostSessions, ARowStrideBelowVocabIsInvalidArgument) {
  SessionOpen open = OpenIn("host");
  open.row_stride = kV - 1;
  EXPECT_TRUE(HasStatus(Open(open), absl::StatusCode::kInvalidArgument,
                        "expected DeviceSessionOpen.row_stride 0 or >= V = 100, got 99"));
}

TEST_F(HostSessions, AMissingRequiredBufferIsInvalidArgumentNamingIt) {
  const std::vector<std::pair<SessionSlice SessionOpen::*, std::string>> required = {
      {&SessionOpen::control, "control"},       {&SessionOpen::logits, "logits"},
      {&SessionOpen::params, "params"},         {&SessionOpen::token_ids, "token_ids"},
      {&SessionOpen::row_status, "row_status"},
  };
  for (const auto& [field, name] : required) {
    SessionOpen open = OpenIn("host");
    open.*field = {};
    EXPECT_TRUE(
        HasStatus(Open(open), absl::StatusCode::kInvalidArgument,
                  "expected DeviceSessionOpen." + name + " to name a registered region, got none"));
  }
}

TEST_F(HostSessions, AnUnknownLogprobSourceOrPlaneIsInvalidArgument) {
  SessionOpen open = OpenIn("host");
  open.logprob_source = 3;
  EXPECT_TRUE(HasStatus(Open(open), absl::StatusCode::kInvalidArgument,
                        "expected DeviceSessionOpen.logprob_source 0 to 2"));
  open = OpenIn("host");
  open.plane = 3;
  EXPECT_TRUE(HasStatus(Open(open), absl::StatusCode::kInvalidArgument,
                        "expected DeviceSessionOpen.plane 0 to 2"));
}

TEST_F(HostSessions, AnUnknownRegionIsNotFoundNamingTheBuffer) {
  SessionOpen open = OpenIn("host");
  open.params.region = "nope";
  EXPECT_TRUE(HasStatus(Open(open), absl::StatusCode::kNotFound,
                        "DeviceSessionOpen.params (36 * max_batch 8 bytes): expected "
                        "a registered region, got \"nope\""));
}

TEST_F(HostSessions, ASliceTooSmallForItsBufferIsOutOfRangeWithTheBytes) {
  // Each buffer moved to the last bytes of the region, one byte short.
  const uint64_t size = shm_.size();
  const std::vector<std::tuple<SessionSlice SessionOpen::*, std::string, uint64_t>> cases = {
      {&SessionOpen::control, "control", 256},
      {&SessionOpen::logits, "logits", uint64_t{kM} * kV * 4},
      {&SessionOpen::params, "params", 36 * kM},
      {&SessionOpen::token_ids, "token_ids", 4 * kM},
      {&SessionOpen::row_status, "row_status", 4 * kM},
      {&SessionOpen::sampled_logprobs, "sampled_logprobs", 4 * kM},
  };
  for (const auto& [field, name, bytes] : cases) {
    SessionOpen open = OpenIn("host");
    (open.*field).offset = size - bytes + 1;
    EXPECT_TRUE(HasStatus(Open(open), absl::StatusCode::kOutOfRange,
                          absl::StrCat("DeviceSessionOpen.", name)))
        << name;
    EXPECT_TRUE(HasStatus(Open(open), absl::StatusCode::kOutOfRange,
                          absl::StrCat("expected ", bytes, " bytes at offset ", size - bytes + 1,
                                       ", got a region of ", size, " bytes")))
        << name;
  }
  // fp16 logits need half the bytes: the same slice that is short for fp32 fits.
  SessionOpen open = OpenIn("host");
  open.dtype = 2;
  open.logits.offset = size - uint64_t{kM} * kV * 2;
  EXPECT_TRUE(Open(open).ok());
}

TEST_F(HostSessions, AMisalignedBufferIsInvalidArgument) {
  const std::vector<std::tuple<SessionSlice SessionOpen::*, std::string, uint64_t, uint64_t>>
      cases = {
          {&SessionOpen::control, "control", 64, 32},
          {&SessionOpen::logits, "logits", 4, 2},
          {&SessionOpen::params, "params", 8, 4},
          {&SessionOpen::token_ids, "token_ids", 4, 2},
          {&SessionOpen::row_status, "row_status", 4, 1},
          {&SessionOpen::sampled_logprobs, "sampled_logprobs", 4, 3},
      };
  for (const auto& [field, name, align, shift] : cases) {
    // A second packed layout past the first, so that nothing overlaps after the shift.
    SessionOpen open = OpenIn("host");
    (open.*field).offset = Pack(kM, kV, 4).total + 64 + shift;
    EXPECT_TRUE(HasStatus(
        Open(open), absl::StatusCode::kInvalidArgument,
        absl::StrCat("expected DeviceSessionOpen.", name, " aligned to ", align, " bytes, got")))
        << name;
  }
  // fp16 logits need only 2.
  SessionOpen open = OpenIn("host");
  open.dtype = 2;
  open.logits.offset += 2;
  EXPECT_TRUE(Open(open).ok());
}

TEST_F(HostSessions, OverlappingBuffersAreInvalidArgumentNamingBoth) {
  SessionOpen open = OpenIn("host");
  open.row_status.offset = open.token_ids.offset + 4;  // shares 4 * (kM - 1) bytes
  EXPECT_TRUE(HasStatus(Open(open), absl::StatusCode::kInvalidArgument,
                        "expected buffers that do not overlap, got DeviceSessionOpen.token_ids "
                        "and DeviceSessionOpen.row_status sharing 28 bytes"));
  // The control block inside the logits.
  open = OpenIn("host");
  open.control.offset = open.logits.offset + 64;
  EXPECT_TRUE(HasStatus(Open(open), absl::StatusCode::kInvalidArgument,
                        "DeviceSessionOpen.control and DeviceSessionOpen.logits"));
}

TEST_F(HostSessions, TheGpuPlaneOnACpuServerIsFailedPrecondition) {
  SessionOpen open = OpenIn("host");
  open.plane = 1;
  EXPECT_TRUE(HasStatus(Open(open), absl::StatusCode::kFailedPrecondition,
                        "got DEVICE_PLANE_GPU, but this server samples on the CPU: use host shm "
                        "buffers (the host plane)"));
  open.plane = 2;  // asking for the host plane explicitly is fine
  EXPECT_TRUE(Open(open).ok());
}

TEST_F(HostSessions, ASecondOpenOnTheSameControlBlockIsAlreadyExists) {
  absl::StatusOr<OpenedSession> first = Open(OpenIn("host"));
  ASSERT_TRUE(first.ok());
  // Other buffers, the same control block.
  SessionOpen open = OpenIn("host", Pack(kM, kV, 4).total + 64);
  open.control = OpenIn("host").control;
  EXPECT_TRUE(HasStatus(Open(open), absl::StatusCode::kAlreadyExists, first->id));
  // Once closed, the control block is free again.
  ASSERT_TRUE(manager_->Close(first->id).ok());
  EXPECT_TRUE(Open(open).ok());
}

TEST_F(HostSessions, OneSessionOverTheMaximumIsResourceExhausted) {
  ASSERT_TRUE(Open(OpenIn("host")).ok());
  ASSERT_TRUE(Open(OpenIn("host", Pack(kM, kV, 4).total + 64)).ok());
  TestShm third(Pack(kM, kV, 4).total);
  ASSERT_TRUE(third.ok());
  ASSERT_TRUE(regions_.RegisterHostShm("third", third.key(), 0, third.size()).ok());
  EXPECT_TRUE(HasStatus(Open(OpenIn("third")), absl::StatusCode::kResourceExhausted,
                        "expected at most 2 open device sessions (--max_device_sessions), got a "
                        "request for one more"));
  EXPECT_EQ(manager_->open_count(), 2);
}

TEST_F(HostSessions, CloseStopsTheRunnerReturnsItsStepsAndFreesTheSlot) {
  absl::StatusOr<OpenedSession> opened = Open(OpenIn("host"));
  ASSERT_TRUE(opened.ok());
  absl::StatusOr<uint64_t> steps = manager_->Close(opened->id);
  ASSERT_TRUE(steps.ok());
  EXPECT_EQ(*steps, 42u);
  EXPECT_EQ(recorder_.stops, 1);
  EXPECT_EQ(recorder_.destroyed, 1);
  EXPECT_EQ(manager_->open_count(), 0);
  EXPECT_TRUE(HasStatus(manager_->Close(opened->id), absl::StatusCode::kNotFound, "has ended"));
}

TEST_F(HostSessions, CloseAllEndsEverySessionWithUnavailableAndRefusesLaterOpens) {
  std::vector<absl::Status> ended;
  std::mutex mu;
  const auto record = [&](const absl::Status& status) {
    std::lock_guard<std::mutex> lock(mu);
    ended.push_back(status);
  };
  ASSERT_TRUE(manager_->Open(OpenIn("host"), record).ok());
  ASSERT_TRUE(manager_->Open(OpenIn("host", Pack(kM, kV, 4).total + 64), record).ok());
  manager_->CloseAll();
  EXPECT_EQ(recorder_.stops, 2);
  EXPECT_EQ(recorder_.destroyed, 2);
  ASSERT_EQ(ended.size(), 2u);
  for (const absl::Status& status : ended) {
    EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
    EXPECT_NE(status.message().find("ABORTED"), absl::string_view::npos) << status;
  }
  EXPECT_EQ(manager_->open_count(), 0);
  EXPECT_TRUE(HasStatus(Open(OpenIn("host")), absl::StatusCode::kUnavailable, "shutting down"));
  manager_->CloseAll();  // idempotent
  EXPECT_EQ(ended.size(), 2u);
}

TEST_F(HostSessions, ARunnerFaultEndsItsSessionAndCallsItsEndCallback) {
  absl::Notification ended;
  absl::Status status;
  absl::StatusOr<OpenedSession> opened = manager_->Open(OpenIn("host"), [&](const absl::Status& s) {
    status = s;
    ended.Notify();
  });
  ASSERT_TRUE(opened.ok());
  // From the runner's own thread, as a real runner reports.
  std::thread runner_thread(recorder_.on_fault, absl::InternalError("device lost"));
  runner_thread.join();
  ASSERT_TRUE(ended.WaitForNotificationWithTimeout(absl::Seconds(5)));
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(status.message(), "device lost");
  EXPECT_EQ(recorder_.stops, 1);
  EXPECT_EQ(manager_->open_count(), 0);
  EXPECT_TRUE(HasStatus(manager_->Close(opened->id), absl::StatusCode::kNotFound, "has ended"));
}

TEST_F(HostSessions, OwnedRegionsAreUnregisteredWhenTheSessionEndsHoweverItEnds) {
  SessionOpen open = OpenIn("host");
  open.unregister_regions_on_end = true;
  // Ended by Close.
  absl::StatusOr<OpenedSession> opened = Open(open);
  ASSERT_TRUE(opened.ok()) << opened.status();
  EXPECT_EQ(regions_.List().size(), 1u);  // held while the session lives
  ASSERT_TRUE(manager_->Close(opened->id).ok());
  EXPECT_TRUE(regions_.List().empty());

  // Ended by a runner fault (the engine gone, say).
  ASSERT_TRUE(regions_.RegisterHostShm("host", shm_.key(), 0, shm_.size()).ok());
  absl::Notification ended;
  ASSERT_TRUE(manager_->Open(open, [&](const absl::Status&) { ended.Notify(); }).ok());
  std::thread runner_thread(recorder_.on_fault, absl::InternalError("engine gone"));
  runner_thread.join();
  ASSERT_TRUE(ended.WaitForNotificationWithTimeout(absl::Seconds(5)));
  EXPECT_TRUE(regions_.List().empty());

  // Ended by CloseAll (drain).
  ASSERT_TRUE(regions_.RegisterHostShm("host", shm_.key(), 0, shm_.size()).ok());
  ASSERT_TRUE(Open(open).ok());
  manager_->CloseAll();
  EXPECT_TRUE(regions_.List().empty());
}

TEST_F(HostSessions, RegionsStayRegisteredWithoutTheFlagOrWhenTheOpenFails) {
  absl::StatusOr<OpenedSession> opened = Open(OpenIn("host"));
  ASSERT_TRUE(opened.ok());
  ASSERT_TRUE(manager_->Close(opened->id).ok());
  EXPECT_EQ(regions_.List().size(), 1u);

  SessionOpen open = OpenIn("host");
  open.unregister_regions_on_end = true;
  recorder_.fail_start = absl::ResourceExhaustedError("no threads");
  EXPECT_FALSE(Open(open).ok());
  EXPECT_EQ(regions_.List().size(), 1u);  // the client may retry the open
}

TEST_F(HostSessions, ARunnerThatFailsToStartFailsTheOpenAndFreesTheSlot) {
  recorder_.fail_start = absl::ResourceExhaustedError("no threads");
  EXPECT_TRUE(HasStatus(Open(OpenIn("host")), absl::StatusCode::kResourceExhausted, "no threads"));
  EXPECT_EQ(manager_->open_count(), 0);
  recorder_.fail_start = absl::OkStatus();
  EXPECT_TRUE(Open(OpenIn("host")).ok());  // the control block was released
}

TEST_F(HostSessions, SupportReportsTheLimitPlanesAndOpenSessions) {
  ASSERT_TRUE(Open(OpenIn("host")).ok());
  const SessionSupport support = manager_->Support();
  EXPECT_EQ(support.max_sessions, 2);
  EXPECT_FALSE(support.gpu_plane);
  EXPECT_TRUE(support.host_plane);
  EXPECT_EQ(support.open_sessions, 1);
}

TEST_F(HostSessions, OutputsSamplerdCannotWriteAreFailedPrecondition) {
  const Layout l = Pack(kM, kV, 4);
  TestShm rw(l.total, 0666);
  TestShm ro(4096, 0444);
  ASSERT_TRUE(rw.ok() && ro.ok());
  const std::string rw_key = rw.key();
  const std::string ro_key = ro.key();
  EXPECT_EQ(RunUnprivileged([&]() -> std::string {
              RegionRegistry registry(RegionOptions{}, nullptr, {});
              if (!registry.RegisterHostShm("rw", rw_key, 0, l.total).ok()) return "rw failed";
              if (!registry.RegisterHostShm("ro", ro_key, 0, 4096).ok()) return "ro failed";
              Recorder recorder;
              SessionManager manager(&registry, BackendKind::kCpu, kCpu, Limits{},
                                     DeviceSessionOptions{}, FakeFactory(&recorder));
              SessionOpen open = OpenIn("rw");
              open.token_ids = {"ro", 0};
              absl::StatusOr<OpenedSession> opened = manager.Open(open, nullptr);
              if (opened.status().code() != absl::StatusCode::kFailedPrecondition) {
                return "got " + opened.status().ToString();
              }
              if (opened.status().message().find("DeviceSessionOpen.token_ids in a region "
                                                 "samplerd can write") == std::string::npos) {
                return "message " + std::string(opened.status().message());
              }
              // Logits and params are only read: a read-only object is fine for them.
              open = OpenIn("rw");
              open.params = {"ro", 0};
              opened = manager.Open(open, nullptr);
              return opened.ok() ? "" : "read-only params: " + opened.status().ToString();
            }),
            "");
}

// ---- GPU plane, a fake GPU backend ------------------------------------------------------------

class GpuSessions : public HostSessions {
 protected:
  void SetUp() override {
    HostSessions::SetUp();
    manager_ = MakeManager(kGpu, BackendKind::kGpu, 4);
    for (int device = 0; device < 2; ++device) {
      memory_[device].resize(Pack(kM, kV, 4).total + 64);
      const uintptr_t address = reinterpret_cast<uintptr_t>(memory_[device].data());
      const uint64_t pad = (64 - address % 64) % 64;  // resolved addresses aligned to 64
      const std::string handle = ipc_.Export(&memory_[device], static_cast<char>('a' + device));
      if (device == 0) {
        // Another name over the same allocation: the registry opens it once, so both names
        // resolve to the same addresses.
        ASSERT_TRUE(
            regions_.RegisterGpuIpc("gpu_alias", handle, pad, Pack(kM, kV, 4).total, "0000:3b:00.0")
                .ok());
      }
      ASSERT_TRUE(regions_
                      .RegisterGpuIpc(device == 0 ? "gpu" : "other_gpu", handle, pad,
                                      Pack(kM, kV, 4).total, device == 0 ? "3b:00.0" : "5e:00.0")
                      .ok());
    }
  }
};

TEST_F(GpuSessions, GpuIpcBuffersOpenAGpuPlaneSessionOnTheServersDevice) {
  absl::StatusOr<OpenedSession> opened = Open(GpuOpen("gpu"));
  ASSERT_TRUE(opened.ok()) << opened.status();
  EXPECT_EQ(opened->plane, SessionPlane::kGpu);
  EXPECT_EQ(opened->device, "0000:3b:00.0");
  EXPECT_EQ(recorder_.last.plane, SessionPlane::kGpu);
  EXPECT_EQ(recorder_.last.device_ordinal, 0);
  EXPECT_TRUE(manager_->Support().gpu_plane);
  // Named by UUID or PCI bus id in another spelling: the same device.
  SessionOpen open = GpuOpen("gpu");
  open.device = "0b5c6a1e";
  ASSERT_TRUE(manager_->Close(opened->id).ok());
  EXPECT_TRUE(Open(open).ok());
}

TEST_F(GpuSessions, DataBuffersOfMixedKindsAreInvalidArgument) {
  SessionOpen open = GpuOpen("gpu");
  open.logits = OpenIn("host").logits;
  EXPECT_TRUE(HasStatus(Open(open), absl::StatusCode::kInvalidArgument,
                        "expected the data buffers in one kind of region (all host shm or all "
                        "GPU IPC), got DeviceSessionOpen.logits in host shm and "
                        "DeviceSessionOpen.params in GPU IPC"));
}

TEST_F(GpuSessions, AControlBlockInGpuMemoryIsInvalidArgument) {
  EXPECT_TRUE(HasStatus(Open(OpenIn("gpu")), absl::StatusCode::kInvalidArgument,
                        "expected DeviceSessionOpen.control in a host shm region (both planes), "
                        "got a GPU IPC region"));
}

TEST_F(GpuSessions, APlaneTheRegionsDoNotFitIsFailedPrecondition) {
  SessionOpen open = OpenIn("host");
  open.plane = 1;
  EXPECT_TRUE(HasStatus(Open(open), absl::StatusCode::kFailedPrecondition,
                        "expected GPU IPC buffers for DEVICE_PLANE_GPU"));
  open = GpuOpen("gpu");
  open.plane = 2;
  EXPECT_TRUE(HasStatus(Open(open), absl::StatusCode::kFailedPrecondition,
                        "expected host shm buffers for DEVICE_PLANE_HOST"));
  // Host shm buffers on a GPU server: the host plane.
  absl::StatusOr<OpenedSession> opened = Open(OpenIn("host"));
  ASSERT_TRUE(opened.ok());
  EXPECT_EQ(opened->plane, SessionPlane::kHost);
}

TEST_F(GpuSessions, RegionsOnAnotherGpuAreFailedPrecondition) {
  EXPECT_TRUE(HasStatus(Open(GpuOpen("other_gpu")), absl::StatusCode::kFailedPrecondition,
                        "expected every buffer on this server's GPU 0000:3b:00.0, got "
                        "DeviceSessionOpen.logits on another GPU"));
}

TEST_F(GpuSessions, ADeviceFieldNamingAnotherDeviceIsFailedPrecondition) {
  SessionOpen open = GpuOpen("gpu");
  open.device = "0000:5e:00.0";
  EXPECT_TRUE(HasStatus(Open(open), absl::StatusCode::kFailedPrecondition,
                        "expected device \"0000:3b:00.0\""));
}

TEST_F(GpuSessions, ASliceTooSmallIsOutOfRangeOnGpuRegionsToo) {
  SessionOpen open = GpuOpen("gpu");
  open.logits.offset = Pack(kM, kV, 4).total - 64;
  EXPECT_TRUE(HasStatus(Open(open), absl::StatusCode::kOutOfRange, "DeviceSessionOpen.logits"));
}

TEST_F(GpuSessions, ResolvedAddressesCatchASharedControlBlockOrOverlapThroughAnotherName) {
  absl::StatusOr<OpenedSession> first = Open(GpuOpen("gpu"));
  ASSERT_TRUE(first.ok());
  std::vector<uint8_t> other(Pack(kM, kV, 4).total + 64);
  const uint64_t pad = (64 - reinterpret_cast<uintptr_t>(other.data()) % 64) % 64;
  ASSERT_TRUE(regions_
                  .RegisterGpuIpc("other", ipc_.Export(&other, 'o'), pad, Pack(kM, kV, 4).total,
                                  "0000:3b:00.0")
                  .ok());
  SessionOpen open = GpuOpen("other");  // the same host control block as `first`
  EXPECT_TRUE(HasStatus(Open(open), absl::StatusCode::kAlreadyExists, first->id));
  ASSERT_TRUE(manager_->Close(first->id).ok());
  open = GpuOpen("gpu");
  open.params = OpenIn("gpu_alias").logits;
  EXPECT_TRUE(HasStatus(Open(open), absl::StatusCode::kInvalidArgument,
                        "DeviceSessionOpen.logits and DeviceSessionOpen.params"));
}

TEST_F(GpuSessions, ClosingASessionReleasesItsLeases) {
  absl::StatusOr<OpenedSession> opened = Open(GpuOpen("gpu"));
  ASSERT_TRUE(opened.ok());
  ASSERT_TRUE(regions_.Unregister("gpu").ok());
  ASSERT_TRUE(regions_.Unregister("gpu_alias").ok());
  EXPECT_EQ(ipc_.memory_closes(), 0);  // the session holds it
  ASSERT_TRUE(manager_->Close(opened->id).ok());
  EXPECT_TRUE(ipc_.WaitForMemoryCloses(1));
}

// ---- UnderMps ---------------------------------------------------------------------------------

TEST(Mps, TheControlPipeInThePipeDirectoryMeansMps) {
  char dir_template[] = "/tmp/samplerd-mps-test-XXXXXX";
  const char* dir = mkdtemp(dir_template);
  ASSERT_NE(dir, nullptr);
  const std::string pipe = std::string(dir) + "/control";
  EXPECT_FALSE(MpsControlPipeIn(dir));  // nothing there
  ASSERT_EQ(mkfifo(pipe.c_str(), 0600), 0);
  EXPECT_TRUE(MpsControlPipeIn(dir));

  const char* saved = std::getenv("CUDA_MPS_PIPE_DIRECTORY");
  const std::string restore = saved != nullptr ? saved : "";
  setenv("CUDA_MPS_PIPE_DIRECTORY", dir, 1);
  EXPECT_EQ(MpsPipeDirectory(), dir);
  EXPECT_TRUE(UnderMps());
  unlink(pipe.c_str());
  EXPECT_FALSE(UnderMps());
  // A regular file of that name is not the daemon's pipe.
  FILE* file = std::fopen(pipe.c_str(), "w");
  ASSERT_NE(file, nullptr);
  std::fclose(file);
  EXPECT_FALSE(UnderMps());
  unlink(pipe.c_str());
  rmdir(dir);
  unsetenv("CUDA_MPS_PIPE_DIRECTORY");
  EXPECT_EQ(MpsPipeDirectory(), "/tmp/nvidia-mps");
  if (saved != nullptr) setenv("CUDA_MPS_PIPE_DIRECTORY", restore.c_str(), 1);
}

}  // namespace
}  // namespace samplerd::core
