// samplerd's metric set: names, labels and what each recording call moves.
//
// Expected texts are prometheus-cpp's exposition, which differs from the hand-written one it
// replaced in ways a Prometheus server does not see: labels are sorted by name
// ({code="OK",method="Sample"}), a histogram's _count and _sum come before its buckets, and a
// family without any series (requests before the first answer, build info before it is set) is
// left out instead of showing its HELP and TYPE lines alone.
#include "service/metrics/sampler_metrics.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace samplerd::metrics {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

class SamplerMetricsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<SamplerMetrics>> metrics = SamplerMetrics::Create(&registry_);
    ASSERT_TRUE(metrics.ok()) << metrics.status();
    metrics_ = *std::move(metrics);
  }

  std::string Text() const { return registry_.ExpositionText(); }

  Registry registry_;
  std::unique_ptr<SamplerMetrics> metrics_;
};

TEST_F(SamplerMetricsTest, EveryFamilyHasHelpAndTypeOnceItHasASeries) {
  EXPECT_THAT(Text(), Not(HasSubstr("# TYPE samplerd_build_info ")));
  metrics_->CountRequest(Method::kSample, absl::StatusCode::kOk);
  metrics_->SetBuildInfo({"0.1.0", "cpu"});
  const std::string text = Text();
  for (const char* family :
       {"samplerd_requests_total counter", "samplerd_rows_sampled_total counter",
        "samplerd_input_bytes_total counter", "samplerd_queue_wait_seconds histogram",
        "samplerd_backend_seconds histogram", "samplerd_request_duration_seconds histogram",
        "samplerd_regions gauge", "samplerd_region_bytes gauge", "samplerd_ipc_opens_total counter",
        "samplerd_inflight_requests gauge", "samplerd_inflight_bytes gauge",
        "samplerd_build_info gauge"}) {
    EXPECT_THAT(text, HasSubstr(std::string("# TYPE ") + family + "\n")) << family;
  }
  EXPECT_THAT(text, HasSubstr("# HELP samplerd_requests_total "));
}

TEST_F(SamplerMetricsTest, KnownLabelSetsStartAtZero) {
  const std::string text = Text();
  EXPECT_THAT(text, HasSubstr("samplerd_input_bytes_total{transport=\"inline\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("samplerd_input_bytes_total{transport=\"host_shm\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("samplerd_input_bytes_total{transport=\"gpu_ipc\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("samplerd_regions{kind=\"host_shm\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("samplerd_region_bytes{kind=\"host_shm\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("samplerd_region_bytes{kind=\"gpu_ipc\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("samplerd_ipc_opens_total{kind=\"event\",result=\"error\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("samplerd_inflight_requests 0\n"));
  EXPECT_THAT(text, HasSubstr("samplerd_inflight_bytes 0\n"));
  // Requests appear with their first (method, code).
  EXPECT_THAT(text, Not(HasSubstr("samplerd_requests_total{")));
}

TEST_F(SamplerMetricsTest, RequestsAreCountedByMethodAndCodeName) {
  metrics_->CountRequest(Method::kSample, absl::StatusCode::kOk);
  metrics_->CountRequest(Method::kSample, absl::StatusCode::kOk);
  metrics_->CountRequest(Method::kSampleStream, absl::StatusCode::kResourceExhausted);
  metrics_->CountRequest(Method::kGetServerInfo, absl::StatusCode::kOk);
  const std::string text = Text();
  EXPECT_THAT(text, HasSubstr("samplerd_requests_total{code=\"OK\",method=\"Sample\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("samplerd_requests_total{code=\"RESOURCE_EXHAUSTED\","
                              "method=\"SampleStream\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("samplerd_requests_total{code=\"OK\",method=\"GetServerInfo\"} 1\n"));
}

TEST_F(SamplerMetricsTest, CodesOutsideTheCanonicalRangeCountAsUnknown) {
  metrics_->CountRequest(Method::kListRegions, static_cast<absl::StatusCode>(99));
  EXPECT_THAT(Text(),
              HasSubstr("samplerd_requests_total{code=\"UNKNOWN\",method=\"ListRegions\"} 1\n"));
}

TEST_F(SamplerMetricsTest, SampledRowsAndBytesGoByTransport) {
  metrics_->CountSampled(Transport::kInline, 4, 128);
  metrics_->CountSampled(Transport::kHostShm, 2, 64);
  metrics_->CountSampled(Transport::kInline, 1, 32);
  const std::string text = Text();
  EXPECT_THAT(text, HasSubstr("samplerd_rows_sampled_total 7\n"));
  EXPECT_THAT(text, HasSubstr("samplerd_input_bytes_total{transport=\"inline\"} 160\n"));
  EXPECT_THAT(text, HasSubstr("samplerd_input_bytes_total{transport=\"host_shm\"} 64\n"));
  EXPECT_THAT(text, HasSubstr("samplerd_input_bytes_total{transport=\"gpu_ipc\"} 0\n"));
}

TEST_F(SamplerMetricsTest, LatenciesLandInTheirHistograms) {
  metrics_->ObserveQueueWait(absl::Microseconds(10));
  metrics_->ObserveBackend(absl::Milliseconds(3));
  metrics_->ObserveTotal(absl::Seconds(20));
  const std::string text = Text();
  EXPECT_THAT(text, HasSubstr("samplerd_queue_wait_seconds_bucket{le=\"2.5e-05\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("samplerd_backend_seconds_bucket{le=\"0.0025\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("samplerd_backend_seconds_bucket{le=\"0.005\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("samplerd_request_duration_seconds_bucket{le=\"10\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("samplerd_request_duration_seconds_bucket{le=\"+Inf\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("samplerd_request_duration_seconds_sum 20\n"));
}

TEST_F(SamplerMetricsTest, GaugesFollowRegionsInflightAndBuildInfo) {
  metrics_->SetRegions({3, 12288}, {1, uint64_t{1} << 40});
  metrics_->AddInflight(2);
  metrics_->AddInflight(-1);
  metrics_->AddInflightBytes(4096);
  metrics_->AddInflightBytes(-1024);
  metrics_->CountIpcOpen(IpcOpenKind::kMemory, true);
  metrics_->CountIpcOpen(IpcOpenKind::kEvent, false);
  metrics_->SetBuildInfo({"0.1.0", "cpu"});
  const std::string text = Text();
  EXPECT_THAT(text, HasSubstr("samplerd_regions{kind=\"host_shm\"} 3\n"));
  EXPECT_THAT(text, HasSubstr("samplerd_regions{kind=\"gpu_ipc\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("samplerd_region_bytes{kind=\"host_shm\"} 12288\n"));
  EXPECT_THAT(text, HasSubstr("samplerd_region_bytes{kind=\"gpu_ipc\"} 1099511627776\n"));
  EXPECT_THAT(text, HasSubstr("samplerd_inflight_requests 1\n"));
  EXPECT_THAT(text, HasSubstr("samplerd_inflight_bytes 3072\n"));
  EXPECT_THAT(text, HasSubstr("samplerd_ipc_opens_total{kind=\"memory\",result=\"ok\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("samplerd_ipc_opens_total{kind=\"event\",result=\"error\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("samplerd_build_info{backend=\"cpu\",version=\"0.1.0\"} 1\n"));
}

// The `le` values as dashboards and alerts spell them (e.g. le="0.005"): the bucket layout, and
// how it is printed, must not change under them.
TEST_F(SamplerMetricsTest, LatencyBucketsAreExposedAsBefore) {
  metrics_->ObserveBackend(absl::Milliseconds(3));
  const std::string text = Text();
  for (const char* le :
       {"2.5e-05", "5e-05", "0.0001", "0.00025", "0.0005", "0.001", "0.0025", "0.005", "0.01",
        "0.025", "0.05", "0.1", "0.25", "0.5", "1", "2.5", "5", "10", "+Inf"}) {
    const std::string bucket = std::string("samplerd_backend_seconds_bucket{le=\"") + le + "\"} ";
    EXPECT_THAT(text, HasSubstr(bucket)) << le;
  }
}

TEST_F(SamplerMetricsTest, ConcurrentRecordingIsAllCountedWhileScraped) {
  constexpr int kThreads = 4;
  constexpr int kPerThread = 20000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([this] {
      for (int i = 0; i < kPerThread; ++i) {
        metrics_->AddInflight(1);
        metrics_->ObserveTotal(absl::Milliseconds(i % 2 == 0 ? 3 : 30));
        metrics_->CountSampled(Transport::kInline, 1, 8);
        metrics_->CountRequest(Method::kSample, absl::StatusCode::kOk);
        metrics_->AddInflight(-1);
        if (i % 1024 == 0) Text();  // scrapes while writers write
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  const std::string n = std::to_string(kThreads * kPerThread);
  const std::string half = std::to_string(kThreads * kPerThread / 2);
  const std::string text = Text();
  EXPECT_THAT(text, HasSubstr("samplerd_requests_total{code=\"OK\",method=\"Sample\"} " + n));
  EXPECT_THAT(text, HasSubstr("samplerd_rows_sampled_total " + n + "\n"));
  EXPECT_THAT(text, HasSubstr("samplerd_request_duration_seconds_bucket{le=\"0.005\"} " + half));
  EXPECT_THAT(text, HasSubstr("samplerd_request_duration_seconds_count " + n + "\n"));
  EXPECT_THAT(text, HasSubstr("samplerd_inflight_requests 0\n"));
}

TEST(LatencyBuckets, AreStrictlyIncreasingFrom25MicrosecondsTo10Seconds) {
  const std::vector<double> bounds = LatencyBucketsSeconds();
  ASSERT_EQ(bounds.size(), 18u);
  EXPECT_DOUBLE_EQ(bounds.front(), 25e-6);
  EXPECT_DOUBLE_EQ(bounds.back(), 10.0);
  for (size_t i = 1; i < bounds.size(); ++i) EXPECT_LT(bounds[i - 1], bounds[i]) << i;
}

TEST(SamplerMetrics, CannotBeRegisteredTwiceInOneRegistry) {
  Registry registry;
  ASSERT_TRUE(SamplerMetrics::Create(&registry).ok());
  EXPECT_EQ(SamplerMetrics::Create(&registry).status().code(), absl::StatusCode::kAlreadyExists);
}

}  // namespace
}  // namespace samplerd::metrics
