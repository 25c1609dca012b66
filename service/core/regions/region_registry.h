// Named shared-memory regions that requests may reference instead of sending bytes: host POSIX
// shared memory, and GPU memory exported by another process through an IPC handle.
//
// Contract (issue #4, docs/DESIGN.md "Transports and GPU rules"): names are unique
// (ALREADY_EXISTS) and unknown names are NOT_FOUND; host shm keys must start with the configured
// prefix and hold no further '/' and no ".."; bounds are checked overflow-safely against the
// object's real size; GPU IPC handles are exactly 64 bytes (or PyTorch's 66-byte shareable form,
// version byte + 'c' + handle; its 'e' expandable-segments form is FAILED_PRECONDITION) and are
// opened once per (device, handle), refcounted across region names; an unregister while
// requests hold the region defers the close to the last release; closes never run on the
// request path; CloseAll() at shutdown. Error messages never echo keys or handles.
//
// Owners (issue #12): a region registered with an owner pid is released when that process
// exits, as if it had unregistered it (the deferred close included), through an OwnerWatcher.
// A region without an owner (TCP, or a pid the server cannot see) stays until Unregister.
// Thread-safe.
#ifndef SAMPLERD_SERVICE_CORE_REGIONS_REGION_REGISTRY_H_
#define SAMPLERD_SERVICE_CORE_REGIONS_REGION_REGISTRY_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "service/core/regions/gpu_ipc.h"

namespace samplerd::core {

enum class RegionKind { kHostShm, kGpuIpc };

// What ListRegions / RegisterRegion report (never the key or handle).
struct RegionInfo {
  std::string name;
  RegionKind kind = RegionKind::kHostShm;
  uint64_t byte_size = 0;
  std::string device;  // PCI bus id of a GPU region; empty for host shm
  // The process that registered it (0: unknown, e.g. over TCP), and whether its exit releases
  // the region (a pidfd watches it).
  int64_t owner_pid = 0;
  bool owner_watched = false;
};

// Where a region's bytes are, for the duration of a lease.
struct RegionView {
  RegionKind kind = RegionKind::kHostShm;
  uint8_t* data = nullptr;  // host pointer (host shm) or device pointer (GPU IPC)
  uint64_t size = 0;
  int device_ordinal = -1;  // GPU regions
  // The bytes may be written (an output region): GPU IPC memory, or a host shm object that
  // samplerd could open read-write.
  bool writable = false;
  // Host shm: the object (st_dev, st_ino) and the offset of `data` in it, the same for the same
  // bytes however many names they are registered under (HostShmMapping). 0 for GPU regions.
  uint64_t object_dev = 0;
  uint64_t object_ino = 0;
  uint64_t object_offset = 0;
};

// Keeps a region mapped while a request uses it; releasing the last lease of an unregistered
// region schedules its close. Movable, not copyable.
class RegionLease {
 public:
  RegionLease() = default;
  RegionLease(RegionLease&&) noexcept;
  RegionLease& operator=(RegionLease&&) noexcept;
  RegionLease(const RegionLease&) = delete;
  RegionLease& operator=(const RegionLease&) = delete;
  ~RegionLease();

  const RegionView& view() const { return view_; }
  explicit operator bool() const { return holder_ != nullptr; }
  // Which registration of the region this lease is on: a number no other registration (of any
  // name) ever gets, for RegionRegistry::UnregisterRegistration. 0 for an empty lease.
  uint64_t registration() const;

 private:
  friend class RegionRegistry;
  struct Holder;  // one registered region (region_registry.cc)
  RegionLease(std::shared_ptr<Holder> holder, RegionView view);
  void Release();
  std::shared_ptr<Holder> holder_;
  RegionView view_;
};

struct RegionOptions {
  std::string shm_prefix = "/samplerd-";  // required start of host shm keys
  // Most regions registered at once (--max_regions; 0 = no limit): one more is
  // RESOURCE_EXHAUSTED before anything is mapped or opened. Each host shm region is a mapping of
  // its own, and the kernel's map count (vm.max_map_count, ~65,530) is process-wide.
  int64_t max_regions = 4096;
  // Most bytes of regions at once, both kinds, each region counted by its byte_size
  // (--max_region_bytes; 0 = no limit): a registration past it is RESOURCE_EXHAUSTED before
  // anything is mapped or opened. A region counts from its registration until it is closed: an
  // unregistered region still used by a request or a device session counts until that ends.
  // Each host shm region maps its whole slice into the server's address space (128 TiB on
  // x86-64), and so does a GPU IPC open under unified addressing: without a bound ~100 sparse
  // 4 TiB objects filled the space and the next allocation aborted the server (redteam25 F6).
  // 4 TiB by default: more than the shared memory of any host today, 1/32 of the space.
  int64_t max_region_bytes = int64_t{4} << 40;
};

// A GPU device the registry may open IPC handles on.
struct IpcDevice {
  int ordinal = 0;
  std::string pci_bus_id;
  std::string uuid;
};

class RegionRegistry {
 public:
  // `ipc` may be null (no GPU backend): GPU IPC registration is then FAILED_PRECONDITION.
  RegionRegistry(RegionOptions options, GpuIpc* ipc, std::vector<IpcDevice> devices);
  ~RegionRegistry();  // CloseAll()

  // `owner_pid` > 0 binds the region to that process: its exit releases the region. When the
  // process cannot be watched (it is gone already, no pidfd_open), the region is registered
  // unwatched (RegionInfo::owner_watched false) and stays until Unregister.
  absl::StatusOr<RegionInfo> RegisterHostShm(const std::string& name, const std::string& key,
                                             uint64_t offset, uint64_t byte_size,
                                             int64_t owner_pid = 0);
  // `handle` is the raw bytes sent by the client (64, or PyTorch's 66-byte form); `device` a
  // PCI bus id or UUID (matched like request devices). `owner_pid` as above.
  absl::StatusOr<RegionInfo> RegisterGpuIpc(const std::string& name, const std::string& handle,
                                            uint64_t offset, uint64_t byte_size,
                                            const std::string& device, int64_t owner_pid = 0);
  absl::Status Unregister(const std::string& name);
  // Unregisters `name` only while it still names `registration` (RegionLease::registration):
  // NOT_FOUND when the name is gone or was registered again since (a newer region, perhaps
  // another process's, which stays).
  absl::Status UnregisterRegistration(const std::string& name, uint64_t registration);
  std::vector<RegionInfo> List() const;  // sorted by name

  // Called on the watcher's thread after an owner's exit released `released` regions of
  // process `pid`, e.g. to recount the region gauges; it may call List(). Null: nothing.
  // Replaces the previous listener, waiting for a call of it in progress: set it to null
  // before what it refers to goes away.
  void SetOwnerExitListener(std::function<void(int64_t pid, int released)> listener);

  // A lease on [offset, offset + bytes) of region `name`: NOT_FOUND, or OUT_OF_RANGE when the
  // slice does not fit (overflow-safe). The view covers exactly the slice.
  absl::StatusOr<RegionLease> Acquire(const std::string& name, uint64_t offset,
                                      uint64_t bytes) const;

  // Stops watching owners, then closes every mapping (waiting for none: call after the
  // executors have drained).
  void CloseAll();

 private:
  friend class RegionLease;
  struct State;  // region_registry.cc; shared with the leases so that a late release stays safe
  class Reservation;  // region_registry.cc: bytes held for a registration in progress

  // Adds `holder` under its name, watching `owner_pid` when > 0 (RegionInfo's owner fields are
  // set here) and handing it the reserved `bytes`, or ALREADY_EXISTS / RESOURCE_EXHAUSTED (the
  // caller then closes it; `bytes` go back when it is destroyed).
  absl::Status Insert(std::shared_ptr<RegionLease::Holder> holder, int64_t owner_pid,
                      Reservation& bytes);

  std::shared_ptr<State> state_;
};

}  // namespace samplerd::core

#endif  // SAMPLERD_SERVICE_CORE_REGIONS_REGION_REGISTRY_H_
