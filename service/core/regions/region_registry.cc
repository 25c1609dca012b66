// RegionRegistry: a name map of registered regions, the leases requests take on them, the
// shared (device, handle) opens of GPU IPC memory, and a closer thread for deferred closes.
//
// Lifetimes: a region (a RegionLease::Holder) is registered until Unregister or CloseAll; leases
// count its users. The close of a region is *claimed* exactly once, under `mu`, by whoever sees
// it unregistered with no lease left: Unregister closes at once, the release of a request's last
// lease hands it to the closer thread (never closing on the request's own thread), CloseAll
// closes what is left. An owner's exit (OwnerWatcher's thread) retires its regions as
// Unregister would.
#include "service/core/regions/region_registry.h"

#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <tuple>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "service/core/backend/device_match.h"
#include "service/core/model/status_macros.h"
#include "service/core/model/thread_name.h"
#include "service/core/regions/host_shm.h"
#include "service/core/regions/ipc_handle.h"
#include "service/core/regions/owner_watcher.h"

namespace samplerd::core {
namespace regions_internal {

// One opened IPC allocation, shared by every region that names (ordinal, handle).
struct IpcKey {
  int ordinal = 0;
  IpcHandle handle{};
  bool operator<(const IpcKey& o) const {
    return std::tie(ordinal, handle) < std::tie(o.ordinal, o.handle);
  }
};

struct IpcOpen {
  IpcMapping mapping;
  int64_t regions = 0;
};

}  // namespace regions_internal

namespace {

using regions_internal::IpcKey;
using regions_internal::IpcOpen;

constexpr size_t kMaxNameBytes = 128;

// Names are echoed in messages only once they pass this check (safe characters, short).
absl::Status ValidateName(absl::string_view name) {
  constexpr char kExpected[] = "expected a region name of 1 to 128 characters [A-Za-z0-9._-], got ";
  if (name.empty() || name.size() > kMaxNameBytes) {
    return absl::InvalidArgumentError(absl::StrCat(kExpected, name.size(), " characters"));
  }
  for (char c : name) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-') {
      return absl::InvalidArgumentError(absl::StrCat(kExpected, "a name with other characters"));
    }
  }
  return absl::OkStatus();
}

absl::Status NotRegistered(absl::string_view name) {
  return absl::NotFoundError(absl::StrCat("expected a registered region, got \"", name,
                                          "\", which is not (ListRegions lists them)"));
}

absl::Status TooMany(int64_t max_regions) {
  return absl::ResourceExhaustedError(
      absl::StrCat("expected at most ", max_regions,
                   " registered regions (--max_regions), got a request for one more: unregister "
                   "regions that are no longer used"));
}

absl::Status TooManyBytes(int64_t max_bytes, uint64_t used, uint64_t bytes) {
  // used + bytes passes 2^64 only for a byte_size no object can hold.
  const std::string total =
      used > UINT64_MAX - bytes ? std::string("over 2^64") : absl::StrCat(used + bytes);
  return absl::ResourceExhaustedError(absl::StrCat(
      "expected the registered regions to total at most ", max_bytes,
      " bytes (--max_region_bytes), got ", total, " bytes with this region of ", bytes,
      ": unregister regions that are no longer used (one unregistered while a request or "
      "device session uses it counts until that ends)"));
}

absl::Status Taken(absl::string_view name) {
  return absl::AlreadyExistsError(
      absl::StrCat("expected a new region name, got \"", name, "\", which is registered already"));
}

}  // namespace

struct RegionLease::Holder {
  std::shared_ptr<RegionRegistry::State> state;
  RegionInfo info;
  RegionView view;            // the whole region
  HostShmMapping shm;         // kHostShm
  IpcKey ipc;                 // kGpuIpc
  uint64_t owner_token = 0;   // OwnerWatcher's token; 0: unwatched
  uint64_t registration = 0;  // set once by Insert (under state->mu), never 0 once registered
  // Guarded by state->mu.
  int64_t leases = 0;
  bool registered = true;
  bool close_claimed = false;
  uint64_t counted_bytes = 0;  // of State::region_bytes: set by Insert, given back by the claim
};

struct RegionRegistry::State {
  using Holder = RegionLease::Holder;

  State(RegionOptions o, GpuIpc* i, std::vector<IpcDevice> d)
      : options(std::move(o)),
        ipc(i),
        devices(std::move(d)),
        watcher([this](uint64_t token) { OnOwnerExit(token); }) {}

  // OK while one more region may be registered (mu held), else RESOURCE_EXHAUSTED.
  absl::Status CheckRoomLocked() const {
    if (options.max_regions > 0 && static_cast<int64_t>(registered.size()) >= options.max_regions) {
      return TooMany(options.max_regions);
    }
    return absl::OkStatus();
  }

  // Reserves `bytes` for a registration (mu held): RESOURCE_EXHAUSTED when the regions would
  // pass options.max_region_bytes. Counted (wrapping harmlessly) without a limit too.
  absl::StatusOr<uint64_t> ReserveBytesLocked(uint64_t bytes) {
    const int64_t max = options.max_region_bytes;
    if (max > 0 && (bytes > static_cast<uint64_t>(max) - region_bytes)) {
      return TooManyBytes(max, region_bytes, bytes);
    }
    region_bytes += bytes;
    return bytes;
  }

  // Gives back the bytes of a registration that failed (takes mu).
  void GiveBackBytes(uint64_t bytes) {
    std::lock_guard<std::mutex> lock(mu);
    region_bytes -= bytes;
  }

  // Claims `holder`'s close (mu held) and gives its bytes back at once, before the unmap: a
  // client whose UnregisterRegion was answered may register as much again without racing the
  // closer thread (which unmaps a released region within microseconds).
  void ClaimCloseLocked(Holder& holder) {
    holder.close_claimed = true;
    region_bytes -= holder.counted_bytes;
    holder.counted_bytes = 0;
  }

  // Takes `holder` out of use after its removal from `registered` (mu held): stops watching its
  // owner, and returns it when the caller must close it now (no lease), else keeps it in
  // `retired` for the last lease's release to close.
  std::shared_ptr<Holder> RetireLocked(std::shared_ptr<Holder> holder) {
    holder->registered = false;
    if (holder->owner_token != 0) watcher.Unwatch(holder->owner_token);
    if (holder->leases == 0) {
      ClaimCloseLocked(*holder);
      return holder;
    }
    retired.insert(std::move(holder));
    return nullptr;
  }

  // The watcher's report: the owner behind `token` exited; retire every region it holds.
  void OnOwnerExit(uint64_t token) {
    std::vector<std::shared_ptr<Holder>> close_now;
    int64_t pid = 0;
    int released = 0;
    {
      std::lock_guard<std::mutex> lock(mu);
      for (auto it = registered.begin(); it != registered.end();) {
        if (it->second->owner_token != token) {
          ++it;
          continue;
        }
        std::shared_ptr<Holder> holder = std::move(it->second);
        it = registered.erase(it);
        pid = holder->info.owner_pid;
        holder->owner_token = 0;  // the watch is gone already: no Unwatch
        ++released;
        if (std::shared_ptr<Holder> now = RetireLocked(std::move(holder))) {
          close_now.push_back(std::move(now));
        }
      }
    }
    for (const std::shared_ptr<Holder>& holder : close_now) Close(*holder);
    std::lock_guard<std::mutex> lock(listener_mu);  // SetOwnerExitListener waits for this call
    if (owner_exit_listener && released > 0) owner_exit_listener(pid, released);
  }

  // Starts the closer thread unless it runs (mu held).
  void EnsureCloserLocked() {
    if (closer.joinable()) return;
    closer = std::thread([this, generation = closer_generation] {
      NameThisThread("sd-region-close");
      CloserLoop(generation);
    });
  }

  // Closes queued regions until CloseAll moves past `generation` and the queue is empty.
  void CloserLoop(uint64_t generation) {
    std::unique_lock<std::mutex> lock(mu);
    while (true) {
      closer_cv.wait(lock, [&] { return !to_close.empty() || closer_generation != generation; });
      if (to_close.empty()) return;
      std::shared_ptr<Holder> holder = std::move(to_close.front());
      to_close.pop_front();
      lock.unlock();
      Close(*holder);
      holder.reset();
      lock.lock();
    }
  }

  // Releases what `holder` maps; its close must have been claimed. Not under `mu`.
  void Close(const Holder& holder) {
    if (holder.info.kind == RegionKind::kHostShm) {
      UnmapHostShm(holder.shm);
    } else {
      ReleaseIpc(holder.ipc);
    }
  }

  // Opens `key` or takes another reference on its existing open.
  absl::StatusOr<IpcMapping> RetainIpc(const IpcKey& key) {
    std::lock_guard<std::mutex> lock(ipc_mu);
    auto it = opens.find(key);
    if (it != opens.end()) {
      ++it->second.regions;
      return it->second.mapping;
    }
    ASSIGN_OR_RETURN(IpcMapping mapping, ipc->OpenMemory(key.ordinal, key.handle));
    opens.emplace(key, IpcOpen{mapping, 1});
    return mapping;
  }

  // Drops a reference; the last one closes the allocation (under ipc_mu, so that a concurrent
  // registration of the same handle opens it afresh only after the close).
  void ReleaseIpc(const IpcKey& key) {
    std::lock_guard<std::mutex> lock(ipc_mu);
    auto it = opens.find(key);
    if (it == opens.end() || --it->second.regions > 0) return;
    ipc->CloseMemory(key.ordinal, it->second.mapping);
    opens.erase(it);
  }

  const RegionOptions options;
  GpuIpc* const ipc;
  const std::vector<IpcDevice> devices;

  std::mutex mu;  // guards the members up to ipc_mu, and every Holder's counters
  std::map<std::string, std::shared_ptr<Holder>> registered;  // by name, sorted
  std::set<std::shared_ptr<Holder>> retired;                  // unregistered, still leased
  uint64_t last_registration = 0;                             // Holder::registration's source
  // Bytes of the regions registered, or unregistered and still leased, and of registrations in
  // progress (Reservation).
  uint64_t region_bytes = 0;
  std::deque<std::shared_ptr<Holder>> to_close;  // claimed, for the closer
  std::condition_variable closer_cv;
  std::thread closer;
  uint64_t closer_generation = 0;  // CloseAll increments it to stop the running closer

  std::mutex listener_mu;  // held while the listener runs; never taken under mu
  std::function<void(int64_t, int)> owner_exit_listener;

  std::mutex ipc_mu;  // held across OpenMemory/CloseMemory: one open per (ordinal, handle)
  std::map<IpcKey, IpcOpen> opens;

  // Last: its thread calls OnOwnerExit, which uses the members above. Order: mu, then the
  // watcher's own lock (Watch and Unwatch are called under mu; OnOwnerExit runs without it).
  OwnerWatcher watcher;
};

// Bytes of RegionOptions::max_region_bytes held for a registration in progress, from before
// its mapping until Insert hands them to the region (Holder::counted_bytes); given back when
// destroyed otherwise. So concurrent registrations never map more than the limit together.
class RegionRegistry::Reservation {
 public:
  Reservation(State* state, uint64_t bytes) : state_(state), bytes_(bytes) {}
  Reservation(const Reservation&) = delete;
  Reservation& operator=(const Reservation&) = delete;
  ~Reservation() {
    if (bytes_ != 0) state_->GiveBackBytes(bytes_);
  }
  // Moves the bytes to `holder` (state's mu held).
  void HandToLocked(RegionLease::Holder& holder) {
    holder.counted_bytes = bytes_;
    bytes_ = 0;
  }

 private:
  State* const state_;
  uint64_t bytes_;
};

// ---- RegionLease -------------------------------------------------------------------------------

uint64_t RegionLease::registration() const {
  return holder_ != nullptr ? holder_->registration : 0;
}

RegionLease::RegionLease(std::shared_ptr<Holder> holder, RegionView view)
    : holder_(std::move(holder)), view_(view) {}

RegionLease::RegionLease(RegionLease&& other) noexcept
    : holder_(std::move(other.holder_)), view_(other.view_) {
  other.view_ = RegionView();
}

RegionLease& RegionLease::operator=(RegionLease&& other) noexcept {
  if (this != &other) {
    Release();
    holder_ = std::move(other.holder_);
    view_ = other.view_;
    other.view_ = RegionView();
  }
  return *this;
}

RegionLease::~RegionLease() { Release(); }

void RegionLease::Release() {
  view_ = RegionView();
  if (holder_ == nullptr) return;
  std::shared_ptr<Holder> holder = std::move(holder_);
  RegionRegistry::State& state = *holder->state;
  {
    std::lock_guard<std::mutex> lock(state.mu);
    if (--holder->leases > 0 || holder->registered || holder->close_claimed) return;
    state.ClaimCloseLocked(*holder);
    state.retired.erase(holder);
    if (state.closer.joinable()) {
      // The common case: this runs at the end of a request; the closer unmaps off its path.
      state.to_close.push_back(holder);
      state.closer_cv.notify_one();
      return;
    }
  }
  state.Close(*holder);  // no closer (CloseAll ran): nothing else would close it
}

// ---- RegionRegistry ----------------------------------------------------------------------------

RegionRegistry::RegionRegistry(RegionOptions options, GpuIpc* ipc, std::vector<IpcDevice> devices)
    : state_(std::make_shared<State>(std::move(options), ipc, std::move(devices))) {}

RegionRegistry::~RegionRegistry() { CloseAll(); }

absl::Status RegionRegistry::Insert(std::shared_ptr<RegionLease::Holder> holder, int64_t owner_pid,
                                    Reservation& bytes) {
  std::lock_guard<std::mutex> lock(state_->mu);
  const std::string& name = holder->info.name;
  if (state_->registered.count(name) != 0) return Taken(name);
  RETURN_IF_ERROR(state_->CheckRoomLocked());
  bytes.HandToLocked(*holder);
  holder->info.owner_pid = owner_pid > 0 ? owner_pid : 0;
  if (owner_pid > 0) {
    // Under mu: an exit reported at once (a dead owner) finds the region registered.
    absl::StatusOr<uint64_t> token = state_->watcher.Watch(owner_pid);
    holder->owner_token = token.ok() ? *token : 0;
    holder->info.owner_watched = token.ok();
  }
  holder->registration = ++state_->last_registration;
  state_->registered.emplace(name, holder);
  state_->EnsureCloserLocked();
  return absl::OkStatus();
}

void RegionRegistry::SetOwnerExitListener(std::function<void(int64_t pid, int released)> listener) {
  std::lock_guard<std::mutex> lock(state_->listener_mu);
  state_->owner_exit_listener = std::move(listener);
}

absl::StatusOr<RegionInfo> RegionRegistry::RegisterHostShm(const std::string& name,
                                                           const std::string& key, uint64_t offset,
                                                           uint64_t byte_size, int64_t owner_pid) {
  RETURN_IF_ERROR(ValidateName(name));
  RETURN_IF_ERROR(ValidateShmKey(key, state_->options.shm_prefix));
  {
    std::lock_guard<std::mutex> lock(state_->mu);  // fail early; Insert decides for good
    if (state_->registered.count(name) != 0) return Taken(name);
    RETURN_IF_ERROR(state_->CheckRoomLocked());
  }
  // The bytes are reserved once the range fits the object (a range that does not is
  // OUT_OF_RANGE whatever its size), before it is mapped.
  std::optional<Reservation> bytes;
  ASSIGN_OR_RETURN(HostShmMapping shm, MapHostShm(key, offset, byte_size, [&]() -> absl::Status {
                     std::lock_guard<std::mutex> lock(state_->mu);
                     ASSIGN_OR_RETURN(const uint64_t reserved,
                                      state_->ReserveBytesLocked(byte_size));
                     bytes.emplace(state_.get(), reserved);
                     return absl::OkStatus();
                   }));
  auto holder = std::make_shared<RegionLease::Holder>();
  holder->state = state_;
  holder->info = RegionInfo{name, RegionKind::kHostShm, byte_size, ""};
  holder->view =
      RegionView{RegionKind::kHostShm, shm.data,       byte_size,      -1,
                 shm.writable,         shm.object_dev, shm.object_ino, shm.object_offset};
  holder->shm = shm;
  absl::Status inserted = Insert(holder, owner_pid, *bytes);
  if (!inserted.ok()) {
    UnmapHostShm(shm);
    return inserted;
  }
  return holder->info;
}

absl::StatusOr<RegionInfo> RegionRegistry::RegisterGpuIpc(const std::string& name,
                                                          const std::string& handle,
                                                          uint64_t offset, uint64_t byte_size,
                                                          const std::string& device,
                                                          int64_t owner_pid) {
  RETURN_IF_ERROR(ValidateName(name));
  ASSIGN_OR_RETURN(const IpcHandle parsed, ParseIpcMemoryHandle(handle));
  if (byte_size == 0) return absl::InvalidArgumentError("expected gpu_ipc.byte_size >= 1, got 0");
  if (offset > UINT64_MAX - byte_size) {
    return absl::OutOfRangeError(
        absl::StrCat("expected gpu_ipc.offset + gpu_ipc.byte_size < 2^64, got offset ", offset,
                     " and byte_size ", byte_size));
  }
  if (state_->ipc == nullptr || state_->devices.empty()) {
    return absl::FailedPreconditionError(
        "expected a server with GPU IPC for a gpu_ipc region, got one without: this server has "
        "no GPU backend (GetServerInfo: devices[].ipc_memory); register a host_shm region or "
        "send inline logits");
  }
  if (device.empty()) {
    return absl::InvalidArgumentError(
        "expected gpu_ipc.device (a PCI bus id or UUID, as GetServerInfo lists them), got none");
  }
  const IpcDevice* match = nullptr;
  absl::Status mismatch;
  for (const IpcDevice& d : state_->devices) {
    mismatch = MatchDevice(device, DeviceInfo{d.ordinal, d.pci_bus_id, d.uuid, "", true, false});
    if (mismatch.ok()) {
      match = &d;
      break;
    }
  }
  if (match == nullptr) {
    if (state_->devices.size() == 1) return mismatch;
    return absl::FailedPreconditionError(
        "expected gpu_ipc.device to name one of this server's GPUs by PCI bus id or UUID "
        "(GetServerInfo lists them), got another device");
  }
  {
    std::lock_guard<std::mutex> lock(state_->mu);  // fail early, before opening the handle
    if (state_->registered.count(name) != 0) return Taken(name);
    RETURN_IF_ERROR(state_->CheckRoomLocked());
  }
  const IpcKey key{match->ordinal, parsed};
  ASSIGN_OR_RETURN(const IpcMapping mapping, state_->RetainIpc(key));
  if (offset > mapping.size || byte_size > mapping.size - offset) {
    state_->ReleaseIpc(key);
    return absl::OutOfRangeError(
        absl::StrCat("expected gpu_ipc.offset + gpu_ipc.byte_size <= the allocation's size of ",
                     mapping.size, " bytes, got offset ", offset, " and byte_size ", byte_size));
  }
  // Reserved once the range fits the allocation, as for host shm (the open is then released).
  absl::StatusOr<uint64_t> reserved;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    reserved = state_->ReserveBytesLocked(byte_size);
  }
  if (!reserved.ok()) {
    state_->ReleaseIpc(key);
    return reserved.status();
  }
  Reservation bytes(state_.get(), *reserved);
  auto holder = std::make_shared<RegionLease::Holder>();
  holder->state = state_;
  holder->info = RegionInfo{name, RegionKind::kGpuIpc, byte_size, match->pci_bus_id};
  holder->view = RegionView{RegionKind::kGpuIpc, static_cast<uint8_t*>(mapping.base) + offset,
                            byte_size, match->ordinal, /*writable=*/true};
  holder->ipc = key;
  absl::Status inserted = Insert(holder, owner_pid, bytes);
  if (!inserted.ok()) {
    state_->ReleaseIpc(key);
    return inserted;
  }
  return holder->info;
}

absl::Status RegionRegistry::Unregister(const std::string& name) {
  return UnregisterRegistration(name, 0);
}

// `registration` 0: whatever `name` names now.
absl::Status RegionRegistry::UnregisterRegistration(const std::string& name,
                                                    uint64_t registration) {
  RETURN_IF_ERROR(ValidateName(name));
  std::shared_ptr<RegionLease::Holder> close_now;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    auto it = state_->registered.find(name);
    if (it == state_->registered.end()) return NotRegistered(name);
    if (registration != 0 && it->second->registration != registration) {
      return absl::NotFoundError(absl::StrCat("expected region \"", name,
                                              "\" as registered when it was leased, got a ",
                                              "newer registration of that name (left registered)"));
    }
    std::shared_ptr<RegionLease::Holder> holder = std::move(it->second);
    state_->registered.erase(it);
    close_now = state_->RetireLocked(std::move(holder));  // else the last lease's release
  }
  if (close_now != nullptr) state_->Close(*close_now);
  return absl::OkStatus();
}

std::vector<RegionInfo> RegionRegistry::List() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  std::vector<RegionInfo> out;
  out.reserve(state_->registered.size());
  for (const auto& [name, holder] : state_->registered) out.push_back(holder->info);
  return out;
}

absl::StatusOr<RegionLease> RegionRegistry::Acquire(const std::string& name, uint64_t offset,
                                                    uint64_t bytes) const {
  RETURN_IF_ERROR(ValidateName(name));
  std::lock_guard<std::mutex> lock(state_->mu);
  auto it = state_->registered.find(name);
  if (it == state_->registered.end()) return NotRegistered(name);
  const std::shared_ptr<RegionLease::Holder>& holder = it->second;
  const uint64_t size = holder->view.size;
  if (offset > size || bytes > size - offset) {
    return absl::OutOfRangeError(absl::StrCat("expected ", bytes, " bytes at offset ", offset,
                                              ", got a region of ", size, " bytes"));
  }
  ++holder->leases;
  RegionView view = holder->view;
  view.data += offset;
  view.size = bytes;
  view.object_offset += offset;
  return RegionLease(holder, view);
}

void RegionRegistry::CloseAll() {
  state_->watcher.Stop();  // no owner exit retires anything from here on
  std::vector<std::shared_ptr<RegionLease::Holder>> closing;
  std::thread closer;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    for (auto& [name, holder] : state_->registered) {
      holder->registered = false;
      state_->ClaimCloseLocked(*holder);
      closing.push_back(std::move(holder));
    }
    state_->registered.clear();
    for (const std::shared_ptr<RegionLease::Holder>& holder : state_->retired) {
      state_->ClaimCloseLocked(*holder);
      closing.push_back(holder);
    }
    state_->retired.clear();
    // The closer finishes what is queued, then stops.
    ++state_->closer_generation;
    closer = std::move(state_->closer);
    state_->closer_cv.notify_all();
  }
  if (closer.joinable()) closer.join();
  for (const std::shared_ptr<RegionLease::Holder>& holder : closing) state_->Close(*holder);
}

}  // namespace samplerd::core
