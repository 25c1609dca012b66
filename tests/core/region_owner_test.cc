// Regions bound to their owner (issue 12), in one process: OwnerWatcher reports a watched child
// process's exit once, shares one pidfd per live pid and closes it with the last Unwatch; the
// registry releases a dead owner's regions (deferred while a lease holds one), keeps explicit
// Unregister, and registers a region it cannot watch (no owner, or a pid already gone)
// unwatched. The owners are forked children that wait on a pipe: killing one is its exit.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "service/core/regions/owner_watcher.h"
#include "service/core/regions/region_registry.h"
#include "tests/core/shm_test_util.h"

namespace samplerd::core {
namespace {

// A child process that lives until Kill() (or the test's end).
class ChildProcess {
 public:
  ChildProcess() {
    int fds[2];
    if (pipe(fds) != 0) return;
    pid_ = fork();
    if (pid_ == 0) {
      close(fds[1]);
      char byte;
      while (read(fds[0], &byte, 1) > 0) {
      }
      _exit(0);
    }
    close(fds[0]);
    write_end_ = fds[1];
  }
  ~ChildProcess() {
    Kill();
    if (write_end_ >= 0) close(write_end_);
  }
  // SIGKILLs and reaps the child.
  void Kill() {
    if (pid_ <= 0) return;
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
  int write_end_ = -1;
};

// What a watcher or registry reported, for the test thread to wait on.
class Reports {
 public:
  void Add(int64_t value) {
    std::lock_guard<std::mutex> lock(mu_);
    values_.push_back(value);
    cv_.notify_all();
  }
  // The reports once there are `n`, or what there is after 10 s.
  std::vector<int64_t> WaitFor(size_t n) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, std::chrono::seconds(10), [&] { return values_.size() >= n; });
    return values_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<int64_t> values_;
};

int OpenFds() {
  int count = 0;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    (void)entry;
    ++count;
  }
  return count;
}

// Lines of this process's memory map that map shm object `key`.
int Mappings(const std::string& key) {
  std::ifstream maps("/proc/self/maps");
  int count = 0;
  for (std::string line; std::getline(maps, line);) {
    if (line.find("/dev/shm" + key) != std::string::npos) ++count;
  }
  return count;
}

TEST(OwnerWatcher, ReportsAWatchedProcessExitOnceWithItsToken) {
  Reports exits;
  OwnerWatcher watcher([&](uint64_t token) { exits.Add(static_cast<int64_t>(token)); });
  ChildProcess child;
  ASSERT_GT(child.pid(), 0);
  absl::StatusOr<uint64_t> token = watcher.Watch(child.pid());
  ASSERT_TRUE(token.ok()) << token.status();
  EXPECT_EQ(watcher.watched(), 1);
  child.Kill();
  EXPECT_THAT(exits.WaitFor(1), ::testing::ElementsAre(static_cast<int64_t>(*token)));
  EXPECT_EQ(watcher.watched(), 0);
  watcher.Unwatch(*token);  // a reported token is ignored
  watcher.Stop();
  EXPECT_EQ(exits.WaitFor(1).size(), 1u);  // still one report
}

TEST(OwnerWatcher, SharesOnePidfdPerPidAndClosesItWithTheLastUnwatch) {
  OwnerWatcher watcher([](uint64_t) {});
  ChildProcess child;
  ASSERT_GT(child.pid(), 0);
  absl::StatusOr<uint64_t> first = watcher.Watch(child.pid());
  ASSERT_TRUE(first.ok()) << first.status();
  const int fds = OpenFds();  // the thread's epoll and eventfd exist from the first Watch
  absl::StatusOr<uint64_t> second = watcher.Watch(child.pid());
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(*second, *first);
  EXPECT_EQ(OpenFds(), fds);
  watcher.Unwatch(*first);
  EXPECT_EQ(watcher.watched(), 1);
  watcher.Unwatch(*first);
  EXPECT_EQ(watcher.watched(), 0);
  EXPECT_EQ(OpenFds(), fds - 1);
}

TEST(OwnerWatcher, RefusesBadPidsGoneProcessesAndWatchesAfterStop) {
  OwnerWatcher watcher([](uint64_t) {});
  EXPECT_EQ(watcher.Watch(0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(watcher.Watch(-4).status().code(), absl::StatusCode::kInvalidArgument);
  pid_t gone;
  {
    ChildProcess child;
    gone = child.pid();
  }  // killed and reaped: no process has this pid for now
  const absl::Status status = watcher.Watch(gone).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_THAT(std::string(status.message()), ::testing::HasSubstr("expected a pidfd"));
  watcher.Stop();
  EXPECT_EQ(watcher.Watch(getpid()).status().code(), absl::StatusCode::kFailedPrecondition);
}

class RegistryOwners : public ::testing::Test {
 protected:
  RegistryOwners() : registry_(RegionOptions{}, nullptr, {}) {
    registry_.SetOwnerExitListener([this](int64_t pid, int released) {
      released_.Add(pid);
      released_.Add(released);
    });
  }
  ~RegistryOwners() override { registry_.SetOwnerExitListener(nullptr); }

  TestShm shm_{8192};
  Reports released_;  // pid, count, pid, count, ...
  RegionRegistry registry_;
};

TEST_F(RegistryOwners, ADeadOwnersRegionsAreReleasedAndOthersStay) {
  // One object per region, so that each mapping is a line of its own in /proc/self/maps.
  TestShm a(4096, 0600, "a"), b(4096, 0600, "b"), c(4096, 0600, "c"), d(4096, 0600, "d");
  ASSERT_TRUE(a.ok() && b.ok() && c.ok() && d.ok());
  ChildProcess owner, other;
  const pid_t owner_pid = owner.pid();
  absl::StatusOr<RegionInfo> info = registry_.RegisterHostShm("a", a.key(), 0, 4096, owner_pid);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->owner_pid, owner_pid);
  EXPECT_TRUE(info->owner_watched);
  ASSERT_TRUE(registry_.RegisterHostShm("b", b.key(), 0, 4096, owner_pid).ok());
  ASSERT_TRUE(registry_.RegisterHostShm("c", c.key(), 0, 4096, other.pid()).ok());
  info = registry_.RegisterHostShm("d", d.key(), 0, 4096);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->owner_pid, 0);
  EXPECT_FALSE(info->owner_watched);
  for (const TestShm* shm : {&a, &b, &c, &d}) EXPECT_EQ(Mappings(shm->key()), 2);  // + the test's

  owner.Kill();
  EXPECT_THAT(released_.WaitFor(2), ::testing::ElementsAre(owner_pid, 2));
  std::vector<std::string> names;
  for (const RegionInfo& r : registry_.List()) names.push_back(r.name);
  EXPECT_THAT(names, ::testing::ElementsAre("c", "d"));
  EXPECT_EQ(Mappings(a.key()), 1);
  EXPECT_EQ(Mappings(b.key()), 1);
  EXPECT_EQ(Mappings(c.key()), 2);
  EXPECT_EQ(Mappings(d.key()), 2);
  // The names are free again, for anyone.
  EXPECT_TRUE(registry_.RegisterHostShm("a", a.key(), 0, 4096, getpid()).ok());
}

TEST_F(RegistryOwners, ARegionInUseIsUnmappedOnlyWhenItsLastLeaseGoes) {
  ASSERT_TRUE(shm_.ok());
  ChildProcess owner;
  const pid_t owner_pid = owner.pid();
  ASSERT_TRUE(registry_.RegisterHostShm("held", shm_.key(), 0, 8192, owner_pid).ok());
  absl::StatusOr<RegionLease> lease = registry_.Acquire("held", 100, 16);
  ASSERT_TRUE(lease.ok()) << lease.status();
  owner.Kill();
  EXPECT_THAT(released_.WaitFor(2), ::testing::ElementsAre(owner_pid, 1));
  EXPECT_TRUE(registry_.List().empty());
  EXPECT_EQ(registry_.Acquire("held", 0, 1).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(lease->view().data[0], shm_.data()[100]);  // still mapped, still the bytes
  EXPECT_EQ(Mappings(shm_.key()), 1 + 1);
  *lease = RegionLease();  // the request ends: the closer thread unmaps
  for (int i = 0; i < 1000 && Mappings(shm_.key()) != 1; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));  // the closer is asynchronous
  }
  EXPECT_EQ(Mappings(shm_.key()), 1);
}

TEST_F(RegistryOwners, ExplicitUnregisterStopsTheWatchAndAGoneOwnerIsUnwatched) {
  ASSERT_TRUE(shm_.ok());
  ChildProcess owner;
  ASSERT_TRUE(registry_.RegisterHostShm("first", shm_.key(), 0, 4096, owner.pid()).ok());
  const int fds = OpenFds();  // the watcher's thread, epoll and eventfd, and one pidfd
  ASSERT_TRUE(registry_.Unregister("first").ok());
  EXPECT_EQ(OpenFds(), fds - 1);  // the pidfd is closed
  EXPECT_EQ(registry_.Unregister("first").code(), absl::StatusCode::kNotFound);
  owner.Kill();  // no region of it is left: nothing is reported
  pid_t gone;
  {
    ChildProcess child;
    gone = child.pid();
  }
  absl::StatusOr<RegionInfo> late = registry_.RegisterHostShm("late", shm_.key(), 0, 4096, gone);
  ASSERT_TRUE(late.ok()) << late.status();
  EXPECT_EQ(late->owner_pid, gone);
  EXPECT_FALSE(late->owner_watched);  // kept until Unregister, like a TCP registration
  ASSERT_EQ(registry_.List().size(), 1u);
  EXPECT_TRUE(registry_.Unregister("late").ok());
  EXPECT_TRUE(released_.WaitFor(0).empty());
}

}  // namespace
}  // namespace samplerd::core
