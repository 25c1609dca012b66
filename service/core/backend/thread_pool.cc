#include "service/core/backend/thread_pool.h"

#include <algorithm>

namespace samplerd::core {

ThreadPool::ThreadPool(int threads) {
  try {
    for (int i = 1; i < std::max(threads, 1); ++i) {
      workers_.emplace_back([this] { WorkerLoop(); });
    }
  } catch (...) {
    Stop();  // a joinable std::thread destroyed by the unwinding would std::terminate
    throw;
  }
}

ThreadPool::~ThreadPool() { Stop(); }

void ThreadPool::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (auto& t : workers_) t.join();
  workers_.clear();
}

void ThreadPool::ParallelFor(int64_t n, int64_t grain,
                             const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  const int64_t parts =
      std::max<int64_t>(1, std::min<int64_t>(size(), n / std::max<int64_t>(grain, 1)));
  if (parts == 1) {
    fn(0, n);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    fn_ = &fn;
    n_ = n;
    chunk_ = (n + parts - 1) / parts;
    next_ = 0;
    pending_ = (n + chunk_ - 1) / chunk_;
    ++generation_;
  }
  work_cv_.notify_all();
  RunChunks();
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [this] { return pending_ == 0; });
  fn_ = nullptr;
}

void ThreadPool::RunChunks() {
  while (true) {
    int64_t begin;
    const std::function<void(int64_t, int64_t)>* fn;
    int64_t end;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (fn_ == nullptr || next_ >= n_) return;
      begin = next_;
      end = std::min(n_, begin + chunk_);
      next_ = end;
      fn = fn_;
    }
    (*fn)(begin, end);
    std::lock_guard<std::mutex> lock(mu_);
    if (--pending_ == 0) done_cv_.notify_all();
  }
}

void ThreadPool::WorkerLoop() {
  uint64_t seen = 0;
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
    }
    RunChunks();
  }
}

}  // namespace samplerd::core
