#include "service/grpc/sampler_service.h"

#include <utility>

#include "service/grpc/convert.h"
#include "service/grpc/sample_stream_reactor.h"
#include "service/grpc/status_convert.h"

namespace samplerd::grpc_transport {
namespace {

grpc::ServerUnaryReactor* FinishNow(grpc::CallbackServerContext* context, grpc::Status status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(std::move(status));
  return reactor;
}

grpc::ServerUnaryReactor* RegionsUnimplemented(grpc::CallbackServerContext* context) {
  return FinishNow(context, grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                                         "regions are not supported by this samplerd version "
                                         "yet; send logits.inline_data instead"));
}

}  // namespace

grpc::ServerUnaryReactor* SamplerServiceImpl::Sample(grpc::CallbackServerContext* context,
                                                     const v1::SampleRequest* request,
                                                     v1::SampleResponse* response) {
  core::SampleRequest core_request;
  absl::Status status = FromProto(*request, &core_request);
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
  return new SampleStreamReactor(core_, context);
}

grpc::ServerUnaryReactor* SamplerServiceImpl::RegisterRegion(grpc::CallbackServerContext* context,
                                                             const v1::RegisterRegionRequest*,
                                                             v1::RegisterRegionResponse*) {
  return RegionsUnimplemented(context);
}

grpc::ServerUnaryReactor* SamplerServiceImpl::UnregisterRegion(
    grpc::CallbackServerContext* context, const v1::UnregisterRegionRequest*,
    v1::UnregisterRegionResponse*) {
  return RegionsUnimplemented(context);
}

grpc::ServerUnaryReactor* SamplerServiceImpl::ListRegions(grpc::CallbackServerContext* context,
                                                          const v1::ListRegionsRequest*,
                                                          v1::ListRegionsResponse*) {
  return RegionsUnimplemented(context);
}

grpc::ServerUnaryReactor* SamplerServiceImpl::GetServerInfo(grpc::CallbackServerContext* context,
                                                            const v1::GetServerInfoRequest*,
                                                            v1::GetServerInfoResponse* response) {
  ToProto(core_->Info(), response);
  return FinishNow(context, grpc::Status::OK);
}

}  // namespace samplerd::grpc_transport
