// Who may use regions: clients on a unix socket always; TCP clients only when the server was
// started with --allow_remote_regions (a region names memory of the server's host, and an
// output region is written to). And who a unix-socket client is: the process that connected.
#ifndef SAMPLERD_SERVICE_GRPC_PEER_H_
#define SAMPLERD_SERVICE_GRPC_PEER_H_

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <mutex>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace samplerd::grpc_transport {

// Whether `peer` (grpc::ServerContext::peer()) is a unix-socket client. The server accepts
// unix connections itself and hands them to gRPC by descriptor (unix_listener.h), which names
// them "fd:N"; gRPC's own unix listeners would name them "unix:..." or "unix-abstract:...".
// TCP clients are "ipv4:..." or "ipv6:...".
bool IsUnixPeer(absl::string_view peer);

// OK for a unix-socket peer, or for any peer when `allow_remote_regions`; otherwise
// PERMISSION_DENIED saying how to allow it. The peer's address is not echoed.
absl::Status CheckRegionPeer(absl::string_view peer, bool allow_remote_regions);

// The processes behind the server's unix-socket connections, by descriptor. The listener
// records each accepted connection (its SO_PEERCRED pid and its socket's inode); a call's peer
// "fd:N" is then looked up, and believed only while descriptor N is still that socket (a
// closed connection's number may be reused by the next one). Thread-safe.
class PeerTable {
 public:
  // Records the connection on descriptor `fd` (an accepted unix socket), replacing what an
  // earlier connection on the same number left. Cost: two system calls.
  void Record(int fd);

  // The pid of the process that opened `peer`'s connection (in the server's pid namespace), or
  // 0 when it is unknown: not an "fd:N" peer, never recorded, a connection closed since, or a
  // process the server's pid namespace cannot see. Cost: one fstat.
  int64_t PidOf(absl::string_view peer) const;

 private:
  struct Connection {
    ino_t inode = 0;
    int64_t pid = 0;
  };
  mutable std::mutex mu_;
  std::map<int, Connection> connections_;  // by descriptor
};

}  // namespace samplerd::grpc_transport

#endif  // SAMPLERD_SERVICE_GRPC_PEER_H_
