#include "service/grpc/peer.h"

#include "absl/strings/match.h"

namespace samplerd::grpc_transport {

bool IsUnixPeer(absl::string_view peer) {
  return absl::StartsWith(peer, "unix:") || absl::StartsWith(peer, "unix-abstract:");
}

absl::Status CheckRegionPeer(absl::string_view peer, bool allow_remote_regions) {
  if (allow_remote_regions || IsUnixPeer(peer)) return absl::OkStatus();
  return absl::PermissionDeniedError(
      "expected region calls (RegisterRegion, UnregisterRegion, ListRegions, and requests that "
      "name a region) over a unix socket, got a call over TCP; connect through the server's "
      "unix socket, or start samplerd with --allow_remote_regions to allow them over TCP");
}

}  // namespace samplerd::grpc_transport
