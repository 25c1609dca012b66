#include "service/grpc/sampler_service.h"

#include <utility>

#include "service/grpc/convert.h"
#include "service/grpc/device_session_reactor.h"
#include "service/grpc/gated_unary_call.h"
#include "service/grpc/peer.h"
#include "service/grpc/raw_message.h"
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

template <typename Request, typename Response, typename Serve>
void SamplerServiceImpl::AddUnaryMethod(const char* name, Method method, Serve serve) {
  // The generated service numbers its methods in the order of the .proto.
  const int index = v1::SampleRequest::descriptor()
                        ->file()
                        ->FindServiceByName("SamplerService")
                        ->FindMethodByName(name)
                        ->index();
  // Runs the method on a call whose request has arrived, or answers the parse error.
  auto run = [this, method, serve](grpc::CallbackServerContext* context, auto* call,
                                   const absl::Status& parsed) {
    if (parsed.ok()) {
      serve(context, call);
    } else {
      this->Finish(call, method, ToGrpcStatus(parsed));  // this->: clang sees no use otherwise
    }
  };
  if (receive_gate_.max_shares() == 0) {
    // No budget: what the generated WithRawCallbackMethod_* registers. gRPC reads the request
    // whole, then runs the handler.
    MarkMethodRawCallback(
        index, new grpc::internal::CallbackUnaryHandler<grpc::ByteBuffer, grpc::ByteBuffer>(
                   [run](grpc::CallbackServerContext* context, const grpc::ByteBuffer* raw_request,
                         grpc::ByteBuffer* raw_response) {
                     auto* call = new UnaryCall<Request, Response>(raw_response);
                     run(context, call, call->ParseRequest(*raw_request));
                     return call;
                   }));
    return;
  }
  // A stream to gRPC, which then reads no message before the reactor asks (the handler given
  // here only makes way for the next line's), and a raw callback method.
  MarkMethodStreamed(index, nullptr);
  MarkMethodRawCallback(
      index, new grpc::internal::CallbackBidiHandler<grpc::ByteBuffer, grpc::ByteBuffer>(
                 [this, run](grpc::CallbackServerContext* context) {
                   using Call = GatedUnaryCall<Request, Response>;
                   return new Call(
                       context, &receive_gate_, limits_.chunk_timeout,
                       [run, context](RawGatedUnaryCall* call, const absl::Status& parsed) {
                         run(context, static_cast<Call*>(call), parsed);
                       });
                 }));
}

template <typename Call>
void SamplerServiceImpl::Finish(Call* call, Method method, grpc::Status status) {
  if (metrics_ != nullptr) {
    metrics_->CountRequest(method, static_cast<absl::StatusCode>(status.error_code()));
  }
  call->Reply(std::move(status));
}

SamplerServiceImpl::SamplerServiceImpl(core::SamplerCore* core, bool allow_remote_regions,
                                       const TransportLimits& limits,
                                       metrics::SamplerMetrics* metrics, const PeerTable* peers)
    : core_(core),
      allow_remote_regions_(allow_remote_regions),
      limits_(limits),
      receive_gate_(limits.max_receive_bytes, limits.max_message_bytes),
      metrics_(metrics),
      peers_(peers) {
  using grpc::CallbackServerContext;
  AddUnaryMethod<v1::SampleRequest, v1::SampleResponse>(
      "Sample", Method::kSample,
      [this](CallbackServerContext* context, auto* call) { ServeSample(context, call); });
  AddUnaryMethod<v1::RegisterRegionRequest, v1::RegisterRegionResponse>(
      "RegisterRegion", Method::kRegisterRegion,
      [this](CallbackServerContext* context, auto* call) { ServeRegisterRegion(context, call); });
  AddUnaryMethod<v1::UnregisterRegionRequest, v1::UnregisterRegionResponse>(
      "UnregisterRegion", Method::kUnregisterRegion,
      [this](CallbackServerContext* context, auto* call) { ServeUnregisterRegion(context, call); });
  AddUnaryMethod<v1::ListRegionsRequest, v1::ListRegionsResponse>(
      "ListRegions", Method::kListRegions,
      [this](CallbackServerContext* context, auto* call) { ServeListRegions(context, call); });
  AddUnaryMethod<v1::GetServerInfoRequest, v1::GetServerInfoResponse>(
      "GetServerInfo", Method::kGetServerInfo,
      [this](CallbackServerContext* context, auto* call) { ServeGetServerInfo(context, call); });
  // An owner's exit unregisters regions behind the service's back: recount them.
  core_->regions().SetOwnerExitListener([this](int64_t, int) { UpdateRegionGauges(); });
}

SamplerServiceImpl::~SamplerServiceImpl() { core_->regions().SetOwnerExitListener(nullptr); }

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

template <typename Call>
void SamplerServiceImpl::ServeSample(grpc::CallbackServerContext* context, Call* call) {
  // The core request views the inline bytes of call->request, which lives until the call ends.
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

template <typename Call>
void SamplerServiceImpl::ServeRegisterRegion(grpc::CallbackServerContext* context, Call* call) {
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
}

template <typename Call>
void SamplerServiceImpl::ServeUnregisterRegion(grpc::CallbackServerContext* context, Call* call) {
  absl::Status status = CheckRegionPeer(context->peer(), allow_remote_regions_);
  if (status.ok()) status = core_->regions().Unregister(call->request.name());
  if (status.ok()) UpdateRegionGauges();
  Finish(call, Method::kUnregisterRegion, ToGrpcStatus(status));
}

template <typename Call>
void SamplerServiceImpl::ServeListRegions(grpc::CallbackServerContext* context, Call* call) {
  absl::Status status = CheckRegionPeer(context->peer(), allow_remote_regions_);
  if (!status.ok()) {
    Finish(call, Method::kListRegions, ToGrpcStatus(status));
    return;
  }
  for (const core::RegionInfo& info : core_->regions().List()) {
    ToProto(info, call->response.add_regions());
  }
  Finish(call, Method::kListRegions, grpc::Status::OK);
}

template <typename Call>
void SamplerServiceImpl::ServeGetServerInfo(grpc::CallbackServerContext*, Call* call) {
  ToProto(core_->Info(), limits_, &call->response);
  Finish(call, Method::kGetServerInfo, grpc::Status::OK);
}

}  // namespace samplerd::grpc_transport
