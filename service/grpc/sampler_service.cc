#include "service/grpc/sampler_service.h"

#include <utility>

#include "service/grpc/convert.h"
#include "service/grpc/peer.h"
#include "service/grpc/sample_stream_reactor.h"
#include "service/grpc/status_convert.h"

namespace samplerd::grpc_transport {
namespace {

grpc::ServerUnaryReactor* FinishNow(grpc::CallbackServerContext* context, grpc::Status status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(std::move(status));
  return reactor;
}

absl::StatusOr<core::RegionInfo> Register(core::RegionRegistry* regions,
                                          const v1::RegisterRegionRequest& request) {
  switch (request.kind_case()) {
    case v1::RegisterRegionRequest::kHostShm: {
      const v1::HostShmRegion& shm = request.host_shm();
      return regions->RegisterHostShm(request.name(), shm.key(), shm.offset(), shm.byte_size());
    }
    case v1::RegisterRegionRequest::kGpuIpc: {
      const v1::GpuIpcRegion& ipc = request.gpu_ipc();
      return regions->RegisterGpuIpc(request.name(), ipc.memory_handle(), ipc.offset(),
                                     ipc.byte_size(), ipc.device());
    }
    case v1::RegisterRegionRequest::KIND_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError(
      "expected host_shm or gpu_ipc in RegisterRegionRequest, got neither");
}

}  // namespace

grpc::ServerUnaryReactor* SamplerServiceImpl::Sample(grpc::CallbackServerContext* context,
                                                     const v1::SampleRequest* request,
                                                     v1::SampleResponse* response) {
  core::SampleRequest core_request;
  absl::Status status = FromProto(*request, &core_request);
  if (status.ok() && UsesRegions(*request)) {
    status = CheckRegionPeer(context->peer(), allow_remote_regions_);
  }
  if (!status.ok()) return FinishNow(context, ToGrpcStatus(status));
  core_request.is_cancelled = [context] { return context->IsCancelled(); };

  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  status = core_->SampleAsync(std::move(core_request),
                              [reactor, response](absl::StatusOr<core::SampleResult> result) {
                                if (!result.ok()) {
                                  reactor->Finish(ToGrpcStatus(result.status()));
                                  return;
                                }
                                ToProto(*result, response);
                                reactor->Finish(grpc::Status::OK);
                              });
  if (!status.ok()) reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

grpc::ServerBidiReactor<v1::SampleStreamRequest, v1::SampleStreamResponse>*
SamplerServiceImpl::SampleStream(grpc::CallbackServerContext* context) {
  return new SampleStreamReactor(core_, context, allow_remote_regions_);
}

grpc::ServerUnaryReactor* SamplerServiceImpl::RegisterRegion(
    grpc::CallbackServerContext* context, const v1::RegisterRegionRequest* request,
    v1::RegisterRegionResponse* response) {
  absl::Status status = CheckRegionPeer(context->peer(), allow_remote_regions_);
  if (!status.ok()) return FinishNow(context, ToGrpcStatus(status));
  absl::StatusOr<core::RegionInfo> info = Register(&core_->regions(), *request);
  if (!info.ok()) return FinishNow(context, ToGrpcStatus(info.status()));
  ToProto(*info, response->mutable_region());
  return FinishNow(context, grpc::Status::OK);
}

grpc::ServerUnaryReactor* SamplerServiceImpl::UnregisterRegion(
    grpc::CallbackServerContext* context, const v1::UnregisterRegionRequest* request,
    v1::UnregisterRegionResponse*) {
  absl::Status status = CheckRegionPeer(context->peer(), allow_remote_regions_);
  if (status.ok()) status = core_->regions().Unregister(request->name());
  return FinishNow(context, ToGrpcStatus(status));
}

grpc::ServerUnaryReactor* SamplerServiceImpl::ListRegions(grpc::CallbackServerContext* context,
                                                          const v1::ListRegionsRequest*,
                                                          v1::ListRegionsResponse* response) {
  absl::Status status = CheckRegionPeer(context->peer(), allow_remote_regions_);
  if (!status.ok()) return FinishNow(context, ToGrpcStatus(status));
  for (const core::RegionInfo& info : core_->regions().List()) {
    ToProto(info, response->add_regions());
  }
  return FinishNow(context, grpc::Status::OK);
}

grpc::ServerUnaryReactor* SamplerServiceImpl::GetServerInfo(grpc::CallbackServerContext* context,
                                                            const v1::GetServerInfoRequest*,
                                                            v1::GetServerInfoResponse* response) {
  ToProto(core_->Info(), response);
  return FinishNow(context, grpc::Status::OK);
}

}  // namespace samplerd::grpc_transport
