// Gives freed heap memory back to the system once the server goes idle.
//
// glibc's malloc keeps what a burst of large requests freed: 32 streams of 8 MB steps left
// ~3 GB resident in its per-thread arenas (64 MB heaps) after every request had ended, and the
// allocator reused it but never returned it. malloc_trim(0) returns it (measured: 2989 MB ->
// 43 MB). IdleTrimmer calls it from a thread of its own, never on the request path, at most once
// per interval, and only while the server is idle after some activity: on the first few ticks
// that end a whole interval with no admission and nothing in flight (buffers a cancelled stream
// held may be freed a little after its last answer), then not again until a new request comes
// in. A busy server is never trimmed: malloc_trim locks each arena while it walks it, which
// would stall the threads allocating for a request.
#ifndef SAMPLERD_SERVICE_CORE_IDLE_TRIMMER_H_
#define SAMPLERD_SERVICE_CORE_IDLE_TRIMMER_H_

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>

#include "absl/time/time.h"

namespace samplerd::core {

class IdleTrimmer {
 public:
  struct Hooks {
    // Requests in flight now (SamplerCore::admitted).
    std::function<int64_t()> in_flight;
    // Requests admitted since start (SamplerCore::admissions): a change means activity.
    std::function<uint64_t()> admissions;
    // Gives memory back; null: glibc's malloc_trim(0).
    std::function<void()> trim;
  };

  // Quiet ticks (no admission during the interval, nothing in flight) after activity on which
  // memory is trimmed.
  static constexpr int kTrimsPerIdlePeriod = 3;

  // Starts the thread: it checks every `interval`.
  IdleTrimmer(Hooks hooks, absl::Duration interval = absl::Seconds(1));
  ~IdleTrimmer();  // stops and joins the thread
  IdleTrimmer(const IdleTrimmer&) = delete;
  IdleTrimmer& operator=(const IdleTrimmer&) = delete;

  // Trims so far.
  int64_t trims() const;

 private:
  // `seen`: admissions() when the trimmer started.
  void Loop(uint64_t seen);

  Hooks hooks_;
  const absl::Duration interval_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;  // guarded by mu_
  int64_t trims_ = 0;  // guarded by mu_
  std::thread thread_;
};

}  // namespace samplerd::core

#endif  // SAMPLERD_SERVICE_CORE_IDLE_TRIMMER_H_
