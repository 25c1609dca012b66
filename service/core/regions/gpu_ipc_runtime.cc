#include "service/core/regions/gpu_ipc_runtime.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "kernels/gpu/runtime.h"

namespace samplerd::core {
namespace {

namespace gpu = kernels::gpu;

class RuntimeGpuIpc final : public GpuIpc {
 public:
  explicit RuntimeGpuIpc(std::vector<gpu::DeviceProperties> devices)
      : devices_(std::move(devices)) {}

  absl::StatusOr<IpcMapping> OpenMemory(int ordinal, const IpcHandle& handle) override {
    const std::string device = Name(ordinal);
    if (absl::Status s = MakeCurrent(ordinal, device); !s.ok()) return s;
    void* ptr = nullptr;
    const int opened = gpu::IpcOpenMemHandle(&ptr, handle);
    if (opened != 0) return OpenError(opened, "an IPC memory handle", device);

    void* base = nullptr;
    size_t size = 0;
    const int ranged = gpu::MemoryRange(ptr, &base, &size);
    const uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
    const uintptr_t b = reinterpret_cast<uintptr_t>(base);
    if (ranged != 0 || p < b || p - b >= size) {
      (void)gpu::LastError();
      (void)gpu::IpcCloseMemHandle(ptr);
      (void)gpu::LastError();
      return absl::FailedPreconditionError(absl::StrCat(
          "expected the runtime to report the range of the opened IPC allocation on ", device,
          ", got ",
          ranged != 0 ? gpu::ErrorString(ranged) : "a range that does not hold the pointer"));
    }
    IpcMapping mapping;
    mapping.base = ptr;
    mapping.size = static_cast<uint64_t>(size - (p - b));
    return mapping;
  }

  void CloseMemory(int ordinal, const IpcMapping& mapping) override {
    if (gpu::SetDevice(ordinal) == 0) {
      (void)gpu::DeviceSynchronize();
      (void)gpu::IpcCloseMemHandle(mapping.base);
    }
    (void)gpu::LastError();
  }

  absl::StatusOr<void*> OpenEvent(int ordinal, const IpcHandle& handle) override {
    const std::string device = Name(ordinal);
    if (absl::Status s = MakeCurrent(ordinal, device); !s.ok()) return s;
    gpu::Event event = nullptr;
    const int opened = gpu::IpcOpenEventHandle(&event, handle);
    if (opened != 0) return OpenError(opened, "an IPC event handle", device);
    return event;
  }

  void CloseEvent(int ordinal, void* event) override {
    if (gpu::SetDevice(ordinal) == 0) (void)gpu::EventDestroy(event);
    (void)gpu::LastError();
  }

  // On the legacy default stream (null): the samplers' own streams are non-blocking, so this
  // waits for nothing of theirs. A D2H copy into pageable memory returns once done; the
  // synchronize makes that explicit.
  absl::Status CopyToHost(int ordinal, void* ready_event, const void* src, void* dst,
                          uint64_t bytes) override {
    const std::string device = Name(ordinal);
    if (absl::Status s = MakeCurrent(ordinal, device); !s.ok()) return s;
    gpu::Stream stream = nullptr;
    int code = ready_event != nullptr ? gpu::StreamWaitEvent(stream, ready_event) : 0;
    if (code == 0) code = gpu::CopyToHost(dst, src, static_cast<size_t>(bytes), stream);
    if (code == 0) code = gpu::StreamSynchronize(stream);
    if (code == 0) return absl::OkStatus();
    (void)gpu::LastError();
    return absl::FailedPreconditionError(absl::StrCat("expected to copy ", bytes, " bytes from ",
                                                      device, " to the host, got ",
                                                      gpu::ErrorString(code)));
  }

 private:
  // "GPU 0000:00:06.0" for messages (ordinals mean nothing to clients).
  std::string Name(int ordinal) const {
    for (const gpu::DeviceProperties& d : devices_) {
      if (d.ordinal == ordinal) return absl::StrCat("GPU ", d.pci_bus_id);
    }
    return absl::StrCat(gpu::RuntimeName(), " device ", ordinal);
  }

  static absl::Status MakeCurrent(int ordinal, absl::string_view device) {
    const int code = gpu::SetDevice(ordinal);
    if (code == 0) return absl::OkStatus();
    (void)gpu::LastError();
    return absl::FailedPreconditionError(
        absl::StrCat("expected ", device, " to be usable, got ", gpu::ErrorString(code)));
  }

  // IPC open errors are not sticky; clear them so they do not surface at a later call.
  static absl::Status OpenError(int code, absl::string_view what, absl::string_view device) {
    (void)gpu::LastError();
    const std::string message =
        absl::StrCat("expected ", what, " that ", gpu::RuntimeName(), " can open on ", device,
                     ", got ", gpu::ErrorString(code));
    if (gpu::IsRuntimeStateError(code)) return absl::FailedPreconditionError(message);
    return absl::InvalidArgumentError(absl::StrCat(
        message, " (a handle of a freed allocation, of another kind, or made by this process)"));
  }

  const std::vector<gpu::DeviceProperties> devices_;
};

}  // namespace

std::unique_ptr<GpuIpc> MakeRuntimeGpuIpc() {
  std::string ignored;
  return std::make_unique<RuntimeGpuIpc>(gpu::ListDevices(&ignored));
}

}  // namespace samplerd::core
