// The gRPC SamplerService: thin reactors over SamplerCore. Reactors never block; sampling runs
// on the core's device executor, which finishes the call.
#ifndef SAMPLERD_SERVICE_GRPC_SAMPLER_SERVICE_H_
#define SAMPLERD_SERVICE_GRPC_SAMPLER_SERVICE_H_

#include <grpcpp/grpcpp.h>

#include <mutex>

#include "absl/time/time.h"
#include "samplerd/v1/sampler.grpc.pb.h"
#include "service/core/sampler_core.h"
#include "service/grpc/peer.h"
#include "service/grpc/raw_message.h"
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
// with that status after the steps before them are answered.
using RawSamplerService = v1::SamplerService::WithRawCallbackMethod_Sample<
    v1::SamplerService::WithRawCallbackMethod_SampleStream<
        v1::SamplerService::WithRawCallbackMethod_RegisterRegion<
            v1::SamplerService::WithRawCallbackMethod_UnregisterRegion<
                v1::SamplerService::WithRawCallbackMethod_ListRegions<
                    v1::SamplerService::WithRawCallbackMethod_GetServerInfo<
                        v1::SamplerService::WithRawCallbackMethod_DeviceSession<
                            v1::SamplerService::Service>>>>>>>;

class SamplerServiceImpl final : public RawSamplerService {
 public:
  // `core` must outlive the service and every call on it; so must `metrics` (null: none) and
  // `peers` (null: no caller is known, and regions are registered without an owner).
  // `max_message_bytes` is the server's message size limit; `chunk_timeout` (> 0) bounds each
  // chunked SampleStream step (SampleStreamReactor). GetServerInfo reports both.
  SamplerServiceImpl(core::SamplerCore* core, bool allow_remote_regions, int64_t max_message_bytes,
                     absl::Duration chunk_timeout, metrics::SamplerMetrics* metrics = nullptr,
                     const PeerTable* peers = nullptr);
  ~SamplerServiceImpl() override;

  // Each unary method: a samplerd.v1 request in `request`, its response written to `response`.
  grpc::ServerUnaryReactor* Sample(grpc::CallbackServerContext* context,
                                   const grpc::ByteBuffer* request,
                                   grpc::ByteBuffer* response) override;
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* SampleStream(
      grpc::CallbackServerContext* context) override;
  grpc::ServerUnaryReactor* RegisterRegion(grpc::CallbackServerContext* context,
                                           const grpc::ByteBuffer* request,
                                           grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* UnregisterRegion(grpc::CallbackServerContext* context,
                                             const grpc::ByteBuffer* request,
                                             grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* ListRegions(grpc::CallbackServerContext* context,
                                        const grpc::ByteBuffer* request,
                                        grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* GetServerInfo(grpc::CallbackServerContext* context,
                                          const grpc::ByteBuffer* request,
                                          grpc::ByteBuffer* response) override;
  // Served like the region calls (a session names regions). Not counted in metrics yet.
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* DeviceSession(
      grpc::CallbackServerContext* context) override;

 private:
  // Counts `status` for `method`, then answers `call` with it.
  void Finish(RawUnaryCall* call, metrics::Method method, grpc::Status status);
  // Parses `call`'s request from `raw`; when it does not parse, answers (and counts)
  // INVALID_ARGUMENT and returns false.
  bool Parse(RawUnaryCall* call, const grpc::ByteBuffer* raw, metrics::Method method);
  // Recounts the registered regions into the region gauges (after a change).
  void UpdateRegionGauges();

  core::SamplerCore* core_;
  const bool allow_remote_regions_;
  const int64_t max_message_bytes_;
  const absl::Duration chunk_timeout_;
  metrics::SamplerMetrics* const metrics_;
  const PeerTable* const peers_;
  std::mutex regions_gauge_mu_;  // orders recounts, so that the last one set wins
};

}  // namespace samplerd::grpc_transport

#endif  // SAMPLERD_SERVICE_GRPC_SAMPLER_SERVICE_H_
