// samplerd's metric set: names, labels and what each recording call moves.
#include "service/metrics/sampler_metrics.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>

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

TEST_F(SamplerMetricsTest, EveryFamilyHasHelpAndType) {
  const std::string text = Text();
  for (const char* family :
       {"samplerd_requests_total counter", "samplerd_rows_sampled_total counter",
        "samplerd_input_bytes_total counter", "samplerd_queue_wait_seconds histogram",
        "samplerd_backend_seconds histogram", "samplerd_request_duration_seconds histogram",
        "samplerd_regions gauge", "samplerd_ipc_opens_total counter",
        "samplerd_inflight_requests gauge", "samplerd_build_info gauge"}) {
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
  EXPECT_THAT(text, HasSubstr("samplerd_ipc_opens_total{kind=\"event\",result=\"error\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("samplerd_inflight_requests 0\n"));
  // Requests appear with their first (method, code).
  EXPECT_THAT(text, Not(HasSubstr("samplerd_requests_total{")));
}

TEST_F(SamplerMetricsTest, RequestsAreCountedByMethodAndCodeName) {
  metrics_->CountRequest(Method::kSample, absl::StatusCode::kOk);
  metrics_->CountRequest(Method::kSample, absl::StatusCode::kOk);
  metrics_->CountRequest(Method::kSampleStream, absl::StatusCode::kResourceExhausted);
  metrics_->CountRequest(Method::kGetServerInfo, absl::StatusCode::kOk);
  const std::string text = Text();
  EXPECT_THAT(text, HasSubstr("samplerd_requests_total{method=\"Sample\",code=\"OK\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("samplerd_requests_total{method=\"SampleStream\",code="
                              "\"RESOURCE_EXHAUSTED\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("samplerd_requests_total{method=\"GetServerInfo\",code=\"OK\"} 1\n"));
}

TEST_F(SamplerMetricsTest, CodesOutsideTheCanonicalRangeCountAsUnknown) {
  metrics_->CountRequest(Method::kListRegions, static_cast<absl::StatusCode>(99));
  EXPECT_THAT(Text(),
              HasSubstr("samplerd_requests_total{method=\"ListRegions\",code=\"UNKNOWN\"} 1\n"));
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
  metrics_->SetRegions(3, 1);
  metrics_->AddInflight(2);
  metrics_->AddInflight(-1);
  metrics_->CountIpcOpen(IpcOpenKind::kMemory, true);
  metrics_->CountIpcOpen(IpcOpenKind::kEvent, false);
  metrics_->SetBuildInfo({"0.1.0", "cpu"});
  const std::string text = Text();
  EXPECT_THAT(text, HasSubstr("samplerd_regions{kind=\"host_shm\"} 3\n"));
  EXPECT_THAT(text, HasSubstr("samplerd_regions{kind=\"gpu_ipc\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("samplerd_inflight_requests 1\n"));
  EXPECT_THAT(text, HasSubstr("samplerd_ipc_opens_total{kind=\"memory\",result=\"ok\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("samplerd_ipc_opens_total{kind=\"event\",result=\"error\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("samplerd_build_info{version=\"0.1.0\",backend=\"cpu\"} 1\n"));
}

TEST(SamplerMetrics, CannotBeRegisteredTwiceInOneRegistry) {
  Registry registry;
  ASSERT_TRUE(SamplerMetrics::Create(&registry).ok());
  EXPECT_EQ(SamplerMetrics::Create(&registry).status().code(), absl::StatusCode::kAlreadyExists);
}

}  // namespace
}  // namespace samplerd::metrics
