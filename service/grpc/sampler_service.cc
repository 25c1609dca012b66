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
                                       const TransportLimits& limits,
                                       metrics::SamplerMetrics* metrics, const PeerTable* peers)
    : core_(core),
      allow_remote_regions_(allow_remote_regions),
      limits_(limits),
      receive_gate_(limits.max_receive_bytes, limits.max_message_bytes),
      metrics_(metrics),
      peers_(peers) {
  RegisterUnary("Sample", [this](grpc::CallbackServerContext* c) { return Sample(c); });
  RegisterUnary("RegisterRegion",
                [this](grpc::CallbackServerContext* c) { return RegisterRegion(c); });
  RegisterUnary("UnregisterRegion",
                [this](grpc::CallbackServerContext* c) { return UnregisterRegion(c); });
  RegisterUnary("ListRegions", [this](grpc::CallbackServerContext* c) { return ListRegions(c); });
  RegisterUnary("GetServerInfo",
                [this](grpc::CallbackServerContext* c) { return GetServerInfo(c); });
  // An owner's exit unregisters regions behind the service's back: recount them.
  core_->regions().SetOwnerExitListener([this](int64_t, int) { UpdateRegionGauges(); });
}

SamplerServiceImpl::~SamplerServiceImpl() { core_->regions().SetOwnerExitListener(nullptr); }

void SamplerServiceImpl::RegisterUnary(
    const char* name, std::function<UnaryReactor*(grpc::CallbackServerContext*)> make) {
  // The generated service numbers its methods in the order of the .proto.
  const google::protobuf::MethodDescriptor* method = v1::SampleRequest::descriptor()
                                                         ->file()
                                                         ->FindServiceByName("SamplerService")
                                                         ->FindMethodByName(name);
  // A stream to gRPC, which then reads no message before the reactor asks (the handler given
  // here only makes way for the next line's), and a raw callback method.
  MarkMethodStreamed(method->index(), nullptr);
  MarkMethodRawCallback(
      method->index(),
      new grpc::internal::CallbackBidiHandler<grpc::ByteBuffer, grpc::ByteBuffer>(std::move(make)));
}

template <typename Call>
SamplerServiceImpl::UnaryReactor* SamplerServiceImpl::StartUnary(
    grpc::CallbackServerContext* context, Method method, std::function<void(Call*)> serve) {
  // Without a budget no call waits for another: nothing to time out.
  const absl::Duration receive_timeout =
      receive_gate_.max_shares() == 0 ? absl::InfiniteDuration() : limits_.chunk_timeout;
  return new Call(
      context, &receive_gate_, receive_timeout,
      [this, method, serve = std::move(serve)](RawUnaryCall* call, const absl::Status& parsed) {
        if (!parsed.ok()) {
          Finish(call, method, ToGrpcStatus(parsed));
          return;
        }
        serve(static_cast<Call*>(call));
      });
}

void SamplerServiceImpl::Finish(RawUnaryCall* call, Method method, grpc::Status status) {
  if (metrics_ != nullptr) {
    metrics_->CountRequest(method, static_cast<absl::StatusCode>(status.error_code()));
  }
  call->Reply(std::move(status));
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

SamplerServiceImpl::UnaryReactor* SamplerServiceImpl::Sample(grpc::CallbackServerContext* context) {
  using Call = UnaryCall<v1::SampleRequest, v1::SampleResponse>;
  return StartUnary<Call>(context, Method::kSample, [this, context](Call* call) {
    // The core request views the inline bytes of call->request, which lives until the call
    // ends.
    core::SampleRequest core_request;
    absl::Status status = FromProto(call->request, &core_request);
    if (status.ok() && UsesRegions(call->request)) {
      status = CheckRegionPeer(context->peer(), allow_remote_regions_);
    }
    if (!status.ok()) {
      Finish(call, Method::kSample, ToGrpcStatus(status));
      return;
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
  });
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* SamplerServiceImpl::SampleStream(
    grpc::CallbackServerContext* context) {
  return new SampleStreamReactor(core_, context, allow_remote_regions_, metrics_,
                                 limits_.chunk_timeout);
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* SamplerServiceImpl::DeviceSession(
    grpc::CallbackServerContext* context) {
  return new DeviceSessionReactor(&core_->sessions(), context, allow_remote_regions_);
}

SamplerServiceImpl::UnaryReactor* SamplerServiceImpl::RegisterRegion(
    grpc::CallbackServerContext* context) {
  using Call = UnaryCall<v1::RegisterRegionRequest, v1::RegisterRegionResponse>;
  return StartUnary<Call>(context, Method::kRegisterRegion, [this, context](Call* call) {
    absl::Status status = CheckRegionPeer(context->peer(), allow_remote_regions_);
    if (!status.ok()) {
      Finish(call, Method::kRegisterRegion, ToGrpcStatus(status));
      return;
    }
    const int64_t owner_pid = peers_ != nullptr ? peers_->PidOf(context->peer()) : 0;
    absl::StatusOr<core::RegionInfo> info = Register(&core_->regions(), call->request, owner_pid);
    if (!info.ok()) {
      Finish(call, Method::kRegisterRegion, ToGrpcStatus(info.status()));
      return;
    }
    UpdateRegionGauges();
    ToProto(*info, call->response.mutable_region());
    Finish(call, Method::kRegisterRegion, grpc::Status::OK);
  });
}

SamplerServiceImpl::UnaryReactor* SamplerServiceImpl::UnregisterRegion(
    grpc::CallbackServerContext* context) {
  using Call = UnaryCall<v1::UnregisterRegionRequest, v1::UnregisterRegionResponse>;
  return StartUnary<Call>(context, Method::kUnregisterRegion, [this, context](Call* call) {
    absl::Status status = CheckRegionPeer(context->peer(), allow_remote_regions_);
    if (status.ok()) status = core_->regions().Unregister(call->request.name());
    if (status.ok()) UpdateRegionGauges();
    Finish(call, Method::kUnregisterRegion, ToGrpcStatus(status));
  });
}

SamplerServiceImpl::UnaryReactor* SamplerServiceImpl::ListRegions(
    grpc::CallbackServerContext* context) {
  using Call = UnaryCall<v1::ListRegionsRequest, v1::ListRegionsResponse>;
  return StartUnary<Call>(context, Method::kListRegions, [this, context](Call* call) {
    absl::Status status = CheckRegionPeer(context->peer(), allow_remote_regions_);
    if (!status.ok()) {
      Finish(call, Method::kListRegions, ToGrpcStatus(status));
      return;
    }
    for (const core::RegionInfo& info : core_->regions().List()) {
      ToProto(info, call->response.add_regions());
    }
    Finish(call, Method::kListRegions, grpc::Status::OK);
  });
}

SamplerServiceImpl::UnaryReactor* SamplerServiceImpl::GetServerInfo(
    grpc::CallbackServerContext* context) {
  using Call = UnaryCall<v1::GetServerInfoRequest, v1::GetServerInfoResponse>;
  return StartUnary<Call>(context, Method::kGetServerInfo, [this](Call* call) {
    ToProto(core_->Info(), limits_, &call->response);
    Finish(call, Method::kGetServerInfo, grpc::Status::OK);
  });
}

}  // namespace samplerd::grpc_transport
