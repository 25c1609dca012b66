// Helpers of the raw C++ GPU IPC producer test (ipc_producer_raw.cc): logits on the host in fp32
// or bf16, per-row sampling parameters, device memory owned by this (the producer) process, and
// the region RPCs through the generated stub. GPU calls go through kernels/gpu/runtime.h, so the
// helpers compile with the host compiler and run on CUDA or HIP alike.
#ifndef SAMPLERD_TESTS_GPU_IPC_RAW_UTIL_H_
#define SAMPLERD_TESTS_GPU_IPC_RAW_UTIL_H_

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/gpu/runtime.h"
#include "samplerd/client.h"

namespace samplerd::ipc_test {

namespace gpu = kernels::gpu;

// A [batch, vocab] logits tensor with `row_stride` elements between rows, as little-endian bytes
// of fp32 or bf16: (batch - 1) * row_stride + vocab elements, N(0, 3^2) from `seed` (the padding
// between rows holds a large logit, so that reading it by mistake changes the tokens).
struct HostLogits {
  v1::DType dtype = v1::DTYPE_FP32;
  int64_t batch = 0;
  int64_t vocab = 0;
  int64_t row_stride = 0;
  std::string bytes;

  size_t ElementSize() const { return dtype == v1::DTYPE_BF16 ? 2 : 4; }
};
HostLogits RandomLogits(v1::DType dtype, int64_t batch, int64_t vocab, int64_t row_stride,
                        uint64_t seed);
// Logits whose argmax is column `column` in every row (a decoy that the real logits replace).
HostLogits ConstantArgmaxLogits(v1::DType dtype, int64_t batch, int64_t vocab, int64_t row_stride,
                                int64_t column);

// A request for `l` carrying no data yet: dtype, shape, row_stride and one SamplingParams per
// row, cycling through greedy, T = 0.8, top-k 50, top-p 0.9, top-k 50 + top-p 0.9 and min-p
// 0.1, each with a fixed per-row seed and position.
v1::SampleRequest RequestShape(const HostLogits& l);
// The same request with the logits inline.
v1::SampleRequest InlineRequest(const HostLogits& l);
// The same request with the logits in region `name` at `offset`.
v1::SampleRequest RegionRequest(const HostLogits& l, const std::string& name, uint64_t offset);

// Device memory of this process, freed on destruction. Move-only.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes);  // ok() says whether the allocation worked
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  bool ok() const { return ptr_ != nullptr; }
  char* data() const { return static_cast<char*>(ptr_); }
  size_t size() const { return bytes_; }
  void Free();

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// Copies host bytes to device memory and waits (legacy default stream). Returns the runtime code.
int Upload(void* device_dst, const std::string& bytes);
// Copies `count` int32 values from device memory to the host after `stream` finished.
std::vector<int32_t> DownloadInt32(const void* device_src, size_t count, gpu::Stream stream);

// Enqueues `copies` device-to-device copies of `scratch` (two halves into each other) on
// `stream`: a few hundred make a window of tens to hundreds of milliseconds during which later
// work on the stream has not run, without a custom kernel.
int EnqueueDelay(const DeviceBuffer& scratch, int copies, gpu::Stream stream);

// The raw 64 bytes as the proto's bytes field.
std::string HandleString(const gpu::IpcHandleBytes& handle);

// RegisterRegion / UnregisterRegion / ListRegions through the stub (60 s deadline).
grpc::Status RegisterGpuIpc(Client* client, const std::string& name, const std::string& handle,
                            uint64_t offset, uint64_t byte_size, const std::string& device);
grpc::Status Unregister(Client* client, const std::string& name);
std::vector<std::string> RegionNames(Client* client);

// The runtime ordinal of the device whose PCI bus id is `bus_id` (case-insensitive), or -1.
int OrdinalOf(const std::string& bus_id);

}  // namespace samplerd::ipc_test

#endif  // SAMPLERD_TESTS_GPU_IPC_RAW_UTIL_H_
