// SamplerCore's admission limits (max_inflight, max_inflight_bytes and the reservations of
// requests assembled from pieces), deadlines (passed on arrival, passed while queued) and what it
// records in the metrics, over a backend the test can hold.
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
  void MakeCore(int64_t max_inflight, int64_t max_inflight_bytes = 0) {
    metrics_ = *metrics::SamplerMetrics::Create(&registry_);
    auto sampler = std::make_unique<HeldSampler>();
    sampler_ = sampler.get();
    sampler_->hold_ = &hold_;
    sampler_->entered_ = &entered_;
    CoreOptions options;
    options.limits.max_inflight = max_inflight;
    options.limits.max_inflight_bytes = max_inflight_bytes;
    options.metrics = metrics_.get();
    core_ = std::make_unique<SamplerCore>(options, std::move(sampler), /*seed_start=*/3);
  }

  void TearDown() override {
    if (!hold_.HasBeenNotified()) hold_.Notify();
    core_.reset();  // finishes queued work while the members it uses live
  }

  // A [batch, 4] fp32 request: batch x 16 inline bytes.
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

// ---- max_inflight_bytes ------------------------------------------------------------------------

TEST_F(CoreLimits, BeyondMaxInflightBytesIsResourceExhaustedAndTheBytesComeBackWithTheAnswer) {
  MakeCore(/*max_inflight=*/0, /*max_inflight_bytes=*/100);
  Answer first, second;
  ASSERT_TRUE(core_->SampleAsync(Request(/*batch=*/2), first.Callback()).ok());   // 32 bytes
  ASSERT_TRUE(core_->SampleAsync(Request(/*batch=*/4), second.Callback()).ok());  // 64 bytes
  entered_.WaitForNotification();  // the first runs (held), the second is queued
  EXPECT_EQ(core_->inflight_bytes(), 96);
  EXPECT_THAT(Metrics(), HasSubstr("\nsamplerd_inflight_bytes 96\n"));

  bool called = false;
  const absl::Status full = core_->SampleAsync(
      Request(/*batch=*/1), [&](absl::StatusOr<SampleResult>) { called = true; });
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(full.message(),
            "expected at most 100 inline logits bytes in flight (--max_inflight_bytes), got 16 "
            "more with 96 in flight; retry later");
  EXPECT_FALSE(called);
  EXPECT_EQ(core_->admitted(), 2);  // the refused request took no slot
  EXPECT_EQ(core_->inflight_bytes(), 96);

  hold_.Notify();
  first.done.WaitForNotification();
  second.done.WaitForNotification();
  EXPECT_TRUE(first.result.ok());
  EXPECT_TRUE(second.result.ok());
  // Released before the answers were handed over: nothing leaked, and the budget is whole again.
  EXPECT_EQ(core_->inflight_bytes(), 0);
  EXPECT_THAT(Metrics(), HasSubstr("\nsamplerd_inflight_bytes 0\n"));
  Answer whole;
  ASSERT_TRUE(core_->SampleAsync(Request(/*batch=*/6), whole.Callback()).ok());  // 96 bytes
  whole.done.WaitForNotification();
  EXPECT_TRUE(whole.result.ok());
  EXPECT_EQ(sampler_->calls_, 3);
  EXPECT_EQ(core_->inflight_bytes(), 0);
}

TEST_F(CoreLimits, ARequestLargerThanMaxInflightBytesIsToldItCanNeverFit) {
  MakeCore(/*max_inflight=*/1, /*max_inflight_bytes=*/16);
  const std::string never =
      "expected at most 16 inline logits bytes in flight (--max_inflight_bytes), got 32 bytes in "
      "one request, which can never fit; split the batch or send the logits in a region";
  // Exactly the budget fits.
  Answer blocker;
  ASSERT_TRUE(core_->SampleAsync(Request(/*batch=*/1), blocker.Callback()).ok());
  entered_.WaitForNotification();
  // Said before "server busy": retrying would not help.
  const absl::Status busy = core_->SampleAsync(Request(), [](absl::StatusOr<SampleResult>) {});
  EXPECT_EQ(busy.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(busy.message(), never);
  hold_.Notify();
  blocker.done.WaitForNotification();
  // And on an idle server.
  const absl::Status idle = core_->SampleAsync(Request(), [](absl::StatusOr<SampleResult>) {});
  EXPECT_EQ(idle.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(idle.message(), never);
  EXPECT_EQ(core_->ReserveInflightBytes(32).status().message(), never);
  EXPECT_EQ(core_->inflight_bytes(), 0);
  EXPECT_EQ(core_->admitted(), 0);
}

TEST_F(CoreLimits, ReservedBytesCountOnceUntilTheirRequestIsAnswered) {
  MakeCore(/*max_inflight=*/0, /*max_inflight_bytes=*/100);
  // A step assembled from pieces reserves its bytes at its first piece.
  absl::StatusOr<SamplerCore::InflightBytes> reserved = core_->ReserveInflightBytes(64);
  ASSERT_TRUE(reserved.ok()) << reserved.status();
  EXPECT_EQ(reserved->bytes(), 64);
  EXPECT_EQ(core_->inflight_bytes(), 64);
  EXPECT_EQ(core_->admitted(), 0);  // a reservation takes no request slot
  EXPECT_THAT(Metrics(), HasSubstr("\nsamplerd_inflight_bytes 64\n"));
  // Another step's bytes do not fit while the first is assembled.
  const absl::StatusOr<SamplerCore::InflightBytes> second = core_->ReserveInflightBytes(48);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(second.status().message(),
            "expected at most 100 inline logits bytes in flight (--max_inflight_bytes), got 48 "
            "more with 64 in flight; retry later");

  // The request arrives with its reservation: its 64 bytes are not counted twice.
  Answer answer;
  ASSERT_TRUE(
      core_->SampleAsync(Request(/*batch=*/4), answer.Callback(), *std::move(reserved)).ok());
  entered_.WaitForNotification();
  EXPECT_EQ(core_->inflight_bytes(), 64);
  EXPECT_EQ(core_->admitted(), 1);
  // A reservation smaller than the request's inline bytes: the rest is reserved on admission.
  absl::StatusOr<SamplerCore::InflightBytes> small = core_->ReserveInflightBytes(16);
  ASSERT_TRUE(small.ok()) << small.status();
  Answer larger;
  ASSERT_TRUE(core_->SampleAsync(Request(/*batch=*/2), larger.Callback(), *std::move(small)).ok());
  EXPECT_EQ(core_->inflight_bytes(), 96);

  hold_.Notify();
  answer.done.WaitForNotification();
  larger.done.WaitForNotification();
  EXPECT_TRUE(answer.result.ok());
  EXPECT_TRUE(larger.result.ok());
  EXPECT_EQ(core_->inflight_bytes(), 0);
  EXPECT_THAT(Metrics(), HasSubstr("\nsamplerd_inflight_bytes 0\n"));
  // The whole budget can be reserved again.
  absl::StatusOr<SamplerCore::InflightBytes> again = core_->ReserveInflightBytes(100);
  EXPECT_TRUE(again.ok()) << again.status();
}

TEST_F(CoreLimits, AReservationGivesItsBytesBackWhenDroppedOrRefusedWithItsRequest) {
  MakeCore(/*max_inflight=*/1, /*max_inflight_bytes=*/100);
  {
    absl::StatusOr<SamplerCore::InflightBytes> reserved = core_->ReserveInflightBytes(100);
    ASSERT_TRUE(reserved.ok()) << reserved.status();
    SamplerCore::InflightBytes moved = *std::move(reserved);
    EXPECT_EQ(moved.bytes(), 100);
    EXPECT_EQ(core_->inflight_bytes(), 100);  // a move keeps them
    moved.Reset();
    EXPECT_EQ(moved.bytes(), 0);
    EXPECT_EQ(core_->inflight_bytes(), 0);
    moved.Reset();  // at most once
    EXPECT_EQ(core_->inflight_bytes(), 0);
  }
  {
    absl::StatusOr<SamplerCore::InflightBytes> dropped = core_->ReserveInflightBytes(100);
    ASSERT_TRUE(dropped.ok());
  }
  EXPECT_EQ(core_->inflight_bytes(), 0);

  // Refused by validation (a shape the 32 bytes do not match).
  SampleRequest bad = Request();
  bad.shape = {2};
  EXPECT_EQ(
      core_
          ->SampleAsync(
              std::move(bad), [](absl::StatusOr<SampleResult>) {}, *core_->ReserveInflightBytes(32))
          .code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(core_->inflight_bytes(), 0);
  // Refused before admission (its deadline passed).
  SampleRequest late = Request();
  late.deadline = absl::Now() - absl::Milliseconds(5);
  EXPECT_EQ(core_
                ->SampleAsync(
                    std::move(late), [](absl::StatusOr<SampleResult>) {},
                    *core_->ReserveInflightBytes(32))
                .code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(core_->inflight_bytes(), 0);
  // Refused for want of a request slot.
  Answer blocker;
  ASSERT_TRUE(core_->SampleAsync(Request(/*batch=*/1), blocker.Callback()).ok());
  entered_.WaitForNotification();
  const absl::Status busy = core_->SampleAsync(
      Request(), [](absl::StatusOr<SampleResult>) {}, *core_->ReserveInflightBytes(32));
  EXPECT_EQ(busy.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(busy.message()), HasSubstr("server busy"));
  EXPECT_EQ(core_->inflight_bytes(), 16);  // the blocker's only
  hold_.Notify();
  blocker.done.WaitForNotification();
  EXPECT_EQ(core_->inflight_bytes(), 0);
  EXPECT_THAT(Metrics(), HasSubstr("\nsamplerd_inflight_bytes 0\n"));
}

TEST_F(CoreLimits, ARequestCancelledInTheQueueGivesItsBytesBack) {
  MakeCore(/*max_inflight=*/0, /*max_inflight_bytes=*/100);
  Answer blocker, cancelled;
  ASSERT_TRUE(core_->SampleAsync(Request(/*batch=*/1), blocker.Callback()).ok());
  entered_.WaitForNotification();
  SampleRequest r = Request(/*batch=*/4);
  r.is_cancelled = [] { return true; };  // the client went away while it was queued
  ASSERT_TRUE(core_->SampleAsync(std::move(r), cancelled.Callback()).ok());
  EXPECT_EQ(core_->inflight_bytes(), 80);
  hold_.Notify();
  blocker.done.WaitForNotification();
  cancelled.done.WaitForNotification();
  EXPECT_EQ(cancelled.result.status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(core_->inflight_bytes(), 0);
  Answer whole;
  ASSERT_TRUE(core_->SampleAsync(Request(/*batch=*/6), whole.Callback()).ok());
  whole.done.WaitForNotification();
  EXPECT_TRUE(whole.result.ok());
  EXPECT_EQ(sampler_->calls_, 2);  // not the cancelled one
}

TEST_F(CoreLimits, ZeroMaxInflightBytesMeansNoLimitAndTheBytesAreStillCounted) {
  MakeCore(/*max_inflight=*/0, /*max_inflight_bytes=*/0);
  std::vector<std::unique_ptr<Answer>> answers;
  for (int i = 0; i < 10; ++i) {
    answers.push_back(std::make_unique<Answer>());
    ASSERT_TRUE(core_->SampleAsync(Request(/*batch=*/100), answers.back()->Callback()).ok()) << i;
  }
  entered_.WaitForNotification();
  EXPECT_EQ(core_->inflight_bytes(), 16000);
  absl::StatusOr<SamplerCore::InflightBytes> huge = core_->ReserveInflightBytes(int64_t{1} << 40);
  ASSERT_TRUE(huge.ok()) << huge.status();
  EXPECT_THAT(Metrics(), HasSubstr("\nsamplerd_inflight_bytes 1099511643776\n"));
  huge->Reset();
  hold_.Notify();
  for (auto& answer : answers) answer->done.WaitForNotification();
  EXPECT_EQ(core_->inflight_bytes(), 0);
}

TEST_F(CoreLimits, NoBytesAreReservedWhileDraining) {
  MakeCore(/*max_inflight=*/0, /*max_inflight_bytes=*/100);
  EXPECT_TRUE(core_->Drain(absl::Now() + absl::Seconds(10)));
  // A chunked step that could never run is refused at its first message, not after its chunks.
  const absl::StatusOr<SamplerCore::InflightBytes> reserved = core_->ReserveInflightBytes(16);
  EXPECT_EQ(reserved.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(reserved.status().message(), "samplerd is shutting down; retry on another instance");
  EXPECT_EQ(core_->inflight_bytes(), 0);
}

}  // namespace
}  // namespace samplerd::core
