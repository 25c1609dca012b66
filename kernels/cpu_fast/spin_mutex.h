// A lock for the short merges of a row's chunk tasks into its RowState (a few hundred histogram
// adds, one vector append, one best score), and the pause instruction spin loops use. Internal
// to kernels/cpu_fast.
//
// Why not std::mutex: at B = 1 the 12-24 tasks of a pass finish within microseconds of each
// other, so their merges collide, and a std::mutex waiter sleeps in the kernel. Waking it takes
// an inter-processor interrupt, tens of microseconds in a virtual machine, and the whole pass
// waits for the last task: on the GPU host at 12 threads a gather pass took as long as on one
// thread (tests/bench/HOST_PLANE_RESULTS.md, run 8). A waiter here spins on the line instead,
// and yields the core after ~50 µs in case the holder itself was descheduled (an
// oversubscribed host).
#ifndef SAMPLERD_KERNELS_CPU_FAST_SPIN_MUTEX_H_
#define SAMPLERD_KERNELS_CPU_FAST_SPIN_MUTEX_H_

#include <atomic>
#include <thread>

namespace samplerd::kernels::cpu_fast_internal {

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// BasicLockable (std::lock_guard<SpinMutex>).
class SpinMutex {
 public:
  void lock() {
    while (locked_.exchange(true, std::memory_order_acquire)) {
      // Wait reading the line (no writes while it is held), then try again.
      for (int spins = 0; locked_.load(std::memory_order_relaxed); ++spins) {
        if (spins < kSpinsBeforeYield) {
          CpuRelax();
        } else {
          std::this_thread::yield();
        }
      }
    }
  }
  void unlock() { locked_.store(false, std::memory_order_release); }

 private:
  // ~50 µs of pause instructions (~30-140 cycles each, by CPU).
  static constexpr int kSpinsBeforeYield = 4096;
  std::atomic<bool> locked_{false};
};

}  // namespace samplerd::kernels::cpu_fast_internal

#endif  // SAMPLERD_KERNELS_CPU_FAST_SPIN_MUTEX_H_
