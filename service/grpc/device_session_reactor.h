// The DeviceSession reactor: one per call, holding one device session for as long as the call
// lives. The first message opens the session (SessionManager::Open) and is answered `opened`;
// `close`, the client half-closing, cancelling or going away ends it (answered `closed` while
// the call is still there); the session ending on its own (drain: UNAVAILABLE, a runner fault:
// its status) ends the call. A message that does not parse as a DeviceSessionRequest (messages
// arrive raw, raw_message.h) ends the call with INVALID_ARGUMENT, closing an open session
// without a `closed` answer.
#ifndef SAMPLERD_SERVICE_GRPC_DEVICE_SESSION_REACTOR_H_
#define SAMPLERD_SERVICE_GRPC_DEVICE_SESSION_REACTOR_H_

#include <grpcpp/grpcpp.h>

#include <mutex>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "samplerd/v1/sampler.pb.h"
#include "service/core/session/session_manager.h"

namespace samplerd::grpc_transport {

class DeviceSessionReactor final
    : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  // A session names regions: it needs a unix-socket peer unless `allow_remote_regions`
  // (peer.h). `sessions` must outlive the call.
  DeviceSessionReactor(core::SessionManager* sessions, grpc::CallbackServerContext* context,
                       bool allow_remote_regions);

  void OnReadDone(bool ok) override;
  void OnWriteDone(bool ok) override;
  void OnDone() override;

 private:
  enum class State { kAwaitingOpen, kOpen, kEnded };

  // Handles the first message (mu_ held).
  void OpenLocked();
  // Handles a message, or the end of reads, of an open session (mu_ held).
  void WhileOpenLocked(bool ok);
  // Serializes `message` and starts writing it (mu_ held; no write pending).
  void WriteLocked(const v1::DeviceSessionResponse& message);
  // Closes the session; then answers `closed` and finishes with `status` when `answer`, else
  // finishes with `status` at once (mu_ held). A session that has ended meanwhile finishes
  // through OnSessionEnded instead.
  void CloseLocked(bool answer, const grpc::Status& status);
  // The session ended without Close (any thread).
  void OnSessionEnded(const absl::Status& status);
  // Ends the call with `status` once no write is pending (mu_ held).
  void EndLocked(const grpc::Status& status);
  // Starts the `closed` write or the Finish that is due (mu_ held).
  void ProgressLocked();

  core::SessionManager* const sessions_;
  grpc::CallbackServerContext* const context_;
  std::mutex mu_;
  State state_ = State::kAwaitingOpen;
  std::string id_;
  grpc::ByteBuffer read_bytes_;  // the message being read; parsed into read_
  v1::DeviceSessionRequest read_;
  absl::Status read_error_;  // why read_bytes_ did not parse
  grpc::ByteBuffer write_bytes_;
  v1::DeviceSessionResponse opened_;
  v1::DeviceSessionResponse closed_;
  bool writing_ = false;
  bool closed_due_ = false;             // `closed_` is to be written
  bool write_failed_ = false;           // the client is gone: nothing more is written
  std::optional<grpc::Status> finish_;  // the status to finish with, once writes are done
  bool finished_ = false;
};

}  // namespace samplerd::grpc_transport

#endif  // SAMPLERD_SERVICE_GRPC_DEVICE_SESSION_REACTOR_H_
