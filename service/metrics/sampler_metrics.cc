#include "service/metrics/sampler_metrics.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace samplerd::metrics {
namespace {

#define SAMPLERD_ASSIGN_OR_RETURN_METRIC(lhs, expr) \
  do {                                              \
    auto _result = (expr);                          \
    if (!_result.ok()) return _result.status();     \
    lhs = *_result;                                 \
  } while (false)

double Seconds(absl::Duration d) { return absl::ToDoubleSeconds(d); }

}  // namespace

const char* MethodName(Method method) {
  switch (method) {
    case Method::kSample:
      return "Sample";
    case Method::kSampleStream:
      return "SampleStream";
    case Method::kRegisterRegion:
      return "RegisterRegion";
    case Method::kUnregisterRegion:
      return "UnregisterRegion";
    case Method::kListRegions:
      return "ListRegions";
    case Method::kGetServerInfo:
      return "GetServerInfo";
  }
  return "unknown";
}

const char* TransportName(Transport transport) {
  switch (transport) {
    case Transport::kInline:
      return "inline";
    case Transport::kHostShm:
      return "host_shm";
    case Transport::kGpuIpc:
      return "gpu_ipc";
  }
  return "unknown";
}

absl::StatusOr<std::unique_ptr<SamplerMetrics>> SamplerMetrics::Create(Registry* registry) {
  std::unique_ptr<SamplerMetrics> m(new SamplerMetrics());
  SAMPLERD_ASSIGN_OR_RETURN_METRIC(
      m->requests_,
      registry->AddCounter("samplerd_requests_total",
                           "SamplerService RPCs answered, by method and gRPC status code "
                           "(SampleStream: one per step, with the step's code).",
                           {"method", "code"}));
  CounterFamily* rows;
  SAMPLERD_ASSIGN_OR_RETURN_METRIC(
      rows, registry->AddCounter("samplerd_rows_sampled_total",
                                 "Rows (batch entries) of successfully sampled requests."));
  m->rows_ = &rows->Get();
  CounterFamily* bytes;
  SAMPLERD_ASSIGN_OR_RETURN_METRIC(
      bytes, registry->AddCounter("samplerd_input_bytes_total",
                                  "Logits bytes read by successfully sampled requests, by "
                                  "transport (inline, host_shm, gpu_ipc).",
                                  {"transport"}));
  for (int t = 0; t < kTransportCount; ++t) {
    SAMPLERD_ASSIGN_OR_RETURN_METRIC(m->input_bytes_[t],
                                     bytes->WithLabels({TransportName(static_cast<Transport>(t))}));
  }
  HistogramFamily* histogram;
  SAMPLERD_ASSIGN_OR_RETURN_METRIC(
      histogram, registry->AddHistogram("samplerd_queue_wait_seconds",
                                        "Time from a request's arrival until the backend starts "
                                        "on it (or it is refused there), seconds.",
                                        LatencyBucketsSeconds()));
  m->queue_wait_ = &histogram->Get();
  SAMPLERD_ASSIGN_OR_RETURN_METRIC(
      histogram,
      registry->AddHistogram("samplerd_backend_seconds",
                             "Time a request spends in the sampling backend (kernels and "
                             "copies), seconds.",
                             LatencyBucketsSeconds()));
  m->backend_ = &histogram->Get();
  SAMPLERD_ASSIGN_OR_RETURN_METRIC(
      histogram, registry->AddHistogram("samplerd_request_duration_seconds",
                                        "Server-side time from a request's arrival until its "
                                        "answer is ready, seconds.",
                                        LatencyBucketsSeconds()));
  m->total_ = &histogram->Get();
  GaugeFamily* regions;
  SAMPLERD_ASSIGN_OR_RETURN_METRIC(
      regions, registry->AddGauge("samplerd_regions", "Registered regions, by kind.", {"kind"}));
  SAMPLERD_ASSIGN_OR_RETURN_METRIC(m->regions_host_shm_, regions->WithLabels({"host_shm"}));
  SAMPLERD_ASSIGN_OR_RETURN_METRIC(m->regions_gpu_ipc_, regions->WithLabels({"gpu_ipc"}));
  CounterFamily* opens;
  SAMPLERD_ASSIGN_OR_RETURN_METRIC(
      opens, registry->AddCounter("samplerd_ipc_opens_total",
                                  "GPU IPC handles opened through the runtime, by kind (memory, "
                                  "event) and result (ok, error); cached reuses are not counted.",
                                  {"kind", "result"}));
  const char* kinds[] = {"memory", "event"};
  const char* results[] = {"ok", "error"};
  for (int k = 0; k < 2; ++k) {
    for (int r = 0; r < 2; ++r) {
      SAMPLERD_ASSIGN_OR_RETURN_METRIC(m->ipc_opens_[k][r],
                                       opens->WithLabels({kinds[k], results[r]}));
    }
  }
  GaugeFamily* inflight;
  SAMPLERD_ASSIGN_OR_RETURN_METRIC(
      inflight, registry->AddGauge("samplerd_inflight_requests",
                                   "Sampling requests and stream steps admitted and not yet "
                                   "answered (bounded by --max_inflight)."));
  m->inflight_ = &inflight->Get();
  SAMPLERD_ASSIGN_OR_RETURN_METRIC(
      m->build_info_,
      registry->AddGauge("samplerd_build_info", "Always 1; the labels describe the server.",
                         {"version", "backend"}));
  return m;
}

void SamplerMetrics::SetBuildInfo(const BuildInfo& info) {
  absl::StatusOr<Gauge*> gauge = build_info_->WithLabels({info.version, info.backend});
  if (gauge.ok()) (*gauge)->Set(1);
}

void SamplerMetrics::CountRequest(Method method, absl::StatusCode code) {
  const int m = static_cast<int>(method);
  int c = static_cast<int>(code);
  if (m < 0 || m >= kMethodCount) return;
  if (c < 0 || c >= kCodeCount) c = static_cast<int>(absl::StatusCode::kUnknown);
  std::atomic<Counter*>& slot = request_cache_[m][c];
  Counter* counter = slot.load(std::memory_order_acquire);
  if (counter == nullptr) {
    // First use of this pair: the family's lock, once (a racing thread gets the same child).
    absl::StatusOr<Counter*> child = requests_->WithLabels(
        {MethodName(method), absl::StatusCodeToString(static_cast<absl::StatusCode>(c))});
    if (!child.ok()) return;
    counter = *child;
    slot.store(counter, std::memory_order_release);
  }
  counter->Increment();
}

void SamplerMetrics::CountSampled(Transport transport, int64_t rows, int64_t bytes) {
  const int t = static_cast<int>(transport);
  if (t < 0 || t >= kTransportCount) return;
  if (rows > 0) rows_->Increment(static_cast<uint64_t>(rows));
  if (bytes > 0) input_bytes_[t]->Increment(static_cast<uint64_t>(bytes));
}

void SamplerMetrics::ObserveQueueWait(absl::Duration queue) {
  queue_wait_->Observe(Seconds(queue));
}

void SamplerMetrics::ObserveBackend(absl::Duration backend) { backend_->Observe(Seconds(backend)); }

void SamplerMetrics::ObserveTotal(absl::Duration total) { total_->Observe(Seconds(total)); }

void SamplerMetrics::CountIpcOpen(IpcOpenKind kind, bool ok) {
  ipc_opens_[kind == IpcOpenKind::kMemory ? 0 : 1][ok ? 0 : 1]->Increment();
}

void SamplerMetrics::SetRegions(int64_t host_shm, int64_t gpu_ipc) {
  regions_host_shm_->Set(static_cast<double>(host_shm));
  regions_gpu_ipc_->Set(static_cast<double>(gpu_ipc));
}

}  // namespace samplerd::metrics
