// Limits of the real binary: --max_inflight answers RESOURCE_EXHAUSTED at once and keeps
// serving; a request whose deadline passes while it is queued is answered DEADLINE_EXCEEDED
// without being sampled; lists in regions are bounded like inline ones, logits in regions by
// --max_batch and --max_vocab only. The server's own counters (/metrics) show what happened
// inside.
//
// The CPU backend on one thread makes a 64 x 32,000 request take ~0.2 s (tests/bench/RESULTS.md:
// ~3.4 ms per 32k row), the window in which the other requests arrive. The tests wait for the
// server to report it in flight (samplerd_inflight_requests) before sending them.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <future>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "samplerd/host_shm_buffer.h"
#include "tests/integration/integration_fixture.h"
#include "tests/integration/metrics_scrape.h"

namespace samplerd::integration {
namespace {

constexpr int64_t kSlowBatch = 64;
// 33.5 MB of logits: sampled on the one executor for well over the deadline test's 100 ms, with
// or without sanitizers (32,000 let the deadline test's request through under ASan, session 35).
constexpr int64_t kSlowVocab = 131072;

class Limits : public ServerSuite {
 protected:
  static void StartWith(const std::string& extra) {
    port_ = PickFreeTcpPort();
    ServerProcess::Options options = CpuServerOptions();
    options.extra_args = {"--threads=1", "--grace_period=10s",
                          "--metrics_port=" + std::to_string(port_), "--metrics_address=127.0.0.1"};
    if (!extra.empty()) options.extra_args.push_back(extra);
    StartServer(options);
  }

  // Waits until the scraped value of `series` is `value`; false after 30 s.
  static bool WaitForSeries(const std::string& series, double value) {
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (absl::Now() < deadline) {
      if (SeriesValue(ScrapeMetrics(port_), series) == value) return true;
    }
    return false;
  }

  // Starts a slow Sample on its own client; the future holds its status.
  std::future<grpc::Status> StartSlowSample() {
    return std::async(std::launch::async, [target = server().target()] {
      ClientOptions options;
      options.default_deadline = std::chrono::seconds(60);
      Client client(target, options);
      v1::SampleResponse response;
      return client.Sample(RandomLogits(kSlowBatch, kSlowVocab, /*seed=*/61).Request({TopKTopP(3)}),
                           &response);
    });
  }

  inline static int port_ = 0;
};

class MaxInflight : public Limits {
 protected:
  static void SetUpTestSuite() { StartWith("--max_inflight=1"); }
};

TEST_F(MaxInflight, BeyondTheLimitIsResourceExhaustedAtOnceAndTheServerKeepsServing) {
  std::future<grpc::Status> slow = StartSlowSample();
  ASSERT_TRUE(WaitForSeries("samplerd_inflight_requests", 1));

  const GreedyCase c = KnownGreedyBatch();
  v1::SampleResponse response;
  const grpc::Status busy = client_->Sample(c.logits.Request({Greedy()}), &response);
  EXPECT_EQ(busy.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << busy.error_message();
  EXPECT_TRUE(MentionsAny(busy.error_message(), {"server busy: 1 requests in flight, limit 1"}))
      << busy.error_message();
  // A stream step is refused the same way, on its own response; the stream stays open.
  std::unique_ptr<SampleSession> session = client_->OpenStream();
  const grpc::Status step = session->Step(c.logits.Request({Greedy()}), &response);
  EXPECT_EQ(step.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << step.error_message();
  EXPECT_TRUE(session->open());

  // Nothing lost: the admitted request completes, and there is room again afterwards.
  const grpc::Status slow_status = slow.get();
  EXPECT_TRUE(slow_status.ok()) << slow_status.error_message();
  ASSERT_TRUE(session->Step(c.logits.Request({Greedy()}), &response).ok());
  EXPECT_EQ(Tokens(response), c.expected);
  EXPECT_TRUE(session->Close().ok());
  ASSERT_TRUE(client_->Sample(c.logits.Request({Greedy()}), &response).ok());
  EXPECT_EQ(Tokens(response), c.expected);
}

class Deadlines : public Limits {
 protected:
  static void SetUpTestSuite() { StartWith(""); }
};

TEST_F(Deadlines, ARequestWhoseDeadlinePassesInTheQueueIsNotSampled) {
  // Connected up front, so that the short deadline below is spent in the server's queue.
  std::shared_ptr<grpc::Channel> channel =
      grpc::CreateChannel(server().target(), grpc::InsecureChannelCredentials());
  ASSERT_TRUE(
      channel->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(10)));
  std::unique_ptr<v1::SamplerService::Stub> stub = v1::SamplerService::NewStub(channel);
  const std::string before = ScrapeMetrics(port_);
  std::future<grpc::Status> slow = StartSlowSample();
  // The slow request holds the one executor once its queue wait is counted (the backend started
  // it); in flight alone, it may still be arriving, and a small request sent then can overtake it.
  ASSERT_TRUE(WaitForSeries("samplerd_queue_wait_seconds_count",
                            SeriesValue(before, "samplerd_queue_wait_seconds_count") + 1));

  // Queued behind the slow request on the one executor, with a 100 ms deadline.
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(100));
  const GreedyCase c = KnownGreedyBatch();
  v1::SampleResponse response;
  const grpc::Status status = stub->Sample(&context, c.logits.Request({Greedy()}), &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  ASSERT_TRUE(slow.get().ok());

  // The server answered it DEADLINE_EXCEEDED itself, without sampling its 4 rows.
  const double expired_before = Requests(before, "Sample", "DEADLINE_EXCEEDED");
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  std::string after;
  do {
    after = ScrapeMetrics(port_);
  } while (Requests(after, "Sample", "DEADLINE_EXCEEDED") == expired_before &&
           absl::Now() < deadline);
  EXPECT_EQ(Requests(after, "Sample", "DEADLINE_EXCEEDED") - expired_before, 1);
  EXPECT_EQ(SeriesValue(after, "samplerd_rows_sampled_total") -
                SeriesValue(before, "samplerd_rows_sampled_total"),
            kSlowBatch);
  EXPECT_EQ(SeriesValue(after, "samplerd_backend_seconds_count") -
                SeriesValue(before, "samplerd_backend_seconds_count"),
            1);
  EXPECT_EQ(SeriesValue(after, "samplerd_queue_wait_seconds_count") -
                SeriesValue(before, "samplerd_queue_wait_seconds_count"),
            2);

  // And it keeps serving.
  ASSERT_TRUE(client_->Sample(c.logits.Request({Greedy()}), &response).ok());
  EXPECT_EQ(Tokens(response), c.expected);
}

// A logit-bias list or token history in a region is copied into the server's memory, so
// --max_message_bytes bounds it as it bounds an inline list: one whose announced entries pass
// the limit is RESOURCE_EXHAUSTED before anything is allocated (a sparse shm object announcing
// 4e9 entries made one request allocate 36 GB, and std::bad_alloc aborted the server).
class RegionListBytes : public Limits {
 protected:
  static void SetUpTestSuite() { StartWith("--max_message_bytes=65536"); }
};

TEST_F(RegionListBytes, AListPastMaxMessageBytesIsResourceExhaustedAndTheServerKeepsServing) {
  constexpr int64_t kVocab = 10000;           // [1, 10000] fp32 inline: 40,000 bytes
  constexpr uint64_t kRegionBytes = 1 << 20;  // holds any list below
  std::string error;
  std::unique_ptr<HostShmBuffer> shm = HostShmBuffer::Create(
      "/samplerd-it-" + std::to_string(getpid()) + "-lists", kRegionBytes, &error);
  ASSERT_NE(shm, nullptr) << error;
  ASSERT_TRUE(client_->RegisterHostShm("lists", shm->key(), 0, kRegionBytes).ok());
  // row_offsets = {0, n} at the start of the region; the entries are zeros (not read).
  auto announce = [&shm](uint32_t n) {
    const uint32_t offsets[2] = {0, n};
    std::memcpy(shm->data(), offsets, sizeof(offsets));
  };
  const Logits logits = RandomLogits(1, kVocab, /*seed=*/71);
  v1::SampleRequest request = logits.Request({Greedy()});
  request.mutable_logit_bias()->mutable_region()->set_region("lists");
  v1::SampleResponse response;

  announce(8192);  // (1 + 1 + 2 * 8192) * 4 = 65,544 bytes > 65,536
  const grpc::Status over = client_->Sample(request, &response);
  EXPECT_EQ(over.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << over.error_message();
  EXPECT_EQ(over.error_message(),
            "logit_bias.region: expected a list of at most 65536 bytes (--max_message_bytes, as "
            "an inline list), got 65544 bytes (B = 1, N = row_offsets[B] = 8192: (B + 1 + 2N) * 4 "
            "bytes)");
  v1::SampleRequest history = logits.Request({Greedy()});
  history.mutable_token_history()->mutable_region()->set_region("lists");
  announce(7282);  // (1 + 1) * 4 + 9 * 7282 = 65,546 bytes
  const grpc::Status history_over = client_->Sample(history, &response);
  EXPECT_EQ(history_over.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << history_over.error_message();
  EXPECT_TRUE(MentionsAny(history_over.error_message(),
                          {"token_history.region: expected a list of at most 65536 bytes"}))
      << history_over.error_message();

  // At the limit the list is read and checked as before (token 0 repeated: INVALID_ARGUMENT).
  announce(8191);  // 65,536 bytes
  const grpc::Status at_limit = client_->Sample(request, &response);
  EXPECT_EQ(at_limit.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << at_limit.error_message();
  // A real list of one entry works, and the server kept serving.
  const uint32_t offsets[2] = {0, 1};
  const int32_t token = 17;
  const float bias = std::numeric_limits<float>::infinity();
  std::memcpy(shm->data(), offsets, sizeof(offsets));
  std::memcpy(static_cast<char*>(shm->data()) + 8, &token, 4);
  std::memcpy(static_cast<char*>(shm->data()) + 12, &bias, 4);
  const grpc::Status ok = client_->Sample(request, &response);
  ASSERT_TRUE(ok.ok()) << ok.error_message();
  EXPECT_EQ(Tokens(response), (std::vector<int32_t>{17}));
  EXPECT_TRUE(client_->Unregister("lists").ok());
}

// Logits in a region are read where they are, not received: --max_batch and --max_vocab bound
// them (B x row_stride elements, the stride at most 16 x --max_vocab), --max_message_bytes does
// not, so an engine can sample a batch larger than any message. The CPU backend copies host shm
// logits out a block of rows at a time, each row's V elements only. It used to copy the whole
// B x row_stride span at once: a valid [4096, 16] fp32 request with row_stride 64Mi (16 x the
// default --max_vocab) over a sparse 1 TiB object allocated 1 TiB, and std::bad_alloc aborted
// the server.
class RegionLogits : public Limits {
 protected:
  static void SetUpTestSuite() { StartWith("--max_message_bytes=65536"); }
};

TEST_F(RegionLogits, AWideStrideOverASparseObjectIsSampledAndTheServerKeepsServing) {
  constexpr int64_t kBatch = 4096, kVocab = 16;
  constexpr int64_t kStride = int64_t{16} << 22;        // 16 x the default --max_vocab (4Mi)
  constexpr uint64_t kObjectBytes = uint64_t{1} << 40;  // >= ((B - 1) x stride + V) x 4
  const std::string key = "/samplerd-it-" + std::to_string(getpid()) + "-wide";
  const int fd = shm_open(key.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  ASSERT_GE(fd, 0) << std::strerror(errno);
  bool written = ftruncate(fd, static_cast<off_t>(kObjectBytes)) == 0;  // no pages: sparse
  // Row r's logits are zeros but for a 1 at token r % V, its greedy token.
  const float one = 1.0f;
  for (int64_t r = 0; written && r < kBatch; ++r) {
    const off_t at = static_cast<off_t>((r * kStride + r % kVocab) * 4);
    written = pwrite(fd, &one, sizeof(one), at) == static_cast<ssize_t>(sizeof(one));
  }
  close(fd);
  if (!written) {
    shm_unlink(key.c_str());
    GTEST_SKIP() << "this /dev/shm cannot hold a sparse 1 TiB object";
  }
  const grpc::Status registered = client_->RegisterHostShm("wide", key, 0, kObjectBytes);
  ASSERT_TRUE(registered.ok()) << registered.error_message();

  v1::SampleRequest request =
      MakeRegionRequest("wide", 0, v1::DTYPE_FP32, kBatch, kVocab, {Greedy()});
  request.mutable_logits()->set_row_stride(kStride);
  v1::SampleResponse response;
  const grpc::Status sampled = client_->Sample(request, &response);
  ASSERT_TRUE(sampled.ok()) << sampled.error_message();
  std::vector<int32_t> expected(kBatch);
  for (int64_t r = 0; r < kBatch; ++r) expected[r] = static_cast<int32_t>(r % kVocab);
  EXPECT_EQ(Tokens(response), expected);

  // The same logits inline (256 KiB) are past --max_message_bytes; the server keeps serving.
  const Logits dense = RandomLogits(kBatch, kVocab, /*seed=*/72);
  EXPECT_EQ(client_->Sample(dense.Request({Greedy()}), &response).error_code(),
            grpc::StatusCode::RESOURCE_EXHAUSTED);
  v1::GetServerInfoResponse info;
  EXPECT_TRUE(client_->GetServerInfo(&info).ok());
  EXPECT_TRUE(client_->Unregister("wide").ok());
  shm_unlink(key.c_str());
}

TEST(LimitFlags, NegativeMaxInflightFailsStartupWithExitCode2) {
  ServerProcess::Options options = CpuServerOptions();
  options.extra_args.push_back("--max_inflight=-1");
  std::string error;
  EXPECT_EQ(ServerProcess::Start(options, &error), nullptr);
  EXPECT_TRUE(MentionsAny(error, {"exited with status 2"})) << error;
  EXPECT_TRUE(MentionsAny(error, {"expected --max_inflight >= 0 (0 = no limit), got -1"})) << error;
}

}  // namespace
}  // namespace samplerd::integration
