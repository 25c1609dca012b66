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
                                          const v1::RegisterRegionRequest& request,
                                          int64_t owner_pid) {
  switch (request.kind_case()) {
    case v1::RegisterRegionRequest::kHostShm: {
      const v1::HostShmRegion& shm = request.host_shm();
      return regions->RegisterHostShm(request.name(), shm.key(), shm.offset(), shm.byte_size(),
                                      owner_pid);
    }
    case v1::RegisterRegionRequest::kGpuIpc: {
      const v1::GpuIpcRegion& ipc = request.gpu_ipc();
      return regions->RegisterGpuIpc(request.name(), ipc.memory_handle(), ipc.offset(),
                                     ipc.byte_size(), ipc.device(), owner_pid);
    }
    case v1::RegisterRegionRequest::KIND_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError(
      "expected host_shm or gpu_ipc in RegisterRegionRequest, got neither");
}

}  // namespace

SamplerServiceImpl::SamplerServiceImpl(core::SamplerCore* core, bool allow_remote_regions,
                                       int64_t max_message_bytes, absl::Duration chunk_timeout,
                                       metrics::SamplerMetrics* metrics, const PeerTable* peers)
    : core_(core),
      allow_remote_regions_(allow_remote_regions),
      max_message_bytes_(max_message_bytes),
      chunk_timeout_(chunk_timeout),
      metrics_(metrics),
      peers_(peers) {
  // An owner's exit unregisters regions behind the service's back: recount them.
  core_->regions().SetOwnerExitListener([this](int64_t, int) { UpdateRegionGauges(); });
}

SamplerServiceImpl::~SamplerServiceImpl() { core_->regions().SetOwnerExitListener(nullptr); }

void SamplerServiceImpl::Finish(RawUnaryCall* call, Method method, grpc::Status status) {
  if (metrics_ != nullptr) {
    metrics_->CountRequest(method, static_cast<absl::StatusCode>(status.error_code()));
  }
  call->Reply(std::move(status));
}

bool SamplerServiceImpl::Parse(RawUnaryCall* call, const grpc::ByteBuffer* raw, Method method) {
  const absl::Status status = call->ParseRequest(*raw);
  if (status.ok()) return true;
  Finish(call, method, ToGrpcStatus(status));
  return false;
}

void SamplerServiceImpl::UpdateRegionGauges() {
  if (metrics_ == nullptr) return;
  std::lock_guard<std::mutex> lock(regions_gauge_mu_);
  metrics::RegionTotals host_shm, gpu_ipc;
  for (const core::RegionInfo& info : core_->regions().List()) {
    metrics::RegionTotals& totals = info.kind == core::RegionKind::kGpuIpc ? gpu_ipc : host_shm;
    ++totals.count;
    totals.bytes += info.byte_size;
  }
  metrics_->SetRegions(host_shm, gpu_ipc);
}

grpc::ServerUnaryReactor* SamplerServiceImpl::Sample(grpc::CallbackServerContext* context,
                                                     const grpc::ByteBuffer* raw_request,
                                                     grpc::ByteBuffer* raw_response) {
  auto* call = new UnaryCall<v1::SampleRequest, v1::SampleResponse>(raw_response);
  if (!Parse(call, raw_request, Method::kSample)) return call;
  // The core request views the inline bytes of call->request, which lives until the call ends.
  core::SampleRequest core_request;
  absl::Status status = FromProto(call->request, &core_request);
  if (status.ok() && UsesRegions(call->request)) {
    status = CheckRegionPeer(context->peer(), allow_remote_regions_);
  }
  if (!status.ok()) {
    Finish(call, Method::kSample, ToGrpcStatus(status));
    return call;
  }
  core_request.deadline = DeadlineOf(*context);
  core_request.is_cancelled = [context] { return context->IsCancelled(); };

  status = core_->SampleAsync(std::move(core_request),
                              [this, call](absl::StatusOr<core::SampleResult> result) {
                                if (!result.ok()) {
                                  Finish(call, Method::kSample, ToGrpcStatus(result.status()));
                                  return;
                                }
                                ToProto(*result, &call->response);
                                Finish(call, Method::kSample, grpc::Status::OK);
                              });
  if (!status.ok()) Finish(call, Method::kSample, ToGrpcStatus(status));
  return call;
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* SamplerServiceImpl::SampleStream(
    grpc::CallbackServerContext* context) {
  return new SampleStreamReactor(core_, context, allow_remote_regions_, metrics_, chunk_timeout_);
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* SamplerServiceImpl::DeviceSession(
    grpc::CallbackServerContext* context) {
  return new DeviceSessionReactor(&core_->sessions(), context, allow_remote_regions_);
}

grpc::ServerUnaryReactor* SamplerServiceImpl::RegisterRegion(grpc::CallbackServerContext* context,
                                                             const grpc::ByteBuffer* raw_request,
                                                             grpc::ByteBuffer* raw_response) {
  auto* call = new UnaryCall<v1::RegisterRegionRequest, v1::RegisterRegionResponse>(raw_response);
  if (!Parse(call, raw_request, Method::kRegisterRegion)) return call;
  absl::Status status = CheckRegionPeer(context->peer(), allow_remote_regions_);
  if (!status.ok()) {
    Finish(call, Method::kRegisterRegion, ToGrpcStatus(status));
    return call;
  }
  const int64_t owner_pid = peers_ != nullptr ? peers_->PidOf(context->peer()) : 0;
  absl::StatusOr<core::RegionInfo> info = Register(&core_->regions(), call->request, owner_pid);
  if (!info.ok()) {
    Finish(call, Method::kRegisterRegion, ToGrpcStatus(info.status()));
    return call;
  }
  UpdateRegionGauges();
  ToProto(*info, call->response.mutable_region());
  Finish(call, Method::kRegisterRegion, grpc::Status::OK);
  return call;
}

grpc::ServerUnaryReactor* SamplerServiceImpl::UnregisterRegion(grpc::CallbackServerContext* context,
                                                               const grpc::ByteBuffer* raw_request,
                                                               grpc::ByteBuffer* raw_response) {
  auto* call =
      new UnaryCall<v1::UnregisterRegionRequest, v1::UnregisterRegionResponse>(raw_response);
  if (!Parse(call, raw_request, Method::kUnregisterRegion)) return call;
  absl::Status status = CheckRegionPeer(context->peer(), allow_remote_regions_);
  if (status.ok()) status = core_->regions().Unregister(call->request.name());
  if (status.ok()) UpdateRegionGauges();
  Finish(call, Method::kUnregisterRegion, ToGrpcStatus(status));
  return call;
}

grpc::ServerUnaryReactor* SamplerServiceImpl::ListRegions(grpc::CallbackServerContext* context,
                                                          const grpc::ByteBuffer* raw_request,
                                                          grpc::ByteBuffer* raw_response) {
  auto* call = new UnaryCall<v1::ListRegionsRequest, v1::ListRegionsResponse>(raw_response);
  if (!Parse(call, raw_request, Method::kListRegions)) return call;
  absl::Status status = CheckRegionPeer(context->peer(), allow_remote_regions_);
  if (!status.ok()) {
    Finish(call, Method::kListRegions, ToGrpcStatus(status));
    return call;
  }
  for (const core::RegionInfo& info : core_->regions().List()) {
    ToProto(info, call->response.add_regions());
  }
  Finish(call, Method::kListRegions, grpc::Status::OK);
  return call;
}

grpc::ServerUnaryReactor* SamplerServiceImpl::GetServerInfo(grpc::CallbackServerContext*,
                                                            const grpc::ByteBuffer* raw_request,
                                                            grpc::ByteBuffer* raw_response) {
  auto* call = new UnaryCall<v1::GetServerInfoRequest, v1::GetServerInfoResponse>(raw_response);
  if (!Parse(call, raw_request, Method::kGetServerInfo)) return call;
  ToProto(core_->Info(), max_message_bytes_, chunk_timeout_, &call->response);
  Finish(call, Method::kGetServerInfo, grpc::Status::OK);
  return call;
}

}  // namespace samplerd::grpc_transport
