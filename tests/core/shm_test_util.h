// Host shm objects for tests: a unique key under the default prefix, created, sized, mapped for
// the test to fill, and unlinked at the end; and a way to run a check as an unprivileged user,
// so that file modes apply even when the tests run as root.
#ifndef SAMPLERD_TESTS_CORE_SHM_TEST_UTIL_H_
#define SAMPLERD_TESTS_CORE_SHM_TEST_UTIL_H_

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <thread>

namespace samplerd::core {

// A unique key: "/samplerd-test-<pid>-<n>-<tag>".
inline std::string UniqueShmKey(const std::string& tag = "obj") {
  static std::atomic<int> counter{0};
  return "/samplerd-test-" + std::to_string(getpid()) + "-" + std::to_string(counter++) + "-" + tag;
}

class TestShm {
 public:
  // Creates an object of `bytes` bytes with `mode`; bytes()[i] = i % 251 to start with.
  explicit TestShm(size_t bytes, mode_t mode = 0600, const std::string& tag = "obj")
      : key_(UniqueShmKey(tag)), size_(bytes) {
    const int fd = shm_open(key_.c_str(), O_CREAT | O_EXCL | O_RDWR, mode);
    if (fd < 0) return;
    if (ftruncate(fd, static_cast<off_t>(bytes)) == 0) {
      void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      if (p != MAP_FAILED) data_ = static_cast<uint8_t*>(p);
    }
    fchmod(fd, mode);  // the umask may have narrowed it
    close(fd);
    if (data_ != nullptr) {
      for (size_t i = 0; i < bytes; ++i) data_[i] = static_cast<uint8_t>(i % 251);
    }
  }
  ~TestShm() {
    if (data_ != nullptr) munmap(data_, size_);
    shm_unlink(key_.c_str());
  }
  TestShm(const TestShm&) = delete;
  TestShm& operator=(const TestShm&) = delete;

  bool ok() const { return data_ != nullptr; }
  const std::string& key() const { return key_; }
  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  std::string key_;
  size_t size_;
  uint8_t* data_ = nullptr;
};

// Runs `check` on a thread of its own whose credentials alone drop to user and group 65534
// (nobody) when this process is root, and returns what it returned. The raw setgroups /
// setresgid / setresuid system calls change only the calling thread's credentials (glibc's
// wrappers would change every thread's), and threads `check` starts inherit them. No fork: a
// forked child of a threaded test that runs C++ before exec can deadlock on a lock another thread
// held at the fork (an allocator's, ASan's among them), and its parent would wait forever.
inline std::string RunUnprivileged(const std::function<std::string()>& check) {
  std::string result;
  std::thread thread([&] {
    if (geteuid() == 0 && (syscall(SYS_setgroups, 0, nullptr) != 0 ||
                           syscall(SYS_setresgid, 65534, 65534, 65534) != 0 ||
                           syscall(SYS_setresuid, 65534, 65534, 65534) != 0)) {
      result = "cannot drop privileges";
      return;
    }
    result = check();
  });
  thread.join();
  return result;
}

}  // namespace samplerd::core

#endif  // SAMPLERD_TESTS_CORE_SHM_TEST_UTIL_H_
