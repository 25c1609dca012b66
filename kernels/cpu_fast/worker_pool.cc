// WorkerPool: a generation counter announces each loop; indices are claimed with fetch_add.
#include "kernels/cpu_fast/worker_pool.h"

#include <chrono>

#include "kernels/cpu_fast/spin_mutex.h"

namespace samplerd::kernels {

using cpu_fast_internal::CpuRelax;

WorkerPool::WorkerPool(int threads, int spin_us)
    : spin_us_(spin_us < 0 ? 0 : spin_us), shares_(threads > 1 ? threads : 1) {
  const int workers = threads > 1 ? threads - 1 : 0;
  workers_.reserve(workers);
  for (int i = 0; i < workers; ++i) workers_.emplace_back([this, i] { WorkerLoop(i + 1); });
}

WorkerPool::~WorkerPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void WorkerPool::Drain(int slot) {
  const std::function<void(int64_t)>& fn = *fn_;
  const int threads = static_cast<int>(shares_.size());
  for (int k = 0; k < threads; ++k) {
    Share& share = shares_[(slot + k) % threads];
    // A look before the claim: a share already taken costs a read, not a write to its line.
    while (share.next.load(std::memory_order_relaxed) < share.end) {
      const int64_t i = share.next.fetch_add(1, std::memory_order_relaxed);
      if (i >= share.end) break;
      fn(i);
    }
  }
}

void WorkerPool::Run(int64_t n, const std::function<void(int64_t)>& fn) {
  if (n <= 0) return;
  if (workers_.empty() || n == 1) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  fn_ = &fn;
  const int64_t threads = static_cast<int64_t>(shares_.size());
  for (int64_t s = 0; s < threads; ++s) {
    shares_[s].next.store(s * n / threads, std::memory_order_relaxed);
    shares_[s].end = (s + 1) * n / threads;
  }
  active_.store(static_cast<int>(workers_.size()), std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_seq_cst);  // publishes fn_, shares_, active_
  if (sleeping_.load(std::memory_order_seq_cst) > 0) {
    std::lock_guard<std::mutex> lock(mu_);
    cv_.notify_all();
  }
  Drain(0);
  // Every worker takes part in every loop (possibly claiming nothing), so this wait is short
  // once the indices run out.
  while (active_.load(std::memory_order_acquire) != 0) CpuRelax();
}

void WorkerPool::WorkerLoop(int slot) {
  uint64_t seen = 0;
  for (;;) {
    uint64_t now = generation_.load(std::memory_order_acquire);
    if (now == seen) {
      const auto spin_until =
          std::chrono::steady_clock::now() + std::chrono::microseconds(spin_us_);
      for (int i = 0; now == seen; ++i) {
        CpuRelax();
        now = generation_.load(std::memory_order_acquire);
        if ((i & 255) == 255 && std::chrono::steady_clock::now() >= spin_until) break;
      }
    }
    if (now == seen) {
      std::unique_lock<std::mutex> lock(mu_);
      sleeping_.fetch_add(1, std::memory_order_seq_cst);
      cv_.wait(lock, [&] {
        now = generation_.load(std::memory_order_seq_cst);
        return stop_ || now != seen;
      });
      sleeping_.fetch_sub(1, std::memory_order_relaxed);
      if (stop_) return;
    }
    seen = now;
    Drain(slot);
    active_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

}  // namespace samplerd::kernels
