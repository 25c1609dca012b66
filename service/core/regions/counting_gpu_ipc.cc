#include "service/core/regions/counting_gpu_ipc.h"

#include <utility>

namespace samplerd::core {

absl::StatusOr<IpcMapping> CountingGpuIpc::OpenMemory(int ordinal, const IpcHandle& handle) {
  absl::StatusOr<IpcMapping> mapping = inner_->OpenMemory(ordinal, handle);
  metrics_->CountIpcOpen(metrics::IpcOpenKind::kMemory, mapping.ok());
  return mapping;
}

void CountingGpuIpc::CloseMemory(int ordinal, const IpcMapping& mapping) {
  inner_->CloseMemory(ordinal, mapping);
}

absl::StatusOr<void*> CountingGpuIpc::OpenEvent(int ordinal, const IpcHandle& handle) {
  absl::StatusOr<void*> event = inner_->OpenEvent(ordinal, handle);
  metrics_->CountIpcOpen(metrics::IpcOpenKind::kEvent, event.ok());
  return event;
}

void CountingGpuIpc::CloseEvent(int ordinal, void* event) { inner_->CloseEvent(ordinal, event); }

absl::Status CountingGpuIpc::CopyToHost(int ordinal, void* ready_event, const void* src, void* dst,
                                        uint64_t bytes) {
  return inner_->CopyToHost(ordinal, ready_event, src, dst, bytes);
}

std::shared_ptr<GpuIpc> WithOpenCounting(std::shared_ptr<GpuIpc> ipc,
                                         metrics::SamplerMetrics* metrics) {
  if (ipc == nullptr || metrics == nullptr) return ipc;
  return std::make_shared<CountingGpuIpc>(std::move(ipc), metrics);
}

}  // namespace samplerd::core
