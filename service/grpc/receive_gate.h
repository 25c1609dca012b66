// ReceiveGate: the budget of request bytes the server receives at once before admission
// (--max_receive_bytes).
//
// Why: gRPC reads a unary call's whole message before any handler runs, so admission
// (--max_inflight, --max_inflight_bytes) comes too late to bound what a burst costs: 32
// concurrent 64 MiB Sample requests took a CPU server to a peak RSS of 1.4 GiB with
// --max_inflight=2 (tests/bench/RECEIVE_BURST_RESULTS.md). With a budget, SamplerService's
// unary methods are therefore served as streams (gated_unary_call.h) that start reading their
// message only once they hold a share of it; the others wait, in arrival order, without failing
// (backpressure: a waiting call's unread bytes stay in the client, beyond gRPC's flow-control
// window). Without one, the service does not use the gate. gRPC's own ResourceQuota bounds that
// memory too, but by resetting arbitrary streams, an engine's idle SampleStream included (same
// file), so it is not used.
#ifndef SAMPLERD_SERVICE_GRPC_RECEIVE_GATE_H_
#define SAMPLERD_SERVICE_GRPC_RECEIVE_GATE_H_

#include <cstdint>
#include <deque>
#include <mutex>

namespace samplerd::grpc_transport {

class ReceiveGate {
 public:
  // A call waiting for a share.
  class Waiter {
   public:
    // Called once, when the waiter holds a share it must Release; on the thread of the Release
    // that freed it, never under the gate's lock.
    virtual void OnReceiveGranted() = 0;

   protected:
    ~Waiter() = default;
  };

  // `budget_bytes`: 0 = no limit (every Acquire succeeds at once); otherwise each message being
  // received holds `share_bytes` of it (the largest message: its size is unknown until it has
  // arrived), so floor(budget_bytes / share_bytes) messages are received at once, at least one.
  // `share_bytes` > 0.
  ReceiveGate(int64_t budget_bytes, int64_t share_bytes);

  ReceiveGate(const ReceiveGate&) = delete;
  ReceiveGate& operator=(const ReceiveGate&) = delete;

  // Takes a share for `waiter` and returns true when one is free and nobody waits; otherwise
  // queues `waiter` (first come, first served), returns false, and calls
  // waiter->OnReceiveGranted() once a share is passed to it. `waiter` must stay valid until
  // then or until Cancel returns true. Thread-safe, as are the methods below.
  bool Acquire(Waiter* waiter);

  // Removes a queued `waiter`: returns true when it was waiting (it holds nothing and will not
  // be granted), false when it holds a share or its OnReceiveGranted is under way (it must
  // Release as usual).
  bool Cancel(Waiter* waiter);

  // Gives back a share (taken by Acquire or granted); passes it to the first waiter, if any.
  void Release();

  // The budget in bytes (0: no limit), and the messages that may be received at once (0: no
  // limit).
  int64_t budget_bytes() const { return budget_bytes_; }
  int64_t max_shares() const { return max_shares_; }
  // Shares held and calls waiting now.
  int64_t held() const;
  int64_t waiting() const;

 private:
  const int64_t budget_bytes_;
  const int64_t max_shares_;
  mutable std::mutex mu_;
  int64_t held_ = 0;
  std::deque<Waiter*> waiters_;
};

}  // namespace samplerd::grpc_transport

#endif  // SAMPLERD_SERVICE_GRPC_RECEIVE_GATE_H_
