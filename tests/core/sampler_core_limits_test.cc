// SamplerCore's admission limit (max_inflight), deadlines (passed on arrival, passed while
// queued) and what it records in the metrics, over a backend the test can hold.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "service/core/sampler_core.h"
#include "service/metrics/registry.h"
#include "service/metrics/sampler_metrics.h"
#include "tests/core/test_util.h"

namespace samplerd::core {
namespace {

using ::testing::HasSubstr;

// Answers token 0 per row; optionally blocks in Sample until released, and tells when entered.
class HeldSampler : public Sampler {
 public:
  absl::Status Sample(const ValidatedBatch& batch, const SampleIo&, SampleResult* result) override {
    ++calls_;
    if (entered_ != nullptr && !entered_->HasBeenNotified()) entered_->Notify();
    if (hold_ != nullptr) hold_->WaitForNotification();
    result->token_ids.assign(batch.batch, 0);
    result->row_status.assign(batch.batch, kernels::RowStatus::kOk);
    return absl::OkStatus();
  }
  BackendKind kind() const override { return BackendKind::kCpu; }
  const DeviceInfo& device() const override { return device_; }

  absl::Notification* hold_ = nullptr;
  absl::Notification* entered_ = nullptr;
  int calls_ = 0;  // read by the test after the executor has finished with it
  DeviceInfo device_{0, "", "held", "Held", false, false};
};

class CoreLimits : public ::testing::Test {
 protected:
  void MakeCore(int64_t max_inflight) {
    metrics_ = *metrics::SamplerMetrics::Create(&registry_);
    auto sampler = std::make_unique<HeldSampler>();
    sampler_ = sampler.get();
    sampler_->hold_ = &hold_;
    sampler_->entered_ = &entered_;
    CoreOptions options;
    options.limits.max_inflight = max_inflight;
    options.metrics = metrics_.get();
    core_ = std::make_unique<SamplerCore>(options, std::move(sampler), /*seed_start=*/3);
  }

  void TearDown() override {
    if (!hold_.HasBeenNotified()) hold_.Notify();
    core_.reset();  // finishes queued work while the members it uses live
  }

  SampleRequest Request(int64_t batch = 2) {
    SampleRequest r;
    r.dtype = kernels::DType::kFp32;
    r.shape = {batch, 4};
    bytes_.emplace_back(static_cast<size_t>(batch * 4 * 4), '\0');
    r.inline_data = bytes_.back();
    r.has_inline_data = true;
    return r;
  }

  std::string Metrics() const { return registry_.ExpositionText(); }

  metrics::Registry registry_;
  std::unique_ptr<metrics::SamplerMetrics> metrics_;
  absl::Notification hold_;
  absl::Notification entered_;
  HeldSampler* sampler_ = nullptr;
  std::unique_ptr<SamplerCore> core_;
  std::deque<std::string> bytes_;  // the requests' inline bytes (deque: views stay valid)
};

TEST_F(CoreLimits, BeyondMaxInflightIsResourceExhaustedAtOnceAndNothingIsLost) {
  MakeCore(/*max_inflight=*/2);
  Answer first, second;
  ASSERT_TRUE(core_->SampleAsync(Request(), first.Callback()).ok());
  ASSERT_TRUE(core_->SampleAsync(Request(), second.Callback()).ok());
  entered_.WaitForNotification();  // the first runs (held), the second is queued
  EXPECT_EQ(core_->admitted(), 2);
  EXPECT_THAT(Metrics(), HasSubstr("\nsamplerd_inflight_requests 2\n"));

  bool called = false;
  const absl::Status busy =
      core_->SampleAsync(Request(), [&](absl::StatusOr<SampleResult>) { called = true; });
  EXPECT_EQ(busy.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(busy.message()), HasSubstr("server busy: 2 requests in flight, limit 2"));
  EXPECT_FALSE(called);

  hold_.Notify();
  first.done.WaitForNotification();
  second.done.WaitForNotification();
  EXPECT_TRUE(first.result.ok());
  EXPECT_TRUE(second.result.ok());
  EXPECT_EQ(sampler_->calls_, 2);
  // Room again: the server kept serving.
  Answer third;
  ASSERT_TRUE(core_->SampleAsync(Request(), third.Callback()).ok());
  third.done.WaitForNotification();
  EXPECT_TRUE(third.result.ok());
  EXPECT_TRUE(core_->Drain(absl::Now() + absl::Seconds(10)));
  EXPECT_EQ(core_->admitted(), 0);
  EXPECT_THAT(Metrics(), HasSubstr("\nsamplerd_inflight_requests 0\n"));
}

TEST_F(CoreLimits, TheSlotIsFreeWhenTheAnswerIsHandedOver) {
  MakeCore(/*max_inflight=*/1);
  hold_.Notify();
  // A client that sends its next request from the callback (as soon as it has the answer) must
  // be admitted: the slot is released before the callback runs.
  Answer next;
  absl::Status next_status = absl::UnknownError("not sent");
  absl::Notification first_done;
  ASSERT_TRUE(core_
                  ->SampleAsync(Request(),
                                [&](absl::StatusOr<SampleResult>) {
                                  next_status = core_->SampleAsync(Request(), next.Callback());
                                  first_done.Notify();
                                })
                  .ok());
  first_done.WaitForNotification();
  EXPECT_TRUE(next_status.ok()) << next_status;
  next.done.WaitForNotification();
  EXPECT_TRUE(next.result.ok());
}

TEST_F(CoreLimits, ZeroMeansNoLimit) {
  MakeCore(/*max_inflight=*/0);
  std::vector<std::unique_ptr<Answer>> answers;
  for (int i = 0; i < 50; ++i) {
    answers.push_back(std::make_unique<Answer>());
    ASSERT_TRUE(core_->SampleAsync(Request(), answers.back()->Callback()).ok()) << i;
  }
  hold_.Notify();
  for (auto& answer : answers) answer->done.WaitForNotification();
}

TEST_F(CoreLimits, RefusedRequestsGiveTheirSlotBack) {
  MakeCore(/*max_inflight=*/1);
  hold_.Notify();
  SampleRequest bad = Request();
  bad.shape = {2};
  EXPECT_EQ(core_->SampleAsync(std::move(bad), [](absl::StatusOr<SampleResult>) {}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(core_->admitted(), 0);
  Answer ok;
  ASSERT_TRUE(core_->SampleAsync(Request(), ok.Callback()).ok());
  ok.done.WaitForNotification();
}

TEST_F(CoreLimits, ADeadlinePassedOnArrivalIsRefusedBeforeQueueing) {
  MakeCore(/*max_inflight=*/4);
  hold_.Notify();
  SampleRequest late = Request();
  late.deadline = absl::Now() - absl::Milliseconds(5);
  bool called = false;
  const absl::Status status =
      core_->SampleAsync(std::move(late), [&](absl::StatusOr<SampleResult>) { called = true; });
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(status.message()), HasSubstr("expected a deadline in the future"));
  EXPECT_FALSE(called);
  EXPECT_EQ(core_->admitted(), 0);
}

TEST_F(CoreLimits, ADeadlinePassedInTheQueueIsAnsweredWithoutSampling) {
  MakeCore(/*max_inflight=*/4);
  Answer blocker, expiring;
  ASSERT_TRUE(core_->SampleAsync(Request(), blocker.Callback()).ok());
  entered_.WaitForNotification();  // the executor is busy with `blocker`
  SampleRequest r = Request(/*batch=*/3);
  r.deadline = absl::Now() + absl::Milliseconds(20);
  const absl::Time deadline = r.deadline;
  ASSERT_TRUE(core_->SampleAsync(std::move(r), expiring.Callback()).ok());
  // Let the deadline pass while the request waits behind the held one (time must pass: this
  // is the behaviour under test, not a synchronisation).
  absl::SleepFor(deadline - absl::Now() + absl::Milliseconds(5));
  hold_.Notify();
  blocker.done.WaitForNotification();
  expiring.done.WaitForNotification();
  ASSERT_TRUE(blocker.result.ok());
  EXPECT_EQ(expiring.result.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(expiring.result.status().message()),
              HasSubstr("expected to start sampling before the request's deadline"));
  EXPECT_TRUE(core_->Drain(absl::Now() + absl::Seconds(10)));
  EXPECT_EQ(sampler_->calls_, 1);  // only the blocker ran
  const std::string text = Metrics();
  EXPECT_THAT(text, HasSubstr("\nsamplerd_rows_sampled_total 2\n"));  // not the 3 expired rows
  EXPECT_THAT(text, HasSubstr("\nsamplerd_queue_wait_seconds_count 2\n"));
  EXPECT_THAT(text, HasSubstr("\nsamplerd_backend_seconds_count 1\n"));
  EXPECT_THAT(text, HasSubstr("\nsamplerd_request_duration_seconds_count 2\n"));
}

TEST_F(CoreLimits, SampledRequestsCountRowsAndInlineBytes) {
  MakeCore(/*max_inflight=*/4);
  hold_.Notify();
  Answer a, b;
  ASSERT_TRUE(core_->SampleAsync(Request(/*batch=*/2), a.Callback()).ok());
  ASSERT_TRUE(core_->SampleAsync(Request(/*batch=*/5), b.Callback()).ok());
  a.done.WaitForNotification();
  b.done.WaitForNotification();
  EXPECT_TRUE(core_->Drain(absl::Now() + absl::Seconds(10)));
  const std::string text = Metrics();
  EXPECT_THAT(text, HasSubstr("\nsamplerd_rows_sampled_total 7\n"));
  EXPECT_THAT(text, HasSubstr("samplerd_input_bytes_total{transport=\"inline\"} 112\n"));  // 7x4x4
  EXPECT_THAT(text, HasSubstr("samplerd_input_bytes_total{transport=\"host_shm\"} 0\n"));
}

}  // namespace
}  // namespace samplerd::core
