#include "service/grpc/sampler_service.h"

#include <utility>

#include "service/grpc/convert.h"
#include "service/grpc/device_session_reactor.h"
#include "service/grpc/peer.h"
#include "service/grpc/sample_stream_reactor.h"
#include "service/grpc/status_convert.h"

namespace samplerd::grpc_transport {
namespace {

using metrics::Method;

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

void SamplerServiceImpl::Finish(grpc::ServerUnaryReactor* reactor, Method method,
                                grpc::Status status) {
  if (metrics_ != nullptr) {
    metrics_->CountRequest(method, static_cast<absl::StatusCode>(status.error_code()));
  }
  reactor->Finish(std::move(status));
}

grpc::ServerUnaryReactor* SamplerServiceImpl::FinishNow(grpc::CallbackServerContext* context,
                                                        Method method, grpc::Status status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  Finish(reactor, method, std::move(status));
  return reactor;
}

void SamplerServiceImpl::UpdateRegionGauges() {
  if (metrics_ == nullptr) return;
  std::lock_guard<std::mutex> lock(regions_gauge_mu_);
  int64_t host_shm = 0;
  int64_t gpu_ipc = 0;
  for (const core::RegionInfo& info : core_->regions().List()) {
    ++(info.kind == core::RegionKind::kGpuIpc ? gpu_ipc : host_shm);
  }
  metrics_->SetRegions(host_shm, gpu_ipc);
}

grpc::ServerUnaryReactor* SamplerServiceImpl::Sample(grpc::CallbackServerContext* context,
                                                     const v1::SampleRequest* request,
                                                     v1::SampleResponse* response) {
  core::SampleRequest core_request;
  absl::Status status = FromProto(*request, &core_request);
  if (status.ok() && UsesRegions(*request)) {
    status = CheckRegionPeer(context->peer(), allow_remote_regions_);
  }
  if (!status.ok()) return FinishNow(context, Method::kSample, ToGrpcStatus(status));
  core_request.deadline = DeadlineOf(*context);
  core_request.is_cancelled = [context] { return context->IsCancelled(); };

  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  status = core_->SampleAsync(std::move(core_request),
                              [this, reactor, response](absl::StatusOr<core::SampleResult> result) {
                                if (!result.ok()) {
                                  Finish(reactor, Method::kSample, ToGrpcStatus(result.status()));
                                  return;
                                }
                                ToProto(*result, response);
                                Finish(reactor, Method::kSample, grpc::Status::OK);
                              });
  if (!status.ok()) Finish(reactor, Method::kSample, ToGrpcStatus(status));
  return reactor;
}

grpc::ServerBidiReactor<v1::SampleStreamRequest, v1::SampleStreamResponse>*
SamplerServiceImpl::SampleStream(grpc::CallbackServerContext* context) {
  return new SampleStreamReactor(core_, context, allow_remote_regions_, metrics_);
}

grpc::ServerBidiReactor<v1::DeviceSessionRequest, v1::DeviceSessionResponse>*
SamplerServiceImpl::DeviceSession(grpc::CallbackServerContext* context) {
  return new DeviceSessionReactor(&core_->sessions(), context, allow_remote_regions_);
}

grpc::ServerUnaryReactor* SamplerServiceImpl::RegisterRegion(
    grpc::CallbackServerContext* context, const v1::RegisterRegionRequest* request,
    v1::RegisterRegionResponse* response) {
  absl::Status status = CheckRegionPeer(context->peer(), allow_remote_regions_);
  if (!status.ok()) return FinishNow(context, Method::kRegisterRegion, ToGrpcStatus(status));
  absl::StatusOr<core::RegionInfo> info = Register(&core_->regions(), *request);
  if (!info.ok()) {
    return FinishNow(context, Method::kRegisterRegion, ToGrpcStatus(info.status()));
  }
  UpdateRegionGauges();
  ToProto(*info, response->mutable_region());
  return FinishNow(context, Method::kRegisterRegion, grpc::Status::OK);
}

grpc::ServerUnaryReactor* SamplerServiceImpl::UnregisterRegion(
    grpc::CallbackServerContext* context, const v1::UnregisterRegionRequest* request,
    v1::UnregisterRegionResponse*) {
  absl::Status status = CheckRegionPeer(context->peer(), allow_remote_regions_);
  if (status.ok()) status = core_->regions().Unregister(request->name());
  if (status.ok()) UpdateRegionGauges();
  return FinishNow(context, Method::kUnregisterRegion, ToGrpcStatus(status));
}

grpc::ServerUnaryReactor* SamplerServiceImpl::ListRegions(grpc::CallbackServerContext* context,
                                                          const v1::ListRegionsRequest*,
                                                          v1::ListRegionsResponse* response) {
  absl::Status status = CheckRegionPeer(context->peer(), allow_remote_regions_);
  if (!status.ok()) return FinishNow(context, Method::kListRegions, ToGrpcStatus(status));
  for (const core::RegionInfo& info : core_->regions().List()) {
    ToProto(info, response->add_regions());
  }
  return FinishNow(context, Method::kListRegions, grpc::Status::OK);
}

grpc::ServerUnaryReactor* SamplerServiceImpl::GetServerInfo(grpc::CallbackServerContext* context,
                                                            const v1::GetServerInfoRequest*,
                                                            v1::GetServerInfoResponse* response) {
  ToProto(core_->Info(), max_message_bytes_, response);
  return FinishNow(context, Method::kGetServerInfo, grpc::Status::OK);
}

}  // namespace samplerd::grpc_transport
