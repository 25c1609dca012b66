// A GpuIpc that forwards to another and counts its opens (samplerd_ipc_opens_total), so that
// the region registry and event cache need not know about metrics.
#ifndef SAMPLERD_SERVICE_CORE_REGIONS_COUNTING_GPU_IPC_H_
#define SAMPLERD_SERVICE_CORE_REGIONS_COUNTING_GPU_IPC_H_

#include <memory>

#include "service/core/regions/gpu_ipc.h"
#include "service/metrics/sampler_metrics.h"

namespace samplerd::core {

class CountingGpuIpc final : public GpuIpc {
 public:
  // `inner` must not be null; `metrics` must outlive this object.
  CountingGpuIpc(std::shared_ptr<GpuIpc> inner, metrics::SamplerMetrics* metrics)
      : inner_(std::move(inner)), metrics_(metrics) {}

  absl::StatusOr<IpcMapping> OpenMemory(int ordinal, const IpcHandle& handle) override;
  void CloseMemory(int ordinal, const IpcMapping& mapping) override;
  absl::StatusOr<void*> OpenEvent(int ordinal, const IpcHandle& handle) override;
  void CloseEvent(int ordinal, void* event) override;
  absl::Status CopyToHost(int ordinal, void* ready_event, const void* src, void* dst,
                          uint64_t bytes) override;

 private:
  const std::shared_ptr<GpuIpc> inner_;
  metrics::SamplerMetrics* const metrics_;
};

// `ipc` wrapped in a CountingGpuIpc when both `ipc` and `metrics` are set, else `ipc`.
std::shared_ptr<GpuIpc> WithOpenCounting(std::shared_ptr<GpuIpc> ipc,
                                         metrics::SamplerMetrics* metrics);

}  // namespace samplerd::core

#endif  // SAMPLERD_SERVICE_CORE_REGIONS_COUNTING_GPU_IPC_H_
