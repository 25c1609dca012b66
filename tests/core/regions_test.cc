// RegionRegistry: names, host shm registration and leases, GPU IPC through a fake GpuIpc (one
// open per handle across names, refcounts, ranges against the allocation), unregister while
// leased (deferred close off the releasing thread), CloseAll, and messages without secrets;
// BindSampleIo's refusal of GPU IPC slices on a CPU sampler.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "service/core/backend/cpu_sampler.h"
#include "service/core/regions/region_registry.h"
#include "service/core/regions/request_io.h"
#include "tests/core/fake_gpu_ipc.h"
#include "tests/core/shm_test_util.h"

namespace samplerd::core {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kSecret[] = "s3cr3t";
const IpcDevice kGpu{0, "0000:3b:00.0", "GPU-0b5c6a1e-1111-2222-3333-444455556666"};

std::vector<std::string> Names(const std::vector<RegionInfo>& infos) {
  std::vector<std::string> names;
  for (const RegionInfo& info : infos) names.push_back(info.name);
  return names;
}

// ---- Names and host shm ------------------------------------------------------------------------

class HostRegions : public ::testing::Test {
 protected:
  HostRegions() : shm_(8192, 0600, kSecret), registry_(RegionOptions{}, nullptr, {}) {}

  TestShm shm_;
  RegionRegistry registry_;
};

TEST_F(HostRegions, RegistersListsAndLeasesASlice) {
  ASSERT_TRUE(shm_.ok());
  absl::StatusOr<RegionInfo> info = registry_.RegisterHostShm("logits", shm_.key(), 100, 4000);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->name, "logits");
  EXPECT_EQ(info->kind, RegionKind::kHostShm);
  EXPECT_EQ(info->byte_size, 4000u);
  EXPECT_TRUE(info->device.empty());

  absl::StatusOr<RegionLease> lease = registry_.Acquire("logits", 28, 64);
  ASSERT_TRUE(lease.ok()) << lease.status();
  EXPECT_TRUE(static_cast<bool>(*lease));
  EXPECT_EQ(lease->view().kind, RegionKind::kHostShm);
  EXPECT_EQ(lease->view().size, 64u);
  EXPECT_TRUE(lease->view().writable);
  // Offsets add up once: the registration's, then the slice's.
  EXPECT_EQ(lease->view().data[0], shm_.data()[128]);
  EXPECT_EQ(lease->view().data[63], shm_.data()[191]);
}

TEST_F(HostRegions, ListsByNameWithoutKeys) {
  ASSERT_TRUE(shm_.ok());
  ASSERT_TRUE(registry_.RegisterHostShm("b", shm_.key(), 0, 10).ok());
  ASSERT_TRUE(registry_.RegisterHostShm("a", shm_.key(), 10, 20).ok());
  const std::vector<RegionInfo> list = registry_.List();
  EXPECT_THAT(Names(list), ElementsAre("a", "b"));
  EXPECT_EQ(list[0].byte_size, 20u);
}

TEST_F(HostRegions, NamesAreUniqueAndReusableAfterUnregister) {
  ASSERT_TRUE(shm_.ok());
  ASSERT_TRUE(registry_.RegisterHostShm("r", shm_.key(), 0, 10).ok());
  EXPECT_EQ(registry_.RegisterHostShm("r", shm_.key(), 0, 10).status().code(),
            absl::StatusCode::kAlreadyExists);
  ASSERT_TRUE(registry_.Unregister("r").ok());
  EXPECT_EQ(registry_.Unregister("r").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(registry_.Acquire("r", 0, 1).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(registry_.RegisterHostShm("r", shm_.key(), 0, 10).ok());
}

TEST_F(HostRegions, RefusesMalformedNames) {
  ASSERT_TRUE(shm_.ok());
  for (const std::string& name :
       {std::string(), std::string(129, 'a'), std::string("a/b"), std::string("a b"),
        std::string("caf\xc3\xa9"), std::string("a\0b", 3)}) {
    EXPECT_EQ(registry_.RegisterHostShm(name, shm_.key(), 0, 10).status().code(),
              absl::StatusCode::kInvalidArgument)
        << name;
    EXPECT_EQ(registry_.Unregister(name).code(), absl::StatusCode::kInvalidArgument) << name;
    EXPECT_EQ(registry_.Acquire(name, 0, 1).status().code(), absl::StatusCode::kInvalidArgument);
  }
  EXPECT_TRUE(registry_.RegisterHostShm(std::string(128, 'a'), shm_.key(), 0, 10).ok());
  EXPECT_TRUE(registry_.RegisterHostShm("A-z_0.9", shm_.key(), 0, 10).ok());
}

TEST_F(HostRegions, SlicesPastTheEndAreOutOfRange) {
  ASSERT_TRUE(shm_.ok());
  ASSERT_TRUE(registry_.RegisterHostShm("r", shm_.key(), 0, 1000).ok());
  absl::StatusOr<RegionLease> lease = registry_.Acquire("r", 1, 1000);
  EXPECT_EQ(lease.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(std::string(lease.status().message()),
              HasSubstr("expected 1000 bytes at offset 1, got a region of 1000 bytes"));
  const uint64_t max = std::numeric_limits<uint64_t>::max();
  EXPECT_EQ(registry_.Acquire("r", max, 2).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(registry_.Acquire("r", 2, max).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_TRUE(registry_.Acquire("r", 999, 1).ok());
}

TEST_F(HostRegions, BadKeysAndRangesNeverEchoTheKey) {
  ASSERT_TRUE(shm_.ok());
  const uint64_t max = std::numeric_limits<uint64_t>::max();
  struct Case {
    std::string key;
    uint64_t offset, size;
    absl::StatusCode code;
  };
  const std::string s = kSecret;
  const std::vector<Case> cases = {
      {"/other-" + s, 0, 10, absl::StatusCode::kInvalidArgument},
      {"/samplerd-.." + s, 0, 10, absl::StatusCode::kInvalidArgument},
      {"/samplerd-" + s + "/x", 0, 10, absl::StatusCode::kInvalidArgument},
      {UniqueShmKey(kSecret), 0, 10, absl::StatusCode::kNotFound},
      {shm_.key(), 8192, 1, absl::StatusCode::kOutOfRange},
      {shm_.key(), 0, 8193, absl::StatusCode::kOutOfRange},
      {shm_.key(), max, 2, absl::StatusCode::kOutOfRange},
      {shm_.key(), 16, max - 15, absl::StatusCode::kOutOfRange},
      {shm_.key(), 0, 0, absl::StatusCode::kInvalidArgument},
  };
  for (const Case& c : cases) {
    absl::StatusOr<RegionInfo> info = registry_.RegisterHostShm("r", c.key, c.offset, c.size);
    EXPECT_EQ(info.status().code(), c.code) << c.offset << " " << c.size;
    EXPECT_THAT(std::string(info.status().message()), Not(HasSubstr(kSecret)));
  }
  EXPECT_TRUE(registry_.List().empty());
}

TEST_F(HostRegions, AConfiguredPrefixIsRequired) {
  ASSERT_TRUE(shm_.ok());
  RegionRegistry custom(RegionOptions{"/engine-"}, nullptr, {});
  EXPECT_EQ(custom.RegisterHostShm("r", shm_.key(), 0, 10).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(HostRegions, RegistrationsPastMaxRegionsAreResourceExhausted) {
  ASSERT_TRUE(shm_.ok());
  RegionOptions options;
  options.max_regions = 2;
  RegionRegistry capped(options, nullptr, {});
  ASSERT_TRUE(capped.RegisterHostShm("a", shm_.key(), 0, 4096).ok());
  ASSERT_TRUE(capped.RegisterHostShm("b", shm_.key(), 0, 4096).ok());
  absl::StatusOr<RegionInfo> third = capped.RegisterHostShm("c", shm_.key(), 0, 4096);
  EXPECT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(third.status().message()),
              HasSubstr("expected at most 2 registered regions (--max_regions), got a request for "
                        "one more"));
  EXPECT_THAT(std::string(third.status().message()), Not(HasSubstr(shm_.key())));
  EXPECT_THAT(Names(capped.List()), ElementsAre("a", "b"));
  // A name taken is still ALREADY_EXISTS, and an unregister makes room again.
  EXPECT_EQ(capped.RegisterHostShm("a", shm_.key(), 0, 4096).status().code(),
            absl::StatusCode::kAlreadyExists);
  ASSERT_TRUE(capped.Unregister("a").ok());
  EXPECT_TRUE(capped.RegisterHostShm("c", shm_.key(), 0, 4096).ok());
}

// Regression (redteam25 F6): ~100 regions over one sparse 4 TiB object filled the server's
// 128 TiB address space, and its next allocation aborted it. The regions' bytes are bounded.
TEST_F(HostRegions, RegistrationsPastMaxRegionBytesAreResourceExhaustedUntilUnregistered) {
  ASSERT_TRUE(shm_.ok());
  RegionOptions options;
  options.max_region_bytes = 8192;
  RegionRegistry capped(options, nullptr, {});
  ASSERT_TRUE(capped.RegisterHostShm("a", shm_.key(), 0, 4096).ok());
  ASSERT_TRUE(capped.RegisterHostShm("b", shm_.key(), 4000, 4096).ok());
  absl::StatusOr<RegionInfo> c = capped.RegisterHostShm("c", shm_.key(), 100, 1);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(c.status().message(),
            "expected the registered regions to total at most 8192 bytes (--max_region_bytes), "
            "got 8193 bytes with this region of 1: unregister regions that are no longer used "
            "(one unregistered while a request or device session uses it counts until that "
            "ends)");
  EXPECT_THAT(Names(capped.List()), ElementsAre("a", "b"));
  // A range past the object is still OUT_OF_RANGE, whatever its size; a name taken, ALREADY_EXISTS.
  EXPECT_EQ(capped.RegisterHostShm("c", shm_.key(), 0, 1ull << 50).status().code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(capped.RegisterHostShm("a", shm_.key(), 0, 1).status().code(),
            absl::StatusCode::kAlreadyExists);

  // Unregistering gives the bytes back, and only those.
  ASSERT_TRUE(capped.Unregister("a").ok());
  EXPECT_TRUE(capped.RegisterHostShm("c", shm_.key(), 0, 4096).ok());
  EXPECT_EQ(capped.RegisterHostShm("d", shm_.key(), 0, 1).status().code(),
            absl::StatusCode::kResourceExhausted);

  // A region unregistered while leased is still mapped: it counts until its last lease goes.
  absl::StatusOr<RegionLease> lease = capped.Acquire("b", 0, 16);
  ASSERT_TRUE(lease.ok());
  ASSERT_TRUE(capped.Unregister("b").ok());
  EXPECT_EQ(capped.RegisterHostShm("d", shm_.key(), 0, 1).status().code(),
            absl::StatusCode::kResourceExhausted);
  *lease = RegionLease();
  EXPECT_TRUE(capped.RegisterHostShm("d", shm_.key(), 0, 4096).ok());
  EXPECT_THAT(Names(capped.List()), ElementsAre("c", "d"));

  // 0: no limit.
  options.max_region_bytes = 0;
  RegionRegistry unlimited(options, nullptr, {});
  for (const char* name : {"a", "b", "c", "d"}) {
    EXPECT_TRUE(unlimited.RegisterHostShm(name, shm_.key(), 0, 8192).ok()) << name;
  }
}

// Failed registrations (a missing object, a taken name, a range past the object) hold no bytes.
TEST_F(HostRegions, FailedRegistrationsGiveTheirBytesBack) {
  ASSERT_TRUE(shm_.ok());
  RegionOptions options;
  options.max_region_bytes = 8192;
  RegionRegistry capped(options, nullptr, {});
  ASSERT_TRUE(capped.RegisterHostShm("a", shm_.key(), 0, 4096).ok());
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(capped.RegisterHostShm("a", shm_.key(), 0, 4096).status().code(),
              absl::StatusCode::kAlreadyExists);
    EXPECT_EQ(capped.RegisterHostShm("b", UniqueShmKey("gone"), 0, 4096).status().code(),
              absl::StatusCode::kNotFound);
    EXPECT_EQ(capped.RegisterHostShm("b", shm_.key(), 4097, 4096).status().code(),
              absl::StatusCode::kOutOfRange);
  }
  EXPECT_TRUE(capped.RegisterHostShm("b", shm_.key(), 0, 4096).ok());
}

TEST_F(HostRegions, AReadOnlyObjectGivesAReadOnlyView) {
  TestShm readonly(4096, 0444);
  ASSERT_TRUE(readonly.ok());
  const std::string key = readonly.key();
  EXPECT_EQ(RunUnprivileged([&]() -> std::string {
              RegionRegistry registry(RegionOptions{}, nullptr, {});
              if (!registry.RegisterHostShm("ro", key, 0, 4096).ok()) return "register failed";
              absl::StatusOr<RegionLease> lease = registry.Acquire("ro", 8, 8);
              if (!lease.ok()) return "acquire failed";
              if (lease->view().writable) return "writable";
              return lease->view().data[0] == 8 ? "" : "wrong bytes";
            }),
            "");
}

TEST_F(HostRegions, ALeaseKeepsAnUnregisteredRegionMapped) {
  ASSERT_TRUE(shm_.ok());
  ASSERT_TRUE(registry_.RegisterHostShm("r", shm_.key(), 0, 8192).ok());
  absl::StatusOr<RegionLease> lease = registry_.Acquire("r", 4096, 16);
  ASSERT_TRUE(lease.ok());
  ASSERT_TRUE(registry_.Unregister("r").ok());
  EXPECT_TRUE(registry_.List().empty());
  EXPECT_EQ(registry_.Acquire("r", 0, 1).status().code(), absl::StatusCode::kNotFound);
  shm_.data()[4096] = 0x5a;
  EXPECT_EQ(lease->view().data[0], 0x5a);  // still mapped
  RegionLease moved = *std::move(lease);
  EXPECT_EQ(moved.view().data[0], 0x5a);
  EXPECT_FALSE(static_cast<bool>(*lease));  // NOLINT(bugprone-use-after-move)
}

// ---- GPU IPC through a fake runtime ------------------------------------------------------------

class GpuRegions : public ::testing::Test {
 protected:
  GpuRegions() : memory_a_(4096), memory_b_(1024), registry_(RegionOptions{}, &ipc_, {kGpu}) {
    handle_a_ = ipc_.Export(&memory_a_, 'S');
    handle_b_ = ipc_.Export(&memory_b_, 'T');
  }

  FakeGpuIpc ipc_;
  std::vector<uint8_t> memory_a_;
  std::vector<uint8_t> memory_b_;
  std::string handle_a_;
  std::string handle_b_;
  RegionRegistry registry_;
};

TEST_F(GpuRegions, OpensAHandleOncePerDeviceAcrossNames) {
  absl::StatusOr<RegionInfo> a = registry_.RegisterGpuIpc("a", handle_a_, 0, 1024, kGpu.pci_bus_id);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->kind, RegionKind::kGpuIpc);
  EXPECT_EQ(a->device, kGpu.pci_bus_id);
  // The same allocation again, by UUID and in PyTorch's form, at another offset.
  ASSERT_TRUE(registry_
                  .RegisterGpuIpc("b",
                                  "\x01"
                                  "c" +
                                      handle_a_,
                                  2048, 2048, kGpu.uuid)
                  .ok());
  EXPECT_EQ(ipc_.memory_opens(), 1);

  absl::StatusOr<RegionLease> lease = registry_.Acquire("b", 16, 32);
  ASSERT_TRUE(lease.ok());
  EXPECT_EQ(lease->view().kind, RegionKind::kGpuIpc);
  EXPECT_EQ(lease->view().data, memory_a_.data() + 2048 + 16);
  EXPECT_EQ(lease->view().device_ordinal, 0);
  EXPECT_TRUE(lease->view().writable);
  *lease = RegionLease();

  ASSERT_TRUE(registry_.Unregister("a").ok());
  EXPECT_EQ(ipc_.memory_closes(), 0);  // "b" still uses it
  ASSERT_TRUE(registry_.Unregister("b").ok());
  EXPECT_EQ(ipc_.memory_closes(), 1);  // closed in Unregister: no lease was held
  // A new registration opens it afresh.
  ASSERT_TRUE(registry_.RegisterGpuIpc("a", handle_a_, 0, 16, "3b:00.0").ok());
  EXPECT_EQ(ipc_.memory_opens(), 2);
}

TEST_F(GpuRegions, DefersTheCloseOfALeasedRegionToTheCloser) {
  ASSERT_TRUE(registry_.RegisterGpuIpc("r", handle_a_, 0, 4096, kGpu.pci_bus_id).ok());
  absl::StatusOr<RegionLease> first = registry_.Acquire("r", 0, 64);
  absl::StatusOr<RegionLease> second = registry_.Acquire("r", 64, 64);
  ASSERT_TRUE(first.ok() && second.ok());
  ASSERT_TRUE(registry_.Unregister("r").ok());
  EXPECT_TRUE(registry_.List().empty());
  // The name is free at once, even for another allocation.
  ASSERT_TRUE(registry_.RegisterGpuIpc("r", handle_b_, 0, 1024, kGpu.pci_bus_id).ok());
  *first = RegionLease();
  EXPECT_EQ(ipc_.memory_closes(), 0);  // one lease left
  *second = RegionLease();
  EXPECT_TRUE(ipc_.WaitForMemoryCloses(1));
  EXPECT_EQ(ipc_.memory_closes(), 1);
  // Off the releasing thread (a request's executor, in the server).
  EXPECT_NE(ipc_.last_close_thread(), std::this_thread::get_id());
  // The new "r" is unaffected.
  absl::StatusOr<RegionLease> lease = registry_.Acquire("r", 0, 8);
  ASSERT_TRUE(lease.ok());
  EXPECT_EQ(lease->view().data, memory_b_.data());
}

TEST_F(GpuRegions, ChecksTheRangeAgainstTheAllocation) {
  const uint64_t max = std::numeric_limits<uint64_t>::max();
  for (const auto& [offset, size] :
       std::vector<std::pair<uint64_t, uint64_t>>{{0, 4097}, {4096, 1}, {1, 4096}, {max - 7, 8}}) {
    absl::StatusOr<RegionInfo> info =
        registry_.RegisterGpuIpc("r", handle_a_, offset, size, kGpu.pci_bus_id);
    EXPECT_EQ(info.status().code(), absl::StatusCode::kOutOfRange) << offset << " " << size;
  }
  EXPECT_EQ(registry_.RegisterGpuIpc("r", handle_a_, max, 2, kGpu.pci_bus_id).status().code(),
            absl::StatusCode::kOutOfRange);              // wraps 2^64: refused before opening
  EXPECT_EQ(ipc_.memory_opens(), ipc_.memory_closes());  // failed registrations closed again
  EXPECT_TRUE(registry_.RegisterGpuIpc("r", handle_a_, 4095, 1, kGpu.pci_bus_id).ok());
}

// GPU IPC regions count against --max_region_bytes too (an IPC open maps the allocation into
// the server's unified address space), each by its byte_size, after their range is checked.
TEST(GpuRegionsWithMaxBytes, CountAgainstTheSameTotalAsHostShm) {
  FakeGpuIpc ipc;
  std::vector<uint8_t> memory(4096);
  const std::string handle = ipc.Export(&memory, 'U');
  TestShm shm(4096);
  ASSERT_TRUE(shm.ok());
  RegionOptions options;
  options.max_region_bytes = 6144;
  RegionRegistry registry(options, &ipc, {kGpu});
  ASSERT_TRUE(registry.RegisterGpuIpc("g", handle, 0, 4096, kGpu.pci_bus_id).ok());
  absl::StatusOr<RegionInfo> host = registry.RegisterHostShm("h", shm.key(), 0, 4096);
  EXPECT_EQ(host.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(host.status().message()),
              HasSubstr("at most 6144 bytes (--max_region_bytes), got 8192 bytes"));
  absl::StatusOr<RegionInfo> alias = registry.RegisterGpuIpc("g2", handle, 0, 4096, "3b:00.0");
  EXPECT_EQ(alias.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(ipc.memory_opens(), 1);  // the refused alias released its reference
  EXPECT_EQ(registry.RegisterGpuIpc("g2", handle, 4000, 4096, "3b:00.0").status().code(),
            absl::StatusCode::kOutOfRange);  // the range first
  EXPECT_TRUE(registry.RegisterHostShm("h", shm.key(), 0, 2048).ok());
  ASSERT_TRUE(registry.Unregister("g").ok());
  EXPECT_EQ(ipc.memory_closes(), 1);
  EXPECT_TRUE(registry.RegisterHostShm("h2", shm.key(), 0, 4096).ok());
}

TEST_F(GpuRegions, RefusesBadHandlesAndDevicesWithoutEchoingHandles) {
  struct Case {
    std::string handle;
    std::string device;
    absl::StatusCode code;
  };
  const std::vector<Case> cases = {
      {handle_a_.substr(0, 63), kGpu.pci_bus_id, absl::StatusCode::kInvalidArgument},
      {handle_a_ + "S", kGpu.pci_bus_id, absl::StatusCode::kInvalidArgument},
      {"\x01"
       "e" +
           handle_a_,
       kGpu.pci_bus_id, absl::StatusCode::kFailedPrecondition},
      {handle_a_, "0000:3c:00.0", absl::StatusCode::kFailedPrecondition},
      {handle_a_, "GPU-ffffffff", absl::StatusCode::kFailedPrecondition},
      {handle_a_, "0", absl::StatusCode::kFailedPrecondition},  // ordinals are not names
      {handle_a_, "", absl::StatusCode::kInvalidArgument},
      {std::string(64, 'S'), kGpu.pci_bus_id, absl::StatusCode::kInvalidArgument},  // stale
  };
  for (const Case& c : cases) {
    absl::StatusOr<RegionInfo> info = registry_.RegisterGpuIpc("r", c.handle, 0, 16, c.device);
    EXPECT_EQ(info.status().code(), c.code) << c.handle.size() << " " << c.device;
    EXPECT_THAT(std::string(info.status().message()), Not(HasSubstr("SSSS")));
    EXPECT_THAT(std::string(info.status().message()), HasSubstr("expected"));
  }
  EXPECT_EQ(ipc_.memory_opens(), 0);
}

TEST_F(GpuRegions, DuplicateNamesDoNotLeakOpens) {
  ASSERT_TRUE(registry_.RegisterGpuIpc("r", handle_a_, 0, 16, kGpu.pci_bus_id).ok());
  EXPECT_EQ(registry_.RegisterGpuIpc("r", handle_b_, 0, 16, kGpu.pci_bus_id).status().code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(ipc_.memory_opens(), 1);  // refused before opening
}

TEST_F(GpuRegions, CloseAllClosesRegisteredAndLeasedRegionsOnce) {
  ASSERT_TRUE(registry_.RegisterGpuIpc("a", handle_a_, 0, 16, kGpu.pci_bus_id).ok());
  ASSERT_TRUE(registry_.RegisterGpuIpc("a2", handle_a_, 16, 16, kGpu.pci_bus_id).ok());
  ASSERT_TRUE(registry_.RegisterGpuIpc("b", handle_b_, 0, 16, kGpu.pci_bus_id).ok());
  absl::StatusOr<RegionLease> lease = registry_.Acquire("b", 0, 16);
  ASSERT_TRUE(lease.ok());
  ASSERT_TRUE(registry_.Unregister("b").ok());  // leased: deferred
  registry_.CloseAll();
  EXPECT_EQ(ipc_.memory_closes(), 2);
  EXPECT_TRUE(registry_.List().empty());
  *lease = RegionLease();  // after CloseAll: nothing left to close
  EXPECT_EQ(ipc_.memory_closes(), 2);
  // The registry still works afterwards.
  ASSERT_TRUE(registry_.RegisterGpuIpc("c", handle_b_, 0, 16, kGpu.pci_bus_id).ok());
  registry_.CloseAll();
  EXPECT_EQ(ipc_.memory_closes(), 3);
}

TEST(GpuRegionsWithoutIpc, AreFailedPreconditionOnACpuServer) {
  RegionRegistry registry(RegionOptions{}, nullptr, {});
  absl::StatusOr<RegionInfo> info =
      registry.RegisterGpuIpc("r", std::string(64, 'S'), 0, 16, kGpu.pci_bus_id);
  EXPECT_EQ(info.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(info.status().message()), HasSubstr("no GPU backend"));
}

// The CPU backend reads host memory only: a GPU IPC token bitmask gets the code GPU IPC logits
// get there (a CPU server has no GpuIpc, so this is BindSampleIo's own check).
TEST_F(GpuRegions, AGpuIpcBitmaskOnACpuSamplerIsFailedPrecondition) {
  ASSERT_TRUE(registry_.RegisterGpuIpc("m", handle_a_, 0, 1024, kGpu.pci_bus_id).ok());
  CpuSampler cpu(1);
  const std::string logits(2 * 40 * 4, '\0');
  SampleRequest r;
  r.dtype = kernels::DType::kFp32;
  r.shape = {2, 40};
  r.inline_data = logits;
  r.has_inline_data = true;
  r.token_bitmask.emplace().region = RegionRef{"m", 0};
  ValidatedBatch batch;
  batch.batch = 2;
  batch.vocab = 40;
  batch.row_stride = 40;
  batch.bitmask_words = 2;
  absl::StatusOr<BoundIo> bound = BindSampleIo(r, batch, cpu, registry_, nullptr, {});
  ASSERT_FALSE(bound.ok());
  EXPECT_EQ(bound.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(bound.status().message(),
            "expected token_bitmask.region in host memory (this server samples on the CPU), got "
            "GPU memory");
}

}  // namespace
}  // namespace samplerd::core
