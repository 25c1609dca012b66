// samplerd's metrics: every name, label and bucket the server exports, in one place.
//
//   samplerd_requests_total{method,code}        counter  RPCs answered (SampleStream: per step)
//   samplerd_rows_sampled_total                 counter  rows of successfully sampled requests
//   samplerd_input_bytes_total{transport}       counter  logits bytes of sampled requests, by
//                                                        transport inline|host_shm|gpu_ipc
//   samplerd_queue_wait_seconds                 histogram arrival -> the backend starts
//   samplerd_backend_seconds                    histogram time in the backend (kernel, copies)
//   samplerd_request_duration_seconds           histogram arrival -> result (server side)
//   samplerd_regions{kind}                      gauge    registered regions, host_shm|gpu_ipc
//   samplerd_region_bytes{kind}                 gauge    their bytes (byte_size), host_shm|gpu_ipc
//   samplerd_ipc_opens_total{kind,result}       counter  GPU IPC opens: memory|event, ok|error
//   samplerd_inflight_requests                  gauge    sampling requests and stream steps
//                                                        admitted and not yet answered
//   samplerd_inflight_bytes                     gauge    their inline logits bytes, plus those
//                                                        reserved by chunked stream steps
//                                                        being assembled
//   samplerd_build_info{version,backend}        gauge    always 1
//
// Label values come from fixed enums below (gRPC codes: the 17 canonical names), so the number
// of series is bounded. The metrics are prometheus-cpp's (registry.h); dashboards depend on the
// names, labels, help texts and buckets here, so they stay as they are when the code moves.
//
// Hot-path cost: the children are looked up at Create, or (requests) once per (method, code) and
// then cached in an atomic pointer, so a call never takes a family's lock. Counters and gauges
// are an atomic add; a histogram observation takes that histogram's mutex (prometheus-cpp).
// Measured (tests/bench/bench_metrics.cc, RESULTS.md): a request's whole set of calls costs
// ~110 ns of CPU (~75 ns on the lock-free registry this replaced), against tens of µs or more
// for the sampling itself.
#ifndef SAMPLERD_SERVICE_METRICS_SAMPLER_METRICS_H_
#define SAMPLERD_SERVICE_METRICS_SAMPLER_METRICS_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "service/metrics/registry.h"

namespace samplerd::metrics {

// The RPCs of samplerd.v1.SamplerService.
enum class Method {
  kSample,
  kSampleStream,
  kRegisterRegion,
  kUnregisterRegion,
  kListRegions,
  kGetServerInfo,
};
inline constexpr int kMethodCount = 6;

// Where a request's logits came from.
enum class Transport { kInline, kHostShm, kGpuIpc };
inline constexpr int kTransportCount = 3;

// What an IPC open opened.
enum class IpcOpenKind { kMemory, kEvent };

// The registered regions of one kind (samplerd_regions, samplerd_region_bytes).
struct RegionTotals {
  int64_t count = 0;
  uint64_t bytes = 0;  // their byte_size, summed
};

// The labels of samplerd_build_info.
struct BuildInfo {
  std::string version;
  std::string backend;  // "cpu" or "gpu"
};

class SamplerMetrics {
 public:
  // Registers every samplerd metric in `registry` (which must outlive the result). Errors:
  // ALREADY_EXISTS when a samplerd metric name is taken there (e.g. a second Create), with
  // prometheus-cpp's reason.
  static absl::StatusOr<std::unique_ptr<SamplerMetrics>> Create(Registry* registry);

  // Sets samplerd_build_info{version, backend} to 1 (call once the backend is known).
  void SetBuildInfo(const BuildInfo& info);

  // One answered RPC; for SampleStream, one answered step (its StepStatus code).
  void CountRequest(Method method, absl::StatusCode code);

  // A successfully sampled request: `rows` rows, `bytes` bytes of logits read over `transport`.
  void CountSampled(Transport transport, int64_t rows, int64_t bytes);

  // Durations of a request that reached the executor: the wait in the queue, the backend's
  // time (zero when it did not run) and the total from arrival to answer.
  void ObserveQueueWait(absl::Duration queue);
  void ObserveBackend(absl::Duration backend);
  void ObserveTotal(absl::Duration total);

  // One GPU IPC open through the runtime (cache hits are not opens).
  void CountIpcOpen(IpcOpenKind kind, bool ok);

  // The registered regions now, and their bytes.
  void SetRegions(const RegionTotals& host_shm, const RegionTotals& gpu_ipc);

  // Admitted sampling work: +1 when a request or step is admitted, -1 when it is answered.
  void AddInflight(int64_t delta) { inflight_->Increment(static_cast<double>(delta)); }

  // Inline logits bytes admitted or reserved: + when admitted or reserved, - when answered or
  // given back.
  void AddInflightBytes(int64_t delta) { inflight_bytes_->Increment(static_cast<double>(delta)); }

 private:
  SamplerMetrics() = default;

  static constexpr int kCodeCount = 17;  // absl::StatusCode 0 (OK) .. 16 (UNAUTHENTICATED)

  // Builds the families and children (prometheus-cpp throws std::invalid_argument on a taken
  // name; Create turns that into a status).
  void Register(prometheus::Registry& registry);

  prometheus::Family<prometheus::Counter>* requests_ = nullptr;
  // requests_ children by (method, code), created at first use.
  std::array<std::array<std::atomic<prometheus::Counter*>, kCodeCount>, kMethodCount>
      request_cache_{};
  prometheus::Counter* rows_ = nullptr;
  std::array<prometheus::Counter*, kTransportCount> input_bytes_{};
  prometheus::Histogram* queue_wait_ = nullptr;
  prometheus::Histogram* backend_ = nullptr;
  prometheus::Histogram* total_ = nullptr;
  prometheus::Gauge* regions_host_shm_ = nullptr;
  prometheus::Gauge* regions_gpu_ipc_ = nullptr;
  prometheus::Gauge* region_bytes_host_shm_ = nullptr;
  prometheus::Gauge* region_bytes_gpu_ipc_ = nullptr;
  std::array<std::array<prometheus::Counter*, 2>, 2> ipc_opens_{};  // [memory, event][ok, error]
  prometheus::Gauge* inflight_ = nullptr;
  prometheus::Gauge* inflight_bytes_ = nullptr;
  prometheus::Family<prometheus::Gauge>* build_info_ = nullptr;
};

// The label value of `method` (its RPC name, e.g. "Sample").
const char* MethodName(Method method);
// The label value of `transport`: "inline", "host_shm" or "gpu_ipc".
const char* TransportName(Transport transport);

// The bucket bounds of the three latency histograms, in seconds: 25 µs to 10 s, roughly 1-2.5-5
// per decade (a sampling call takes tens of µs on a GPU, ms on the CPU; queueing can add more).
std::vector<double> LatencyBucketsSeconds();

}  // namespace samplerd::metrics

#endif  // SAMPLERD_SERVICE_METRICS_SAMPLER_METRICS_H_
