// Watches the processes that own regions and reports each one's exit, so that the region
// registry can release what a dead process registered (docs/DESIGN.md "Regions bound to their
// owner"). A process is watched through a pidfd (pidfd_open, Linux >= 5.3), which stays bound
// to that process even when its pid is later reused; one thread waits on every pidfd with
// epoll. Watches of the same live pid share one pidfd and are reference-counted.
//
// Cost: no thread and no descriptor until the first Watch; then one thread, an epoll and an
// eventfd for the watcher's life, plus one pidfd per watched process. Thread-safe.
#ifndef SAMPLERD_SERVICE_CORE_REGIONS_OWNER_WATCHER_H_
#define SAMPLERD_SERVICE_CORE_REGIONS_OWNER_WATCHER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <thread>

#include "absl/status/statusor.h"

namespace samplerd::core {

class OwnerWatcher {
 public:
  // `on_exit(token)` runs on the watcher's thread, once for each watch whose process exited
  // (never after Stop), with no lock of the watcher held: it may call Watch and Unwatch.
  explicit OwnerWatcher(std::function<void(uint64_t token)> on_exit);
  ~OwnerWatcher();  // Stop()
  OwnerWatcher(const OwnerWatcher&) = delete;
  OwnerWatcher& operator=(const OwnerWatcher&) = delete;

  // Starts watching process `pid`, or takes another reference on its live watch; returns the
  // watch's token (never 0, never reused). Errors: INVALID_ARGUMENT for pid <= 0;
  // FAILED_PRECONDITION when no pidfd can be had (the process is gone, the kernel predates
  // pidfd_open, a seccomp filter refuses it, descriptors ran out) or after Stop. A process that
  // has exited but is not yet reaped is watched, and reported at once.
  absl::StatusOr<uint64_t> Watch(int64_t pid);

  // Drops one reference on watch `token`; the last closes its pidfd. A token that was reported
  // (or never given) is ignored.
  void Unwatch(uint64_t token);

  // Ends the thread (waiting for an on_exit in progress) and closes every descriptor. Watch
  // then fails; Unwatch does nothing. Must not be called from on_exit. Idempotent.
  void Stop();

  // Processes watched now (for tests).
  int watched() const;

 private:
  struct Entry {
    int64_t pid = 0;
    int pidfd = -1;
    int64_t refs = 0;
  };

  // Starts the thread with its epoll and eventfd (mu_ held); false when they cannot be made.
  bool EnsureThreadLocked();
  // Removes `token` (mu_ held): closes its pidfd; returns false when it is unknown.
  bool EraseLocked(uint64_t token);
  void Loop();

  const std::function<void(uint64_t)> on_exit_;
  mutable std::mutex mu_;
  std::map<uint64_t, Entry> entries_;  // by token
  std::map<int64_t, uint64_t> live_;   // pid -> token of its current watch
  uint64_t next_token_ = 1;
  int epoll_fd_ = -1;
  int wake_fd_ = -1;  // eventfd: Stop wakes the thread
  bool stopped_ = false;
  std::thread thread_;
};

}  // namespace samplerd::core

#endif  // SAMPLERD_SERVICE_CORE_REGIONS_OWNER_WATCHER_H_
