// service/core/gpu_ipc_runtime (GpuIpc over the GPU runtime) and the runtime.h calls under it,
// in one process: what can be checked without a second process. Opening a real foreign handle
// needs two processes: ipc_producer_raw.cc and ipc_producer.py do that against a server.
//
// Without a GPU (this machine, CI) the open calls must fail cleanly with FAILED_PRECONDITION
// (the binary has no driver to talk to); on the GPU machine they must refuse bad handles with
// INVALID_ARGUMENT. Neither may echo the handle.
#include "service/core/regions/gpu_ipc_runtime.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "kernels/gpu/runtime.h"

namespace samplerd::core {
namespace {

namespace gpu = kernels::gpu;

bool HaveGpu() {
  std::string why;
  return !gpu::ListDevices(&why).empty();
}

// 64 bytes of 'A': any echo of them in a message would show as "AAAA" (or its hex, 41414141).
IpcHandle Printable() {
  IpcHandle h;
  h.fill('A');
  return h;
}

void ExpectNoEcho(const absl::Status& s) {
  EXPECT_EQ(std::string(s.message()).find("AAAA"), std::string::npos) << s;
  EXPECT_EQ(std::string(s.message()).find("41414141"), std::string::npos) << s;
}

TEST(RuntimeGpuIpc, RefusedOpensMapToStatusCodesWithoutEchoingTheHandle) {
  std::unique_ptr<GpuIpc> ipc = MakeRuntimeGpuIpc();
  const absl::StatusCode expected =
      HaveGpu() ? absl::StatusCode::kInvalidArgument : absl::StatusCode::kFailedPrecondition;
  const absl::StatusOr<IpcMapping> memory = ipc->OpenMemory(0, Printable());
  ASSERT_FALSE(memory.ok());
  EXPECT_EQ(memory.status().code(), expected) << memory.status();
  ExpectNoEcho(memory.status());
  const absl::StatusOr<void*> event = ipc->OpenEvent(0, Printable());
  ASSERT_FALSE(event.ok());
  EXPECT_EQ(event.status().code(), expected) << event.status();
  ExpectNoEcho(event.status());
}

TEST(RuntimeGpuIpc, AnUnknownDeviceIsFailedPrecondition) {
  std::unique_ptr<GpuIpc> ipc = MakeRuntimeGpuIpc();
  const absl::StatusOr<IpcMapping> memory = ipc->OpenMemory(4096, Printable());
  ASSERT_FALSE(memory.ok());
  EXPECT_EQ(memory.status().code(), absl::StatusCode::kFailedPrecondition) << memory.status();
}

TEST(RuntimeGpuIpc, AHandleMadeByThisProcessIsInvalidArgument) {
  if (!HaveGpu()) GTEST_SKIP() << "no GPU";
  ASSERT_EQ(gpu::SetDevice(0), 0);
  void* ptr = nullptr;
  ASSERT_EQ(gpu::DeviceMalloc(&ptr, size_t{4} << 20), 0);
  gpu::IpcHandleBytes handle;
  ASSERT_EQ(gpu::IpcGetMemHandle(&handle, ptr), 0);
  std::unique_ptr<GpuIpc> ipc = MakeRuntimeGpuIpc();
  const absl::StatusOr<IpcMapping> memory = ipc->OpenMemory(0, handle);
  EXPECT_EQ(memory.status().code(), absl::StatusCode::kInvalidArgument) << memory.status();
  // Not sticky: the device still works.
  EXPECT_EQ(gpu::DeviceFree(ptr), 0);
  EXPECT_EQ(gpu::LastError(), 0);
}

TEST(GpuRuntime, MemoryRangeReportsTheWholeAllocation) {
  if (!HaveGpu()) GTEST_SKIP() << "no GPU";
  ASSERT_EQ(gpu::SetDevice(0), 0);
  const size_t bytes = (size_t{3} << 20) + 5;
  void* ptr = nullptr;
  ASSERT_EQ(gpu::DeviceMalloc(&ptr, bytes), 0);
  void* base = nullptr;
  size_t size = 0;
  ASSERT_EQ(gpu::MemoryRange(static_cast<char*>(ptr) + 1000, &base, &size), 0);
  EXPECT_EQ(base, ptr);
  EXPECT_GE(size, bytes);
  EXPECT_LT(size, bytes + (size_t{2} << 20)) << "at most rounded up to the allocation granule";
  std::printf("DeviceMalloc(%zu) -> range of %zu bytes\n", bytes, size);
  EXPECT_EQ(gpu::DeviceFree(ptr), 0);
}

// The copy ReadProcessorLists makes of a bias list or token history in GPU IPC memory: after
// the ready event (an interprocess one, as engines record), whole or from an offset; an unknown
// device is FAILED_PRECONDITION.
TEST(RuntimeGpuIpc, CopyToHostReadsDeviceMemoryAfterTheReadyEvent) {
  std::unique_ptr<GpuIpc> ipc = MakeRuntimeGpuIpc();
  std::vector<uint8_t> dst(64, 0);
  int x = 0;
  EXPECT_EQ(ipc->CopyToHost(4096, nullptr, &x, dst.data(), 4).code(),
            absl::StatusCode::kFailedPrecondition);
  if (!HaveGpu()) GTEST_SKIP() << "no GPU";
  ASSERT_EQ(gpu::SetDevice(0), 0);
  std::vector<uint8_t> src(1 << 20);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 7 + 3);
  void* device = nullptr;
  ASSERT_EQ(gpu::DeviceMalloc(&device, src.size()), 0);
  gpu::Stream stream = nullptr;
  ASSERT_EQ(gpu::StreamCreate(&stream), 0);
  gpu::Event ready = nullptr;
  ASSERT_EQ(gpu::EventCreate(&ready, /*interprocess=*/true), 0);
  ASSERT_EQ(gpu::CopyToDevice(device, src.data(), src.size(), stream), 0);
  ASSERT_EQ(gpu::EventRecord(ready, stream), 0);  // no host sync: the copy must wait for it
  dst.assign(src.size(), 0);
  ASSERT_TRUE(ipc->CopyToHost(0, ready, device, dst.data(), dst.size()).ok());
  EXPECT_EQ(dst, src);
  std::vector<uint8_t> part(8, 0);
  ASSERT_TRUE(ipc->CopyToHost(0, nullptr, static_cast<char*>(device) + 100, part.data(), 8).ok());
  EXPECT_EQ(part, std::vector<uint8_t>(src.begin() + 100, src.begin() + 108));
  EXPECT_EQ(gpu::StreamSynchronize(stream), 0);
  EXPECT_EQ(gpu::EventDestroy(ready), 0);
  EXPECT_EQ(gpu::StreamDestroy(stream), 0);
  EXPECT_EQ(gpu::DeviceFree(device), 0);
}

// Without a driver (dlopen finds no libcuda) or for host memory (with one), an error, no crash.
TEST(GpuRuntime, MemoryRangeOfHostMemoryFailsCleanly) {
  if (HaveGpu()) {
    ASSERT_EQ(gpu::SetDevice(0), 0);
  }
  void* base = reinterpret_cast<void*>(1);
  size_t size = 1;
  int x = 0;
  EXPECT_NE(gpu::MemoryRange(&x, &base, &size), 0);
  EXPECT_EQ(base, nullptr);
  EXPECT_EQ(size, 0u);
  (void)gpu::LastError();
}

}  // namespace
}  // namespace samplerd::core
