#include "service/core/executor.h"

#include <gtest/gtest.h>

#include <mutex>
#include <vector>

#include "tests/core/notification.h"

namespace samplerd::core {
namespace {

TEST(Executor, RunsTasksInSubmissionOrder) {
  std::vector<int> order;
  std::mutex mu;
  {
    Executor executor;
    for (int i = 0; i < 100; ++i) {
      executor.Submit([&, i] {
        std::lock_guard<std::mutex> lock(mu);
        order.push_back(i);
      });
    }
  }  // the destructor runs what is queued
  ASSERT_EQ(order.size(), 100u);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(order[i], i);
}

TEST(Executor, SubmitDoesNotWaitForRunningTasks) {
  Executor executor;
  TestNotification release;
  TestNotification started;
  executor.Submit([&] {
    started.Notify();
    release.WaitForNotification();
  });
  started.WaitForNotification();
  bool second_ran = false;
  executor.Submit([&] { second_ran = true; });  // returns although the first task blocks
  EXPECT_EQ(executor.pending(), 2u);
  release.Notify();
  TestNotification done;
  executor.Submit([&] { done.Notify(); });
  done.WaitForNotification();
  EXPECT_TRUE(second_ran);
}

}  // namespace
}  // namespace samplerd::core
