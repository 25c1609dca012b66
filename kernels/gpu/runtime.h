// A thin, plain-C++ view of the GPU runtime (HIP or CUDA) for the server: device discovery,
// memory, streams. Implemented in runtime.hip, compiled by hipcc or nvcc; returns the runtime's
// integer error codes (0 = success).
#ifndef SAMPLERD_KERNELS_GPU_RUNTIME_H_
#define SAMPLERD_KERNELS_GPU_RUNTIME_H_

#include <cstddef>
#include <string>
#include <vector>

#include "kernels/gpu/gpu_sampler.h"

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
int StreamCreate(Stream* stream);  // non-blocking stream
int StreamDestroy(Stream stream);
int StreamSynchronize(Stream stream);
int CopyToDevice(void* dst, const void* src, size_t bytes, Stream stream);
int CopyToHost(void* dst, const void* src, size_t bytes, Stream stream);
// The sticky-error check after a fault: the runtime's last error, cleared.
int LastError();

}  // namespace samplerd::kernels::gpu

#endif  // SAMPLERD_KERNELS_GPU_RUNTIME_H_
