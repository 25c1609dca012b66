// A device executor: one thread that runs a device's work in arrival order.
//
// gRPC reactors hand work here and return at once, so they never block on sampling.
#ifndef SAMPLERD_SERVICE_CORE_EXECUTOR_H_
#define SAMPLERD_SERVICE_CORE_EXECUTOR_H_

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace samplerd::core {

class Executor {
 public:
  Executor();
  // Runs what is queued, then stops.
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // Queues `task`; it runs on the executor thread after every task queued before it.
  // Thread-safe, never blocks on running tasks.
  void Submit(std::function<void()> task);

  // Number of tasks queued or running.
  size_t pending() const;

 private:
  void Loop();

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  size_t running_ = 0;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace samplerd::core

#endif  // SAMPLERD_SERVICE_CORE_EXECUTOR_H_
