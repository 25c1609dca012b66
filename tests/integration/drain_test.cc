// The drain's bound (issue 12, item 1): SIGTERM while a CPU batch longer than the grace period
// is computing. The batch is given up at the end of the grace period, its call is answered
// UNAVAILABLE (as the proto says of a draining server), and the process exits within the grace
// period plus the documented 1 s.
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>

#include "tests/integration/integration_fixture.h"
#include "tests/integration/metrics_scrape.h"

namespace samplerd::integration {
namespace {

constexpr std::chrono::milliseconds kGrace{500};
// README.md and docs/DESIGN.md: the process exits within the grace period plus 1 s.
constexpr std::chrono::milliseconds kExitBound{1000};

// A [batch, vocab] bf16 request of random logits in [-10, 10) under top-k + top-p, so that every
// row is sorted: ~16 ms a row at V = 151,936 on one core of the CI machine (bench_cpu_sampler).
v1::SampleRequest SlowBatch(int64_t batch, int64_t vocab) {
  v1::SampleRequest request = MakeFp32Request(nullptr, batch, vocab, {TopKTopP(7)});
  request.mutable_logits()->set_dtype(v1::DTYPE_BF16);
  std::string* bytes = request.mutable_logits()->mutable_inline_data();
  bytes->resize(static_cast<size_t>(batch * vocab) * 2);
  std::mt19937 rng(12);
  std::uniform_real_distribution<float> uniform(-10.0f, 10.0f);
  for (size_t i = 0; i < bytes->size(); i += 2) {
    const float x = uniform(rng);
    uint32_t bits;
    std::memcpy(&bits, &x, sizeof(bits));
    const uint16_t bf16 = static_cast<uint16_t>(bits >> 16);  // truncation, as ToBf16Bytes
    std::memcpy(&(*bytes)[i], &bf16, sizeof(bf16));
  }
  return request;
}

// Polls /metrics until `requests` are admitted and unanswered (bounded: 10 s).
bool WaitForInflight(int port, double requests) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < deadline) {
    if (SeriesValue(ScrapeMetrics(port), "samplerd_inflight_requests") == requests) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

TEST(Drain, ABatchLongerThanTheGracePeriodEndsUnavailableAndTheServerExitsInTime) {
  const int metrics_port = PickFreeTcpPort();
  ASSERT_GT(metrics_port, 0);
  ServerProcess::Options options = CpuServerOptions();
  // One sampling thread: the batch below then takes ~2.5 s in a release build, 5x the grace.
  options.extra_args = {"--threads=1", "--grace_period=500ms",
                        "--metrics_port=" + std::to_string(metrics_port),
                        "--metrics_address=127.0.0.1"};
  std::string error;
  std::unique_ptr<ServerProcess> server = ServerProcess::Start(options, &error);
  ASSERT_NE(server, nullptr) << error;

  const v1::SampleRequest request = SlowBatch(160, 151936);
  Client client(server->target());
  grpc::Status status;
  std::thread call([&] {
    v1::SampleResponse response;
    status = client.Sample(request, &response);
  });
  if (!WaitForInflight(metrics_port, 1)) {
    server->Stop();
    call.join();
    FAIL() << "the batch never reached the core; log:\n" << server->Log();
  }

  const auto start = std::chrono::steady_clock::now();
  const int exit_code = server->Stop(kGrace + kExitBound);
  const auto took = std::chrono::steady_clock::now() - start;
  call.join();

  EXPECT_EQ(exit_code, 0) << "exit code -1: still running " << (kGrace + kExitBound).count()
                          << " ms after SIGTERM; log:\n"
                          << server->Log();
  EXPECT_GE(took, kGrace) << "the batch must have outlived the grace period; log:\n"
                          << server->Log();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
  EXPECT_TRUE(MentionsAny(status.error_message(), {"grace period"})) << status.error_message();
  EXPECT_TRUE(MentionsAny(server->Log(), {"cancelling the work still in flight"})) << server->Log();
}

}  // namespace
}  // namespace samplerd::integration
