// The registry: counters, gauges and histograms, their exposition (exact text), name and label
// rules, and increments from many threads at once.
#include "service/metrics/registry.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <limits>
#include <string>
#include <thread>
#include <vector>

namespace samplerd::metrics {
namespace {

using ::testing::HasSubstr;

TEST(Registry, CounterWithoutLabelsIsExposedWithHelpAndType) {
  Registry registry;
  absl::StatusOr<CounterFamily*> family = registry.AddCounter("rows_total", "Rows sampled.");
  ASSERT_TRUE(family.ok()) << family.status();
  Counter& rows = (*family)->Get();
  rows.Increment();
  rows.Increment(41);
  EXPECT_EQ(rows.Value(), 42u);
  EXPECT_EQ(registry.ExpositionText(),
            "# HELP rows_total Rows sampled.\n"
            "# TYPE rows_total counter\n"
            "rows_total 42\n");
}

TEST(Registry, LabelledChildrenAreSortedByLabelValuesAndCreatedAtFirstUse) {
  Registry registry;
  CounterFamily* requests = *registry.AddCounter("requests_total", "Requests.", {"method", "code"});
  EXPECT_EQ(registry.ExpositionText(),
            "# HELP requests_total Requests.\n# TYPE requests_total counter\n");
  (*requests->WithLabels({"Sample", "OK"}))->Increment(2);
  (*requests->WithLabels({"GetServerInfo", "OK"}))->Increment();
  (*requests->WithLabels({"Sample", "INVALID_ARGUMENT"}))->Increment();
  // The same values give the same child.
  EXPECT_EQ(*requests->WithLabels({"Sample", "OK"}), *requests->WithLabels({"Sample", "OK"}));
  EXPECT_EQ(registry.ExpositionText(),
            "# HELP requests_total Requests.\n"
            "# TYPE requests_total counter\n"
            "requests_total{method=\"GetServerInfo\",code=\"OK\"} 1\n"
            "requests_total{method=\"Sample\",code=\"INVALID_ARGUMENT\"} 1\n"
            "requests_total{method=\"Sample\",code=\"OK\"} 2\n");
}

TEST(Registry, WrongNumberOfLabelValuesIsInvalid) {
  Registry registry;
  CounterFamily* requests = *registry.AddCounter("requests_total", "", {"method", "code"});
  absl::StatusOr<Counter*> child = requests->WithLabels({"Sample"});
  EXPECT_EQ(child.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(child.status().message()), HasSubstr("expected 2 label values"));
}

TEST(Registry, LabelValuesAndHelpAreEscaped) {
  Registry registry;
  GaugeFamily* info = *registry.AddGauge("build_info", "Line one\nback\\slash", {"name"});
  (*info->WithLabels({"a \"quoted\"\\ name\n"}))->Set(1);
  EXPECT_EQ(registry.ExpositionText(),
            "# HELP build_info Line one\\nback\\\\slash\n"
            "# TYPE build_info gauge\n"
            "build_info{name=\"a \\\"quoted\\\"\\\\ name\\n\"} 1\n");
}

TEST(Registry, GaugeGoesUpAndDownAndKeepsFractions) {
  Registry registry;
  Gauge& inflight = (*registry.AddGauge("inflight", "In flight."))->Get();
  inflight.Add(3);
  inflight.Add(-1);
  EXPECT_EQ(inflight.Value(), 2);
  inflight.Set(0.25);
  EXPECT_EQ(inflight.Value(), 0.25);
  inflight.Add(-1);
  EXPECT_THAT(registry.ExpositionText(), HasSubstr("\ninflight -0.75\n"));
}

TEST(Registry, HistogramHasCumulativeBucketsSumAndCount) {
  Registry registry;
  Histogram& latency =
      (*registry.AddHistogram("latency_seconds", "Latency.", {0.01, 0.1, 1}))->Get();
  latency.Observe(0.005);  // le 0.01
  latency.Observe(0.01);   // le 0.01: bounds are inclusive
  latency.Observe(0.05);   // le 0.1
  latency.Observe(3);      // +Inf only
  EXPECT_EQ(registry.ExpositionText(),
            "# HELP latency_seconds Latency.\n"
            "# TYPE latency_seconds histogram\n"
            "latency_seconds_bucket{le=\"0.01\"} 2\n"
            "latency_seconds_bucket{le=\"0.1\"} 3\n"
            "latency_seconds_bucket{le=\"1\"} 3\n"
            "latency_seconds_bucket{le=\"+Inf\"} 4\n"
            "latency_seconds_sum 3.065\n"
            "latency_seconds_count 4\n");
}

TEST(Registry, LabelledHistogramPutsLeLast) {
  Registry registry;
  HistogramFamily* family = *registry.AddHistogram("h", "", {1}, {"kind"});
  (*family->WithLabels({"x"}))->Observe(0.5);
  EXPECT_EQ(registry.ExpositionText(),
            "# HELP h \n# TYPE h histogram\n"
            "h_bucket{kind=\"x\",le=\"1\"} 1\n"
            "h_bucket{kind=\"x\",le=\"+Inf\"} 1\n"
            "h_sum{kind=\"x\"} 0.5\n"
            "h_count{kind=\"x\"} 1\n");
}

TEST(Registry, HistogramCountsNanInInfOnly) {
  Registry registry;
  Histogram& h = (*registry.AddHistogram("h", "", {1}))->Get();
  h.Observe(std::numeric_limits<double>::quiet_NaN());
  EXPECT_EQ(h.CumulativeCounts(), (std::vector<uint64_t>{0, 1}));
}

TEST(Registry, FamiliesAreExposedInRegistrationOrder) {
  Registry registry;
  ASSERT_TRUE(registry.AddGauge("zeta", "").ok());
  ASSERT_TRUE(registry.AddCounter("alpha_total", "").ok());
  const std::string text = registry.ExpositionText();
  EXPECT_LT(text.find("zeta"), text.find("alpha_total"));
}

TEST(Registry, RefusesBadOrTakenNamesAndLabels) {
  Registry registry;
  ASSERT_TRUE(registry.AddCounter("a_total", "").ok());
  EXPECT_EQ(registry.AddGauge("a_total", "").status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(registry.AddCounter("1bad", "").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(registry.AddCounter("b_total", "", {"__reserved"}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(registry.AddCounter("b_total", "", {"x", "x"}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(registry.AddHistogram("h", "", {1}, {"le"}).status().code(),
            absl::StatusCode::kInvalidArgument);
  // A refused registration does not take the name.
  EXPECT_TRUE(registry.AddCounter("b_total", "", {"x"}).ok());
}

TEST(Registry, RefusesHistogramBoundsThatAreEmptyUnsortedOrInfinite) {
  Registry registry;
  const double inf = std::numeric_limits<double>::infinity();
  for (const std::vector<double>& bounds :
       std::vector<std::vector<double>>{{}, {1, 1}, {2, 1}, {1, inf}}) {
    absl::StatusOr<HistogramFamily*> h = registry.AddHistogram("h", "", bounds);
    EXPECT_EQ(h.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(h.status().message()), HasSubstr("expected"));
  }
}

TEST(Registry, ConcurrentIncrementsAreAllCounted) {
  Registry registry;
  CounterFamily* family = *registry.AddCounter("c_total", "", {"t"});
  Histogram& histogram = (*registry.AddHistogram("h", "", {0.5}))->Get();
  Gauge& gauge = (*registry.AddGauge("g", ""))->Get();
  constexpr int kThreads = 4;
  constexpr int kPerThread = 20000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      Counter& shared = **family->WithLabels({"shared"});
      Counter& own = **family->WithLabels({std::to_string(t)});
      for (int i = 0; i < kPerThread; ++i) {
        shared.Increment();
        own.Increment();
        histogram.Observe(i % 2 == 0 ? 0.25 : 1.0);
        gauge.Add(1);
        if (i % 256 == 0) registry.ExpositionText();  // scrapes while writers write
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ((*family->WithLabels({"shared"}))->Value(), uint64_t{kThreads * kPerThread});
  EXPECT_EQ((*family->WithLabels({"0"}))->Value(), uint64_t{kPerThread});
  EXPECT_EQ(histogram.CumulativeCounts(),
            (std::vector<uint64_t>{kThreads * kPerThread / 2, kThreads * kPerThread}));
  EXPECT_EQ(histogram.Sum(), kThreads * kPerThread / 2 * 1.25);
  EXPECT_EQ(gauge.Value(), kThreads * kPerThread);
}

TEST(LatencyBuckets, AreStrictlyIncreasingFrom25MicrosecondsTo10Seconds) {
  const std::vector<double> bounds = LatencyBucketsSeconds();
  ASSERT_FALSE(bounds.empty());
  EXPECT_EQ(bounds.front(), 25e-6);
  EXPECT_EQ(bounds.back(), 10.0);
  Registry registry;
  EXPECT_TRUE(registry.AddHistogram("h", "", bounds).ok());
}

}  // namespace
}  // namespace samplerd::metrics
