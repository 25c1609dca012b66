// The gRPC SamplerService: thin reactors over SamplerCore. Reactors never block; sampling runs
// on the core's device executor, which finishes the call.
#ifndef SAMPLERD_SERVICE_GRPC_SAMPLER_SERVICE_H_
#define SAMPLERD_SERVICE_GRPC_SAMPLER_SERVICE_H_

#include <grpcpp/grpcpp.h>

#include <mutex>

#include "samplerd/v1/sampler.grpc.pb.h"
#include "service/core/sampler_core.h"
#include "service/grpc/convert.h"
#include "service/grpc/peer.h"
#include "service/grpc/receive_gate.h"
#include "service/metrics/sampler_metrics.h"

namespace samplerd::grpc_transport {

// Region RPCs (and requests that name a region) are served to unix-socket clients, and to TCP
// clients only with `allow_remote_regions` (peer.h); others get PERMISSION_DENIED. Registration
// maps the memory on the calling gRPC thread (a few system calls for host shm, a runtime call
// for GPU IPC): rare, and never on the sampling path. A region registered over a unix socket
// is bound to the calling process (its pid from `peers`): the registry releases it when that
// process exits. Over TCP it has no owner and stays until UnregisterRegion.
//
// With metrics, every answered call is counted by method and code (samplerd_requests_total;
// SampleStream per step) and the region gauges follow registrations.
// Every method is registered raw (grpc::ByteBuffer in and out) and parses its own request
// (raw_message.h): bytes that do not parse are INVALID_ARGUMENT with a message, and end a stream
// with that status after the steps before them are answered. SampleStream and DeviceSession are
// raw callback streams. The unary methods are raw callback unary methods (UnaryCall) without a
// receive budget, so such a server serves them as gRPC's generated code would; with one
// (--max_receive_bytes), they are raw callback streams on the server's side (GatedUnaryCall),
// so that their requests are read only within the ReceiveGate's budget. The constructor
// registers them one way or the other.
using RawSamplerService = v1::SamplerService::WithRawCallbackMethod_SampleStream<
    v1::SamplerService::WithRawCallbackMethod_DeviceSession<v1::SamplerService::Service>>;

class SamplerServiceImpl final : public RawSamplerService {
 public:
  // `core` must outlive the service and every call on it; so must `metrics` (null: none) and
  // `peers` (null: no caller is known, and regions are registered without an owner).
  // `limits` are the transport's: the message size limit, the receive budget of the unary
  // methods' requests (0: none, and the unary methods are plain unary methods), and the deadline
  // of each chunked SampleStream step (SampleStreamReactor) and, with a budget, of a unary
  // request's arrival once its turn came. GetServerInfo reports them.
  SamplerServiceImpl(core::SamplerCore* core, bool allow_remote_regions,
                     const TransportLimits& limits, metrics::SamplerMetrics* metrics = nullptr,
                     const PeerTable* peers = nullptr);
  ~SamplerServiceImpl() override;

  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* SampleStream(
      grpc::CallbackServerContext* context) override;
  // Served like the region calls (a session names regions). Not counted in metrics yet.
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* DeviceSession(
      grpc::CallbackServerContext* context) override;

  // The budget the unary methods' requests are received within (unused without one).
  const ReceiveGate& receive_gate() const { return receive_gate_; }

 private:
  // Registers the unary method `name`, counted as `method`: a raw callback unary method without
  // a receive budget, a gated raw callback stream with one. Each call parses its request
  // (Request) and runs serve(context, call) with it, `call` a UnaryCall<Request, Response> or a
  // GatedUnaryCall<Request, Response>; a request that does not parse is answered (and counted)
  // INVALID_ARGUMENT instead.
  template <typename Request, typename Response, typename Serve>
  void AddUnaryMethod(const char* name, metrics::Method method, Serve serve);

  // The unary methods, on a call whose request (call->request) has arrived and parsed; each
  // answers it through Finish, now or from the core's executor. `Call` is a UnaryCall or a
  // GatedUnaryCall (AddUnaryMethod).
  template <typename Call>
  void ServeSample(grpc::CallbackServerContext* context, Call* call);
  template <typename Call>
  void ServeRegisterRegion(grpc::CallbackServerContext* context, Call* call);
  template <typename Call>
  void ServeUnregisterRegion(grpc::CallbackServerContext* context, Call* call);
  template <typename Call>
  void ServeListRegions(grpc::CallbackServerContext* context, Call* call);
  template <typename Call>
  void ServeGetServerInfo(grpc::CallbackServerContext* context, Call* call);

  // Counts `status` for `method`, then answers `call` (a UnaryCall or GatedUnaryCall) with it.
  template <typename Call>
  void Finish(Call* call, metrics::Method method, grpc::Status status);
  // Recounts the registered regions into the region gauges (after a change).
  void UpdateRegionGauges();

  core::SamplerCore* core_;
  const bool allow_remote_regions_;
  const TransportLimits limits_;
  ReceiveGate receive_gate_;
  metrics::SamplerMetrics* const metrics_;
  const PeerTable* const peers_;
  std::mutex regions_gauge_mu_;  // orders recounts, so that the last one set wins
};

}  // namespace samplerd::grpc_transport

#endif  // SAMPLERD_SERVICE_GRPC_SAMPLER_SERVICE_H_
