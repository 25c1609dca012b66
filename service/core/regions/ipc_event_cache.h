// IPC events that requests name (ready_event, done_event), opened once per (device, handle) and
// kept open for the server's lifetime: engines reuse a handful of events for every step.
#ifndef SAMPLERD_SERVICE_CORE_REGIONS_IPC_EVENT_CACHE_H_
#define SAMPLERD_SERVICE_CORE_REGIONS_IPC_EVENT_CACHE_H_

#include <cstddef>
#include <map>
#include <mutex>
#include <utility>

#include "absl/status/statusor.h"
#include "service/core/regions/gpu_ipc.h"

namespace samplerd::core {

class IpcEventCache {
 public:
  // Distinct events kept open at most; one more is RESOURCE_EXHAUSTED (a client that sends a
  // new event per step would otherwise grow the cache without bound).
  static constexpr size_t kMaxEvents = 1024;

  // `ipc` must not be null and must outlive the cache.
  explicit IpcEventCache(GpuIpc* ipc) : ipc_(ipc) {}
  ~IpcEventCache() { CloseAll(); }
  IpcEventCache(const IpcEventCache&) = delete;
  IpcEventCache& operator=(const IpcEventCache&) = delete;

  // The opened event for `handle` on device `ordinal`, opened through GpuIpc::OpenEvent the
  // first time (that call's errors are returned and nothing is cached). Thread-safe; the first
  // open of a handle costs a runtime call, later ones a map lookup.
  absl::StatusOr<void*> Get(int ordinal, const IpcHandle& handle);

  // Closes every cached event. Call once no request uses them (after the drain).
  void CloseAll();

 private:
  GpuIpc* const ipc_;
  std::mutex mu_;
  std::map<std::pair<int, IpcHandle>, void*> events_;
};

}  // namespace samplerd::core

#endif  // SAMPLERD_SERVICE_CORE_REGIONS_IPC_EVENT_CACHE_H_
