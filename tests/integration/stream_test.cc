// SampleStream through samplerd::SampleSession: order, request ids, a bad step in the middle,
// chunked steps, and agreement with unary Sample.
#include <fstream>
#include <string>
#include <vector>

#include "tests/integration/integration_fixture.h"

namespace samplerd::integration {
namespace {

using SampleStream = ServerSuite;

// Step i samples the known batch with its rows rotated left by i, so each step has its own answer.
v1::SampleRequest RotatedGreedyStep(int step, std::vector<int32_t>* expected) {
  const GreedyCase c = KnownGreedyBatch();
  Logits rotated{4, 8, {}};
  expected->clear();
  for (int r = 0; r < 4; ++r) {
    const int source = (r + step) % 4;
    rotated.values.insert(rotated.values.end(), c.logits.values.begin() + source * 8,
                          c.logits.values.begin() + (source + 1) * 8);
    expected->push_back(c.expected[source]);
  }
  v1::SampleRequest request = rotated.Request({Greedy()});
  request.set_request_id("step-" + std::to_string(step));
  return request;
}

TEST_F(SampleStream, StepsAreAnsweredInOrderWithTheirRequestIds) {
  std::unique_ptr<SampleSession> session = client_->OpenStream();
  for (int step = 0; step < 6; ++step) {
    std::vector<int32_t> expected;
    const v1::SampleRequest request = RotatedGreedyStep(step, &expected);
    v1::SampleResponse response;
    const grpc::Status status = session->Step(request, &response);
    ASSERT_TRUE(status.ok()) << "step " << step << ": " << status.error_message();
    EXPECT_EQ(response.request_id(), request.request_id());
    EXPECT_EQ(Tokens(response), expected) << "step " << step;
  }
  EXPECT_TRUE(session->Close().ok());
  EXPECT_FALSE(session->open());
}

TEST_F(SampleStream, BadStepFailsAloneAndLaterStepsStillWork) {
  std::unique_ptr<SampleSession> session = client_->OpenStream();
  for (int step = 0; step < 5; ++step) {
    std::vector<int32_t> expected;
    v1::SampleRequest request = RotatedGreedyStep(step, &expected);
    if (step == 2) request.mutable_params(0)->set_top_p(1.5f);
    v1::SampleResponse response;
    const grpc::Status status = session->Step(request, &response);
    EXPECT_EQ(response.request_id(), request.request_id()) << "step " << step;
    if (step == 2) {
      EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
      EXPECT_TRUE(MentionsAny(status.error_message(), {"top_p"}));
      EXPECT_EQ(response.token_ids_size(), 0);
      EXPECT_TRUE(session->open());
    } else {
      ASSERT_TRUE(status.ok()) << "step " << step << ": " << status.error_message();
      EXPECT_EQ(Tokens(response), expected) << "step " << step;
    }
  }
  EXPECT_TRUE(session->Close().ok());
}

TEST_F(SampleStream, SeededStepsMatchUnarySample) {
  const Logits logits = RandomLogits(8, 5000, /*seed=*/21);
  std::unique_ptr<SampleSession> session = client_->OpenStream();
  for (uint64_t position = 0; position < 4; ++position) {
    v1::SamplingParams params = TopKTopP(555);
    params.set_position(position);
    const v1::SampleRequest request = logits.Request({params});
    v1::SampleResponse streamed, unary;
    ASSERT_TRUE(session->Step(request, &streamed).ok());
    ASSERT_TRUE(client_->Sample(request, &unary).ok());
    EXPECT_EQ(Tokens(streamed), Tokens(unary)) << "position " << position;
  }
  EXPECT_TRUE(session->Close().ok());
}

TEST_F(SampleStream, ChunkedStepIsReassembled) {
  ClientOptions options;
  options.stream_chunk_bytes = 1000;  // 3 x 700 x 4 bytes -> 9 messages
  Client chunking_client(server().target(), options);
  const Logits logits = RandomLogits(3, 700, /*seed=*/22);
  const v1::SampleRequest request = logits.Request({TopKTopP(8)});
  v1::SampleResponse chunked, unary;
  std::unique_ptr<SampleSession> session = chunking_client.OpenStream();
  const grpc::Status status = session->Step(request, &chunked);
  ASSERT_TRUE(status.ok()) << status.error_code() << ": " << status.error_message();
  ASSERT_TRUE(client_->Sample(request, &unary).ok());
  EXPECT_EQ(Tokens(chunked), Tokens(unary));
  EXPECT_TRUE(session->Close().ok());
}

// A step larger than the client's message limit is refused before it is written, and the
// session stays open: gRPC would otherwise fail the whole call for it, and every later step.
TEST_F(SampleStream, StepOverTheClientsMessageLimitFailsAloneAndTheSessionStaysOpen) {
  ClientOptions options;
  options.max_message_bytes = 64 << 10;
  Client small_client(server().target(), options);
  std::unique_ptr<SampleSession> session = small_client.OpenStream();
  const Logits big = RandomLogits(1, 32 << 10, /*seed=*/23);  // 128 KiB of logits
  v1::SampleResponse response;
  grpc::Status status = session->Step(big.Request({Greedy()}), &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(status.error_message().rfind("expected a step message of at most 65536 bytes "
                                         "(ClientOptions::max_message_bytes), got 1310",
                                         0),
            0u)
      << status.error_message();
  EXPECT_TRUE(session->open());
  std::vector<int32_t> expected;
  status = session->Step(RotatedGreedyStep(1, &expected), &response);
  ASSERT_TRUE(status.ok()) << status.error_code() << ": " << status.error_message();
  EXPECT_EQ(Tokens(response), expected);
  EXPECT_TRUE(session->Close().ok());
}

TEST_F(SampleStream, StepAfterCloseFailsWithoutSending) {
  std::unique_ptr<SampleSession> session = client_->OpenStream();
  ASSERT_TRUE(session->Close().ok());
  std::vector<int32_t> expected;
  v1::SampleResponse response;
  EXPECT_EQ(session->Step(RotatedGreedyStep(0, &expected), &response).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_TRUE(session->Close().ok());  // idempotent
}

// A server with a small vocabulary limit, to which chunked steps are sent message by message.
class ChunkedStepLimits : public ServerSuite {
 protected:
  static constexpr int kMaxVocab = 4096;
  static constexpr int kChunkBytes = 64 << 10;

  static void SetUpTestSuite() {
    ServerProcess::Options options = CpuServerOptions();
    options.extra_args.push_back("--max_vocab=" + std::to_string(kMaxVocab));
    StartServer(options);
  }

  using RawStream = grpc::ClientReaderWriter<v1::SampleStreamRequest, v1::SampleStreamResponse>;

  // Sends one step of shape [1, vocab] fp32 whose chunks hold `bytes` bytes in all (the first
  // message carries none), and returns its answer.
  static v1::SampleStreamResponse SendChunkedStep(RawStream* stream, int64_t vocab, int64_t bytes) {
    v1::SampleStreamRequest first;
    v1::Tensor* logits = first.mutable_request()->mutable_logits();
    logits->set_dtype(v1::DTYPE_FP32);
    logits->add_shape(1);
    logits->add_shape(vocab);
    logits->set_inline_data("");
    first.set_more_chunks(true);
    EXPECT_TRUE(stream->Write(first));
    const std::string chunk(kChunkBytes, '\0');
    for (int64_t sent = 0; sent < bytes; sent += kChunkBytes) {
      v1::SampleStreamRequest next;
      next.set_chunk(
          chunk.substr(0, static_cast<size_t>(std::min<int64_t>(kChunkBytes, bytes - sent))));
      next.set_more_chunks(sent + kChunkBytes < bytes);
      EXPECT_TRUE(stream->Write(next));
    }
    v1::SampleStreamResponse response;
    EXPECT_TRUE(stream->Read(&response));
    return response;
  }

  // The server's peak resident memory (VmHWM), in bytes; -1 where /proc does not say.
  int64_t ServerPeakRss() {
    std::ifstream status("/proc/" + std::to_string(server().pid()) + "/status");
    std::string line;
    while (std::getline(status, line)) {
      if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
    }
    return -1;
  }
};

TEST_F(ChunkedStepLimits, StepOverTheVocabLimitIsRefusedWithoutCollectingItsChunks) {
  std::unique_ptr<v1::SamplerService::Stub> stub = v1::SamplerService::NewStub(
      grpc::CreateChannel(server().target(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  std::unique_ptr<RawStream> stream = stub->SampleStream(&context);
  const int64_t peak_before = ServerPeakRss();
  ASSERT_GT(peak_before, 0);

  // 128 MiB of chunks for a step whose shape the server refuses at its first message.
  const int64_t sent = int64_t{128} << 20;
  const v1::SampleStreamResponse refused = SendChunkedStep(stream.get(), sent / 4, sent);
  EXPECT_EQ(refused.status().code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_TRUE(MentionsAny(refused.status().message(), {std::to_string(kMaxVocab)}))
      << refused.status().message();
  // The chunks were dropped as they arrived: the peak grew by far less than what was sent.
  if (!kAddressSanitizer) {
    EXPECT_LT(ServerPeakRss() - peak_before, sent / 4)
        << "peak RSS " << peak_before << " -> " << ServerPeakRss();
  }

  // The stream keeps serving: a step within the limits is sampled.
  const v1::SampleStreamResponse ok = SendChunkedStep(stream.get(), 1000, 4000);
  EXPECT_EQ(ok.status().code(), 0) << ok.status().message();
  EXPECT_EQ(ok.response().token_ids_size(), 1);
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
}

TEST_F(ChunkedStepLimits, ChunksBeyondTheShapesBytesAreRefused) {
  std::unique_ptr<v1::SamplerService::Stub> stub = v1::SamplerService::NewStub(
      grpc::CreateChannel(server().target(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  std::unique_ptr<RawStream> stream = stub->SampleStream(&context);
  const v1::SampleStreamResponse refused = SendChunkedStep(stream.get(), 1000, 5000);
  EXPECT_EQ(refused.status().code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(MentionsAny(refused.status().message(), {"expected 4000 bytes"}))
      << refused.status().message();
  const v1::SampleStreamResponse ok = SendChunkedStep(stream.get(), 1000, 4000);
  EXPECT_EQ(ok.status().code(), 0) << ok.status().message();
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
}

}  // namespace
}  // namespace samplerd::integration
