// The GPU side of IPC regions and events, behind an interface so that the region registry (and
// its tests) do not depend on a GPU runtime. Implemented by gpu_ipc_runtime.cc over kernels/gpu
// runtime calls when the build has a GPU backend; absent otherwise.
#ifndef SAMPLERD_SERVICE_CORE_REGIONS_GPU_IPC_H_
#define SAMPLERD_SERVICE_CORE_REGIONS_GPU_IPC_H_

#include <array>
#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"

namespace samplerd::core {

inline constexpr size_t kIpcHandleBytes = 64;
using IpcHandle = std::array<uint8_t, kIpcHandleBytes>;

// One opened IPC memory allocation: `base` maps the exporter's allocation base in this process.
struct IpcMapping {
  void* base = nullptr;
  uint64_t size = 0;  // the allocation's real size, from the runtime
};

class GpuIpc {
 public:
  virtual ~GpuIpc() = default;

  // Opens `handle` on device `ordinal`. Errors: INVALID_ARGUMENT when the runtime rejects the
  // handle (stale, from this process, not a memory handle), FAILED_PRECONDITION for runtime
  // states such as peer access. Never echoes the handle. Not on the request path.
  virtual absl::StatusOr<IpcMapping> OpenMemory(int ordinal, const IpcHandle& handle) = 0;
  // Closes a mapping returned by OpenMemory (exactly once).
  virtual void CloseMemory(int ordinal, const IpcMapping& mapping) = 0;

  // Opens an IPC event handle on `ordinal`; the result is an opaque runtime event.
  virtual absl::StatusOr<void*> OpenEvent(int ordinal, const IpcHandle& handle) = 0;
  virtual void CloseEvent(int ordinal, void* event) = 0;

  // Copies `bytes` from `src`, device memory of an opened mapping on `ordinal`, to host memory
  // `dst`, after `ready_event` (an opened event, or null) completes; returns once the bytes are
  // in `dst`. On the request path (the sparse lists of LogitBias.region and TokenHistory.region).
  // Errors: FAILED_PRECONDITION with the runtime's reason.
  virtual absl::Status CopyToHost(int ordinal, void* ready_event, const void* src, void* dst,
                                  uint64_t bytes) = 0;
};

}  // namespace samplerd::core

#endif  // SAMPLERD_SERVICE_CORE_REGIONS_GPU_IPC_H_
