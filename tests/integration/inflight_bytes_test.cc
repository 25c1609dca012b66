// --max_inflight_bytes on the real binary: unary requests and chunked SampleStream steps that do
// not fit are RESOURCE_EXHAUSTED with the budget in the message, a chunked step reserves its
// bytes at its first message (before any chunk), and the bytes come back when a step is answered,
// when it fails and when its stream is cancelled: a request of the same size is admitted again.
//
// The bytes in flight are read from the server's samplerd_inflight_bytes gauge, so no request
// has to be slow: a chunked step whose chunks have not been sent holds its reservation for as
// long as the test wants.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tests/integration/chunked_step.h"

namespace samplerd::integration {
namespace {

// The budget, and fp32 [1, V] requests of 4 V bytes measured against it.
constexpr int64_t kBudget = 20'000'000;
constexpr int64_t kVocab8MB = 2'000'000;   //  8,000,000 bytes
constexpr int64_t kVocab14MB = 3'500'000;  // 14,000,000 bytes: does not fit beside 8 MB
constexpr int64_t kVocab16MB = 4'000'000;  // 16,000,000 bytes
constexpr int64_t kVocab21MB = 5'250'000;  // 21,000,000 bytes: never fits

std::string Full(int64_t more, int64_t in_flight) {
  return "expected at most " + std::to_string(kBudget) +
         " inline logits bytes in flight (--max_inflight_bytes), got " + std::to_string(more) +
         " more with " + std::to_string(in_flight) + " in flight; retry later";
}

class InflightBytes : public ChunkedStepSuite {
 protected:
  static void SetUpTestSuite() {
    metrics_port_ = StartServerWithMetrics({"--max_inflight_bytes=" + std::to_string(kBudget)});
  }

  // Sends Zeros(vocab) as one Sample call.
  grpc::Status Sample(int64_t vocab, v1::SampleResponse* response) {
    return client_->Sample(Zeros(vocab), response);
  }
};

TEST_F(InflightBytes, AChunkedStepReservesItsBytesAtItsFirstMessageAndUnaryRequestsMustFit) {
  ASSERT_EQ(BytesInFlight(), 0);
  grpc::ClientContext context;
  std::unique_ptr<RawStream> stream = stub_->SampleStream(&context);
  ASSERT_TRUE(stream->Write(FirstMessage(kVocab8MB)));
  // Reserved before a single chunk was sent.
  ASSERT_TRUE(WaitForBytesInFlight(4 * kVocab8MB)) << BytesInFlight();

  v1::SampleResponse response;
  const grpc::Status full = Sample(kVocab14MB, &response);
  EXPECT_EQ(full.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(full.error_message(), Full(4 * kVocab14MB, 4 * kVocab8MB));
  const grpc::Status never = Sample(kVocab21MB, &response);
  EXPECT_EQ(never.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(never.error_message(),
            "expected at most 20000000 inline logits bytes in flight (--max_inflight_bytes), got "
            "21000000 bytes in one request, which can never fit; split the batch or send the "
            "logits in a region");
  // What fits beside the step is served.
  const GreedyCase c = KnownGreedyBatch();
  ASSERT_TRUE(client_->Sample(c.logits.Request({Greedy()}), &response).ok());
  EXPECT_EQ(Tokens(response), c.expected);
  EXPECT_EQ(BytesInFlight(), 4 * kVocab8MB);

  // The step completes; its bytes were given back before its answer was sent.
  const v1::SampleStreamResponse done = FinishStep(stream.get(), kVocab8MB);
  EXPECT_EQ(done.status().code(), 0) << done.status().message();
  EXPECT_EQ(Tokens(done.response()), std::vector<int32_t>{0});
  EXPECT_EQ(BytesInFlight(), 0);
  // Admitted again: nothing leaked.
  const grpc::Status fits = Sample(kVocab14MB, &response);
  ASSERT_TRUE(fits.ok()) << fits.error_message();
  EXPECT_EQ(Tokens(response), std::vector<int32_t>{0});
  EXPECT_EQ(BytesInFlight(), 0);
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
}

TEST_F(InflightBytes, AChunkedStepThatDoesNotFitIsRefusedOnItsResponseAndTheStreamGoesOn) {
  grpc::ClientContext holder_context, context;
  std::unique_ptr<RawStream> holder = stub_->SampleStream(&holder_context);
  ASSERT_TRUE(holder->Write(FirstMessage(kVocab8MB)));
  ASSERT_TRUE(WaitForBytesInFlight(4 * kVocab8MB)) << BytesInFlight();

  std::unique_ptr<RawStream> stream = stub_->SampleStream(&context);
  const v1::SampleStreamResponse refused = ChunkedStep(stream.get(), kVocab14MB);
  EXPECT_EQ(refused.status().code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(refused.status().message(), Full(4 * kVocab14MB, 4 * kVocab8MB));
  EXPECT_EQ(BytesInFlight(), 4 * kVocab8MB);  // the refused step held none

  // The stream stays usable: an unchunked step, and a chunked step that fits.
  const GreedyCase c = KnownGreedyBatch();
  v1::SampleStreamRequest small;
  *small.mutable_request() = c.logits.Request({Greedy()});
  ASSERT_TRUE(stream->Write(small));
  v1::SampleStreamResponse answer;
  ASSERT_TRUE(stream->Read(&answer));
  EXPECT_EQ(answer.status().code(), 0) << answer.status().message();
  EXPECT_EQ(Tokens(answer.response()), c.expected);
  const v1::SampleStreamResponse fits = ChunkedStep(stream.get(), kVocab8MB);
  EXPECT_EQ(fits.status().code(), 0) << fits.status().message();

  // Once the holder's step is answered, the refused step's size fits on the same stream.
  const v1::SampleStreamResponse held = FinishStep(holder.get(), kVocab8MB);
  EXPECT_EQ(held.status().code(), 0) << held.status().message();
  const v1::SampleStreamResponse retried = ChunkedStep(stream.get(), kVocab14MB);
  EXPECT_EQ(retried.status().code(), 0) << retried.status().message();
  EXPECT_EQ(Tokens(retried.response()), std::vector<int32_t>{0});
  EXPECT_EQ(BytesInFlight(), 0);
  for (RawStream* s : {holder.get(), stream.get()}) {
    s->WritesDone();
    EXPECT_TRUE(s->Finish().ok());
  }
}

TEST_F(InflightBytes, CancellingAStreamGivesBackTheBytesOfItsStepInAssembly) {
  {
    grpc::ClientContext context;
    std::unique_ptr<RawStream> stream = stub_->SampleStream(&context);
    ASSERT_TRUE(stream->Write(FirstMessage(kVocab16MB)));
    v1::SampleStreamRequest part;
    part.set_chunk(std::string(kChunkBytes, '\0'));
    part.set_more_chunks(true);
    ASSERT_TRUE(stream->Write(part));
    ASSERT_TRUE(WaitForBytesInFlight(4 * kVocab16MB)) << BytesInFlight();
    v1::SampleResponse response;
    EXPECT_EQ(Sample(kVocab8MB, &response).error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);

    context.TryCancel();
    EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::CANCELLED);
  }
  ASSERT_TRUE(WaitForBytesInFlight(0)) << BytesInFlight();
  v1::SampleResponse response;
  const grpc::Status fits = Sample(kVocab16MB, &response);
  ASSERT_TRUE(fits.ok()) << fits.error_message();
  EXPECT_EQ(Tokens(response), std::vector<int32_t>{0});
}

TEST_F(InflightBytes, AHalfCloseInTheMiddleOfAStepGivesBackItsBytes) {
  grpc::ClientContext context;
  std::unique_ptr<RawStream> stream = stub_->SampleStream(&context);
  ASSERT_TRUE(stream->Write(FirstMessage(kVocab16MB)));
  ASSERT_TRUE(WaitForBytesInFlight(4 * kVocab16MB)) << BytesInFlight();
  stream->WritesDone();
  v1::SampleStreamResponse failed;
  ASSERT_TRUE(stream->Read(&failed));
  EXPECT_EQ(failed.status().code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(failed.status().message(),
            "expected the step's remaining chunks, got the end of the stream");
  EXPECT_TRUE(stream->Finish().ok());
  EXPECT_EQ(BytesInFlight(), 0);  // given back before the step's answer was written
  v1::SampleResponse response;
  const grpc::Status fits = Sample(kVocab16MB, &response);
  ASSERT_TRUE(fits.ok()) << fits.error_message();
}

TEST_F(InflightBytes, ANewRequestInTheMiddleOfAStepFailsThatStepAtOnceAndStartsTheNext) {
  grpc::ClientContext context;
  std::unique_ptr<RawStream> stream = stub_->SampleStream(&context);
  ASSERT_TRUE(stream->Write(FirstMessage(kVocab16MB)));
  ASSERT_TRUE(WaitForBytesInFlight(4 * kVocab16MB)) << BytesInFlight();
  // A `request` where a chunk was expected: the step in progress fails and is answered at once,
  // its bytes free, and the message starts the next step (here a chunked one of 8 MB).
  ASSERT_TRUE(stream->Write(FirstMessage(kVocab8MB)));
  v1::SampleStreamResponse failed;
  ASSERT_TRUE(stream->Read(&failed));
  EXPECT_EQ(failed.status().code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(failed.status().message(),
            "expected a chunk continuing the step in progress, got a new `request`, which starts "
            "the next step");
  ASSERT_TRUE(WaitForBytesInFlight(4 * kVocab8MB)) << BytesInFlight();  // the next step's only
  const v1::SampleStreamResponse next = FinishStep(stream.get(), kVocab8MB);
  EXPECT_EQ(next.status().code(), grpc::StatusCode::OK) << next.status().message();
  ASSERT_EQ(next.response().token_ids_size(), 1);
  EXPECT_EQ(next.response().token_ids(0), 0);
  EXPECT_EQ(BytesInFlight(), 0);
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
}

TEST_F(InflightBytes, EveryRequestOfAStreamIsAnsweredOnceEvenOneThatCutsAStepShort) {
  // The outside tester's sequence: step f chunked, then a whole step g before f's last chunk,
  // then f's last chunk anyway, then a whole step h. Before, g was never answered and f's
  // stray chunk got an answer of its own with no request id.
  grpc::ClientContext context;
  std::unique_ptr<RawStream> stream = stub_->SampleStream(&context);
  v1::SampleStreamRequest f = FirstMessage(kVocab8MB);
  f.mutable_request()->set_request_id("f");
  v1::SampleStreamRequest g;
  *g.mutable_request() = Zeros(1000);
  g.mutable_request()->set_request_id("g");
  v1::SampleStreamRequest h = g;
  h.mutable_request()->set_request_id("h");
  v1::SampleStreamRequest stray;
  stray.set_chunk(std::string(100, '\0'));
  ASSERT_TRUE(stream->Write(f));
  ASSERT_TRUE(stream->Write(g));
  ASSERT_TRUE(stream->Write(stray));
  ASSERT_TRUE(stream->Write(h));
  stream->WritesDone();
  std::vector<std::pair<std::string, grpc::StatusCode>> answers;
  v1::SampleStreamResponse response;
  while (stream->Read(&response)) {
    answers.emplace_back(response.response().request_id(),
                         static_cast<grpc::StatusCode>(response.status().code()));
  }
  EXPECT_TRUE(stream->Finish().ok());
  const std::vector<std::pair<std::string, grpc::StatusCode>> want = {
      {"f", grpc::StatusCode::INVALID_ARGUMENT},
      {"g", grpc::StatusCode::OK},
      {"h", grpc::StatusCode::OK}};
  EXPECT_EQ(answers, want);
  EXPECT_EQ(BytesInFlight(), 0);
}

TEST(InflightBytesFlag, ANegativeValueFailsStartupWithExitCode2) {
  ServerProcess::Options options = CpuServerOptions();
  options.extra_args.push_back("--max_inflight_bytes=-1");
  std::string error;
  EXPECT_EQ(ServerProcess::Start(options, &error), nullptr);
  EXPECT_TRUE(MentionsAny(error, {"exited with status 2"})) << error;
  EXPECT_TRUE(MentionsAny(error, {"expected --max_inflight_bytes >= 0 (0 = no limit), got -1"}))
      << error;
}

}  // namespace
}  // namespace samplerd::integration
