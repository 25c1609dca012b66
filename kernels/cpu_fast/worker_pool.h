// A fixed set of persistent worker threads that run one parallel loop at a time.
//
// Built for per-step latency: between loops the workers spin for a short while (so that a loop
// posted soon after the last one starts without a wake-up), then block on a condition variable.
// The calling thread takes part in every loop. Each thread first runs its own contiguous share
// of a loop's indices, the same share of every loop of the same size, then takes what is left of
// the others' shares: a pass that splits a row the same way as the pass before reads, on each
// thread, the tokens that thread read (or copied) last, from its own cache, while a thread that
// starts late still has its indices run by the others. Pure C++ (the kernels layer links no
// Abseil).
#ifndef SAMPLERD_KERNELS_CPU_FAST_WORKER_POOL_H_
#define SAMPLERD_KERNELS_CPU_FAST_WORKER_POOL_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace samplerd::kernels {

class WorkerPool {
 public:
  // `threads` >= 1 counts the caller: threads - 1 workers are started. Workers spin up to
  // `spin_us` microseconds after a loop before they block.
  WorkerPool(int threads, int spin_us);
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  int threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Runs fn(0) ... fn(n - 1), spread over the workers and the caller, and returns when all have
  // returned. Thread s (0 the caller, w + 1 worker w) starts with indices
  // [s * n / threads(), (s + 1) * n / threads()). Not reentrant: one caller at a time, and fn
  // must not call Run.
  void Run(int64_t n, const std::function<void(int64_t)>& fn);

 private:
  // One thread's share of the current loop: indices [next, end) not yet claimed.
  struct alignas(64) Share {
    std::atomic<int64_t> next{0};
    int64_t end = 0;
  };

  void WorkerLoop(int slot);
  void Drain(int slot);  // runs the slot's share, then claims the others' until none is left

  const int spin_us_;
  std::vector<Share> shares_;  // one per thread, the caller's first
  std::vector<std::thread> workers_;

  const std::function<void(int64_t)>* fn_ = nullptr;
  std::atomic<int> active_{0};  // workers not yet done with the current loop
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> sleeping_{0};
  bool stop_ = false;  // guarded by mu_
  std::mutex mu_;
  std::condition_variable cv_;
};

}  // namespace samplerd::kernels

#endif  // SAMPLERD_KERNELS_CPU_FAST_WORKER_POOL_H_
