// Who may use regions: clients on a unix socket always; TCP clients only when the server was
// started with --allow_remote_regions (a region names memory of the server's host, and an
// output region is written to).
#ifndef SAMPLERD_SERVICE_GRPC_PEER_H_
#define SAMPLERD_SERVICE_GRPC_PEER_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace samplerd::grpc_transport {

// Whether `peer` (grpc::ServerContext::peer()) is a unix-socket client: gRPC names those
// "unix:..." or "unix-abstract:...", and TCP clients "ipv4:..." or "ipv6:...".
bool IsUnixPeer(absl::string_view peer);

// OK for a unix-socket peer, or for any peer when `allow_remote_regions`; otherwise
// PERMISSION_DENIED saying how to allow it. The peer's address is not echoed.
absl::Status CheckRegionPeer(absl::string_view peer, bool allow_remote_regions);

}  // namespace samplerd::grpc_transport

#endif  // SAMPLERD_SERVICE_GRPC_PEER_H_
