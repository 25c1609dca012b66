// Options of the core, with their defaults.
#ifndef SAMPLERD_SERVICE_CORE_OPTIONS_H_
#define SAMPLERD_SERVICE_CORE_OPTIONS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "service/core/backend/select_backend.h"
#include "service/core/model/limits.h"
#include "service/core/regions/gpu_ipc.h"
#include "service/core/regions/region_registry.h"
#include "service/core/session/session_manager.h"
#include "service/metrics/sampler_metrics.h"

namespace samplerd::core {

struct CoreOptions {
  BackendChoice backend = BackendChoice::kAuto;
  // The GPU to sample on, by PCI bus id or UUID (--gpu); empty: the first the runtime lists.
  std::string gpu;
  // Host threads the CPU backend spreads rows over; 0 = one per core.
  int threads = 0;
  Limits limits;
  // Called once when the backend faults for good (Sampler::faulted(), e.g. a sticky GPU error),
  // with the status of the request that faulted. From then on the core refuses work with
  // UNAVAILABLE; the process should drain and exit so that it is restarted. Runs on the
  // executor thread: it must not block (nor call SamplerCore::Drain). May be empty.
  std::function<void(const absl::Status&)> on_fatal;
  // Host shm key prefix and other region settings (--shm_prefix).
  RegionOptions regions;
  // Device sessions: how many, and how their planes run.
  DeviceSessionOptions sessions;
  // GPU IPC (memory regions and events) for a GPU backend; null: none, and registering a
  // gpu_ipc region or sending an IPC event is FAILED_PRECONDITION. Tests set a fake. The hook
  // for the runtime's implementation is in SamplerCore::Create (sampler_core.cc).
  std::shared_ptr<GpuIpc> gpu_ipc;
  // Where the core counts rows, bytes, latencies, in-flight work and IPC opens; null: nowhere.
  // Must outlive the core.
  metrics::SamplerMetrics* metrics = nullptr;
};

}  // namespace samplerd::core

#endif  // SAMPLERD_SERVICE_CORE_OPTIONS_H_
