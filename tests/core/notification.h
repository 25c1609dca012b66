// TestNotification: a one-shot event for tests, on std::mutex and std::condition_variable.
//
// Debian's Abseil is not built with ThreadSanitizer, so the ordering absl::Notification makes is
// invisible to it and every hand-off through one reads as a data race in the tsan step of
// deploy/local/test.sh. The tests that step runs use this instead.
#ifndef SAMPLERD_TESTS_CORE_NOTIFICATION_H_
#define SAMPLERD_TESTS_CORE_NOTIFICATION_H_

#include <condition_variable>
#include <mutex>

namespace samplerd::core {

class TestNotification {
 public:
  // Notifies under the lock: the waiter may destroy this object as soon as it sees notified_.
  void Notify() {
    std::lock_guard<std::mutex> lock(mu_);
    notified_ = true;
    cv_.notify_all();
  }
  void WaitForNotification() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return notified_; });
  }
  bool HasBeenNotified() {
    std::lock_guard<std::mutex> lock(mu_);
    return notified_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool notified_ = false;
};

}  // namespace samplerd::core

#endif  // SAMPLERD_TESTS_CORE_NOTIFICATION_H_
