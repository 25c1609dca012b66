// Internal to the C++ client: the few GPU driver calls a DeviceSession makes (stream memory
// operations, host registration, a write from another thread), resolved with dlopen at first
// use from libcuda.so.1 (CUDA driver API) or libamdhip64.so (HIP runtime). The client library
// therefore builds and links with no GPU toolchain; an engine that never asks for a GPU stream
// never loads either library.
#ifndef SAMPLERD_CLIENT_CPP_SRC_GPU_STREAM_OPS_H_
#define SAMPLERD_CLIENT_CPP_SRC_GPU_STREAM_OPS_H_

#include <cstddef>
#include <cstdint>
#include <string>

namespace samplerd::internal {

// Which runtime to use; kAuto prefers one the process has loaded already, then CUDA, then HIP.
enum class GpuVendor { kAuto, kCuda, kHip };

// Every method returns an empty string on success, else a message "expected X, got Y"-style
// naming the driver call and its error. Thread-safe: the object is immutable once resolved.
class GpuStreamOps {
 public:
  // The resolved runtime, or null with the reason in *error. Resolved once per process (the
  // first successful call fixes the vendor; later calls must ask for kAuto or that vendor).
  static const GpuStreamOps* Get(GpuVendor vendor, std::string* error);

  GpuVendor vendor() const { return vendor_; }
  const char* name() const { return vendor_ == GpuVendor::kCuda ? "CUDA" : "HIP"; }

  // Enqueues "write `value` at `address`" on `stream` (CUstream / hipStream_t; null is the
  // default stream), ordered after the stream's earlier work and capturable in a graph.
  std::string WriteValue32(void* stream, uint64_t address, uint32_t value) const;
  // Enqueues "wait until the 32-bit word at `address` equals `value`" on `stream`.
  std::string WaitValue32Eq(void* stream, uint64_t address, uint32_t value) const;

  // Page-locks [ptr, ptr + bytes), maps it for the device of the current context, and stores
  // the device-visible address of ptr in *device_address. Needs a current context (CUDA) or
  // device (HIP) on the calling thread.
  std::string RegisterHost(void* ptr, size_t bytes, uint64_t* device_address) const;
  // Undoes RegisterHost (best effort).
  void UnregisterHost(void* ptr) const;

 private:
  GpuStreamOps() = default;
  static std::string Resolve(GpuVendor vendor, GpuStreamOps* ops);

  GpuVendor vendor_ = GpuVendor::kAuto;
  void* library_ = nullptr;
  // Resolved entry points, typed in gpu_stream_ops.cc.
  void* write_value_ = nullptr;
  void* wait_value_ = nullptr;
  void* host_register_ = nullptr;
  void* host_unregister_ = nullptr;
  void* host_device_pointer_ = nullptr;
  void* get_context_ = nullptr;  // cuCtxGetCurrent / hipGetDevice
  void* error_string_ = nullptr;
};

}  // namespace samplerd::internal

#endif  // SAMPLERD_CLIENT_CPP_SRC_GPU_STREAM_OPS_H_
