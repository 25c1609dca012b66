#include "service/grpc/raw_message.h"

#include <grpcpp/impl/codegen/proto_utils.h>

#include <string>

#include "absl/strings/str_cat.h"

namespace samplerd::grpc_transport {

absl::Status ParseMessage(grpc::ByteBuffer* buffer, google::protobuf::MessageLite* message) {
  if (!buffer->Valid()) {  // no payload at all (0 bytes are the empty message, and parse)
    return absl::InvalidArgumentError(
        absl::StrCat("expected a serialized ", message->GetTypeName(),
                     ", got no message (the client half-closed the call without sending one)"));
  }
  const size_t size = buffer->Length();
  const grpc::Status status =
      grpc::GenericDeserialize<grpc::ProtoBufferReader, google::protobuf::MessageLite>(buffer,
                                                                                       message);
  if (status.ok()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "expected a serialized ", message->GetTypeName(), ", got ", size,
      " bytes that do not parse (malformed protobuf, or a string field that is not UTF-8)"));
}

absl::Status SerializeMessage(const google::protobuf::MessageLite& message,
                              grpc::ByteBuffer* buffer) {
  buffer->Clear();  // the writer below makes a new buffer without releasing an old one
  bool own_buffer = false;
  const grpc::Status status =
      grpc::GenericSerialize<grpc::ProtoBufferWriter, google::protobuf::MessageLite>(
          message, buffer, &own_buffer);
  if (status.ok()) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat("cannot serialize a ", message.GetTypeName(), ": ", status.error_message()));
}

}  // namespace samplerd::grpc_transport
