// Conversions between the wire types (samplerd.v1) and the core's request model.
#ifndef SAMPLERD_SERVICE_GRPC_CONVERT_H_
#define SAMPLERD_SERVICE_GRPC_CONVERT_H_

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "samplerd/v1/sampler.pb.h"
#include "service/core/model/request.h"
#include "service/core/regions/region_registry.h"
#include "service/core/sampler_core.h"
#include "service/core/session/session_manager.h"

namespace samplerd::grpc_transport {

// The limits the gRPC layer enforces itself (the core's are in core::Limits); GetServerInfo
// reports them.
struct TransportLimits {
  // Largest message received or sent, bytes (--max_message_bytes).
  int64_t max_message_bytes = 256 << 20;
  // Request bytes received at once before admission (--max_receive_bytes, receive_gate.h); each
  // unary request being received counts as max_message_bytes. 0 = no limit.
  int64_t max_receive_bytes = 0;
  // How long a chunked SampleStream step may take from its first message to its last, and a
  // unary request to arrive once its turn came (--chunk_timeout_ms; > 0).
  absl::Duration chunk_timeout = absl::Seconds(10);
};

// Fills `out` from `in`: inline logits or a region slice, the output slice and the event
// handles. out->inline_data views in.logits().inline_data(): `in` must outlive `out`. Errors:
// INVALID_ARGUMENT for enum values this server does not know.
absl::Status FromProto(const v1::SampleRequest& in, core::SampleRequest* out);

// The call's deadline as an absl::Time; absl::InfiniteFuture() when the client set none.
absl::Time DeadlineOf(const grpc::ServerContextBase& context);

// Whether `in` names a region (logits.region, output, token_bitmask.region, logit_bias.region
// or token_history.region).
bool UsesRegions(const v1::SampleRequest& in);

// Fills `out` from a successful result.
void ToProto(const core::SampleResult& in, v1::SampleResponse* out);

// Fills `out` from a registered region's description.
void ToProto(const core::RegionInfo& in, v1::RegionInfo* out);

// Fills `out` from the server's description and the transport's own limits (chunk_timeout in
// whole milliseconds).
void ToProto(const core::ServerInfo& in, const TransportLimits& transport,
             v1::GetServerInfoResponse* out);

// Fills `out` from a DeviceSessionOpen. Enum numbers are copied as they are (unknown ones
// included): SessionManager::Open checks them.
void FromProto(const v1::DeviceSessionOpen& in, core::SessionOpen* out);

// Fills `out` from an opened session.
void ToProto(const core::OpenedSession& in, v1::DeviceSessionOpened* out);

}  // namespace samplerd::grpc_transport

#endif  // SAMPLERD_SERVICE_GRPC_CONVERT_H_
