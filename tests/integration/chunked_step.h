// Chunked SampleStream steps of zeros on a raw stream, and a suite that reads the server's bytes
// in flight, for the tests of --max_inflight_bytes and --chunk_timeout_ms. A step's first message
// carries its shape and no bytes, so a test holds back its chunks for as long as it wants.
#ifndef SAMPLERD_TESTS_INTEGRATION_CHUNKED_STEP_H_
#define SAMPLERD_TESTS_INTEGRATION_CHUNKED_STEP_H_

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "tests/integration/integration_fixture.h"
#include "tests/integration/metrics_scrape.h"

namespace samplerd::integration {

using RawStream = grpc::ClientReaderWriter<v1::SampleStreamRequest, v1::SampleStreamResponse>;

inline constexpr int64_t kChunkBytes = 1 << 20;

// A greedy [1, vocab] fp32 request of zeros: the answer is token 0 (ties go to the lowest index).
inline v1::SampleRequest Zeros(int64_t vocab) {
  const std::vector<float> zeros(static_cast<size_t>(vocab), 0.0f);
  return MakeFp32Request(zeros.data(), 1, vocab, {Greedy()});
}

// The first message of a chunked step of Zeros(vocab): its shape, no bytes, more to come.
inline v1::SampleStreamRequest FirstMessage(int64_t vocab) {
  v1::SampleStreamRequest first;
  *first.mutable_request() = Zeros(vocab);
  first.mutable_request()->mutable_logits()->set_inline_data("");
  first.set_more_chunks(true);
  return first;
}

// Sends the `bytes` zero bytes that continue a chunked step, in chunks of kChunkBytes, the last
// ending the step.
inline void SendChunks(RawStream* stream, int64_t bytes) {
  const std::string chunk(kChunkBytes, '\0');
  for (int64_t sent = 0; sent < bytes; sent += kChunkBytes) {
    v1::SampleStreamRequest next;
    next.set_chunk(chunk.substr(0, static_cast<size_t>(std::min(kChunkBytes, bytes - sent))));
    next.set_more_chunks(sent + kChunkBytes < bytes);
    ASSERT_TRUE(stream->Write(next));
  }
}

// Sends the chunks of a step started with FirstMessage(vocab) and reads its answer.
inline v1::SampleStreamResponse FinishStep(RawStream* stream, int64_t vocab) {
  SendChunks(stream, 4 * vocab);
  v1::SampleStreamResponse response;
  EXPECT_TRUE(stream->Read(&response));
  return response;
}

// A whole chunked step of Zeros(vocab) on `stream`, and its answer.
inline v1::SampleStreamResponse ChunkedStep(RawStream* stream, int64_t vocab) {
  EXPECT_TRUE(stream->Write(FirstMessage(vocab)));
  return FinishStep(stream, vocab);
}

// A suite whose server exposes its metrics on loopback (start it with StartServerWithMetrics and
// keep the port in metrics_port_), with a stub for raw streams.
class ChunkedStepSuite : public ServerSuite {
 protected:
  void SetUp() override {
    ServerSuite::SetUp();
    stub_ = v1::SamplerService::NewStub(
        grpc::CreateChannel(server().target(), grpc::InsecureChannelCredentials()));
  }

  // The server's samplerd_inflight_bytes.
  static double BytesInFlight() {
    return SeriesValue(ScrapeMetrics(metrics_port_), "samplerd_inflight_bytes");
  }

  // Waits until the server reports `bytes` in flight; false after 30 s.
  static bool WaitForBytesInFlight(double bytes) {
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (absl::Now() < deadline) {
      if (BytesInFlight() == bytes) return true;
      absl::SleepFor(absl::Milliseconds(10));  // each scrape is a new connection
    }
    return false;
  }

  inline static int metrics_port_ = 0;
  std::unique_ptr<v1::SamplerService::Stub> stub_;
};

}  // namespace samplerd::integration

#endif  // SAMPLERD_TESTS_INTEGRATION_CHUNKED_STEP_H_
