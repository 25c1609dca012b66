// A GpuIpc over host memory, for tests of regions and events without a GPU: "allocations" are
// host buffers exported under made-up handles; it counts opens and closes, and lets a test wait
// for a close that happens on the registry's closer thread. Copies can be held back, as a ready
// event the client has not recorded yet holds a real one.
#ifndef SAMPLERD_TESTS_CORE_FAKE_GPU_IPC_H_
#define SAMPLERD_TESTS_CORE_FAKE_GPU_IPC_H_

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "service/core/regions/gpu_ipc.h"

namespace samplerd::core {

class FakeGpuIpc : public GpuIpc {
 public:
  // Exports `memory` (kept alive by the caller) under a new handle, returned as the 64 bytes a
  // client sends. `fill` sets the handle's bytes (printable text is handy for no-echo checks).
  std::string Export(std::vector<uint8_t>* memory, char fill = 'h') {
    std::lock_guard<std::mutex> lock(mu_);
    IpcHandle handle;
    handle.fill(static_cast<uint8_t>(fill));
    handle[0] = static_cast<uint8_t>(exported_.size());
    exported_[handle] = memory;
    return std::string(handle.begin(), handle.end());
  }

  absl::StatusOr<IpcMapping> OpenMemory(int ordinal, const IpcHandle& handle) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = exported_.find(handle);
    if (it == exported_.end()) {
      return absl::InvalidArgumentError("expected a valid IPC memory handle, got a stale one");
    }
    ++memory_opens_;
    return IpcMapping{it->second->data(), it->second->size()};
  }

  void CloseMemory(int ordinal, const IpcMapping& mapping) override {
    std::lock_guard<std::mutex> lock(mu_);
    ++memory_closes_;
    last_close_thread_ = std::this_thread::get_id();
    cv_.notify_all();
  }

  absl::StatusOr<void*> OpenEvent(int ordinal, const IpcHandle& handle) override {
    std::lock_guard<std::mutex> lock(mu_);
    ++event_opens_;
    events_.push_back(std::make_unique<int>(0));
    return static_cast<void*>(events_.back().get());
  }

  void CloseEvent(int ordinal, void* event) override {
    std::lock_guard<std::mutex> lock(mu_);
    ++event_closes_;
  }

  // The "device" is host memory: a plain memcpy, counted with the event it waited for and the
  // thread it ran on. While copies are held (HoldCopies), waits for ReleaseCopies (up to 10 s).
  absl::Status CopyToHost(int ordinal, void* ready_event, const void* src, void* dst,
                          uint64_t bytes) override {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, std::chrono::seconds(10), [&] { return !copies_held_; })) {
      copies_held_ = false;  // a test that never releases fails once, not at every copy
    }
    ++copies_;
    last_copy_event_ = ready_event;
    last_copy_thread_ = std::this_thread::get_id();
    std::memcpy(dst, src, bytes);
    return absl::OkStatus();
  }

  // Makes CopyToHost wait until ReleaseCopies, like a copy behind a ready event not yet recorded.
  void HoldCopies() {
    std::lock_guard<std::mutex> lock(mu_);
    copies_held_ = true;
  }
  void ReleaseCopies() {
    std::lock_guard<std::mutex> lock(mu_);
    copies_held_ = false;
    cv_.notify_all();
  }

  // Waits (up to 10 s) until CloseMemory has run `n` times in all; false on timeout.
  bool WaitForMemoryCloses(int n) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(10), [&] { return memory_closes_ >= n; });
  }

  int memory_opens() const { return Get(memory_opens_); }
  int memory_closes() const { return Get(memory_closes_); }
  int event_opens() const { return Get(event_opens_); }
  int event_closes() const { return Get(event_closes_); }
  int copies() const { return Get(copies_); }
  void* last_copy_event() const {
    std::lock_guard<std::mutex> lock(mu_);
    return last_copy_event_;
  }
  std::thread::id last_copy_thread() const {
    std::lock_guard<std::mutex> lock(mu_);
    return last_copy_thread_;
  }
  std::thread::id last_close_thread() const {
    std::lock_guard<std::mutex> lock(mu_);
    return last_close_thread_;
  }

 private:
  int Get(const int& counter) const {
    std::lock_guard<std::mutex> lock(mu_);
    return counter;
  }

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<IpcHandle, std::vector<uint8_t>*> exported_;
  std::vector<std::unique_ptr<int>> events_;
  int memory_opens_ = 0;
  int memory_closes_ = 0;
  int event_opens_ = 0;
  int event_closes_ = 0;
  int copies_ = 0;
  void* last_copy_event_ = nullptr;
  std::thread::id last_copy_thread_;
  bool copies_held_ = false;
  std::thread::id last_close_thread_;
};

}  // namespace samplerd::core

#endif  // SAMPLERD_TESTS_CORE_FAKE_GPU_IPC_H_
