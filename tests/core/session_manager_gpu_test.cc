// SessionManager on a GPU server (a fake GPU backend and GPU IPC regions through a fake
// GpuIpc): GPU-plane opens, the checks on region kinds, devices and resolved addresses, and the
// leases a session holds. Also UnderMps' pipe check.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "service/core/backend/mps.h"
#include "service/core/session/session_manager.h"
#include "tests/core/session_manager_fixture.h"

namespace samplerd::core {
namespace {

// A GPU-plane open: the control block in host shm region "host" (both planes poll it on the
// host), the data buffers in GPU IPC region `region`.
SessionOpen GpuOpen(const std::string& region) {
  SessionOpen open = OpenIn(region);
  open.control = OpenIn("host").control;
  return open;
}

class GpuSessions : public HostSessions {
 protected:
  void SetUp() override {
    HostSessions::SetUp();
    manager_ = MakeManager(kGpu, BackendKind::kGpu, 4);
    for (int device = 0; device < 2; ++device) {
      memory_[device].resize(Pack(kM, kV, 4).total + 64);
      const uintptr_t address = reinterpret_cast<uintptr_t>(memory_[device].data());
      const uint64_t pad = (64 - address % 64) % 64;  // resolved addresses aligned to 64
      const std::string handle = ipc_.Export(&memory_[device], static_cast<char>('a' + device));
      if (device == 0) {
        // Another name over the same allocation: the registry opens it once, so both names
        // resolve to the same addresses.
        ASSERT_TRUE(
            regions_.RegisterGpuIpc("gpu_alias", handle, pad, Pack(kM, kV, 4).total, "0000:3b:00.0")
                .ok());
      }
      ASSERT_TRUE(regions_
                      .RegisterGpuIpc(device == 0 ? "gpu" : "other_gpu", handle, pad,
                                      Pack(kM, kV, 4).total, device == 0 ? "3b:00.0" : "5e:00.0")
                      .ok());
    }
  }
};

TEST_F(GpuSessions, GpuIpcBuffersOpenAGpuPlaneSessionOnTheServersDevice) {
  absl::StatusOr<OpenedSession> opened = Open(GpuOpen("gpu"));
  ASSERT_TRUE(opened.ok()) << opened.status();
  EXPECT_EQ(opened->plane, SessionPlane::kGpu);
  EXPECT_EQ(opened->device, "0000:3b:00.0");
  EXPECT_EQ(recorder_.last.plane, SessionPlane::kGpu);
  EXPECT_EQ(recorder_.last.device_ordinal, 0);
  EXPECT_TRUE(manager_->Support().gpu_plane);
  // Named by UUID or PCI bus id in another spelling: the same device.
  SessionOpen open = GpuOpen("gpu");
  open.device = "0b5c6a1e";
  ASSERT_TRUE(manager_->Close(opened->id).ok());
  EXPECT_TRUE(Open(open).ok());
}

TEST_F(GpuSessions, DataBuffersOfMixedKindsAreInvalidArgument) {
  SessionOpen open = GpuOpen("gpu");
  open.logits = OpenIn("host").logits;
  EXPECT_TRUE(HasStatus(Open(open), absl::StatusCode::kInvalidArgument,
                        "expected the data buffers in one kind of region (all host shm or all "
                        "GPU IPC), got DeviceSessionOpen.logits in host shm and "
                        "DeviceSessionOpen.params in GPU IPC"));
}

TEST_F(GpuSessions, AControlBlockInGpuMemoryIsInvalidArgument) {
  EXPECT_TRUE(HasStatus(Open(OpenIn("gpu")), absl::StatusCode::kInvalidArgument,
                        "expected DeviceSessionOpen.control in a host shm region (both planes), "
                        "got a GPU IPC region"));
}

TEST_F(GpuSessions, APlaneTheRegionsDoNotFitIsFailedPrecondition) {
  SessionOpen open = OpenIn("host");
  open.plane = 1;
  EXPECT_TRUE(HasStatus(Open(open), absl::StatusCode::kFailedPrecondition,
                        "expected GPU IPC buffers for DEVICE_PLANE_GPU"));
  open = GpuOpen("gpu");
  open.plane = 2;
  EXPECT_TRUE(HasStatus(Open(open), absl::StatusCode::kFailedPrecondition,
                        "expected host shm buffers for DEVICE_PLANE_HOST"));
  // Host shm buffers on a GPU server: the host plane.
  absl::StatusOr<OpenedSession> opened = Open(OpenIn("host"));
  ASSERT_TRUE(opened.ok());
  EXPECT_EQ(opened->plane, SessionPlane::kHost);
}

TEST_F(GpuSessions, RegionsOnAnotherGpuAreFailedPrecondition) {
  EXPECT_TRUE(HasStatus(Open(GpuOpen("other_gpu")), absl::StatusCode::kFailedPrecondition,
                        "expected every buffer on this server's GPU 0000:3b:00.0, got "
                        "DeviceSessionOpen.logits on another GPU"));
}

TEST_F(GpuSessions, ADeviceFieldNamingAnotherDeviceIsFailedPrecondition) {
  SessionOpen open = GpuOpen("gpu");
  open.device = "0000:5e:00.0";
  EXPECT_TRUE(HasStatus(Open(open), absl::StatusCode::kFailedPrecondition,
                        "expected device \"0000:3b:00.0\""));
}

TEST_F(GpuSessions, ASliceTooSmallIsOutOfRangeOnGpuRegionsToo) {
  SessionOpen open = GpuOpen("gpu");
  open.logits.offset = Pack(kM, kV, 4).total - 64;
  EXPECT_TRUE(HasStatus(Open(open), absl::StatusCode::kOutOfRange, "DeviceSessionOpen.logits"));
}

TEST_F(GpuSessions, ResolvedAddressesCatchASharedControlBlockOrOverlapThroughAnotherName) {
  absl::StatusOr<OpenedSession> first = Open(GpuOpen("gpu"));
  ASSERT_TRUE(first.ok());
  std::vector<uint8_t> other(Pack(kM, kV, 4).total + 64);
  const uint64_t pad = (64 - reinterpret_cast<uintptr_t>(other.data()) % 64) % 64;
  ASSERT_TRUE(regions_
                  .RegisterGpuIpc("other", ipc_.Export(&other, 'o'), pad, Pack(kM, kV, 4).total,
                                  "0000:3b:00.0")
                  .ok());
  SessionOpen open = GpuOpen("other");  // the same host control block as `first`
  EXPECT_TRUE(HasStatus(Open(open), absl::StatusCode::kAlreadyExists, first->id));
  ASSERT_TRUE(manager_->Close(first->id).ok());
  open = GpuOpen("gpu");
  open.params = OpenIn("gpu_alias").logits;
  EXPECT_TRUE(HasStatus(Open(open), absl::StatusCode::kInvalidArgument,
                        "DeviceSessionOpen.logits and DeviceSessionOpen.params"));
}

// The GPU plane allocates device memory by the capacities (SessionStepWorkspaceBytes): the
// same bound as the host plane's.
TEST_F(GpuSessions, AProcessorsBufferOverMaxMessageBytesIsResourceExhaustedOnTheGpuPlaneToo) {
  const uint64_t bytes = samplerd_processors_bytes(kM, kBiasCapacity, kHistoryCapacity);
  manager_ = MakeManager(kGpu, BackendKind::kGpu, 4, static_cast<int64_t>(bytes) - 1);
  EXPECT_TRUE(HasStatus(Open(WithProcessors(GpuOpen("gpu"))), absl::StatusCode::kResourceExhausted,
                        absl::StrCat("expected a DeviceSessionOpen.processors buffer of at most ",
                                     bytes - 1, " bytes (--max_message_bytes")));
  manager_ = MakeManager(kGpu, BackendKind::kGpu, 4, static_cast<int64_t>(bytes));
  const absl::StatusOr<OpenedSession> opened = Open(WithProcessors(GpuOpen("gpu")));
  ASSERT_TRUE(opened.ok()) << opened.status();
  EXPECT_EQ(opened->plane, SessionPlane::kGpu);
}

// Their logits stay on the GPU: the server keeps no host copy of them.
TEST_F(GpuSessions, GpuPlaneSessionsDoNotCountAgainstMaxHostSessionBytes) {
  manager_ = MakeManager(kGpu, BackendKind::kGpu, 4, Limits{}.max_region_list_bytes, kHostBytes);
  const absl::StatusOr<OpenedSession> gpu = Open(GpuOpen("gpu"));
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  EXPECT_EQ(gpu->plane, SessionPlane::kGpu);
  // The cap is one host-plane session's bytes: that session fits beside the GPU-plane one.
  const absl::StatusOr<OpenedSession> host = Open(OpenIn("host", Pack(kM, kV, 4).total + 64));
  ASSERT_TRUE(host.ok()) << host.status();
  EXPECT_EQ(host->plane, SessionPlane::kHost);
  // A second host-plane session does not: the open ones hold one session's bytes, not two.
  TestShm third(Pack(kM, kV, 4).total);
  ASSERT_TRUE(third.ok());
  ASSERT_TRUE(regions_.RegisterHostShm("third", third.key(), 0, third.size()).ok());
  EXPECT_TRUE(HasStatus(Open(OpenIn("third")), absl::StatusCode::kResourceExhausted,
                        absl::StrCat("(--max_host_session_bytes), got ", kHostBytes,
                                     " bytes held by the open ones "
                                     "plus ",
                                     kHostBytes, " for this one")));
  EXPECT_EQ(manager_->open_count(), 2);
}

TEST_F(GpuSessions, ClosingASessionReleasesItsLeases) {
  absl::StatusOr<OpenedSession> opened = Open(GpuOpen("gpu"));
  ASSERT_TRUE(opened.ok());
  ASSERT_TRUE(regions_.Unregister("gpu").ok());
  ASSERT_TRUE(regions_.Unregister("gpu_alias").ok());
  EXPECT_EQ(ipc_.memory_closes(), 0);  // the session holds it
  ASSERT_TRUE(manager_->Close(opened->id).ok());
  EXPECT_TRUE(ipc_.WaitForMemoryCloses(1));
}

// ---- UnderMps ---------------------------------------------------------------------------------

TEST(Mps, TheControlPipeInThePipeDirectoryMeansMps) {
  char dir_template[] = "/tmp/samplerd-mps-test-XXXXXX";
  const char* dir = mkdtemp(dir_template);
  ASSERT_NE(dir, nullptr);
  const std::string pipe = std::string(dir) + "/control";
  EXPECT_FALSE(MpsControlPipeIn(dir));  // nothing there
  ASSERT_EQ(mkfifo(pipe.c_str(), 0600), 0);
  EXPECT_TRUE(MpsControlPipeIn(dir));

  const char* saved = std::getenv("CUDA_MPS_PIPE_DIRECTORY");
  const std::string restore = saved != nullptr ? saved : "";
  setenv("CUDA_MPS_PIPE_DIRECTORY", dir, 1);
  EXPECT_EQ(MpsPipeDirectory(), dir);
  EXPECT_TRUE(UnderMps());
  unlink(pipe.c_str());
  EXPECT_FALSE(UnderMps());
  // A regular file of that name is not the daemon's pipe.
  FILE* file = std::fopen(pipe.c_str(), "w");
  ASSERT_NE(file, nullptr);
  std::fclose(file);
  EXPECT_FALSE(UnderMps());
  unlink(pipe.c_str());
  rmdir(dir);
  unsetenv("CUDA_MPS_PIPE_DIRECTORY");
  EXPECT_EQ(MpsPipeDirectory(), "/tmp/nvidia-mps");
  if (saved != nullptr) setenv("CUDA_MPS_PIPE_DIRECTORY", restore.c_str(), 1);
}

}  // namespace
}  // namespace samplerd::core
