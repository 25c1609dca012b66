#include "service/core/idle_trimmer.h"

#include <malloc.h>

#include <chrono>
#include <utility>

#include "service/core/model/thread_name.h"

namespace samplerd::core {

IdleTrimmer::IdleTrimmer(Hooks hooks, absl::Duration interval)
    : hooks_(std::move(hooks)), interval_(interval) {
  if (hooks_.trim == nullptr) hooks_.trim = [] { malloc_trim(0); };
  const uint64_t seen = hooks_.admissions();  // before the constructor returns
  thread_ = std::thread([this, seen] { Loop(seen); });
}

IdleTrimmer::~IdleTrimmer() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

int64_t IdleTrimmer::trims() const {
  std::lock_guard<std::mutex> lock(mu_);
  return trims_;
}

void IdleTrimmer::Loop(uint64_t seen) {
  NameThisThread("samplerd-trim");
  int trims_left = 0;  // idle ticks on which to trim before waiting for new activity
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    cv_.wait_for(lock, absl::ToChronoNanoseconds(interval_), [this] { return stop_; });
    if (stop_) break;
    lock.unlock();
    const uint64_t now = hooks_.admissions();
    bool trimmed = false;
    if (now != seen) {  // activity during this interval: not idle yet
      seen = now;
      trims_left = kTrimsPerIdlePeriod;
    } else if (trims_left > 0 && hooks_.in_flight() == 0) {
      hooks_.trim();
      --trims_left;
      trimmed = true;
    }
    lock.lock();
    if (trimmed) ++trims_;
  }
}

}  // namespace samplerd::core
