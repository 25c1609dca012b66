// IdleTrimmer: memory is trimmed on the first quiet ticks after activity, never while requests
// are in flight or arriving, and not again until new activity; SamplerCore counts its admissions
// for it.
#include "service/core/idle_trimmer.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <thread>

#include "absl/time/clock.h"

namespace samplerd::core {
namespace {

constexpr absl::Duration kTick = absl::Milliseconds(5);

struct FakeServer {
  std::atomic<int64_t> in_flight{0};
  std::atomic<uint64_t> admissions{0};
  std::atomic<int> trims{0};

  IdleTrimmer::Hooks Hooks() {
    return {[this] { return in_flight.load(); }, [this] { return admissions.load(); },
            [this] { trims.fetch_add(1); }};
  }
};

bool WaitFor(const std::function<bool()>& done, absl::Duration limit = absl::Seconds(5)) {
  const absl::Time deadline = absl::Now() + limit;
  while (!done()) {
    if (absl::Now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

TEST(IdleTrimmer, TrimsWhenTheServerGoesIdleAfterActivityThenStops) {
  FakeServer server;
  IdleTrimmer trimmer(server.Hooks(), kTick);
  // Nothing has happened yet: no trim.
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(server.trims.load(), 0);

  // Busy: requests admitted and in flight; no trim while they are.
  server.admissions = 5;
  server.in_flight = 2;
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(server.trims.load(), 0);

  // Idle: a few trims, then none until new activity.
  server.in_flight = 0;
  ASSERT_TRUE(WaitFor([&] { return server.trims.load() == IdleTrimmer::kTrimsPerIdlePeriod; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(server.trims.load(), IdleTrimmer::kTrimsPerIdlePeriod);
  EXPECT_EQ(trimmer.trims(), IdleTrimmer::kTrimsPerIdlePeriod);

  // New activity that has ended by the next tick is trimmed after again.
  server.admissions = 6;
  ASSERT_TRUE(WaitFor([&] { return server.trims.load() == 2 * IdleTrimmer::kTrimsPerIdlePeriod; }));
}

TEST(IdleTrimmer, ABusyServerIsNotTrimmedBetweenRequests) {
  // A decode loop: requests admitted back to back, each answered before the next, so nothing is
  // in flight at most ticks. Trimming then would stall its allocations. (50 ms ticks: the loop
  // below would have to be descheduled for a whole tick to look idle.)
  FakeServer server;
  IdleTrimmer trimmer(server.Hooks(), absl::Milliseconds(50));
  const absl::Time end = absl::Now() + absl::Milliseconds(300);
  while (absl::Now() < end) {
    server.admissions.fetch_add(1);
    std::this_thread::yield();
  }
  EXPECT_EQ(server.trims.load(), 0);
  // The loop has stopped: the next quiet ticks trim.
  ASSERT_TRUE(WaitFor([&] { return server.trims.load() == IdleTrimmer::kTrimsPerIdlePeriod; }));
}

TEST(IdleTrimmer, TheDefaultTrimIsGlibcsAndStopsPromptly) {
  FakeServer server;
  IdleTrimmer::Hooks hooks = server.Hooks();
  hooks.trim = nullptr;  // malloc_trim(0)
  IdleTrimmer trimmer(hooks, kTick);
  server.admissions = 1;
  ASSERT_TRUE(WaitFor([&] { return trimmer.trims() >= 1; }));
}

}  // namespace
}  // namespace samplerd::core
