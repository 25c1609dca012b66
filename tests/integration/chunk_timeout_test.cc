// --chunk_timeout_ms on the real binary: a chunked SampleStream step whose last chunk does not
// come in time is answered DEADLINE_EXCEEDED by the server itself (the client sends nothing
// more), its reserved bytes of --max_inflight_bytes are free at once for other clients, the rest
// of its chunks are skipped and the stream goes on.
//
// The suite's server expires steps after 50 ms. Its tests only stall steps on purpose: no test
// here needs a step to beat the deadline, so none depends on how fast this machine is.
#include <memory>
#include <string>
#include <vector>

#include "tests/integration/chunked_step.h"

namespace samplerd::integration {
namespace {

constexpr int64_t kTimeoutMs = 50;
constexpr int64_t kBudget = 20'000'000;
constexpr int64_t kVocab8MB = 2'000'000;   //  8,000,000 bytes
constexpr int64_t kVocab16MB = 4'000'000;  // 16,000,000 bytes: two do not fit in the budget

// The status message of a step that expired after `messages` messages with `received` of its
// `bytes` bytes.
std::string Expired(int64_t timeout_ms, int64_t received, int64_t bytes, int messages) {
  return "expected the chunked step's last chunk within " + std::to_string(timeout_ms) +
         " ms of its first message (--chunk_timeout_ms), got " + std::to_string(received) +
         " of its " + std::to_string(bytes) + " bytes in " + std::to_string(messages) +
         (messages == 1 ? " message" : " messages") +
         "; the step's remaining chunks will be skipped";
}

class ChunkTimeout : public ChunkedStepSuite {
 protected:
  static void SetUpTestSuite() {
    metrics_port_ = StartServerWithMetrics({"--chunk_timeout_ms=" + std::to_string(kTimeoutMs),
                                            "--max_inflight_bytes=" + std::to_string(kBudget),
                                            "--max_inflight=64"});
  }

  void SetUp() override {
    ChunkedStepSuite::SetUp();
    // Without the deadline, a stalled step is never answered: fail, do not hang.
    context_.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    stream_ = stub_->SampleStream(&context_);
  }

  // A greedy unchunked step on stream_ and its answer (KnownGreedyBatch's tokens expected).
  void ExpectAStepIsServed() {
    const GreedyCase c = KnownGreedyBatch();
    v1::SampleStreamRequest step;
    *step.mutable_request() = c.logits.Request({Greedy()});
    step.mutable_request()->set_request_id("after");
    ASSERT_TRUE(stream_->Write(step));
    v1::SampleStreamResponse answer;
    ASSERT_TRUE(stream_->Read(&answer));
    EXPECT_EQ(answer.response().request_id(), "after");
    EXPECT_EQ(answer.status().code(), 0) << answer.status().message();
    EXPECT_EQ(Tokens(answer.response()), c.expected);
  }

  // Half-closes stream_ and expects no further answer and an OK end.
  void ExpectTheStreamEndsOk() {
    stream_->WritesDone();
    v1::SampleStreamResponse extra;
    EXPECT_FALSE(stream_->Read(&extra)) << "an answer no step asked for: " << extra.DebugString();
    const grpc::Status status = stream_->Finish();
    EXPECT_TRUE(status.ok()) << status.error_code() << ": " << status.error_message();
  }

  grpc::ClientContext context_;
  std::unique_ptr<RawStream> stream_;
};

TEST_F(ChunkTimeout, GetServerInfoReportsTheDeadlineAndTheInflightLimits) {
  v1::GetServerInfoResponse info;
  ASSERT_TRUE(client_->GetServerInfo(&info).ok());
  EXPECT_EQ(info.limits().chunk_timeout_ms(), kTimeoutMs);
  EXPECT_EQ(info.limits().max_inflight_bytes(), kBudget);
  EXPECT_EQ(info.limits().max_inflight(), 64);
}

TEST_F(ChunkTimeout, AStalledStepIsAnsweredDeadlineExceededAndItsBytesAreFreeWithNoClientAction) {
  const double expired_before =
      Requests(ScrapeMetrics(metrics_port_), "SampleStream", "DEADLINE_EXCEEDED");
  v1::SampleStreamRequest first = FirstMessage(kVocab16MB);
  first.mutable_request()->set_request_id("stalled");
  ASSERT_TRUE(stream_->Write(first));
  // The client sends nothing more: the server answers the step by itself.
  v1::SampleStreamResponse expired;
  ASSERT_TRUE(stream_->Read(&expired));
  EXPECT_EQ(expired.response().request_id(), "stalled");
  EXPECT_EQ(expired.status().code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_EQ(expired.status().message(), Expired(kTimeoutMs, 0, 4 * kVocab16MB, 1));
  EXPECT_TRUE(WaitForBytesInFlight(0)) << BytesInFlight();
  EXPECT_EQ(
      Requests(ScrapeMetrics(metrics_port_), "SampleStream", "DEADLINE_EXCEEDED") - expired_before,
      1);

  // Another client's request that needs those bytes (it would not fit beside the step) is served.
  v1::SampleResponse response;
  const grpc::Status fits = client_->Sample(Zeros(kVocab16MB), &response);
  ASSERT_TRUE(fits.ok()) << fits.error_message();
  EXPECT_EQ(Tokens(response), std::vector<int32_t>{0});

  // The stream goes on with a new step; the expired step's chunks never came.
  ExpectAStepIsServed();
  ExpectTheStreamEndsOk();
  EXPECT_EQ(BytesInFlight(), 0);
}

TEST_F(ChunkTimeout, TheLateChunksOfAnExpiredStepAreSkippedAndTheStreamGoesOn) {
  // The step's first message carries its first 1 MiB (logits.inline_data).
  v1::SampleStreamRequest first = FirstMessage(kVocab8MB);
  first.mutable_request()->mutable_logits()->set_inline_data(std::string(kChunkBytes, '\0'));
  ASSERT_TRUE(stream_->Write(first));
  v1::SampleStreamResponse expired;
  ASSERT_TRUE(stream_->Read(&expired));
  EXPECT_EQ(expired.status().code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_EQ(expired.status().message(), Expired(kTimeoutMs, kChunkBytes, 4 * kVocab8MB, 1));
  EXPECT_TRUE(WaitForBytesInFlight(0)) << BytesInFlight();

  // The rest of the step comes late, up to its last chunk: no answer for any of it (an answer
  // would come before the next step's).
  SendChunks(stream_.get(), 4 * kVocab8MB - kChunkBytes);
  ExpectAStepIsServed();
  ExpectTheStreamEndsOk();
  EXPECT_EQ(BytesInFlight(), 0);
}

TEST_F(ChunkTimeout, AStalledStepRefusedAtItsFirstMessageIsAnsweredWithItsRefusalAtTheDeadline) {
  // A vocabulary over --max_vocab is refused at the first message and holds no bytes, but the
  // step still answers when its time is up instead of waiting for its last chunk.
  ASSERT_TRUE(stream_->Write(FirstMessage(5'000'000)));
  v1::SampleStreamResponse refused;
  ASSERT_TRUE(stream_->Read(&refused));
  EXPECT_EQ(refused.status().code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(refused.status().message(),
            "expected vocabulary size V <= 4194304 (server limit), got 5000000");
  ExpectAStepIsServed();
  ExpectTheStreamEndsOk();
}

TEST(ChunkTimeoutRace, EveryStepIsAnsweredOnceWhetherItsLastChunkOrItsDeadlineComesFirst) {
  // A 1 ms deadline and steps of two messages sent 0 to 2 ms apart: some complete, some expire,
  // some race their alarm. Whichever wins, each step gets exactly one answer, in order, and
  // gives its bytes back: the budget holds exactly one step, so a leak would refuse the next.
  constexpr int64_t kVocab = 256;  // 1,024 bytes, sent as 512 + 512
  ServerProcess::Options options = CpuServerOptions();
  options.extra_args.push_back("--chunk_timeout_ms=1");
  options.extra_args.push_back("--max_inflight_bytes=" + std::to_string(4 * kVocab));
  std::string error;
  std::unique_ptr<ServerProcess> server = ServerProcess::Start(options, &error);
  ASSERT_NE(server, nullptr) << error;
  {  // the call ends with its context, before the server stops
    std::unique_ptr<v1::SamplerService::Stub> stub = v1::SamplerService::NewStub(
        grpc::CreateChannel(server->target(), grpc::InsecureChannelCredentials()));
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    std::unique_ptr<RawStream> stream = stub->SampleStream(&context);
    int completed = 0, expired = 0;
    for (int i = 0; i < 210; ++i) {
      v1::SampleStreamRequest first = FirstMessage(kVocab);
      first.mutable_request()->set_request_id("step-" + std::to_string(i));
      first.mutable_request()->mutable_logits()->set_inline_data(std::string(2 * kVocab, '\0'));
      ASSERT_TRUE(stream->Write(first));
      // Not a wait for anything: the gap sweeps across the deadline, so that the last chunk
      // arrives before it, after it and at about the moment the alarm fires.
      absl::SleepFor(absl::Microseconds(100 * (i % 21)));
      SendChunks(stream.get(), 2 * kVocab);
      v1::SampleStreamResponse answer;
      ASSERT_TRUE(stream->Read(&answer)) << i;
      ASSERT_EQ(answer.response().request_id(), "step-" + std::to_string(i));
      if (answer.status().code() == 0) {
        EXPECT_EQ(Tokens(answer.response()), std::vector<int32_t>{0}) << i;
        ++completed;
      } else {
        ASSERT_EQ(answer.status().code(), grpc::StatusCode::DEADLINE_EXCEEDED)
            << i << ": " << answer.status().message();
        EXPECT_TRUE(MentionsAny(answer.status().message(), {"within 1 ms of its first message"}));
        ++expired;
      }
    }
    std::cout << completed << " steps completed, " << expired << " expired\n";
    stream->WritesDone();
    v1::SampleStreamResponse extra;
    EXPECT_FALSE(stream->Read(&extra)) << "an answer no step asked for: " << extra.DebugString();
    EXPECT_TRUE(stream->Finish().ok());
  }
  {  // nothing leaked: a request of the whole budget is admitted
    Client client(server->target());
    v1::SampleResponse response;
    const grpc::Status fits = client.Sample(Zeros(kVocab), &response);
    EXPECT_TRUE(fits.ok()) << fits.error_message();
  }
  EXPECT_EQ(server->Stop(), 0) << server->Log();
}

TEST(ChunkTimeoutFlag, ZeroFailsStartupWithExitCode2) {
  ServerProcess::Options options = CpuServerOptions();
  options.extra_args.push_back("--chunk_timeout_ms=0");
  std::string error;
  EXPECT_EQ(ServerProcess::Start(options, &error), nullptr);
  EXPECT_TRUE(MentionsAny(error, {"exited with status 2"})) << error;
  EXPECT_TRUE(MentionsAny(error, {"expected --chunk_timeout_ms in [1, 86400000] (1 ms to 1 day), "
                                  "got 0"}))
      << error;
}

}  // namespace
}  // namespace samplerd::integration
