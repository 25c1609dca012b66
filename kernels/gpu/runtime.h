// A thin, plain-C++ view of the GPU runtime (HIP or CUDA) for the server: device discovery,
// memory, streams, events and IPC. Implemented in runtime.hip, compiled by hipcc or nvcc; returns
// the runtime's integer error codes (0 = success). No HIP or CUDA header leaks out of here: the
// service and the tests include it with the host compiler.
#ifndef SAMPLERD_KERNELS_GPU_RUNTIME_H_
#define SAMPLERD_KERNELS_GPU_RUNTIME_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/gpu/sample.h"

namespace samplerd::kernels::gpu {

// What the runtime says about one device.
struct DeviceProperties {
  int ordinal = 0;
  std::string pci_bus_id;  // "0000:00:06.0", lower case as the runtime prints it
  std::string uuid;        // "GPU-xxxxxxxx-xxxx-..." on CUDA; empty where the runtime has none
  std::string name;        // "NVIDIA H200"
  int wave_size = 0;
  bool ipc_memory = false;  // IPC memory handles supported
  bool ipc_events = false;  // IPC event handles supported
};

// "cuda" or "hip": the runtime this build was compiled for.
const char* RuntimeName();

// Visible devices. Empty, not an error, when there is no driver or no device; *error (if not
// null) then receives the runtime's explanation.
std::vector<DeviceProperties> ListDevices(std::string* error);

const char* ErrorString(int code);

int SetDevice(int ordinal);
int DeviceMalloc(void** ptr, size_t bytes);
int DeviceFree(void* ptr);
int PinnedMalloc(void** ptr, size_t bytes);  // page-locked host memory
int PinnedFree(void* ptr);
// Page-locks `bytes` of existing host memory at `ptr` (e.g. a host shm mapping) for every
// device (Portable) and maps it into the device address space (Mapped), so that kernels and
// stream memory operations can address it through HostGetDevicePointer. The range must not
// overlap another registration of this process (the runtime refuses); page-align it. Undo with
// HostUnregister(ptr) once no pending work touches it.
int HostRegister(void* ptr, size_t bytes);
int HostUnregister(void* ptr);
// The device address of registered (or PinnedMalloc'd) host memory `host` on the current device.
int HostGetDevicePointer(void** device, void* host);
int StreamCreate(Stream* stream);  // non-blocking stream
int StreamDestroy(Stream stream);
int StreamSynchronize(Stream stream);
int CopyToDevice(void* dst, const void* src, size_t bytes, Stream stream);
int CopyToHost(void* dst, const void* src, size_t bytes, Stream stream);
int CopyDeviceToDevice(void* dst, const void* src, size_t bytes, Stream stream);
int ZeroDevice(void* ptr, size_t bytes, Stream stream);  // fills device memory with zero bytes
// Waits for all work on the current device (every stream).
int DeviceSynchronize();
// The sticky-error check after a fault: the runtime's last error, cleared.
int LastError();

// --- Events ---------------------------------------------------------------------------------
// hipEvent_t / cudaEvent_t, as an opaque pointer.
using Event = void*;

// `interprocess`: an event that can be exported with IpcGetEventHandle (timing disabled, as the
// runtime requires); otherwise a timing event for EventElapsedMs.
int EventCreate(Event* event, bool interprocess);
// Destroys an event made by EventCreate or opened by IpcOpenEventHandle. Safe while work that
// records or waits on it is pending: the runtime releases it once that work is done.
int EventDestroy(Event event);
int EventRecord(Event event, Stream stream);
int EventSynchronize(Event event);
int EventElapsedMs(float* ms, Event start, Event end);
// Makes later work on `stream` wait until `event` completes, without blocking the host. An
// event never recorded counts as complete.
int StreamWaitEvent(Stream stream, Event event);
// Whether the work recorded by `event` has completed, without blocking: 0 when it has (or the
// event was never recorded), a code for which IsNotReady() holds while it is pending, any other
// code for a fault.
int EventQuery(Event event);
// True for the runtime's "not ready" code (EventQuery of pending work).
bool IsNotReady(int code);

// --- Stream memory operations -------------------------------------------------------------------
// 32-bit waits and writes that a stream performs in order with its other work, on device memory
// (DeviceMalloc), IPC-mapped device memory (IpcOpenMemHandle) or registered host memory (its
// device pointer). `addr` must be 4-byte aligned. Device sessions (proto/samplerd/v1/
// device_session.h) are built on them.
//
// Caution: a stream blocked in StreamWaitValue32 blocks the hardware queue it is mapped to, and
// with it every stream of this process sharing that queue (CUDA: CUDA_DEVICE_MAX_CONNECTIONS,
// default 8; HIP: GPU_MAX_HW_QUEUES, default 4). Whatever must release the wait has to run on a
// stream of another queue, or on another process. It also holds up every device-wide
// synchronisation of its process (DeviceFree, PinnedFree, IPC opens, DeviceSynchronize): the
// samplerd server therefore only writes (device sessions' waits are the engine's, in its own
// process; service/core/session/gpu_plane.cc polls the doorbell on the host).
//
// CUDA: the driver's cuStreamWaitValue32_v2 / cuStreamWriteValue32_v2, resolved at first use
// with dlopen("libcuda.so.1") like MemoryRange (no libcuda link); their error codes are the
// driver's, returned as they are. HIP: hipStreamWaitValue32 / hipStreamWriteValue32.

// Later work on `stream` waits until *addr == value (all 32 bits compared).
int StreamWaitValue32(Stream stream, void* addr, uint32_t value);
// Writes *addr = value once the earlier work of `stream` is done, after a memory fence: a
// reader that sees the value sees the earlier work's writes.
int StreamWriteValue32(Stream stream, void* addr, uint32_t value);
// *yes: whether device `ordinal` supports the two calls above. CUDA: the driver has the v2
// entry points (CUDA 11.7+ drivers enable 32-bit stream memory operations on every device).
// HIP: hipDeviceAttributeCanUseStreamWaitValue. Returns the runtime's code of a failed query.
int StreamMemOpsSupported(int ordinal, bool* yes);

// --- IPC --------------------------------------------------------------------------------------
// Memory and event handles are 64 opaque bytes on both runtimes (cudaIpcMemHandle_t,
// hipIpcMemHandle_t, and their event twins); runtime.hip checks the sizes at compile time.
inline constexpr size_t kIpcHandleBytes = 64;
using IpcHandleBytes = std::array<uint8_t, kIpcHandleBytes>;

// Maps the allocation that another process exported with IpcGetMemHandle into this process, on
// the current device; *ptr receives the allocation's base. Peer access is enabled lazily when
// the allocation lives on another device. The same process may not open its own handles (the
// runtime refuses). Close with IpcCloseMemHandle.
int IpcOpenMemHandle(void** ptr, const IpcHandleBytes& handle);
int IpcCloseMemHandle(void* ptr);
// The base and byte size of the device allocation that contains `ptr` (for an IPC mapping: the
// exporter's whole allocation). HIP: hipMemGetAddressRange. CUDA: the runtime API has no such
// call (cudaPointerGetAttributes gives no size), so this calls the driver's
// cuMemGetAddressRange_v2, resolved at first use with dlopen("libcuda.so.1"), so that the
// binary still starts on a machine without the NVIDIA driver (the call then returns
// cudaErrorInsufficientDriver). The driver's error codes are returned as they are: the runtime's
// codes mirror them for everything this call can fail with (1 invalid value, 3 not initialised,
// 201 invalid context, ...). Needs the device's context current (any runtime call on the device
// made on this thread before it, e.g. the IpcOpenMemHandle).
int MemoryRange(const void* ptr, void** base, size_t* size);
// Opens an event that another process exported with IpcGetEventHandle; destroy with
// EventDestroy.
int IpcOpenEventHandle(Event* event, const IpcHandleBytes& handle);
// True when `code`, returned by IpcOpenMemHandle or IpcOpenEventHandle, is a state of this
// process, runtime or device (no driver or device, peer access, out of memory) rather than a
// handle that the runtime rejects (stale, freed, made in this process, not a handle at all).
bool IsRuntimeStateError(int code);

// Exporter side (tests, benchmarks): the handle of the allocation that holds `ptr` (device
// memory from DeviceMalloc), and of an interprocess event.
int IpcGetMemHandle(IpcHandleBytes* handle, void* ptr);
int IpcGetEventHandle(IpcHandleBytes* handle, Event event);

}  // namespace samplerd::kernels::gpu

#endif  // SAMPLERD_KERNELS_GPU_RUNTIME_H_
