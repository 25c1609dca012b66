#include "service/grpc/device_session_reactor.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "service/grpc/convert.h"
#include "service/grpc/peer.h"
#include "service/grpc/raw_message.h"
#include "service/grpc/status_convert.h"

namespace samplerd::grpc_transport {
namespace {

std::string Describe(const v1::DeviceSessionRequest& message) {
  switch (message.kind_case()) {
    case v1::DeviceSessionRequest::kOpen:
      return "open";
    case v1::DeviceSessionRequest::kClose:
      return "close";
    case v1::DeviceSessionRequest::KIND_NOT_SET:
      break;
  }
  return "a message with neither open nor close";
}

grpc::Status InvalidArgument(const std::string& message) {
  return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, message);
}

}  // namespace

DeviceSessionReactor::DeviceSessionReactor(core::SessionManager* sessions,
                                           grpc::CallbackServerContext* context,
                                           bool allow_remote_regions)
    : sessions_(sessions), context_(context) {
  const absl::Status peer = CheckRegionPeer(context->peer(), allow_remote_regions);
  std::lock_guard<std::mutex> lock(mu_);
  if (!peer.ok()) {
    state_ = State::kEnded;
    EndLocked(ToGrpcStatus(peer));
    return;
  }
  StartRead(&read_bytes_);
}

void DeviceSessionReactor::OnReadDone(bool ok) {
  // Parsed before taking mu_: only the read in flight uses read_ and read_bytes_, and the next
  // read starts under mu_ below.
  absl::Status parsed;
  if (ok) {
    read_.Clear();
    parsed = ParseMessage(&read_bytes_, &read_);
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (ok && !parsed.ok()) {
    read_error_ = parsed;
  }
  switch (state_) {
    case State::kAwaitingOpen:
      if (!read_error_.ok()) {
        state_ = State::kEnded;
        EndLocked(ToGrpcStatus(read_error_));
      } else if (!ok) {
        state_ = State::kEnded;
        EndLocked(InvalidArgument(
            "expected the first DeviceSession message to set open, got the end of the stream"));
      } else if (!read_.has_open()) {
        state_ = State::kEnded;
        EndLocked(InvalidArgument(absl::StrCat(
            "expected the first DeviceSession message to set open, got ", Describe(read_))));
      } else {
        OpenLocked();
      }
      break;
    case State::kOpen:
      WhileOpenLocked(ok);
      break;
    case State::kEnded:
      break;  // the read that Finish completed
  }
}

void DeviceSessionReactor::OpenLocked() {
  core::SessionOpen open;
  FromProto(read_.open(), &open);
  // The callback takes mu_: it cannot act before this call has recorded the session.
  absl::StatusOr<core::OpenedSession> opened =
      sessions_->Open(open, [this](const absl::Status& status) { OnSessionEnded(status); });
  if (!opened.ok()) {
    state_ = State::kEnded;
    EndLocked(ToGrpcStatus(opened.status()));
    return;
  }
  state_ = State::kOpen;
  id_ = opened->id;
  ToProto(*opened, opened_.mutable_opened());
  WriteLocked(opened_);
  StartRead(&read_bytes_);  // the next message, or the end of the stream, ends the session
}

void DeviceSessionReactor::WriteLocked(const v1::DeviceSessionResponse& message) {
  // These responses are a few bytes: serializing them cannot fail.
  SerializeMessage(message, &write_bytes_).IgnoreError();
  writing_ = true;
  StartWrite(&write_bytes_);
}

void DeviceSessionReactor::WhileOpenLocked(bool ok) {
  if (!read_error_.ok()) {
    CloseLocked(false, ToGrpcStatus(absl::InvalidArgumentError(
                           absl::StrCat(read_error_.message(), "; the session is closed"))));
  } else if (!ok) {
    // Half-closed, cancelled or gone. A cancelled call cannot take an answer.
    if (context_->IsCancelled()) {
      CloseLocked(false, grpc::Status(grpc::StatusCode::CANCELLED,
                                      "the client cancelled the DeviceSession call"));
    } else {
      CloseLocked(true, grpc::Status::OK);
    }
  } else if (read_.has_close()) {
    CloseLocked(true, grpc::Status::OK);
  } else {
    CloseLocked(false, InvalidArgument(absl::StrCat(
                           "expected close (or the end of the stream) after open, got ",
                           read_.has_open() ? "a second open; the session is closed"
                                            : "a message with neither open nor close")));
  }
}

void DeviceSessionReactor::CloseLocked(bool answer, const grpc::Status& status) {
  absl::StatusOr<uint64_t> steps = sessions_->Close(id_);
  if (!steps.ok()) return;  // ended meanwhile: OnSessionEnded finishes the call
  state_ = State::kEnded;
  if (answer) {
    closed_.mutable_closed()->set_steps(*steps);
    closed_due_ = true;
  }
  EndLocked(status);
}

void DeviceSessionReactor::OnSessionEnded(const absl::Status& status) {
  std::lock_guard<std::mutex> lock(mu_);
  if (state_ != State::kOpen) return;
  state_ = State::kEnded;
  EndLocked(ToGrpcStatus(status));
}

void DeviceSessionReactor::EndLocked(const grpc::Status& status) {
  if (!finish_.has_value()) finish_ = status;
  ProgressLocked();
}

void DeviceSessionReactor::ProgressLocked() {
  if (finished_ || writing_) return;
  if (closed_due_ && !write_failed_) {
    closed_due_ = false;
    WriteLocked(closed_);
    return;
  }
  if (finish_.has_value()) {
    finished_ = true;
    Finish(*finish_);
  }
}

void DeviceSessionReactor::OnWriteDone(bool ok) {
  std::lock_guard<std::mutex> lock(mu_);
  writing_ = false;
  if (!ok) write_failed_ = true;
  ProgressLocked();
}

void DeviceSessionReactor::OnDone() {
  // A callback may still be releasing mu_ after its Finish.
  { std::lock_guard<std::mutex> lock(mu_); }
  delete this;
}

}  // namespace samplerd::grpc_transport
