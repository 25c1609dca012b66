#include "service/grpc/sample_stream_reactor.h"

#include <grpc/support/time.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "service/core/model/status_macros.h"
#include "service/core/validation.h"
#include "service/grpc/convert.h"
#include "service/grpc/peer.h"
#include "service/grpc/raw_message.h"
#include "service/grpc/status_convert.h"

namespace samplerd::grpc_transport {

SampleStreamReactor::SampleStreamReactor(core::SamplerCore* core,
                                         grpc::CallbackServerContext* context,
                                         bool allow_remote_regions,
                                         metrics::SamplerMetrics* metrics,
                                         absl::Duration chunk_timeout)
    : core_(core),
      context_(context),
      allow_remote_regions_(allow_remote_regions),
      metrics_(metrics),
      chunk_timeout_(chunk_timeout) {
  std::lock_guard<std::mutex> lock(mu_);
  ProgressLocked();
}

void SampleStreamReactor::OnDone() {
  bool last;
  {
    // gRPC calls OnDone once its own reactions have returned, but an executor callback that
    // called Finish may still be releasing mu_: wait for it (as DeviceSessionReactor does).
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
    last = alarms_pending_ == 0;
  }
  // Else an alarm's callback is still to run (a cancelled alarm's runs too, soon): it deletes
  // the reactor, which must outlive it.
  if (last) delete this;
}

void SampleStreamReactor::OnReadDone(bool ok) {
  // Parsed before taking mu_ (a step may be large): read_ and read_bytes_ belong to the read in
  // flight, and no other read starts before reading_ is cleared below.
  absl::Status parsed;
  if (ok) {
    read_.Clear();
    parsed = ParseMessage(&read_bytes_, &read_);
  }
  std::lock_guard<std::mutex> lock(mu_);
  reading_ = false;
  if (ok && !parsed.ok()) {
    reads_done_ = true;  // nothing after a message that does not parse can be trusted
    end_status_ = absl::InvalidArgumentError(absl::StrCat(
        parsed.message(), "; the stream ends here, every step before this message was answered"));
    if (assembling_ != nullptr) {
      FailLocked(assembling_, absl::InvalidArgumentError(
                                  "expected the step's remaining chunks, got a message that "
                                  "does not parse"));
      EndAssemblyLocked();
    }
  } else if (!ok) {
    reads_done_ = true;
    if (assembling_ != nullptr) {
      FailLocked(assembling_, absl::InvalidArgumentError(
                                  "expected the step's remaining chunks, got the end of the "
                                  "stream"));
      EndAssemblyLocked();
    }
  } else {
    HandleMessageLocked();
  }
  ProgressLocked();
}

void SampleStreamReactor::HandleMessageLocked() {
  if (skipping_) {
    // The rest of a step that expired in assembly, answered already: dropped up to its last
    // chunk, or until the client starts the next step without sending them.
    if (!read_.has_request()) {
      skipping_ = read_.more_chunks();
      return;
    }
    skipping_ = false;
  }
  if (assembling_ != nullptr && read_.has_request()) {
    // A new step before the last chunk of the one in progress: that step fails and is answered
    // now, and this message starts the next step, answered on its own (every `request` gets one
    // answer). The failed step's chunks, if the client still sends them, are dropped up to its
    // last one, unless this message starts a chunked step (they could not be told apart).
    Step* failed = assembling_;
    ++failed->messages;
    failed->error = absl::InvalidArgumentError(
        "expected a chunk continuing the step in progress, got a new `request`, which starts "
        "the next step");
    failed->message.Clear();
    failed->reserved.Reset();  // its bytes are free for others at once
    EndAssemblyLocked();
    SubmitLocked(failed);
    skipping_ = !read_.more_chunks();
  }
  if (assembling_ == nullptr) {
    auto step = std::make_unique<Step>();
    Step* raw = step.get();
    steps_.push_back(std::move(step));
    if (!read_.has_request()) {
      FailLocked(raw, absl::InvalidArgumentError(
                          "expected a message with `request` to start a step, got a chunk "
                          "with no step in progress"));
      return;
    }
    raw->message = std::move(read_);
    raw->response.mutable_response()->set_request_id(raw->message.request().request_id());
    if (!raw->message.chunk().empty()) {
      raw->error = absl::InvalidArgumentError(
          "expected the first message of a step to carry its bytes in "
          "request.logits.inline_data, got a non-empty `chunk`");
    }
    if (raw->message.more_chunks()) {
      if (raw->message.request().logits().data_case() == v1::Tensor::kRegion) {
        raw->error = absl::InvalidArgumentError(
            "expected inline logits for a chunked step, got logits.region");
      }
      // The shape and dtype are known now: a step over the server's limits is refused before
      // its chunks are collected, and the rest are bounded by the bytes the shape needs.
      if (raw->error.ok()) raw->error = ExpectStepBytesLocked(raw);
      StartAssemblyLocked(raw);
      return;
    }
    SubmitLocked(raw);
    return;
  }

  Step* step = assembling_;
  ++step->messages;
  if (step->error.ok()) {
    std::string* data = step->message.mutable_request()->mutable_logits()->mutable_inline_data();
    if (static_cast<int64_t>(data->size() + read_.chunk().size()) > step->expected_bytes) {
      step->error = absl::InvalidArgumentError(
          absl::StrCat("expected ", step->expected_bytes,
                       " bytes of logits for the step's shape and dtype in its chunks, got more"));
      step->message.Clear();
      step->reserved.Reset();
    } else {
      data->append(read_.chunk());
    }
  }
  if (!read_.more_chunks()) {
    EndAssemblyLocked();
    SubmitLocked(step);
  }
}

void SampleStreamReactor::StartAssemblyLocked(Step* step) {
  assembling_ = step;
  step->messages = 1;
  ++alarms_pending_;
  auto* alarm = new grpc::Alarm();
  chunk_alarm_ = alarm;
  // On the monotonic clock: a change of the wall clock neither hastens nor delays it.
  alarm->Set(
      gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                   gpr_time_from_millis(absl::ToInt64Milliseconds(chunk_timeout_), GPR_TIMESPAN)),
      [this, alarm](bool /*fired*/) {
        OnChunkDeadline(alarm);
        delete alarm;  // without mu_ (chunk_alarm_ says why); `this` may be gone by now
      });
}

void SampleStreamReactor::EndAssemblyLocked() {
  assembling_ = nullptr;
  if (chunk_alarm_ != nullptr) {
    chunk_alarm_->Cancel();  // when pending: its callback runs soon, with `fired` false
    chunk_alarm_ = nullptr;
  }
}

void SampleStreamReactor::OnChunkDeadline(const grpc::Alarm* alarm) {
  bool last;
  {
    std::lock_guard<std::mutex> lock(mu_);
    --alarms_pending_;
    // Only while the step it was set for is still assembling, which means it fired: when the
    // step's last chunk won the race (or the step failed, or the stream finished), the alarm was
    // cancelled and forgotten (EndAssemblyLocked), and chunk_alarm_ is null or a later step's.
    // (An alarm is deleted after its callback: no later alarm can have its address yet.)
    if (alarm == chunk_alarm_) {
      Step* step = assembling_;
      absl::Status status = step->error;  // a step that failed already keeps its reason
      if (status.ok()) {
        status = absl::DeadlineExceededError(absl::StrCat(
            "expected the chunked step's last chunk within ",
            absl::ToInt64Milliseconds(chunk_timeout_),
            " ms of its first message (--chunk_timeout_ms), got ",
            step->message.request().logits().inline_data().size(), " of its ", step->expected_bytes,
            " bytes in ", step->messages, step->messages == 1 ? " message" : " messages",
            "; the step's remaining chunks will be skipped"));
      }
      EndAssemblyLocked();
      FailLocked(step, status);  // frees its bytes now, not at the client's next message
      skipping_ = true;
      ProgressLocked();
    }
    last = done_ && alarms_pending_ == 0;
  }
  if (last) delete this;
}

absl::Status SampleStreamReactor::ExpectStepBytesLocked(Step* step) {
  core::SampleRequest request;
  RETURN_IF_ERROR(FromProto(step->message.request(), &request));
  ASSIGN_OR_RETURN(step->expected_bytes, core::ExpectedInlineBytes(request, core_->limits()));
  if (step->expected_bytes > kMaxStepBytes) {
    return absl::ResourceExhaustedError(absl::StrCat("expected a chunked step of at most ",
                                                     kMaxStepBytes, " bytes, got a shape of ",
                                                     step->expected_bytes, " bytes"));
  }
  // Reserved now, not when the last chunk arrives: chunks of a step that does not fit are never
  // collected.
  ASSIGN_OR_RETURN(step->reserved, core_->ReserveInflightBytes(step->expected_bytes));
  // The whole buffer at once: appending chunk by chunk would grow it by doubling, up to twice
  // the reserved bytes (three times while a doubling copies).
  step->message.mutable_request()->mutable_logits()->mutable_inline_data()->reserve(
      static_cast<size_t>(step->expected_bytes));
  return absl::OkStatus();
}

void SampleStreamReactor::SubmitLocked(Step* step) {
  if (!step->error.ok()) {
    FailLocked(step, step->error);
    return;
  }
  core::SampleRequest request;
  absl::Status status = FromProto(step->message.request(), &request);
  if (status.ok() && UsesRegions(step->message.request())) {
    status = CheckRegionPeer(context_->peer(), allow_remote_regions_);
  }
  if (!status.ok()) {
    FailLocked(step, status);
    return;
  }
  request.deadline = DeadlineOf(*context_);
  request.is_cancelled = [this] { return context_->IsCancelled(); };
  // A chunked step's reserved bytes go with it; the core reserves an unchunked step's itself.
  status = core_->SampleAsync(
      std::move(request),
      [this, step](absl::StatusOr<core::SampleResult> result) {
        std::lock_guard<std::mutex> lock(mu_);
        --computing_;
        // The core no longer reads the logits and no longer counts their bytes: free them now,
        // not when the answer has been written (a slow reader would hold them uncounted).
        step->message.Clear();
        if (result.ok()) {
          ToProto(*result, step->response.mutable_response());
          step->response.mutable_status()->set_code(0);
          step->ready = true;
          if (metrics_ != nullptr) {
            metrics_->CountRequest(metrics::Method::kSampleStream, absl::StatusCode::kOk);
          }
        } else {
          FailLocked(step, result.status());
        }
        ProgressLocked();
      },
      std::move(step->reserved));
  if (status.ok()) {
    ++computing_;  // the callback cannot run before this: it needs mu_, which we hold
  } else {
    FailLocked(step, status);
  }
}

void SampleStreamReactor::FailLocked(Step* step, const absl::Status& status) {
  const std::string request_id = step->response.response().request_id();
  step->response.Clear();
  step->response.mutable_response()->set_request_id(request_id);
  step->response.mutable_status()->set_code(static_cast<int>(status.code()));
  step->response.mutable_status()->set_message(std::string(status.message()));
  step->ready = true;
  step->message.Clear();   // release the logits early
  step->reserved.Reset();  // and the bytes reserved for them
  if (metrics_ != nullptr) metrics_->CountRequest(metrics::Method::kSampleStream, status.code());
}

void SampleStreamReactor::ProgressLocked() {
  if (finished_) return;
  if (broken_) {
    // The client is gone: answered steps are dropped; wait for the core to let go of ours.
    while (!steps_.empty() && steps_.front()->ready) steps_.pop_front();
  }
  if (!broken_ && !writing_ && !steps_.empty() && steps_.front()->ready) {
    Step* step = steps_.front().get();
    const absl::Status serialized = SerializeMessage(step->response, &write_bytes_);
    if (!serialized.ok()) {  // a response over 2 GiB: answer the step with why instead
      FailLocked(step, serialized);
      SerializeMessage(step->response, &write_bytes_).IgnoreError();  // a few bytes now
    }
    writing_ = true;
    StartWrite(&write_bytes_);
  }
  if (!reading_ && !reads_done_ && !broken_ && steps_.size() < kMaxStepsInFlight) {
    reading_ = true;
    StartRead(&read_bytes_);
  }
  // A broken stream finishes once nothing of ours is pending; a healthy one once the client
  // has half-closed and every step is answered.
  const bool done = broken_ ? (computing_ == 0 && !reading_ && !writing_)
                            : (reads_done_ && !reading_ && !writing_ && steps_.empty());
  if (done) {
    finished_ = true;
    // A broken stream may end with a step in assembly: give its bytes back now (the reactor
    // itself may outlive the core, until its alarm's callback has run) and cancel its alarm.
    EndAssemblyLocked();
    steps_.clear();
    Finish(broken_ ? grpc::Status(grpc::StatusCode::CANCELLED, "stream write failed")
                   : ToGrpcStatus(end_status_));
  }
}

void SampleStreamReactor::OnWriteDone(bool ok) {
  std::lock_guard<std::mutex> lock(mu_);
  writing_ = false;
  steps_.pop_front();
  if (!ok) broken_ = true;
  ProgressLocked();
}

}  // namespace samplerd::grpc_transport
