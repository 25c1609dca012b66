// samplerd parses its requests itself: every SamplerService method is registered as a raw
// callback method (grpc::ByteBuffer in and out), and the reactors call ParseMessage.
//
// Why: gRPC 1.51's callback API reports a request that does not parse badly. A unary one is
// answered UNIMPLEMENTED with an empty message (CallbackUnaryHandler::RunHandler), and a stream
// message that does not parse reaches OnReadDone(false), exactly like the client's half-close,
// so a SampleStream ended OK with its later steps dropped (issue 12, edge 2). Parsing here
// gives INVALID_ARGUMENT with a message instead, and lets a stream tell the two apart.
#ifndef SAMPLERD_SERVICE_GRPC_RAW_MESSAGE_H_
#define SAMPLERD_SERVICE_GRPC_RAW_MESSAGE_H_

#include <google/protobuf/message_lite.h>
#include <grpcpp/grpcpp.h>

#include <utility>

#include "absl/status/status.h"

namespace samplerd::grpc_transport {

// Parses `buffer` (consumed; cleared afterwards) into `*message` with gRPC's own protobuf
// deserializer, so that what parses is exactly what the generated service accepted. Bytes that
// do not parse (a malformed wire format, or a string field that is not valid UTF-8) are
// INVALID_ARGUMENT "expected a serialized samplerd.v1.X, got N bytes that do not parse ...";
// the bytes themselves are never echoed. No payload at all (a unary call the client half-closed
// without a message) is INVALID_ARGUMENT "expected a serialized samplerd.v1.X, got no message".
// libprotobuf may also log the reason (protobuf_log.h limits that).
absl::Status ParseMessage(grpc::ByteBuffer* buffer, google::protobuf::MessageLite* message);

// Serializes `message` into `*buffer` (replacing its contents); INTERNAL when protobuf cannot
// (a message over 2 GiB).
absl::Status SerializeMessage(const google::protobuf::MessageLite& message,
                              grpc::ByteBuffer* buffer);

// A unary call on a raw method: owns the parsed request and the response until gRPC is done
// with the call (it deletes itself in OnDone).
class RawUnaryCall : public grpc::ServerUnaryReactor {
 public:
  // Parses the call's request from `raw` (not consumed: its slices are shared).
  virtual absl::Status ParseRequest(const grpc::ByteBuffer& raw) = 0;
  // Serializes the response when `status` is OK (a failure to serialize becomes the status),
  // then finishes the call. Called once.
  virtual void Reply(grpc::Status status) = 0;
  void OnDone() override { delete this; }
};

template <typename Request, typename Response>
class UnaryCall final : public RawUnaryCall {
 public:
  // `raw_response` is gRPC's response buffer for the call; it outlives the call.
  explicit UnaryCall(grpc::ByteBuffer* raw_response) : raw_response_(raw_response) {}

  absl::Status ParseRequest(const grpc::ByteBuffer& raw) override {
    grpc::ByteBuffer copy(raw);
    return ParseMessage(&copy, &request);
  }

  void Reply(grpc::Status status) override {
    if (status.ok()) {
      const absl::Status serialized = SerializeMessage(response, raw_response_);
      if (!serialized.ok()) {
        status = grpc::Status(grpc::StatusCode::INTERNAL, std::string(serialized.message()));
      }
    }
    Finish(std::move(status));
  }

  Request request;
  Response response;

 private:
  grpc::ByteBuffer* const raw_response_;
};

}  // namespace samplerd::grpc_transport

#endif  // SAMPLERD_SERVICE_GRPC_RAW_MESSAGE_H_
