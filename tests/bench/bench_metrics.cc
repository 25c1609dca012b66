// The hot-path cost of samplerd's metrics: what SamplerMetrics adds to one request.
//
// BM_Request is what SamplerCore and the gRPC layer record per sampled request: admission and
// answer (AddInflight +1/-1), three latency histograms (queue wait, backend, total), the rows
// and bytes, and the request counter. BM_ObserveTotal is one histogram observation alone
// (prometheus-cpp's Histogram::Observe takes a mutex). Threads(2) makes both threads record
// into the same children, the contended case.
//
//   bench_metrics --benchmark_min_time=0.5
#include <benchmark/benchmark.h>

#include <memory>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "service/metrics/registry.h"
#include "service/metrics/sampler_metrics.h"

namespace samplerd::metrics {
namespace {

// Shared by every benchmark thread, so that Threads(2) contends on the same series.
SamplerMetrics& Metrics() {
  static Registry* registry = new Registry();
  static SamplerMetrics* metrics = SamplerMetrics::Create(registry)->release();
  return *metrics;
}

void BM_Request(benchmark::State& state) {
  SamplerMetrics& metrics = Metrics();
  for (auto _ : state) {
    metrics.AddInflight(1);
    metrics.ObserveQueueWait(absl::Microseconds(30));
    metrics.ObserveBackend(absl::Microseconds(700));
    metrics.ObserveTotal(absl::Microseconds(750));
    metrics.CountSampled(Transport::kInline, 1, 128000);
    metrics.CountRequest(Method::kSample, absl::StatusCode::kOk);
    metrics.AddInflight(-1);
  }
}
BENCHMARK(BM_Request)->Threads(1)->Threads(2);

void BM_ObserveTotal(benchmark::State& state) {
  SamplerMetrics& metrics = Metrics();
  for (auto _ : state) metrics.ObserveTotal(absl::Microseconds(750));
}
BENCHMARK(BM_ObserveTotal)->Threads(1)->Threads(2);

}  // namespace
}  // namespace samplerd::metrics

BENCHMARK_MAIN();
