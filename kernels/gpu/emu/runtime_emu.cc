// runtime.h for the emulated backend: one "device" that is host memory, synchronous streams
// (every launch and copy completes before its call returns), events that are always complete,
// and no IPC (refused with kNotSupported, a code IsRuntimeStateError calls a runtime state).
#include <chrono>
#include <cstdlib>
#include <cstring>

#include "kernels/gpu/runtime.h"

namespace samplerd::kernels::gpu {
namespace {

// The codes CUDA and HIP both use for these errors.
constexpr int kInvalidValue = 1;
constexpr int kOutOfMemory = 2;
constexpr int kInvalidDevice = 101;
constexpr int kNotReady = 600;
constexpr int kNotSupported = 801;

struct EmuEvent {
  bool interprocess = false;
  std::chrono::steady_clock::time_point recorded{};
};

}  // namespace

const char* RuntimeName() { return "emulated"; }

std::vector<DeviceProperties> ListDevices(std::string* error) {
  DeviceProperties d;
  d.ordinal = 0;
  d.pci_bus_id = "0000:00:00.0";
  d.uuid = "EMU-00000000-0000-0000-0000-000000000000";
  d.name = "samplerd emulated GPU (CPU fibers)";
  d.wave_size = SAMPLERD_EMU_WAVE_SIZE;
  return {d};
}

const char* ErrorString(int code) {
  switch (code) {
    case 0:
      return "no error";
    case kInvalidValue:
      return "invalid argument";
    case kOutOfMemory:
      return "out of memory";
    case kInvalidDevice:
      return "invalid device ordinal";
    case kNotReady:
      return "device not ready";
    case kNotSupported:
      return "operation not supported by the emulated GPU";
    default:
      return "unknown error";
  }
}

int SetDevice(int ordinal) { return ordinal == 0 ? 0 : kInvalidDevice; }

int DeviceMalloc(void** ptr, size_t bytes) {
  if (ptr == nullptr) return kInvalidValue;
  // 256-byte aligned as cudaMalloc's; a size rounded up as aligned_alloc requires.
  *ptr = std::aligned_alloc(256, bytes == 0 ? 256 : (bytes + 255) / 256 * 256);
  return *ptr == nullptr ? kOutOfMemory : 0;
}
int DeviceFree(void* ptr) {
  std::free(ptr);
  return 0;
}
int PinnedMalloc(void** ptr, size_t bytes) { return DeviceMalloc(ptr, bytes); }
int PinnedFree(void* ptr) { return DeviceFree(ptr); }
int HostRegister(void* ptr, size_t bytes) { return ptr == nullptr ? kInvalidValue : 0; }
int HostUnregister(void* ptr) { return 0; }
int HostGetDevicePointer(void** device, void* host) {
  *device = host;
  return 0;
}

int StreamCreate(Stream* stream) {
  *stream = new char;  // a distinct non-null handle
  return 0;
}
int StreamDestroy(Stream stream) {
  delete static_cast<char*>(stream);
  return 0;
}
int StreamSynchronize(Stream) { return 0; }
int CopyToDevice(void* dst, const void* src, size_t bytes, Stream) {
  if (bytes != 0) std::memmove(dst, src, bytes);
  return 0;
}
int CopyToHost(void* dst, const void* src, size_t bytes, Stream) {
  if (bytes != 0) std::memmove(dst, src, bytes);
  return 0;
}
int CopyDeviceToDevice(void* dst, const void* src, size_t bytes, Stream) {
  if (bytes != 0) std::memmove(dst, src, bytes);
  return 0;
}
int ZeroDevice(void* ptr, size_t bytes, Stream) {
  if (bytes != 0) std::memset(ptr, 0, bytes);
  return 0;
}
int DeviceSynchronize() { return 0; }
int LastError() { return 0; }

int EventCreate(Event* event, bool interprocess) {
  auto* e = new EmuEvent;
  e->interprocess = interprocess;
  *event = e;
  return 0;
}
int EventDestroy(Event event) {
  delete static_cast<EmuEvent*>(event);
  return 0;
}
int EventRecord(Event event, Stream) {
  static_cast<EmuEvent*>(event)->recorded = std::chrono::steady_clock::now();
  return 0;
}
int EventSynchronize(Event) { return 0; }
int EventElapsedMs(float* ms, Event start, Event end) {
  const auto* a = static_cast<EmuEvent*>(start);
  const auto* b = static_cast<EmuEvent*>(end);
  if (a->interprocess || b->interprocess) return kInvalidValue;  // timing disabled
  *ms = std::chrono::duration<float, std::milli>(b->recorded - a->recorded).count();
  return 0;
}
int StreamWaitEvent(Stream, Event) { return 0; }
int EventQuery(Event) { return 0; }
bool IsNotReady(int code) { return code == kNotReady; }

// A synchronous stream cannot wait for a value that another stream writes later.
int StreamWaitValue32(Stream, void*, uint32_t) { return kNotSupported; }
int StreamWriteValue32(Stream, void* addr, uint32_t value) {
  std::memcpy(addr, &value, 4);
  return 0;
}
int StreamMemOpsSupported(int, bool* yes) {
  *yes = false;
  return 0;
}

int IpcOpenMemHandle(void**, const IpcHandleBytes&) { return kNotSupported; }
int IpcCloseMemHandle(void*) { return kNotSupported; }
int MemoryRange(const void*, void**, size_t*) { return kNotSupported; }
int IpcOpenEventHandle(Event*, const IpcHandleBytes&) { return kNotSupported; }
bool IsRuntimeStateError(int code) { return code == kNotSupported; }
int IpcGetMemHandle(IpcHandleBytes*, void*) { return kNotSupported; }
int IpcGetEventHandle(IpcHandleBytes*, Event) { return kNotSupported; }

}  // namespace samplerd::kernels::gpu
