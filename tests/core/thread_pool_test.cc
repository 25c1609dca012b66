#include "service/core/backend/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <vector>

namespace samplerd::core {
namespace {

TEST(ThreadPool, ParallelForVisitsEveryIndexExactlyOnce) {
  for (int threads : {1, 2, 5}) {
    ThreadPool pool(threads);
    for (int64_t n : {1, 2, 3, 7, 64, 1000}) {
      for (int64_t grain : {1, 4, 100}) {
        std::vector<std::atomic<int>> hits(n);
        pool.ParallelFor(n, grain, [&](int64_t begin, int64_t end) {
          ASSERT_LE(0, begin);
          ASSERT_LT(begin, end);
          ASSERT_LE(end, n);
          for (int64_t i = begin; i < end; ++i) hits[i].fetch_add(1);
        });
        for (int64_t i = 0; i < n; ++i) {
          ASSERT_EQ(hits[i].load(), 1) << "threads " << threads << " n " << n << " i " << i;
        }
      }
    }
  }
}

TEST(ThreadPool, ParallelForWithNothingToDoCallsNothing) {
  ThreadPool pool(3);
  bool called = false;
  pool.ParallelFor(0, 1, [&](int64_t, int64_t) { called = true; });
  EXPECT_FALSE(called);
}

TEST(ThreadPool, UsesSeveralThreadsForLargeLoops) {
  ThreadPool pool(4);
  EXPECT_EQ(pool.size(), 4);
  std::atomic<int> chunks{0};
  pool.ParallelFor(400, 1, [&](int64_t, int64_t) { chunks.fetch_add(1); });
  EXPECT_EQ(chunks.load(), 4);  // one chunk per thread
}

}  // namespace
}  // namespace samplerd::core
