// The gRPC SamplerService: thin reactors over SamplerCore. Reactors never block; sampling runs
// on the core's device executor, which finishes the call.
#ifndef SAMPLERD_SERVICE_GRPC_SAMPLER_SERVICE_H_
#define SAMPLERD_SERVICE_GRPC_SAMPLER_SERVICE_H_

#include <grpcpp/grpcpp.h>

#include "samplerd/v1/sampler.grpc.pb.h"
#include "service/core/sampler_core.h"

namespace samplerd::grpc_transport {

// Region RPCs (and requests that name a region) are served to unix-socket clients, and to TCP
// clients only with `allow_remote_regions` (peer.h); others get PERMISSION_DENIED. Registration
// maps the memory on the calling gRPC thread (a few system calls for host shm, a runtime call
// for GPU IPC): rare, and never on the sampling path.
class SamplerServiceImpl final : public v1::SamplerService::CallbackService {
 public:
  // `core` must outlive the service and every call on it.
  SamplerServiceImpl(core::SamplerCore* core, bool allow_remote_regions)
      : core_(core), allow_remote_regions_(allow_remote_regions) {}

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

 private:
  core::SamplerCore* core_;
  const bool allow_remote_regions_;
};

}  // namespace samplerd::grpc_transport

#endif  // SAMPLERD_SERVICE_GRPC_SAMPLER_SERVICE_H_
