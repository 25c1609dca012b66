// A fixed pool of host threads for data-parallel loops (the CPU backend's rows).
#ifndef SAMPLERD_SERVICE_CORE_BACKEND_THREAD_POOL_H_
#define SAMPLERD_SERVICE_CORE_BACKEND_THREAD_POOL_H_

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace samplerd::core {

class ThreadPool {
 public:
  // Starts `threads - 1` workers (the caller of ParallelFor is the last one). threads >= 1.
  // Throws std::system_error when a thread cannot be started (those started are stopped first).
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // Runs fn(begin, end) over [0, n) split into contiguous chunks of at least `grain`, on the
  // workers and the calling thread; returns when every chunk is done. Not reentrant: one caller
  // at a time (the device executor).
  void ParallelFor(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

  int size() const { return static_cast<int>(workers_.size()) + 1; }

 private:
  // Stops and joins the workers.
  void Stop();
  void WorkerLoop();
  // Claims and runs chunks of the current job until none is left.
  void RunChunks();

  std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  bool stop_ = false;
  uint64_t generation_ = 0;  // bumped for each job
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
  int64_t n_ = 0;
  int64_t chunk_ = 1;
  int64_t next_ = 0;     // next unclaimed index
  int64_t pending_ = 0;  // chunks not yet finished
  std::vector<std::thread> workers_;
};

}  // namespace samplerd::core

#endif  // SAMPLERD_SERVICE_CORE_BACKEND_THREAD_POOL_H_
