// OwnerWatcher: pidfds in one epoll set, polled by one thread. Token 0 in an epoll event is the
// eventfd that Stop writes.
#include "service/core/regions/owner_watcher.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "service/core/model/thread_name.h"

namespace samplerd::core {
namespace {

// pidfd_open(2) by number: glibc before 2.36 has no wrapper.
int PidfdOpen(int64_t pid) {
#ifdef SYS_pidfd_open
  return static_cast<int>(syscall(SYS_pidfd_open, static_cast<pid_t>(pid), 0));
#else
  errno = ENOSYS;
  return -1;
#endif
}

}  // namespace

OwnerWatcher::OwnerWatcher(std::function<void(uint64_t token)> on_exit)
    : on_exit_(std::move(on_exit)) {}

OwnerWatcher::~OwnerWatcher() { Stop(); }

bool OwnerWatcher::EnsureThreadLocked() {
  if (thread_.joinable()) return true;
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  epoll_event wake = {};
  wake.events = EPOLLIN;
  wake.data.u64 = 0;
  if (epoll_fd_ < 0 || wake_fd_ < 0 || epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, wake_fd_, &wake) != 0) {
    if (epoll_fd_ >= 0) close(epoll_fd_);
    if (wake_fd_ >= 0) close(wake_fd_);
    epoll_fd_ = wake_fd_ = -1;
    return false;
  }
  thread_ = std::thread([this] {
    NameThisThread("sd-owner-watch");
    Loop();
  });
  return true;
}

absl::StatusOr<uint64_t> OwnerWatcher::Watch(int64_t pid) {
  if (pid <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("expected an owner pid >= 1, got ", pid));
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (stopped_) {
    return absl::FailedPreconditionError("expected a running owner watcher, got a stopped one");
  }
  auto live = live_.find(pid);
  if (live != live_.end()) {
    ++entries_[live->second].refs;
    return live->second;
  }
  if (!EnsureThreadLocked()) {
    return absl::FailedPreconditionError(
        absl::StrCat("expected an epoll set for owner pidfds, got: ", std::strerror(errno)));
  }
  const int pidfd = PidfdOpen(pid);
  if (pidfd < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("expected a pidfd for owner pid ", pid, ", got: ", std::strerror(errno)));
  }
  const uint64_t token = next_token_++;
  epoll_event event = {};
  event.events = EPOLLIN;
  event.data.u64 = token;
  if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, pidfd, &event) != 0) {
    const int error = errno;
    close(pidfd);
    return absl::FailedPreconditionError(absl::StrCat("expected to watch owner pid ", pid,
                                                      " with epoll, got: ", std::strerror(error)));
  }
  entries_[token] = Entry{pid, pidfd, 1};
  live_[pid] = token;
  return token;
}

bool OwnerWatcher::EraseLocked(uint64_t token) {
  auto it = entries_.find(token);
  if (it == entries_.end()) return false;
  close(it->second.pidfd);  // also leaves the epoll set (its only descriptor)
  auto live = live_.find(it->second.pid);
  if (live != live_.end() && live->second == token) live_.erase(live);
  entries_.erase(it);
  return true;
}

void OwnerWatcher::Unwatch(uint64_t token) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(token);
  if (it == entries_.end() || --it->second.refs > 0) return;
  EraseLocked(token);
}

void OwnerWatcher::Loop() {
  epoll_event events[16];
  while (true) {
    const int n = epoll_wait(epoll_fd_, events, 16, -1);
    if (n < 0 && errno != EINTR) return;  // only EBADF/EINVAL: nothing to wait on
    for (int i = 0; i < n; ++i) {
      const uint64_t token = events[i].data.u64;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (stopped_) return;
        // A pidfd turns readable when its process exits; an Unwatch may have beaten us here.
        if (token == 0 || !EraseLocked(token)) continue;
      }
      on_exit_(token);
    }
  }
}

void OwnerWatcher::Stop() {
  std::thread thread;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_) return;
    stopped_ = true;
    if (wake_fd_ >= 0) {
      const uint64_t one = 1;
      (void)!write(wake_fd_, &one, sizeof(one));
    }
    thread = std::move(thread_);
  }
  if (thread.joinable()) thread.join();
  std::lock_guard<std::mutex> lock(mu_);
  while (!entries_.empty()) EraseLocked(entries_.begin()->first);
  if (epoll_fd_ >= 0) close(epoll_fd_);
  if (wake_fd_ >= 0) close(wake_fd_);
  epoll_fd_ = wake_fd_ = -1;
}

int OwnerWatcher::watched() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(entries_.size());
}

}  // namespace samplerd::core
