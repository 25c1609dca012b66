// samplerd parses its requests itself: every SamplerService method is registered as a raw
// callback method (grpc::ByteBuffer in and out), and the reactors (unary_call.h for the unary
// methods) call ParseMessage.
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

}  // namespace samplerd::grpc_transport

#endif  // SAMPLERD_SERVICE_GRPC_RAW_MESSAGE_H_
