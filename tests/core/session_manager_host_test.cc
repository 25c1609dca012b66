// SessionManager on the host plane with the CPU backend: every bad open with its exact code and
// message, over a real RegionRegistry of host shm objects; the spec a runner gets; close, close
// all, the session count, owned regions and a runner's fault, with a fake runner factory.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "service/core/session/session_manager.h"
#include "tests/core/session_manager_fixture.h"
#include "tests/core/shm_test_util.h"

namespace samplerd::core {
namespace {

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

TEST_F(HostSessions, TheProcessorBuffersAreOptionalAndPassedOnWithTheirCapacities) {
  ASSERT_TRUE(Open(OpenIn("host")).ok());
  EXPECT_EQ(recorder_.last.token_bitmask, nullptr);
  EXPECT_EQ(recorder_.last.processors, nullptr);

  const Layout l = Pack(kM, kV, 4);
  const uint64_t base = l.total + 64;  // a second session, its own control block
  ASSERT_TRUE(Open(WithProcessors(OpenIn("host", base), base)).ok());
  uint8_t* const data = regions_.Acquire("host", 0, 1)->view().data;
  EXPECT_EQ(reinterpret_cast<const uint8_t*>(recorder_.last.token_bitmask),
            data + base + l.bitmask);
  EXPECT_EQ(recorder_.last.processors, data + base + l.processors);
  EXPECT_EQ(recorder_.last.logit_bias_capacity, kBiasCapacity);
  EXPECT_EQ(recorder_.last.token_history_capacity, kHistoryCapacity);
}

TEST_F(HostSessions, ACapacityWithoutProcessorsOrAboveMaxBatchTimesVocabIsInvalidArgument) {
  SessionOpen open = OpenIn("host");
  open.logit_bias_capacity = 3;
  EXPECT_TRUE(HasStatus(Open(open), absl::StatusCode::kInvalidArgument,
                        "expected DeviceSessionOpen.logit_bias_capacity 0 without a processors "
                        "buffer, got 3"));
  open = OpenIn("host");
  open.token_history_capacity = 1;
  EXPECT_TRUE(HasStatus(Open(open), absl::StatusCode::kInvalidArgument,
                        "expected DeviceSessionOpen.token_history_capacity 0 without a "
                        "processors buffer, got 1"));
  open = WithProcessors(OpenIn("host"));
  open.token_history_capacity = kM * kV + 1;
  EXPECT_TRUE(HasStatus(Open(open), absl::StatusCode::kInvalidArgument,
                        "expected DeviceSessionOpen.token_history_capacity <= max_batch * vocab "
                        "= 800 (a row names each token at most once), got 801"));
  // A processors buffer with no lists at all (penalties only) is fine.
  open = WithProcessors(OpenIn("host"));
  open.logit_bias_capacity = 0;
  open.token_history_capacity = 0;
  EXPECT_TRUE(Open(open).ok());
  EXPECT_EQ(recorder_.last.logit_bias_capacity, 0u);
}

// Regression (redteam25 F2): the host plane copies the processors rows into server memory each
// step and the GPU plane sizes its workspace by the capacities, so an open announcing 100M
// history entries over a sparse shm object zero-filled 900 MB of server memory (up to ~19 GiB
// at INT32_MAX). The buffer is bounded like one Sample request's lists, before any lease.
TEST_F(HostSessions, AProcessorsBufferOverMaxMessageBytesIsResourceExhaustedBeforeAnyLease) {
  const uint64_t bytes = samplerd_processors_bytes(kM, kBiasCapacity, kHistoryCapacity);
  manager_ = MakeManager(kCpu, BackendKind::kCpu, 2, static_cast<int64_t>(bytes));
  const absl::StatusOr<OpenedSession> fits = Open(WithProcessors(OpenIn("host")));
  ASSERT_TRUE(fits.ok()) << fits.status();
  ASSERT_TRUE(manager_->Close(fits->id).ok());

  SessionOpen open = WithProcessors(OpenIn("host"));
  open.token_history_capacity = kHistoryCapacity + 1;  // 9 bytes more
  EXPECT_TRUE(HasStatus(
      Open(open), absl::StatusCode::kResourceExhausted,
      absl::StrCat("expected a DeviceSessionOpen.processors buffer of at most ", bytes,
                   " bytes (--max_message_bytes, as the same lists in one Sample request), got ",
                   bytes + 9,
                   " bytes (samplerd_processors_bytes(max_batch 8, logit_bias_capacity 16, "
                   "token_history_capacity 25)): open it with smaller capacities")));
  open = WithProcessors(OpenIn("host"));
  open.logit_bias_capacity = kBiasCapacity + 1;  // 8 bytes more
  EXPECT_TRUE(HasStatus(Open(open), absl::StatusCode::kResourceExhausted,
                        absl::StrCat("got ", bytes + 8, " bytes")));
  // Checked before the buffer is leased: a slice the region cannot hold is refused for its size.
  open.processors.offset = shm_.size();
  EXPECT_TRUE(HasStatus(Open(open), absl::StatusCode::kResourceExhausted, "--max_message_bytes"));
  EXPECT_EQ(recorder_.started, 1);
  EXPECT_EQ(manager_->open_count(), 0);
}

TEST_F(HostSessions, AProcessorBufferTooSmallForMaxBatchVocabAndCapacitiesIsOutOfRange) {
  const uint64_t size = shm_.size();
  const uint64_t bitmask = 4ull * kM * ((kV + 31) / 32);
  // 12 M + 8 (M + 1) for the penalties and offsets, 8 per bias entry, 9 per history entry.
  const uint64_t processors = 12ull * kM + 8 * (kM + 1) + 8 * kBiasCapacity + 9 * kHistoryCapacity;
  ASSERT_EQ(processors, samplerd_processors_bytes(kM, kBiasCapacity, kHistoryCapacity));
  SessionOpen open = WithProcessors(OpenIn("host"));
  open.token_bitmask.offset = size - bitmask + 4;  // one word short, still aligned
  EXPECT_TRUE(HasStatus(Open(open), absl::StatusCode::kOutOfRange,
                        absl::StrCat("DeviceSessionOpen.token_bitmask (int32[max_batch 8, "
                                     "ceil(V / 32) 4]): expected ",
                                     bitmask, " bytes at offset ", size - bitmask + 4,
                                     ", got a region of ", size, " bytes")));
  open = WithProcessors(OpenIn("host"));
  open.processors.offset = size - processors + 4;
  EXPECT_TRUE(
      HasStatus(Open(open), absl::StatusCode::kOutOfRange,
                absl::StrCat("DeviceSessionOpen.processors (samplerd_processors_bytes(max_batch 8, "
                             "logit_bias_capacity 16, token_history_capacity 24) bytes): expected ",
                             processors, " bytes at offset ", size - processors + 4,
                             ", got a region of ", size, " bytes")));
  // The same slice fits once the history capacity is one entry (9 bytes) smaller.
  open.token_history_capacity = kHistoryCapacity - 1;
  EXPECT_TRUE(Open(open).ok());
}

TEST_F(HostSessions, AMisalignedOrOverlappingProcessorBufferIsInvalidArgument) {
  const uint64_t second = Pack(kM, kV, 4).total + 64;
  for (const auto& [field, name, shift] :
       std::vector<std::tuple<SessionSlice SessionOpen::*, std::string, uint64_t>>{
           {&SessionOpen::token_bitmask, "token_bitmask", 2},
           {&SessionOpen::processors, "processors", 1}}) {
    SessionOpen open = WithProcessors(OpenIn("host"));
    (open.*field).offset = second + shift;
    EXPECT_TRUE(
        HasStatus(Open(open), absl::StatusCode::kInvalidArgument,
                  absl::StrCat("expected DeviceSessionOpen.", name, " aligned to 4 bytes, got")))
        << name;
  }
  SessionOpen open = WithProcessors(OpenIn("host"));
  open.token_bitmask.offset = open.row_status.offset;  // 4 * kM bytes shared
  EXPECT_TRUE(HasStatus(Open(open), absl::StatusCode::kInvalidArgument,
                        "expected buffers that do not overlap, got DeviceSessionOpen.row_status "
                        "and DeviceSessionOpen.token_bitmask sharing 32 bytes"));
  open = WithProcessors(OpenIn("host"));
  open.processors.offset = open.logits.offset + 4;
  EXPECT_TRUE(HasStatus(Open(open), absl::StatusCode::kInvalidArgument,
                        "got DeviceSessionOpen.logits and DeviceSessionOpen.processors sharing"));
  open = WithProcessors(OpenIn("host"));
  open.processors.offset = open.token_bitmask.offset;
  EXPECT_TRUE(HasStatus(Open(open), absl::StatusCode::kInvalidArgument,
                        "got DeviceSessionOpen.token_bitmask and DeviceSessionOpen.processors "
                        "sharing"));
}

TEST_F(HostSessions, AnUnknownProcessorRegionIsNotFoundNamingTheBuffer) {
  SessionOpen open = WithProcessors(OpenIn("host"));
  open.processors.region = "nope";
  EXPECT_TRUE(HasStatus(Open(open), absl::StatusCode::kNotFound,
                        "DeviceSessionOpen.processors (samplerd_processors_bytes("));
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

// The same shm object registered under a second name maps at another address: its control
// block is still the open session's (two pollers would take one doorbell's rings), while
// another control block of the same object is free.
TEST_F(HostSessions, TheSameControlBlockUnderAnotherRegionNameIsAlreadyExists) {
  absl::StatusOr<OpenedSession> first = Open(OpenIn("host"));
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE(regions_.RegisterHostShm("alias", shm_.key(), 0, shm_.size()).ok());
  const uint64_t second = Pack(kM, kV, 4).total + 64;
  SessionOpen open = OpenIn("alias", second);
  open.control = OpenIn("alias").control;
  EXPECT_TRUE(HasStatus(Open(open), absl::StatusCode::kAlreadyExists, first->id));
  // A region that starts inside the object: its offset 0 is the object's 64.
  ASSERT_TRUE(regions_.RegisterHostShm("inside", shm_.key(), 64, shm_.size() - 64).ok());
  open = OpenIn("inside", second - 64);
  open.control = {"inside", 0};
  EXPECT_TRUE(HasStatus(Open(open), absl::StatusCode::kAlreadyExists, first->id));
  // The second layout's own control block, through the alias: free.
  EXPECT_TRUE(Open(OpenIn("alias", second)).ok());
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

// The message of an open refused by --max_host_session_bytes, for fp32 sessions.
std::string OverHostBytes(int64_t cap, int64_t held, int64_t needed, uint32_t max_batch) {
  return absl::StrCat(
      "expected host-plane device sessions reserving at most ", cap,
      " bytes in total for their copies of a step's logits (--max_host_session_bytes), got ", held,
      " bytes held by the open ones plus ", needed, " for this one (max_batch ", max_batch,
      " x vocab ", kV,
      " x 4 bytes fp32): open it with a smaller max_batch, close a session, or raise "
      "--max_host_session_bytes");
}

// Each host-plane session reserves a host copy of a full step's logits; the reservation is
// virtual, so the server bounds their sum rather than trusting an allocation failure.
TEST_F(HostSessions, AnOpenPastMaxHostSessionBytesIsResourceExhaustedAndASmallerOneFits) {
  const int64_t cap = kHostBytes + kHostBytes / 2;
  manager_ = MakeManager(kCpu, BackendKind::kCpu, 2, Limits{}.max_region_list_bytes, cap);
  ASSERT_TRUE(Open(OpenIn("host")).ok());
  const uint64_t second = Pack(kM, kV, 4).total + 64;
  const absl::StatusOr<OpenedSession> refused = Open(OpenIn("host", second));
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(refused.status().message(), OverHostBytes(cap, kHostBytes, kHostBytes, kM));
  EXPECT_EQ(manager_->open_count(), 1);
  EXPECT_EQ(recorder_.started, 1);  // refused before its runner started
  // Half the rows fill the cap exactly: that fits.
  SessionOpen smaller = OpenIn("host", second);
  smaller.max_batch = kM / 2;
  const absl::StatusOr<OpenedSession> opened = Open(smaller);
  ASSERT_TRUE(opened.ok()) << opened.status();
  EXPECT_EQ(manager_->open_count(), 2);

  // 0 is no limit.
  manager_ = MakeManager(kCpu, BackendKind::kCpu, 2, Limits{}.max_region_list_bytes, 0);
  EXPECT_TRUE(Open(OpenIn("host")).ok());
  EXPECT_TRUE(Open(OpenIn("host", second)).ok());
}

TEST_F(HostSessions, EndingAHostSessionFreesItsShareOfMaxHostSessionBytes) {
  manager_ = MakeManager(kCpu, BackendKind::kCpu, 2, Limits{}.max_region_list_bytes, kHostBytes);
  const SessionOpen first = OpenIn("host");
  const SessionOpen second = OpenIn("host", Pack(kM, kV, 4).total + 64);
  // Ended by Close.
  absl::StatusOr<OpenedSession> opened = Open(first);
  ASSERT_TRUE(opened.ok()) << opened.status();
  EXPECT_TRUE(HasStatus(Open(second), absl::StatusCode::kResourceExhausted,
                        OverHostBytes(kHostBytes, kHostBytes, kHostBytes, kM)));
  ASSERT_TRUE(manager_->Close(opened->id).ok());
  absl::Notification ended;
  opened = manager_->Open(second, [&](const absl::Status&) { ended.Notify(); });
  ASSERT_TRUE(opened.ok()) << opened.status();

  // Ended by a runner fault (from the runner's own thread, as a real runner reports).
  EXPECT_TRUE(
      HasStatus(Open(first), absl::StatusCode::kResourceExhausted, "(--max_host_session_bytes)"));
  std::thread runner_thread(recorder_.on_fault, absl::InternalError("engine gone"));
  runner_thread.join();
  ASSERT_TRUE(ended.WaitForNotificationWithTimeout(absl::Seconds(5)));
  EXPECT_EQ(manager_->open_count(), 0);

  // A runner that fails to start frees its share with its slot.
  recorder_.fail_start = absl::ResourceExhaustedError("no threads");
  EXPECT_TRUE(HasStatus(Open(first), absl::StatusCode::kResourceExhausted, "no threads"));
  recorder_.fail_start = absl::OkStatus();
  EXPECT_TRUE(Open(first).ok());
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

// The flag owns the regions the open named, not their names: a name unregistered and registered
// again while the session lives (by this client or another process) names a new region, which
// the session's end must leave alone.
TEST_F(HostSessions, ANameRegisteredAgainDuringTheSessionKeepsItsNewRegion) {
  SessionOpen open = OpenIn("host");
  open.unregister_regions_on_end = true;
  absl::StatusOr<OpenedSession> opened = Open(open);
  ASSERT_TRUE(opened.ok()) << opened.status();
  ASSERT_TRUE(regions_.Unregister("host").ok());
  ASSERT_TRUE(regions_.RegisterHostShm("host", shm_.key(), 0, 4096).ok());  // another region
  ASSERT_TRUE(manager_->Close(opened->id).ok());
  const std::vector<RegionInfo> left = regions_.List();
  ASSERT_EQ(left.size(), 1u);
  EXPECT_EQ(left[0].name, "host");
  EXPECT_EQ(left[0].byte_size, 4096u);
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
  EXPECT_EQ(support.max_host_session_bytes, int64_t{8} << 30);  // the default
  EXPECT_FALSE(support.gpu_plane);
  EXPECT_TRUE(support.host_plane);
  EXPECT_EQ(support.open_sessions, 1);
  EXPECT_TRUE(support.processors);
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

}  // namespace
}  // namespace samplerd::core
