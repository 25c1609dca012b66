// SamplerCore over a fake backend: queueing, callbacks, seeds, timings, drain, cancellation and
// sticky backend faults.
#include "service/core/sampler_core.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <string>

#include "absl/synchronization/notification.h"
#include "tests/core/test_util.h"

namespace samplerd::core {
namespace {

using ::testing::HasSubstr;

// Answers token = row index; can be held until released, to test draining. Returns fault_
// when set; with sticky_ the first fault leaves it faulted(), like a GPU with a lost context.
class FakeSampler : public Sampler {
 public:
  absl::Status Sample(const ValidatedBatch& batch, const SampleIo&, SampleResult* result) override {
    if (hold_ != nullptr) hold_->WaitForNotification();
    ++calls_;
    for (int64_t r = 0; r < batch.batch; ++r) {
      result->token_ids.push_back(static_cast<int32_t>(r));
      result->row_status.push_back(kernels::RowStatus::kOk);
    }
    if (!fault_.ok() && sticky_) faulted_ = true;
    return fault_;
  }
  bool faulted() const override { return faulted_; }
  BackendKind kind() const override { return BackendKind::kCpu; }
  const DeviceInfo& device() const override { return device_; }

  absl::Notification* hold_ = nullptr;
  absl::Status fault_;
  bool sticky_ = false;
  bool faulted_ = false;
  int calls_ = 0;
  DeviceInfo device_{0, "", "fake", "Fake", false, false};
};

class SamplerCoreTest : public ::testing::Test {
 protected:
  SamplerCoreTest() {
    auto sampler = std::make_unique<FakeSampler>();
    sampler_ = sampler.get();
    CoreOptions options;
    options.on_fatal = [this](const absl::Status& status) {
      fatal_status_ = status;  // read by the test only after a later request has finished
      ++fatal_calls_;
    };
    core_ = std::make_unique<SamplerCore>(options, std::move(sampler), /*seed_start=*/42);
    bytes_.assign(2 * 3 * 4, '\0');
  }

  SampleRequest Request() {
    SampleRequest r;
    r.request_id = "req-1";
    r.dtype = kernels::DType::kFp32;
    r.shape = {2, 3};
    r.inline_data = bytes_;
    r.has_inline_data = true;
    return r;
  }

  absl::StatusOr<SampleResult> Run(SampleRequest r) { return SampleAndWait(*core_, std::move(r)); }

  FakeSampler* sampler_;
  std::atomic<int> fatal_calls_{0};
  absl::Status fatal_status_;
  std::unique_ptr<SamplerCore> core_;
  std::string bytes_;
};

TEST_F(SamplerCoreTest, ReturnsTokensSeedsAndTimings) {
  absl::StatusOr<SampleResult> got = Run(Request());
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->request_id, "req-1");
  EXPECT_EQ(got->token_ids, (std::vector<int32_t>{0, 1}));
  ASSERT_EQ(got->seeds.size(), 2u);
  EXPECT_NE(got->seeds[0], got->seeds[1]);
  EXPECT_GE(got->timings.total, got->timings.compute);
  EXPECT_GE(got->timings.total, got->timings.queue);
}

TEST_F(SamplerCoreTest, ServerSeedsDifferBetweenRequests) {
  absl::StatusOr<SampleResult> a = Run(Request());
  absl::StatusOr<SampleResult> b = Run(Request());
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(a->seeds, b->seeds);
}

TEST_F(SamplerCoreTest, RefusesInvalidRequestsWithoutCallingBack) {
  SampleRequest r = Request();
  r.shape = {2};
  bool called = false;
  absl::Status status =
      core_->SampleAsync(std::move(r), [&](absl::StatusOr<SampleResult>) { called = true; });
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(called);
  EXPECT_EQ(sampler_->calls_, 0);
}

TEST_F(SamplerCoreTest, CancelledRequestsAreNotSampled) {
  SampleRequest r = Request();
  r.is_cancelled = [] { return true; };
  absl::StatusOr<SampleResult> got = Run(std::move(r));
  EXPECT_EQ(got.status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(sampler_->calls_, 0);
}

TEST_F(SamplerCoreTest, BackendFaultsReachTheCaller) {
  sampler_->fault_ = absl::InternalError("device fault");
  absl::StatusOr<SampleResult> got = Run(Request());
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInternal);
}

TEST_F(SamplerCoreTest, TransientBackendErrorsDoNotStopTheCore) {
  sampler_->fault_ = absl::ResourceExhaustedError("out of device memory");
  EXPECT_EQ(Run(Request()).status().code(), absl::StatusCode::kResourceExhausted);
  sampler_->fault_ = absl::OkStatus();
  EXPECT_TRUE(Run(Request()).ok());
  EXPECT_FALSE(core_->faulted());
  EXPECT_EQ(fatal_calls_.load(), 0);
}

TEST_F(SamplerCoreTest, StickyFaultCallsOnFatalOnceAndRefusesLaterWork) {
  sampler_->fault_ = absl::InternalError("GPU 0000:01:00.0: illegal address");
  sampler_->sticky_ = true;
  absl::Notification hold;
  sampler_->hold_ = &hold;
  // Two requests queued behind each other: the first faults the backend.
  Answer first, second;
  ASSERT_TRUE(core_->SampleAsync(Request(), first.Callback()).ok());
  ASSERT_TRUE(core_->SampleAsync(Request(), second.Callback()).ok());
  hold.Notify();
  first.done.WaitForNotification();
  second.done.WaitForNotification();  // runs after the first task, on_fatal included

  EXPECT_EQ(first.result.status().code(), absl::StatusCode::kInternal);
  // The queued request never reaches the faulted backend.
  EXPECT_EQ(second.result.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(sampler_->calls_, 1);
  EXPECT_EQ(fatal_calls_.load(), 1);
  EXPECT_EQ(fatal_status_.code(), absl::StatusCode::kInternal);
  EXPECT_TRUE(core_->faulted());

  // New requests are refused up front, saying why.
  bool called = false;
  absl::Status refused =
      core_->SampleAsync(Request(), [&](absl::StatusOr<SampleResult>) { called = true; });
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(refused.message()), HasSubstr("illegal address"));
  EXPECT_THAT(std::string(refused.message()), HasSubstr("expected"));
  EXPECT_FALSE(called);
  EXPECT_TRUE(core_->Drain(absl::Now() + absl::Seconds(10)));
  EXPECT_EQ(fatal_calls_.load(), 1);
}

TEST_F(SamplerCoreTest, DrainWaitsForInFlightThenRefusesNewWork) {
  absl::Notification hold;
  sampler_->hold_ = &hold;
  Answer answer;
  ASSERT_TRUE(core_->SampleAsync(Request(), answer.Callback()).ok());
  // The held request cannot finish: a short drain reports work left in flight.
  EXPECT_FALSE(core_->Drain(absl::Now() + absl::Milliseconds(20)));
  absl::Status refused = core_->SampleAsync(Request(), [](absl::StatusOr<SampleResult>) {});
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(refused.message()), HasSubstr("shutting down"));
  hold.Notify();
  answer.done.WaitForNotification();
  EXPECT_TRUE(answer.result.ok()) << answer.result.status();
  EXPECT_TRUE(core_->Drain(absl::Now() + absl::Seconds(10)));
}

TEST_F(SamplerCoreTest, InfoDescribesTheBackend) {
  ServerInfo info = core_->Info();
  EXPECT_EQ(info.version, kVersion);
  ASSERT_EQ(info.devices.size(), 1u);
  EXPECT_EQ(info.devices[0].uuid, "fake");
  EXPECT_EQ(info.limits.max_batch, Limits{}.max_batch);
}

TEST(SamplerCoreCreate, RefusesGpuWithoutAGpuBackend) {
  CoreOptions options;
  options.backend = BackendChoice::kGpu;
  absl::StatusOr<std::unique_ptr<SamplerCore>> core = SamplerCore::Create(options);
#if SAMPLERD_HAVE_GPU
  // A GPU build refuses only where the runtime lists no device (e.g. this CPU-only machine).
  if (core.ok()) {
    EXPECT_EQ((*core)->Info().backend, BackendKind::kGpu);
    return;
  }
#endif
  EXPECT_EQ(core.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(core.status().message()), HasSubstr("expected a usable GPU"));
}

TEST(SamplerCoreCreate, AutoFallsBackToTheCpu) {
  absl::StatusOr<std::unique_ptr<SamplerCore>> core = SamplerCore::Create(CoreOptions{});
  ASSERT_TRUE(core.ok()) << core.status();
#if SAMPLERD_HAVE_GPU
  if ((*core)->Info().backend == BackendKind::kGpu) GTEST_SKIP() << "this machine has a GPU";
#endif
  EXPECT_EQ((*core)->Info().backend, BackendKind::kCpu);
}

}  // namespace
}  // namespace samplerd::core
