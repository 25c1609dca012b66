#include "service/grpc/raw_message.h"

#include <google/protobuf/stubs/logging.h>
#include <gtest/gtest.h>

#include <string>

#include "samplerd/v1/sampler.pb.h"

namespace samplerd::grpc_transport {
namespace {

grpc::ByteBuffer Bytes(const std::string& bytes) {
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

TEST(ParseMessage, RoundTripsWithSerializeMessage) {
  v1::SampleRequest request;
  request.set_request_id("step-7");
  request.mutable_logits()->set_inline_data(std::string(1 << 20, '\x01'));  // several slices
  grpc::ByteBuffer buffer;
  ASSERT_TRUE(SerializeMessage(request, &buffer).ok());
  v1::SampleRequest parsed;
  ASSERT_TRUE(ParseMessage(&buffer, &parsed).ok());
  EXPECT_EQ(parsed.request_id(), "step-7");
  EXPECT_EQ(parsed.logits().inline_data(), request.logits().inline_data());
}

TEST(ParseMessage, BytesThatDoNotParseAreInvalidArgumentNamingTheTypeAndSize) {
  grpc::ByteBuffer buffer = Bytes(std::string("\x0a\x10\x01\x02", 4));
  v1::SampleStreamRequest parsed;
  const absl::Status status = ParseMessage(&buffer, &parsed);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(),
            "expected a serialized samplerd.v1.SampleStreamRequest, got 4 bytes that do not parse "
            "(malformed protobuf, or a string field that is not UTF-8)");
}

TEST(ParseMessage, StringThatIsNotUtf8IsInvalidArgument) {
  v1::UnregisterRegionRequest request;
  request.set_name(std::string("r\xc3\x28", 3));
  std::string bytes;
  {
    google::protobuf::LogSilencer silence;
    bytes = request.SerializeAsString();
  }
  grpc::ByteBuffer buffer = Bytes(bytes);
  v1::UnregisterRegionRequest parsed;
  google::protobuf::LogSilencer silence;
  EXPECT_EQ(ParseMessage(&buffer, &parsed).code(), absl::StatusCode::kInvalidArgument);
}

TEST(ParseMessage, EmptyBytesAreTheEmptyMessage) {
  grpc::ByteBuffer buffer = Bytes("");
  v1::ListRegionsRequest parsed;
  EXPECT_TRUE(ParseMessage(&buffer, &parsed).ok());
}

// A unary call whose client half-closed without sending a message (possible with a raw HTTP/2
// client) reaches the method with no payload at all: that is no message, not "0 bytes that do
// not parse" (0 bytes are the empty message, which parses).
TEST(ParseMessage, NoPayloadIsInvalidArgumentSayingNoMessageCame) {
  grpc::ByteBuffer buffer;  // no payload: Valid() is false
  v1::SampleRequest parsed;
  const absl::Status status = ParseMessage(&buffer, &parsed);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(),
            "expected a serialized samplerd.v1.SampleRequest, got no message (the client "
            "half-closed the call without sending one)");
}

}  // namespace
}  // namespace samplerd::grpc_transport
