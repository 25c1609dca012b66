// runtime.h over the HIP runtime (hipcc) or, through platform.h, the CUDA runtime (nvcc).
//
// Nothing here may abort the process: on a machine without a driver or a device every call
// returns the runtime's error code, and ListDevices returns an empty list with the reason.
#include <cctype>
#include <cstdio>
#include <cstring>
#include <utility>

#include "kernels/gpu/runtime.h"

#if !defined(__HIPCC__)
#include <dlfcn.h>
#endif

#include "kernels/gpu/platform.h"

namespace samplerd::kernels::gpu {
namespace {

hipStream_t AsHipStream(Stream stream) { return static_cast<hipStream_t>(stream); }
hipEvent_t AsHipEvent(Event event) { return static_cast<hipEvent_t>(event); }

static_assert(sizeof(hipIpcMemHandle_t) == kIpcHandleBytes, "IPC memory handles are 64 bytes");
static_assert(sizeof(hipIpcEventHandle_t) == kIpcHandleBytes, "IPC event handles are 64 bytes");

#if !defined(__HIPCC__)
// cuMemGetAddressRange_v2 from the driver, found once with dlopen/dlsym: linking libcuda would
// stop the binary from starting on a machine without the NVIDIA driver (where the CPU backend
// must still run). cudart itself loads libcuda.so.1 the same way, so this is the same library.
// CUresult (CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr), CUdeviceptr = unsigned long
// long on 64-bit hosts.
using CuMemGetAddressRange = int (*)(unsigned long long*, size_t*, unsigned long long);

CuMemGetAddressRange DriverMemGetAddressRange() {
  static const CuMemGetAddressRange fn = []() -> CuMemGetAddressRange {
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) return nullptr;
    // Never dlclose'd: cudart keeps the driver loaded for the life of the process anyway.
    return reinterpret_cast<CuMemGetAddressRange>(dlsym(lib, "cuMemGetAddressRange_v2"));
  }();
  return fn;
}

// The v2 stream memory operations (CUDA 11.7+ drivers): CUresult (CUstream, CUdeviceptr,
// cuuint32_t, unsigned int flags).
using CuStreamValue32 = int (*)(void*, unsigned long long, uint32_t, unsigned int);
constexpr unsigned int kCuStreamWaitValueEq = 0x1;      // CU_STREAM_WAIT_VALUE_EQ
constexpr unsigned int kCuStreamWriteValueDefault = 0;  // CU_STREAM_WRITE_VALUE_DEFAULT: fenced

struct DriverMemOps {
  CuStreamValue32 wait = nullptr;
  CuStreamValue32 write = nullptr;
};

const DriverMemOps& DriverStreamMemOps() {
  static const DriverMemOps ops = []() {
    DriverMemOps out;
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) return out;
    out.wait = reinterpret_cast<CuStreamValue32>(dlsym(lib, "cuStreamWaitValue32_v2"));
    out.write = reinterpret_cast<CuStreamValue32>(dlsym(lib, "cuStreamWriteValue32_v2"));
    return out;
  }();
  return ops;
}
#endif

// "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", the form nvidia-smi and CUDA_VISIBLE_DEVICES use.
std::string FormatUuidBytes(const unsigned char (&b)[16]) {
  char text[64];
  std::snprintf(text, sizeof(text),
                "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
                b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
                b[14], b[15]);
  return text;
}

#if defined(__HIPCC__)
// ROCm fills hipUUID with the 16 ASCII characters of the device's unique id (the form
// HIP_VISIBLE_DEVICES accepts after "GPU-"); older firmware leaves it zero. Binary contents
// are formatted like CUDA's.
std::string DeviceUuid(int ordinal) {
  hipDevice_t device;
  hipUUID uuid;
  if (hipDeviceGet(&device, ordinal) != hipSuccess) return "";
  if (hipDeviceGetUuid(&uuid, device) != hipSuccess) return "";
  unsigned char bytes[16];
  std::memcpy(bytes, uuid.bytes, sizeof(bytes));
  bool all_zero = true;
  bool all_alnum = true;
  for (unsigned char c : bytes) {
    all_zero = all_zero && c == 0;
    all_alnum = all_alnum && std::isalnum(c);
  }
  if (all_zero) return "";
  if (all_alnum) {
    std::string id(reinterpret_cast<const char*>(bytes), sizeof(bytes));
    for (char& c : id) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return "GPU-" + id;
  }
  return FormatUuidBytes(bytes);
}

// ROCm supports IPC memory and event handles on Linux (hipIpcOpenEventHandle since HIP 4.2).
bool IpcMemory(const hipDeviceProp_t&) { return true; }
bool IpcEvents(const hipDeviceProp_t&) { return true; }
#else
std::string DeviceUuid(const cudaDeviceProp& prop) {
  unsigned char bytes[16];
  std::memcpy(bytes, prop.uuid.bytes, sizeof(bytes));
  return FormatUuidBytes(bytes);
}

// CUDA IPC needs Linux and a device in the unified address space.
#if defined(__linux__)
bool IpcMemory(const cudaDeviceProp& prop) { return prop.unifiedAddressing != 0; }
bool IpcEvents(const cudaDeviceProp& prop) { return prop.unifiedAddressing != 0; }
#else
bool IpcMemory(const cudaDeviceProp&) { return false; }
bool IpcEvents(const cudaDeviceProp&) { return false; }
#endif
#endif

// "0000:00:06.0" as the runtime prints it, lower-cased; empty when the runtime fails.
std::string PciBusId(int ordinal) {
  char text[64] = {};
  if (hipDeviceGetPCIBusId(text, static_cast<int>(sizeof(text)), ordinal) != hipSuccess) {
    return "";
  }
  std::string id(text);
  for (char& c : id) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return id;
}

// "cudaErrorNoDevice: no CUDA-capable device is detected"; the name alone where the runtime
// has no better text (HIP often repeats the name).
std::string Describe(hipError_t code) {
  const std::string name = hipGetErrorName(code);
  const std::string text = hipGetErrorString(code);
  std::string out = text == name ? name : name + ": " + text;
#if !defined(__HIPCC__)
  // What a machine without the NVIDIA driver reports; say so in words.
  if (code == cudaErrorInsufficientDriver) {
    out += " (no NVIDIA driver is loaded, or it is older than this build's CUDA runtime)";
  }
#endif
  return out;
}

}  // namespace

const char* RuntimeName() {
#if defined(__HIPCC__)
  return "hip";
#else
  return "cuda";
#endif
}

std::vector<DeviceProperties> ListDevices(std::string* error) {
  std::vector<DeviceProperties> devices;
  int count = 0;
  const hipError_t status = hipGetDeviceCount(&count);
  if (status != hipSuccess) {
    // No driver or no device: not an error for callers, who fall back to the CPU. Clear the
    // runtime's last error so that it does not surface later as a fault of some other call.
    (void)hipGetLastError();
    if (error != nullptr) *error = Describe(status);
    return devices;
  }
  if (count == 0) {
    if (error != nullptr) *error = "the runtime reports no devices";
    return devices;
  }
  for (int i = 0; i < count; ++i) {
    hipDeviceProp_t prop;
    const hipError_t prop_status = hipGetDeviceProperties(&prop, i);
    if (prop_status != hipSuccess) {
      (void)hipGetLastError();
      if (error != nullptr) *error = "device " + std::to_string(i) + ": " + Describe(prop_status);
      continue;
    }
    DeviceProperties d;
    d.ordinal = i;
    d.pci_bus_id = PciBusId(i);
#if defined(__HIPCC__)
    d.uuid = DeviceUuid(i);
#else
    d.uuid = DeviceUuid(prop);
#endif
    d.name = prop.name;
    d.wave_size = prop.warpSize;
    d.ipc_memory = IpcMemory(prop);
    d.ipc_events = IpcEvents(prop);
    devices.push_back(std::move(d));
  }
  return devices;
}

const char* ErrorString(int code) { return hipGetErrorString(static_cast<hipError_t>(code)); }

int SetDevice(int ordinal) { return hipSetDevice(ordinal); }

int DeviceMalloc(void** ptr, size_t bytes) { return hipMalloc(ptr, bytes); }

int DeviceFree(void* ptr) { return hipFree(ptr); }

int PinnedMalloc(void** ptr, size_t bytes) {
  return hipHostMalloc(ptr, bytes, hipHostMallocDefault);
}

int PinnedFree(void* ptr) { return hipHostFree(ptr); }

int HostRegister(void* ptr, size_t bytes) {
#if defined(__HIPCC__)
  return hipHostRegister(ptr, bytes, hipHostRegisterPortable | hipHostRegisterMapped);
#else
  return cudaHostRegister(ptr, bytes, cudaHostRegisterPortable | cudaHostRegisterMapped);
#endif
}

int HostUnregister(void* ptr) {
#if defined(__HIPCC__)
  return hipHostUnregister(ptr);
#else
  return cudaHostUnregister(ptr);
#endif
}

int HostGetDevicePointer(void** device, void* host) {
  *device = nullptr;
#if defined(__HIPCC__)
  return hipHostGetDevicePointer(device, host, 0);
#else
  return cudaHostGetDevicePointer(device, host, 0);
#endif
}

int StreamCreate(Stream* stream) {
  hipStream_t s = nullptr;
  const hipError_t status = hipStreamCreateWithFlags(&s, hipStreamNonBlocking);
  *stream = status == hipSuccess ? static_cast<Stream>(s) : nullptr;
  return status;
}

int StreamDestroy(Stream stream) { return hipStreamDestroy(AsHipStream(stream)); }

int StreamSynchronize(Stream stream) { return hipStreamSynchronize(AsHipStream(stream)); }

int CopyToDevice(void* dst, const void* src, size_t bytes, Stream stream) {
  return hipMemcpyAsync(dst, src, bytes, hipMemcpyHostToDevice, AsHipStream(stream));
}

int CopyToHost(void* dst, const void* src, size_t bytes, Stream stream) {
  return hipMemcpyAsync(dst, src, bytes, hipMemcpyDeviceToHost, AsHipStream(stream));
}

int CopyDeviceToDevice(void* dst, const void* src, size_t bytes, Stream stream) {
  return hipMemcpyAsync(dst, src, bytes, hipMemcpyDeviceToDevice, AsHipStream(stream));
}

int ZeroDevice(void* ptr, size_t bytes, Stream stream) {
  return hipMemsetAsync(ptr, 0, bytes, AsHipStream(stream));
}

int DeviceSynchronize() { return hipDeviceSynchronize(); }

int LastError() { return hipGetLastError(); }

int EventCreate(Event* event, bool interprocess) {
  hipEvent_t e = nullptr;
  const unsigned flags = interprocess ? (hipEventDisableTiming | hipEventInterprocess) : 0u;
  const hipError_t status = hipEventCreateWithFlags(&e, flags);
  *event = status == hipSuccess ? static_cast<Event>(e) : nullptr;
  return status;
}

int EventDestroy(Event event) { return hipEventDestroy(AsHipEvent(event)); }

int EventRecord(Event event, Stream stream) {
  return hipEventRecord(AsHipEvent(event), AsHipStream(stream));
}

int EventSynchronize(Event event) { return hipEventSynchronize(AsHipEvent(event)); }

int EventElapsedMs(float* ms, Event start, Event end) {
  return hipEventElapsedTime(ms, AsHipEvent(start), AsHipEvent(end));
}

int StreamWaitEvent(Stream stream, Event event) {
  return hipStreamWaitEvent(AsHipStream(stream), AsHipEvent(event), 0);
}

int EventQuery(Event event) { return hipEventQuery(AsHipEvent(event)); }

bool IsNotReady(int code) { return code == static_cast<int>(hipErrorNotReady); }

int StreamWaitValue32(Stream stream, void* addr, uint32_t value) {
#if defined(__HIPCC__)
  return hipStreamWaitValue32(AsHipStream(stream), addr, value, hipStreamWaitValueEq, 0xffffffffu);
#else
  const DriverMemOps& ops = DriverStreamMemOps();
  if (ops.wait == nullptr) return cudaErrorInsufficientDriver;
  return ops.wait(stream, reinterpret_cast<unsigned long long>(addr), value, kCuStreamWaitValueEq);
#endif
}

int StreamWriteValue32(Stream stream, void* addr, uint32_t value) {
#if defined(__HIPCC__)
  return hipStreamWriteValue32(AsHipStream(stream), addr, value, 0);
#else
  const DriverMemOps& ops = DriverStreamMemOps();
  if (ops.write == nullptr) return cudaErrorInsufficientDriver;
  return ops.write(stream, reinterpret_cast<unsigned long long>(addr), value,
                   kCuStreamWriteValueDefault);
#endif
}

int StreamMemOpsSupported(int ordinal, bool* yes) {
  *yes = false;
#if defined(__HIPCC__)
  int value = 0;
  const hipError_t status =
      hipDeviceGetAttribute(&value, hipDeviceAttributeCanUseStreamWaitValue, ordinal);
  if (status != hipSuccess) return status;
  *yes = value != 0;
  return hipSuccess;
#else
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) return status;
  if (ordinal < 0 || ordinal >= count) return cudaErrorInvalidDevice;
  const DriverMemOps& ops = DriverStreamMemOps();
  *yes = ops.wait != nullptr && ops.write != nullptr;
  return cudaSuccess;
#endif
}

int IpcOpenMemHandle(void** ptr, const IpcHandleBytes& handle) {
  hipIpcMemHandle_t h;
  std::memcpy(&h, handle.data(), sizeof(h));
  *ptr = nullptr;
  return hipIpcOpenMemHandle(ptr, h, hipIpcMemLazyEnablePeerAccess);
}

int IpcCloseMemHandle(void* ptr) { return hipIpcCloseMemHandle(ptr); }

int MemoryRange(const void* ptr, void** base, size_t* size) {
  *base = nullptr;
  *size = 0;
#if defined(__HIPCC__)
  return hipMemGetAddressRange(base, size, const_cast<void*>(ptr));
#else
  const CuMemGetAddressRange fn = DriverMemGetAddressRange();
  if (fn == nullptr) return cudaErrorInsufficientDriver;
  unsigned long long driver_base = 0;
  const int status = fn(&driver_base, size, reinterpret_cast<unsigned long long>(ptr));
  if (status != 0) {
    *size = 0;
    return status;
  }
  *base = reinterpret_cast<void*>(driver_base);
  return 0;
#endif
}

int IpcOpenEventHandle(Event* event, const IpcHandleBytes& handle) {
  hipIpcEventHandle_t h;
  std::memcpy(&h, handle.data(), sizeof(h));
  hipEvent_t e = nullptr;
  const hipError_t status = hipIpcOpenEventHandle(&e, h);
  *event = status == hipSuccess ? static_cast<Event>(e) : nullptr;
  return status;
}

bool IsRuntimeStateError(int code) {
  switch (static_cast<hipError_t>(code)) {
    case hipErrorOutOfMemory:
    case hipErrorNotInitialized:
    case hipErrorDeinitialized:
    case hipErrorInsufficientDriver:
    case hipErrorNoDevice:
    case hipErrorInvalidDevice:
    case hipErrorPeerAccessUnsupported:
    case hipErrorOperatingSystem:
    case hipErrorIllegalAddress:
    case hipErrorLaunchFailure:
    case hipErrorNotSupported:
      return true;
#if !defined(__HIPCC__)
    case cudaErrorTooManyPeers:
    case cudaErrorDevicesUnavailable:
    case cudaErrorIncompatibleDriverContext:
    case cudaErrorNotPermitted:
    case cudaErrorSystemNotReady:
    case cudaErrorSystemDriverMismatch:
    case cudaErrorCompatNotSupportedOnDevice:
      return true;
#endif
    default:
      return false;
  }
}

int IpcGetMemHandle(IpcHandleBytes* handle, void* ptr) {
  hipIpcMemHandle_t h;
  const hipError_t status = hipIpcGetMemHandle(&h, ptr);
  if (status == hipSuccess) std::memcpy(handle->data(), &h, sizeof(h));
  return status;
}

int IpcGetEventHandle(IpcHandleBytes* handle, Event event) {
  hipIpcEventHandle_t h;
  const hipError_t status = hipIpcGetEventHandle(&h, AsHipEvent(event));
  if (status == hipSuccess) std::memcpy(handle->data(), &h, sizeof(h));
  return status;
}

}  // namespace samplerd::kernels::gpu
