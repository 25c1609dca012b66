// WorkerPool (kernels/cpu_fast/worker_pool.h): every index of every loop runs exactly once, for
// any thread count and loop size (more threads than indices included), and a thread that does
// not get to its share does not hold the loop: the others run that share.
#include "kernels/cpu_fast/worker_pool.h"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace samplerd::kernels {
namespace {

TEST(WorkerPoolTest, EveryIndexOfEveryLoopRunsExactlyOnce) {
  for (int threads : {1, 2, 3, 5}) {
    WorkerPool pool(threads, /*spin_us=*/50);
    for (int64_t n : {0, 1, 2, 3, 4, 7, 64, 1000}) {
      for (int loop = 0; loop < 20; ++loop) {
        std::unique_ptr<std::atomic<int>[]> runs(new std::atomic<int>[n + 1]);
        for (int64_t i = 0; i <= n; ++i) runs[i].store(0);
        pool.Run(n, [&](int64_t i) {
          // Indices out of range land in the extra slot, which must stay 0.
          runs[i >= 0 && i < n ? i : n].fetch_add(1);
        });
        for (int64_t i = 0; i < n; ++i) {
          ASSERT_EQ(runs[i].load(), 1) << "threads " << threads << ", n " << n << ", index " << i;
        }
        ASSERT_EQ(runs[n].load(), 0) << "an index outside [0, " << n << ") ran";
      }
    }
  }
}

TEST(WorkerPoolTest, AShareWhoseThreadIsBusyIsRunByTheOthers) {
  // Three threads, 30 indices: the caller's share is [0, 10). Index 0 (the caller's first)
  // returns only once every other index has run, so indices 1-9 can run only if the workers
  // take them from the caller's share. Without that, the wait below times out.
  WorkerPool pool(3, /*spin_us=*/1000);
  constexpr int64_t kN = 30;
  std::atomic<int64_t> others_done{0};
  std::atomic<bool> timed_out{false};
  const std::thread::id caller = std::this_thread::get_id();
  std::vector<std::thread::id> ran_on(kN);
  pool.Run(kN, [&](int64_t i) {
    ran_on[i] = std::this_thread::get_id();
    if (i != 0) {
      others_done.fetch_add(1);
      return;
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (others_done.load() < kN - 1) {
      if (std::chrono::steady_clock::now() > deadline) {
        timed_out.store(true);
        return;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  });
  EXPECT_FALSE(timed_out.load()) << "the caller's share waited for the caller";
  EXPECT_EQ(ran_on[0], caller);
  for (int64_t i = 1; i < 10; ++i) EXPECT_NE(ran_on[i], caller) << "index " << i;
}

}  // namespace
}  // namespace samplerd::kernels
