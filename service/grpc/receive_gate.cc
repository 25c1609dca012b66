#include "service/grpc/receive_gate.h"

#include <algorithm>

namespace samplerd::grpc_transport {

ReceiveGate::ReceiveGate(int64_t budget_bytes, int64_t share_bytes)
    : budget_bytes_(budget_bytes),
      max_shares_(budget_bytes <= 0 ? 0 : std::max<int64_t>(1, budget_bytes / share_bytes)) {}

bool ReceiveGate::Acquire(Waiter* waiter) {
  std::lock_guard<std::mutex> lock(mu_);
  if (max_shares_ == 0 || (held_ < max_shares_ && waiters_.empty())) {
    ++held_;
    return true;
  }
  waiters_.push_back(waiter);
  return false;
}

bool ReceiveGate::Cancel(Waiter* waiter) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = std::find(waiters_.begin(), waiters_.end(), waiter);
  if (it == waiters_.end()) return false;
  waiters_.erase(it);
  return true;
}

void ReceiveGate::Release() {
  Waiter* next = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (waiters_.empty()) {
      --held_;
      return;
    }
    next = waiters_.front();  // the share passes to it: held_ stays
    waiters_.pop_front();
  }
  next->OnReceiveGranted();
}

int64_t ReceiveGate::held() const {
  std::lock_guard<std::mutex> lock(mu_);
  return held_;
}

int64_t ReceiveGate::waiting() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(waiters_.size());
}

}  // namespace samplerd::grpc_transport
