// The gRPC SamplerService: thin reactors over SamplerCore. Reactors never block; sampling runs
// on the core's device executor, which finishes the call.
#ifndef SAMPLERD_SERVICE_GRPC_SAMPLER_SERVICE_H_
#define SAMPLERD_SERVICE_GRPC_SAMPLER_SERVICE_H_

#include <grpcpp/grpcpp.h>

#include <mutex>

#include "samplerd/v1/sampler.grpc.pb.h"
#include "service/core/sampler_core.h"
#include "service/metrics/sampler_metrics.h"

namespace samplerd::grpc_transport {

// Region RPCs (and requests that name a region) are served to unix-socket clients, and to TCP
// clients only with `allow_remote_regions` (peer.h); others get PERMISSION_DENIED. Registration
// maps the memory on the calling gRPC thread (a few system calls for host shm, a runtime call
// for GPU IPC): rare, and never on the sampling path.
//
// With metrics, every answered call is counted by method and code (samplerd_requests_total;
// SampleStream per step) and the region gauges follow registrations.
class SamplerServiceImpl final : public v1::SamplerService::CallbackService {
 public:
  // `core` must outlive the service and every call on it; so must `metrics` (null: none).
  // `max_message_bytes` is the server's message size limit, which GetServerInfo reports.
  SamplerServiceImpl(core::SamplerCore* core, bool allow_remote_regions, int64_t max_message_bytes,
                     metrics::SamplerMetrics* metrics = nullptr)
      : core_(core),
        allow_remote_regions_(allow_remote_regions),
        max_message_bytes_(max_message_bytes),
        metrics_(metrics) {}

  grpc::ServerUnaryReactor* Sample(grpc::CallbackServerContext* context,
                                   const v1::SampleRequest* request,
                                   v1::SampleResponse* response) override;
  grpc::ServerBidiReactor<v1::SampleStreamRequest, v1::SampleStreamResponse>* SampleStream(
      grpc::CallbackServerContext* context) override;
  grpc::ServerUnaryReactor* RegisterRegion(grpc::CallbackServerContext* context,
                                           const v1::RegisterRegionRequest* request,
                                           v1::RegisterRegionResponse* response) override;
  grpc::ServerUnaryReactor* UnregisterRegion(grpc::CallbackServerContext* context,
                                             const v1::UnregisterRegionRequest* request,
                                             v1::UnregisterRegionResponse* response) override;
  grpc::ServerUnaryReactor* ListRegions(grpc::CallbackServerContext* context,
                                        const v1::ListRegionsRequest* request,
                                        v1::ListRegionsResponse* response) override;
  grpc::ServerUnaryReactor* GetServerInfo(grpc::CallbackServerContext* context,
                                          const v1::GetServerInfoRequest* request,
                                          v1::GetServerInfoResponse* response) override;
  // Served like the region calls (a session names regions). Not counted in metrics yet.
  grpc::ServerBidiReactor<v1::DeviceSessionRequest, v1::DeviceSessionResponse>* DeviceSession(
      grpc::CallbackServerContext* context) override;

 private:
  // Counts `status` for `method`, then finishes `reactor` with it.
  void Finish(grpc::ServerUnaryReactor* reactor, metrics::Method method, grpc::Status status);
  // The context's default reactor, finished (and counted) at once.
  grpc::ServerUnaryReactor* FinishNow(grpc::CallbackServerContext* context, metrics::Method method,
                                      grpc::Status status);
  // Recounts the registered regions into the region gauges (after a change).
  void UpdateRegionGauges();

  core::SamplerCore* core_;
  const bool allow_remote_regions_;
  const int64_t max_message_bytes_;
  metrics::SamplerMetrics* const metrics_;
  std::mutex regions_gauge_mu_;  // orders recounts, so that the last one set wins
};

}  // namespace samplerd::grpc_transport

#endif  // SAMPLERD_SERVICE_GRPC_SAMPLER_SERVICE_H_
