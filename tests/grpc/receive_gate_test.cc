// ReceiveGate alone: how many messages its budget lets in, first come first served, and calls
// that leave the queue.
#include "service/grpc/receive_gate.h"

#include <gtest/gtest.h>

#include <vector>

namespace samplerd::grpc_transport {
namespace {

// Records the order of the grants it sees.
class Recorder : public ReceiveGate::Waiter {
 public:
  Recorder(int id, std::vector<int>* log) : id_(id), log_(log) {}
  void OnReceiveGranted() override { log_->push_back(id_); }

 private:
  const int id_;
  std::vector<int>* const log_;
};

TEST(ReceiveGate, WithoutABudgetEveryCallIsLetInAtOnce) {
  ReceiveGate gate(/*budget_bytes=*/0, /*share_bytes=*/64);
  std::vector<int> log;
  Recorder a(1, &log);
  for (int i = 0; i < 1000; ++i) EXPECT_TRUE(gate.Acquire(&a));
  EXPECT_EQ(gate.max_shares(), 0);
  EXPECT_EQ(gate.waiting(), 0);
  for (int i = 0; i < 1000; ++i) gate.Release();
  EXPECT_TRUE(log.empty());
}

TEST(ReceiveGate, EachMessageCountsAsTheLargestOneAndAtLeastOneFits) {
  EXPECT_EQ(ReceiveGate(100, 30).max_shares(), 3);
  EXPECT_EQ(ReceiveGate(90, 30).max_shares(), 3);
  EXPECT_EQ(ReceiveGate(89, 30).max_shares(), 2);
  EXPECT_EQ(ReceiveGate(10, 30).max_shares(), 1);
}

TEST(ReceiveGate, CallsBeyondTheBudgetWaitAndAreLetInInArrivalOrder) {
  ReceiveGate gate(/*budget_bytes=*/128, /*share_bytes=*/64);
  std::vector<int> log;
  Recorder a(1, &log), b(2, &log), c(3, &log), d(4, &log);
  EXPECT_TRUE(gate.Acquire(&a));
  EXPECT_TRUE(gate.Acquire(&b));
  EXPECT_FALSE(gate.Acquire(&c));
  EXPECT_FALSE(gate.Acquire(&d));
  EXPECT_EQ(gate.held(), 2);
  EXPECT_EQ(gate.waiting(), 2);

  gate.Release();  // a's share passes to c
  EXPECT_EQ(log, (std::vector<int>{3}));
  EXPECT_EQ(gate.held(), 2);
  gate.Release();  // b's to d
  EXPECT_EQ(log, (std::vector<int>{3, 4}));
  EXPECT_EQ(gate.waiting(), 0);
  gate.Release();
  gate.Release();
  EXPECT_EQ(gate.held(), 0);
}

TEST(ReceiveGate, ANewCallQueuesBehindWaitingOnesEvenWhenAShareIsFree) {
  ReceiveGate gate(/*budget_bytes=*/64, /*share_bytes=*/64);
  std::vector<int> log;
  Recorder a(1, &log), b(2, &log), c(3, &log);
  EXPECT_TRUE(gate.Acquire(&a));
  EXPECT_FALSE(gate.Acquire(&b));
  gate.Release();  // to b, not to whoever asks next
  EXPECT_FALSE(gate.Acquire(&c));
  EXPECT_EQ(log, (std::vector<int>{2}));
}

TEST(ReceiveGate, ACancelledWaiterLeavesTheQueueAndIsNeverLetIn) {
  ReceiveGate gate(/*budget_bytes=*/64, /*share_bytes=*/64);
  std::vector<int> log;
  Recorder a(1, &log), b(2, &log), c(3, &log);
  EXPECT_TRUE(gate.Acquire(&a));
  EXPECT_FALSE(gate.Acquire(&b));
  EXPECT_FALSE(gate.Acquire(&c));
  EXPECT_TRUE(gate.Cancel(&b));
  EXPECT_FALSE(gate.Cancel(&b));  // gone already
  EXPECT_FALSE(gate.Cancel(&a));  // a holds its share: it must Release
  gate.Release();
  EXPECT_EQ(log, (std::vector<int>{3}));
  gate.Release();
  EXPECT_EQ(gate.held(), 0);
  EXPECT_EQ(gate.waiting(), 0);
}

}  // namespace
}  // namespace samplerd::grpc_transport
