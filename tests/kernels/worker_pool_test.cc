// WorkerPool (kernels/cpu_fast/worker_pool.h): every index of every loop runs exactly once, for
// any thread count and loop size (more threads than indices included).
#include "kernels/cpu_fast/worker_pool.h"

#include <atomic>
#include <cstdint>
#include <memory>

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

}  // namespace
}  // namespace samplerd::kernels
