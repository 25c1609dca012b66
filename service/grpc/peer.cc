#include "service/grpc/peer.h"

#include <sys/socket.h>
#include <sys/stat.h>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/strip.h"

namespace samplerd::grpc_transport {
namespace {

constexpr absl::string_view kFdPeer = "fd:";

}  // namespace

bool IsUnixPeer(absl::string_view peer) {
  return absl::StartsWith(peer, kFdPeer) || absl::StartsWith(peer, "unix:") ||
         absl::StartsWith(peer, "unix-abstract:");
}

absl::Status CheckRegionPeer(absl::string_view peer, bool allow_remote_regions) {
  if (allow_remote_regions || IsUnixPeer(peer)) return absl::OkStatus();
  return absl::PermissionDeniedError(
      "expected region calls (RegisterRegion, UnregisterRegion, ListRegions, and requests that "
      "name a region) over a unix socket, got a call over TCP; connect through the server's "
      "unix socket, or start samplerd with --allow_remote_regions to allow them over TCP");
}

void PeerTable::Record(int fd) {
  struct stat st;
  ucred cred = {};
  socklen_t length = sizeof(cred);
  Connection connection;
  if (fstat(fd, &st) == 0) connection.inode = st.st_ino;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &length) == 0) connection.pid = cred.pid;
  std::lock_guard<std::mutex> lock(mu_);
  connections_[fd] = connection;
}

int64_t PeerTable::PidOf(absl::string_view peer) const {
  int fd = -1;
  if (!absl::ConsumePrefix(&peer, kFdPeer) || !absl::SimpleAtoi(peer, &fd) || fd < 0) return 0;
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) return 0;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = connections_.find(fd);
  if (it == connections_.end() || it->second.inode != st.st_ino) return 0;
  return it->second.pid;
}

}  // namespace samplerd::grpc_transport
