// Bytes that do not parse (issue 12, edge 2): every method answers INVALID_ARGUMENT with a
// message that names the expected message type (never echoing the bytes); a stream answers the
// steps before such a message, then ends INVALID_ARGUMENT; libprotobuf's log lines are capped;
// the server keeps serving.
//
// The bytes go through gRPC's raw (grpc::ByteBuffer) client calls, as a fuzzer or a client
// with another schema would send them.
#include <google/protobuf/stubs/logging.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/codegen/client_unary_call.h>
#include <grpcpp/impl/codegen/sync_stream.h>

#include <string>
#include <vector>

#include "tests/integration/integration_fixture.h"

namespace samplerd::integration {
namespace {

using C = grpc::StatusCode;

constexpr char kService[] = "/samplerd.v1.SamplerService/";
// A length-delimited field 1 that claims 16 bytes and has 2: no message parses from it.
const std::string kGarbage("\x0a\x10\x01\x02", 4);
// Not UTF-8: a lone continuation byte and an invalid lead byte.
const std::string kNotUtf8("step-\x80\xfe", 7);

grpc::ByteBuffer Bytes(const std::string& bytes) {
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

// Serializes `message` as is; a string field that is not UTF-8 makes libprotobuf log an error
// on the client side too, silenced here.
template <typename Message>
std::string Serialize(const Message& message) {
  google::protobuf::LogSilencer silence;
  return message.SerializeAsString();
}

std::shared_ptr<grpc::Channel> Channel(const std::string& target) {
  return grpc::CreateChannel(target, grpc::InsecureChannelCredentials());
}

// One unary call to `method` with `bytes` as the request.
grpc::Status RawUnary(grpc::Channel* channel, const std::string& method, const std::string& bytes) {
  const std::string path = kService + method;
  const grpc::internal::RpcMethod rpc(path.c_str(), grpc::internal::RpcMethod::NORMAL_RPC);
  grpc::ClientContext context;
  grpc::ByteBuffer response;
  return grpc::internal::BlockingUnaryCall<grpc::ByteBuffer, grpc::ByteBuffer>(
      channel, rpc, &context, Bytes(bytes), &response);
}

// A raw bidirectional stream to `method`.
struct RawStream {
  RawStream(grpc::Channel* channel, const std::string& method) : path(kService + method) {
    const grpc::internal::RpcMethod rpc(path.c_str(), grpc::internal::RpcMethod::BIDI_STREAMING);
    stream.reset(
        grpc::internal::ClientReaderWriterFactory<grpc::ByteBuffer, grpc::ByteBuffer>::Create(
            channel, rpc, &context));
  }
  std::string path;
  grpc::ClientContext context;
  std::unique_ptr<grpc::ClientReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>> stream;
};

::testing::AssertionResult SaysWhatWasExpected(const grpc::Status& status,
                                               const std::string& type) {
  if (status.error_code() != C::INVALID_ARGUMENT) {
    return ::testing::AssertionFailure()
           << "code " << status.error_code() << ": " << status.error_message();
  }
  const std::string& message = status.error_message();
  if (message.find("expected a serialized samplerd.v1." + type) == std::string::npos ||
      message.find("do not parse") == std::string::npos) {
    return ::testing::AssertionFailure() << "message: " << message;
  }
  if (message.find('\x80') != std::string::npos || message.find('\x10') != std::string::npos) {
    return ::testing::AssertionFailure() << "the message echoes the bytes: " << message;
  }
  return ::testing::AssertionSuccess();
}

class Malformed : public ServerSuite {
 protected:
  // A normal Sample call still works.
  void ExpectServing() {
    const GreedyCase c = KnownGreedyBatch();
    v1::SampleResponse response;
    const grpc::Status status = client_->Sample(c.logits.Request({Greedy()}), &response);
    ASSERT_TRUE(status.ok()) << status.error_message();
    EXPECT_EQ(Tokens(response), c.expected);
  }
};

TEST_F(Malformed, UnaryRequestThatDoesNotParseIsInvalidArgumentNamingTheType) {
  const std::shared_ptr<grpc::Channel> channel = Channel(server().target());
  const std::vector<std::pair<std::string, std::string>> methods = {
      {"Sample", "SampleRequest"},
      {"RegisterRegion", "RegisterRegionRequest"},
      {"UnregisterRegion", "UnregisterRegionRequest"},
      {"ListRegions", "ListRegionsRequest"},
      {"GetServerInfo", "GetServerInfoRequest"}};
  for (const auto& [method, type] : methods) {
    EXPECT_TRUE(SaysWhatWasExpected(RawUnary(channel.get(), method, kGarbage), type)) << method;
  }
  ExpectServing();
}

TEST_F(Malformed, RequestIdThatIsNotUtf8IsInvalidArgument) {
  const GreedyCase c = KnownGreedyBatch();
  v1::SampleRequest request = c.logits.Request({Greedy()});
  request.set_request_id(kNotUtf8);
  const grpc::Status status =
      RawUnary(Channel(server().target()).get(), "Sample", Serialize(request));
  EXPECT_TRUE(SaysWhatWasExpected(status, "SampleRequest"));
  EXPECT_NE(status.error_message().find("UTF-8"), std::string::npos) << status.error_message();
  ExpectServing();
}

TEST_F(Malformed, RegionNameThatIsNotUtf8IsInvalidArgument) {
  v1::RegisterRegionRequest request;
  request.set_name(kNotUtf8);
  request.mutable_host_shm()->set_key("/samplerd-x");
  request.mutable_host_shm()->set_byte_size(64);
  EXPECT_TRUE(SaysWhatWasExpected(
      RawUnary(Channel(server().target()).get(), "RegisterRegion", Serialize(request)),
      "RegisterRegionRequest"));
  ExpectServing();
}

TEST_F(Malformed, StreamAnswersTheStepsBeforeAGarbageMessageThenEndsInvalidArgument) {
  const GreedyCase c = KnownGreedyBatch();
  v1::SampleStreamRequest good;
  *good.mutable_request() = c.logits.Request({Greedy()});
  good.mutable_request()->set_request_id("good");
  v1::SampleStreamRequest after = good;
  after.mutable_request()->set_request_id("after");

  const std::shared_ptr<grpc::Channel> channel = Channel(server().target());
  RawStream raw(channel.get(), "SampleStream");
  ASSERT_TRUE(raw.stream->Write(Bytes(Serialize(good))));
  ASSERT_TRUE(raw.stream->Write(Bytes(kGarbage)));
  raw.stream->Write(Bytes(Serialize(after)));  // never read: may fail once the server ends
  raw.stream->WritesDone();

  std::vector<v1::SampleStreamResponse> responses;
  grpc::ByteBuffer bytes;
  while (raw.stream->Read(&bytes)) {
    std::vector<grpc::Slice> slices;
    ASSERT_TRUE(bytes.Dump(&slices).ok());
    std::string flat;
    for (const grpc::Slice& s : slices)
      flat.append(reinterpret_cast<const char*>(s.begin()), s.size());
    ASSERT_TRUE(responses.emplace_back().ParseFromString(flat));
  }
  const grpc::Status status = raw.stream->Finish();

  ASSERT_EQ(responses.size(), 1u) << "only the step before the garbage is answered";
  EXPECT_EQ(responses[0].status().code(), 0) << responses[0].status().message();
  EXPECT_EQ(responses[0].response().request_id(), "good");
  EXPECT_EQ(Tokens(responses[0].response()), c.expected);
  EXPECT_TRUE(SaysWhatWasExpected(status, "SampleStreamRequest"));
  ExpectServing();
}

TEST_F(Malformed, DeviceSessionMessageThatDoesNotParseIsInvalidArgument) {
  const std::shared_ptr<grpc::Channel> channel = Channel(server().target());
  RawStream raw(channel.get(), "DeviceSession");
  raw.stream->Write(Bytes(kGarbage));
  raw.stream->WritesDone();
  grpc::ByteBuffer ignored;
  EXPECT_FALSE(raw.stream->Read(&ignored));
  EXPECT_TRUE(SaysWhatWasExpected(raw.stream->Finish(), "DeviceSessionRequest"));
  ExpectServing();
}

// Its own server, to count every libprotobuf line it logs from start to exit.
TEST(MalformedLog, LibprotobufLinesAreCappedAndTheRestCounted) {
  std::string error;
  std::unique_ptr<ServerProcess> server = ServerProcess::Start(CpuServerOptions(), &error);
  ASSERT_NE(server, nullptr) << error;
  const std::shared_ptr<grpc::Channel> channel = Channel(server->target());
  const GreedyCase c = KnownGreedyBatch();
  v1::SampleRequest request = c.logits.Request({Greedy()});
  request.set_request_id(kNotUtf8);
  const std::string bytes = Serialize(request);
  constexpr int kRequests = 200;
  for (int i = 0; i < kRequests; ++i) {
    ASSERT_EQ(RawUnary(channel.get(), "Sample", bytes).error_code(), C::INVALID_ARGUMENT);
  }
  Client client(server->target());
  v1::SampleResponse response;
  ASSERT_TRUE(client.Sample(c.logits.Request({Greedy()}), &response).ok());
  EXPECT_EQ(Tokens(response), c.expected);
  ASSERT_EQ(server->Stop(), 0);

  // At most 10 lines a minute (kProtobufLogLinesPerMinute); the test takes well under one.
  const std::string log = server->Log();
  int lines = 0;
  for (size_t at = 0; (at = log.find("contains invalid UTF-8", at)) != std::string::npos; ++at) {
    ++lines;
  }
  EXPECT_GE(lines, 1) << log;
  EXPECT_LE(lines, 10) << log;
  const std::string suppressed =
      "suppressed " + std::to_string(kRequests - lines) + " more libprotobuf log lines";
  EXPECT_NE(log.find(suppressed), std::string::npos) << "expected '" << suppressed << "' in\n"
                                                     << log;
}

}  // namespace
}  // namespace samplerd::integration
