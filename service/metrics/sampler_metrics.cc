#include "service/metrics/sampler_metrics.h"

#include <stdexcept>

#include "absl/strings/str_cat.h"

namespace samplerd::metrics {
namespace {

double Seconds(absl::Duration d) { return absl::ToDoubleSeconds(d); }

// Registers the family `name` built by `builder` (prometheus::BuildCounter() and the like).
template <typename Builder>
auto& BuildFamily(Builder builder, const char* name, const char* help,
                  prometheus::Registry& registry) {
  return builder.Name(name).Help(help).Register(registry);
}

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
  try {
    m->Register(registry->prometheus());
  } catch (const std::invalid_argument& e) {
    return absl::AlreadyExistsError(absl::StrCat(
        "expected samplerd's metric names to be new in the registry, got: ", e.what()));
  }
  return m;
}

void SamplerMetrics::Register(prometheus::Registry& registry) {
  requests_ = &BuildFamily(prometheus::BuildCounter(), "samplerd_requests_total",
                           "SamplerService RPCs answered, by method and gRPC status code "
                           "(SampleStream: one per step, with the step's code).",
                           registry);
  rows_ = &BuildFamily(prometheus::BuildCounter(), "samplerd_rows_sampled_total",
                       "Rows (batch entries) of successfully sampled requests.", registry)
               .Add({});
  auto& bytes = BuildFamily(prometheus::BuildCounter(), "samplerd_input_bytes_total",
                            "Logits bytes read by successfully sampled requests, by "
                            "transport (inline, host_shm, gpu_ipc).",
                            registry);
  for (int t = 0; t < kTransportCount; ++t) {
    input_bytes_[t] = &bytes.Add({{"transport", TransportName(static_cast<Transport>(t))}});
  }
  queue_wait_ = &BuildFamily(prometheus::BuildHistogram(), "samplerd_queue_wait_seconds",
                             "Time from a request's arrival until the backend starts "
                             "on it (or it is refused there), seconds.",
                             registry)
                     .Add({}, LatencyBucketsSeconds());
  backend_ = &BuildFamily(prometheus::BuildHistogram(), "samplerd_backend_seconds",
                          "Time a request spends in the sampling backend (kernels and "
                          "copies), seconds.",
                          registry)
                  .Add({}, LatencyBucketsSeconds());
  total_ = &BuildFamily(prometheus::BuildHistogram(), "samplerd_request_duration_seconds",
                        "Server-side time from a request's arrival until its "
                        "answer is ready, seconds.",
                        registry)
                .Add({}, LatencyBucketsSeconds());
  auto& regions = BuildFamily(prometheus::BuildGauge(), "samplerd_regions",
                              "Registered regions, by kind.", registry);
  regions_host_shm_ = &regions.Add({{"kind", "host_shm"}});
  regions_gpu_ipc_ = &regions.Add({{"kind", "gpu_ipc"}});
  auto& region_bytes = BuildFamily(prometheus::BuildGauge(), "samplerd_region_bytes",
                                   "Bytes of the registered regions (their byte_size), by kind; "
                                   "--max_region_bytes bounds their total.",
                                   registry);
  region_bytes_host_shm_ = &region_bytes.Add({{"kind", "host_shm"}});
  region_bytes_gpu_ipc_ = &region_bytes.Add({{"kind", "gpu_ipc"}});
  auto& opens = BuildFamily(prometheus::BuildCounter(), "samplerd_ipc_opens_total",
                            "GPU IPC handles opened through the runtime, by kind (memory, "
                            "event) and result (ok, error); cached reuses are not counted.",
                            registry);
  const char* kinds[] = {"memory", "event"};
  const char* results[] = {"ok", "error"};
  for (int k = 0; k < 2; ++k) {
    for (int r = 0; r < 2; ++r) {
      ipc_opens_[k][r] = &opens.Add({{"kind", kinds[k]}, {"result", results[r]}});
    }
  }
  inflight_ = &BuildFamily(prometheus::BuildGauge(), "samplerd_inflight_requests",
                           "Sampling requests and stream steps admitted and not yet "
                           "answered (bounded by --max_inflight).",
                           registry)
                   .Add({});
  inflight_bytes_ = &BuildFamily(prometheus::BuildGauge(), "samplerd_inflight_bytes",
                                 "Inline logits bytes of the sampling requests and stream steps "
                                 "admitted and not yet answered, plus those reserved by chunked "
                                 "stream steps being assembled (bounded by --max_inflight_bytes).",
                                 registry)
                         .Add({});
  build_info_ = &BuildFamily(prometheus::BuildGauge(), "samplerd_build_info",
                             "Always 1; the labels describe the server.", registry);
}

void SamplerMetrics::SetBuildInfo(const BuildInfo& info) {
  build_info_->Add({{"version", info.version}, {"backend", info.backend}}).Set(1);
}

void SamplerMetrics::CountRequest(Method method, absl::StatusCode code) {
  const int m = static_cast<int>(method);
  int c = static_cast<int>(code);
  if (m < 0 || m >= kMethodCount) return;
  if (c < 0 || c >= kCodeCount) c = static_cast<int>(absl::StatusCode::kUnknown);
  std::atomic<prometheus::Counter*>& slot = request_cache_[m][c];
  prometheus::Counter* counter = slot.load(std::memory_order_acquire);
  if (counter == nullptr) {
    // First use of this pair: the family's lock, once (a racing thread gets the same child).
    counter =
        &requests_->Add({{"method", MethodName(method)},
                         {"code", absl::StatusCodeToString(static_cast<absl::StatusCode>(c))}});
    slot.store(counter, std::memory_order_release);
  }
  counter->Increment();
}

void SamplerMetrics::CountSampled(Transport transport, int64_t rows, int64_t bytes) {
  const int t = static_cast<int>(transport);
  if (t < 0 || t >= kTransportCount) return;
  if (rows > 0) rows_->Increment(static_cast<double>(rows));
  if (bytes > 0) input_bytes_[t]->Increment(static_cast<double>(bytes));
}

void SamplerMetrics::ObserveQueueWait(absl::Duration queue) {
  queue_wait_->Observe(Seconds(queue));
}

void SamplerMetrics::ObserveBackend(absl::Duration backend) { backend_->Observe(Seconds(backend)); }

void SamplerMetrics::ObserveTotal(absl::Duration total) { total_->Observe(Seconds(total)); }

void SamplerMetrics::CountIpcOpen(IpcOpenKind kind, bool ok) {
  ipc_opens_[kind == IpcOpenKind::kMemory ? 0 : 1][ok ? 0 : 1]->Increment();
}

void SamplerMetrics::SetRegions(const RegionTotals& host_shm, const RegionTotals& gpu_ipc) {
  regions_host_shm_->Set(static_cast<double>(host_shm.count));
  regions_gpu_ipc_->Set(static_cast<double>(gpu_ipc.count));
  region_bytes_host_shm_->Set(static_cast<double>(host_shm.bytes));
  region_bytes_gpu_ipc_->Set(static_cast<double>(gpu_ipc.bytes));
}

std::vector<double> LatencyBucketsSeconds() {
  return {25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3,
          25e-3, 50e-3, 100e-3, 250e-3, 500e-3, 1.0,  2.5,    5.0,  10.0};
}

}  // namespace samplerd::metrics
