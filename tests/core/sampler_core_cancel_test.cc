// The end of a drain (issue 12, item 1): SamplerCore::CancelInFlight stops the CPU batch being
// sampled (CpuSampler checks SampleIo::cancel between rows) and answers it, and the requests
// queued behind it, UNAVAILABLE.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <utility>

#include "service/core/backend/cpu_sampler.h"
#include "service/core/sampler_core.h"
#include "tests/core/notification.h"

namespace samplerd::core {
namespace {

using ::testing::HasSubstr;

// A CpuSampler that says when a batch has started and then holds it until the core cancels, so
// that the cancel lands while the batch is in the backend.
class HeldCpuSampler : public Sampler {
 public:
  absl::Status Sample(const ValidatedBatch& batch, const SampleIo& io,
                      SampleResult* result) override {
    calls_.fetch_add(1);
    started_.Notify();
    if (io.cancel == nullptr) return absl::InternalError("expected a cancel flag, got none");
    while (!io.cancel->load()) std::this_thread::yield();
    return cpu_.Sample(batch, io, result);
  }
  BackendKind kind() const override { return BackendKind::kCpu; }
  const DeviceInfo& device() const override { return cpu_.device(); }

  CpuSampler cpu_{2};
  TestNotification started_;
  std::atomic<int> calls_{0};
};

// One request's answer (test_util.h's Answer waits on an absl::Notification, which TSan cannot
// see through: see notification.h).
struct Answer {
  TestNotification done;
  absl::StatusOr<SampleResult> result;

  SamplerCore::Callback Callback() {
    return [this](absl::StatusOr<SampleResult> r) {
      result = std::move(r);
      done.Notify();
    };
  }
};

SampleRequest Request(const std::string& bytes) {
  SampleRequest r;
  r.dtype = kernels::DType::kFp32;
  r.shape = {4, 8};
  r.inline_data = bytes;
  r.has_inline_data = true;
  return r;
}

TEST(SamplerCoreCancel, CancelInFlightAnswersTheRunningAndQueuedRequestsUnavailable) {
  auto sampler = std::make_unique<HeldCpuSampler>();
  HeldCpuSampler* held = sampler.get();
  SamplerCore core(CoreOptions{}, std::move(sampler), /*seed_start=*/1);
  const std::string bytes(4 * 8 * sizeof(float), '\0');
  Answer running;
  Answer queued;
  ASSERT_TRUE(core.SampleAsync(Request(bytes), running.Callback()).ok());
  ASSERT_TRUE(core.SampleAsync(Request(bytes), queued.Callback()).ok());
  held->started_.WaitForNotification();

  EXPECT_FALSE(core.Drain(absl::Now()));  // a grace period that is already over
  EXPECT_TRUE(core.CancelInFlight(absl::Now() + absl::Seconds(30)));
  ASSERT_TRUE(running.done.HasBeenNotified());
  ASSERT_TRUE(queued.done.HasBeenNotified());
  EXPECT_EQ(running.result.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(running.result.status().message(), HasSubstr("grace period"));
  EXPECT_EQ(queued.result.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(held->calls_.load(), 1) << "the queued request must not reach the backend";
  EXPECT_EQ(core.SampleAsync(Request(bytes), [](absl::StatusOr<SampleResult>) {}).code(),
            absl::StatusCode::kUnavailable);
}

TEST(SamplerCoreCancel, ABatchFinishedBeforeTheGracePeriodEndsIsAnsweredNormally) {
  SamplerCore core(CoreOptions{}, std::make_unique<CpuSampler>(2), /*seed_start=*/1);
  const std::string bytes(4 * 8 * sizeof(float), '\0');
  Answer answer;
  ASSERT_TRUE(core.SampleAsync(Request(bytes), answer.Callback()).ok());
  answer.done.WaitForNotification();
  ASSERT_TRUE(answer.result.ok()) << answer.result.status();
  EXPECT_EQ(answer.result->token_ids.size(), 4u);
  EXPECT_TRUE(core.Drain(absl::Now() + absl::Seconds(30)));
  EXPECT_TRUE(core.CancelInFlight(absl::Now() + absl::Seconds(30)));
}

}  // namespace
}  // namespace samplerd::core
