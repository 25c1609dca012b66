#include "service/grpc/gated_unary_call.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace samplerd::grpc_transport {

void RawGatedUnaryCall::Start() {
  if (gate_->Acquire(this)) OnReceiveGranted();
}

void RawGatedUnaryCall::OnReceiveGranted() {
  {
    // Once the read starts, the call may complete and OnDone run on another thread before this
    // function returns (a grant comes from another call's Release): OnDone then leaves the
    // delete to the end of this function.
    std::lock_guard<std::mutex> lock(mu_);
    granting_ = true;
  }
  StartRead(&raw_request_);
  bool last;
  {
    std::lock_guard<std::mutex> lock(mu_);
    granting_ = false;
    if (receive_timeout_ != absl::InfiniteDuration() && !read_done_ && !done_) {
      alarm_pending_ = true;
      auto* alarm = new grpc::Alarm();
      receive_alarm_ = alarm;
      // On the monotonic clock: a change of the wall clock neither hastens nor delays it.
      alarm->Set(gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                              gpr_time_from_millis(absl::ToInt64Milliseconds(receive_timeout_),
                                                   GPR_TIMESPAN)),
                 [this, alarm](bool fired) {
                   OnReceiveDeadline(fired);
                   delete alarm;  // without mu_ (receive_alarm_ says why); `this` may be gone
                 });
    }
    last = done_ && !alarm_pending_;
  }
  if (last) delete this;
}

void RawGatedUnaryCall::OnReceiveDeadline(bool fired) {
  bool expire, last;
  {
    std::lock_guard<std::mutex> lock(mu_);
    alarm_pending_ = false;
    // Cancelled (receive_alarm_ null) once the read completed or the call is done.
    expire = fired && receive_alarm_ != nullptr;
    receive_alarm_ = nullptr;
    expired_ = expire;
    last = done_ && !granting_;
  }
  if (expire) {
    // The pending read then completes, unsuccessfully, and OnReadDone gives the share back.
    // OnDone cannot run before that read's reaction, so `this` is still there for Finish.
    Finish(grpc::Status(
        grpc::StatusCode::DEADLINE_EXCEEDED,
        absl::StrCat("expected the whole request within ",
                     absl::ToInt64Milliseconds(receive_timeout_),
                     " ms of its turn to be received (--chunk_timeout_ms), got it still "
                     "arriving; its share of --max_receive_bytes went to the next call")));
  }
  if (last) delete this;
}

void RawGatedUnaryCall::OnReadDone(bool ok) {
  // ok is false for a call half-closed without a message (ParseRequest says so), a message over
  // --max_message_bytes (gRPC has answered RESOURCE_EXHAUSTED already), a cancelled call or one
  // the receive deadline has answered.
  const absl::Status parsed = ParseRequest(&raw_request_);
  raw_request_.Clear();  // the received bytes go now, not at the end of the call
  gate_->Release();
  bool expired;
  {
    std::lock_guard<std::mutex> lock(mu_);
    read_done_ = true;
    if (receive_alarm_ != nullptr) {
      receive_alarm_->Cancel();  // its callback runs soon, with `fired` false
      receive_alarm_ = nullptr;
    }
    expired = expired_;
  }
  if (expired) return;
  if (!ok && context_->IsCancelled()) {
    Finish(grpc::Status::CANCELLED);  // never reached the method: not counted
    return;
  }
  on_request_(this, parsed);
}

void RawGatedUnaryCall::OnCancel() {
  // Still queued: it will never read, so it is finished here. Otherwise its read fails or has
  // completed, and OnReadDone finishes it.
  if (gate_->Cancel(this)) Finish(grpc::Status::CANCELLED);
}

void RawGatedUnaryCall::OnDone() {
  bool last;
  {
    // gRPC calls OnDone once its own reactions have returned, but a thread that called Finish
    // (the deadline's callback) may still be releasing mu_: wait for it.
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
    if (receive_alarm_ != nullptr) {
      receive_alarm_->Cancel();
      receive_alarm_ = nullptr;
    }
    last = !alarm_pending_ && !granting_;
  }
  // Else the deadline's callback (a cancelled alarm's runs too, soon) or OnReceiveGranted is
  // still to return: it deletes the call, which must outlive it.
  if (last) delete this;
}

void RawGatedUnaryCall::Reply(grpc::Status status) {
  if (status.ok()) {
    const absl::Status serialized = SerializeResponse(&raw_response_);
    if (serialized.ok()) {
      StartWriteAndFinish(&raw_response_, grpc::WriteOptions(), grpc::Status::OK);
      return;
    }
    status = grpc::Status(grpc::StatusCode::INTERNAL, std::string(serialized.message()));
  }
  Finish(std::move(status));
}

}  // namespace samplerd::grpc_transport
