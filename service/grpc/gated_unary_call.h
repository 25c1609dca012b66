// GatedUnaryCall: one call of a unary SamplerService method, served as a stream on the server
// so that its request is read only once the ReceiveGate lets it (receive_gate.h). Used only with
// --max_receive_bytes; without it the unary methods are plain raw unary methods (UnaryCall,
// raw_message.h) and none of this runs.
//
// gRPC 1.51 reads a unary method's whole request before it runs any handler; for a streaming
// method it reads nothing until the reactor asks. The wire protocol does not say which a method
// is (one message each way, then the status), so clients see a unary method as before.
// With a budget, SamplerServiceImpl registers each unary method this way (MarkMethodStreamed,
// then MarkMethodRawCallback), and each call:
//   1. waits for a share of the gate (FIFO); its unread bytes stay in the client meanwhile;
//   2. reads one message, parses it (raw_message.h) and frees the received bytes at once, so
//      that an admitted request holds only its parsed copy;
//   3. gives the share back and hands the request (or the parse error) to the method.
// A call cancelled while it waits (deadline, client gone, server shutdown) leaves the queue and
// is finished CANCELLED without being counted. A call whose request has not arrived
// `receive_timeout` after its turn came (a client that stalls mid-message, or opens the call and
// sends nothing) is answered DEADLINE_EXCEEDED and its share passes on, so that one client
// cannot hold the budget for ever. A second request message, which only a broken client sends,
// is never read.
//
// What it costs: a call is a stream to gRPC, with an extra reaction (the read after the call is
// set up): +6% and +13% p50 round trip for a 128 KB Sample in two measurements on the 2-core VM;
// at 4 MB +9% and -9%, where the allocator's behaviour dominates
// (tests/bench/RECEIVE_BURST_RESULTS.md). A server without a budget pays none of it.
#ifndef SAMPLERD_SERVICE_GRPC_GATED_UNARY_CALL_H_
#define SAMPLERD_SERVICE_GRPC_GATED_UNARY_CALL_H_

#include <grpcpp/alarm.h>
#include <grpcpp/grpcpp.h>

#include <functional>
#include <mutex>
#include <utility>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "service/grpc/raw_message.h"
#include "service/grpc/receive_gate.h"

namespace samplerd::grpc_transport {

class RawGatedUnaryCall : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>,
                          private ReceiveGate::Waiter {
 public:
  // Called once per call that was not cancelled before its message arrived: `parsed` is OK (the
  // request is in the call) or INVALID_ARGUMENT (no message, or one that does not parse: the
  // callee answers it). Runs on a gRPC thread; may reply later, from any thread.
  using OnRequest = std::function<void(RawGatedUnaryCall* call, const absl::Status& parsed)>;

  // Serializes the response when `status` is OK (a failure to serialize becomes the status),
  // then finishes the call. Called once, from any thread.
  void Reply(grpc::Status status);

  void OnReadDone(bool ok) override;
  void OnCancel() override;
  // Deletes the call, or leaves that to the receive deadline's callback still to run.
  void OnDone() override;

 protected:
  // `gate` and `context` must outlive the call. `receive_timeout`: how long the request may take
  // to arrive once its turn came; absl::InfiniteDuration() for no limit.
  RawGatedUnaryCall(grpc::CallbackServerContext* context, ReceiveGate* gate,
                    absl::Duration receive_timeout, OnRequest on_request)
      : context_(context),
        gate_(gate),
        receive_timeout_(receive_timeout),
        on_request_(std::move(on_request)) {}
  ~RawGatedUnaryCall() override = default;

  // Takes a share of the gate or queues for one; the most derived constructor calls it last.
  void Start();

 private:
  // Parses the request out of `raw` (consumed).
  virtual absl::Status ParseRequest(grpc::ByteBuffer* raw) = 0;
  virtual absl::Status SerializeResponse(grpc::ByteBuffer* raw) const = 0;

  // Starts the read, then the receive deadline. Runs on the thread of a Release (another call's),
  // so the call may complete and OnDone run while it does: the last of them deletes the call.
  void OnReceiveGranted() override;
  // The receive deadline's callback, run once on gRPC's executor when it passed (`fired`) or was
  // cancelled; answers the call DEADLINE_EXCEEDED when its request is still arriving.
  void OnReceiveDeadline(bool fired);

  grpc::CallbackServerContext* const context_;
  ReceiveGate* const gate_;
  const absl::Duration receive_timeout_;
  const OnRequest on_request_;
  grpc::ByteBuffer raw_request_;
  grpc::ByteBuffer raw_response_;
  std::mutex mu_;
  // The receive deadline while the request is arriving (null: none). As in SampleStreamReactor,
  // it is set and cancelled with mu_ held (gRPC never runs its callback inside Set or Cancel)
  // and deleted by its own callback without mu_ (~Alarm may drop gRPC's last reference).
  grpc::Alarm* receive_alarm_ = nullptr;
  bool alarm_pending_ = false;  // its callback is still to run; it may delete this
  bool granting_ = false;       // OnReceiveGranted is running; it may delete this
  bool read_done_ = false;
  bool expired_ = false;  // answered DEADLINE_EXCEEDED by the deadline
  bool done_ = false;     // OnDone has run: the call goes once no alarm or grant is pending
};

template <typename Request, typename Response>
class GatedUnaryCall final : public RawGatedUnaryCall {
 public:
  // Starts the call (RawGatedUnaryCall); gRPC owns it once the method's handler returns it.
  GatedUnaryCall(grpc::CallbackServerContext* context, ReceiveGate* gate,
                 absl::Duration receive_timeout, OnRequest on_request)
      : RawGatedUnaryCall(context, gate, receive_timeout, std::move(on_request)) {
    Start();
  }

  Request request;
  Response response;

 private:
  absl::Status ParseRequest(grpc::ByteBuffer* raw) override { return ParseMessage(raw, &request); }
  absl::Status SerializeResponse(grpc::ByteBuffer* raw) const override {
    return SerializeMessage(response, raw);
  }
};

}  // namespace samplerd::grpc_transport

#endif  // SAMPLERD_SERVICE_GRPC_GATED_UNARY_CALL_H_
