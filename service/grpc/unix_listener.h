// The server's unix-socket listeners. samplerd accepts unix connections itself, not through
// gRPC's listener, so that it knows which process is behind each one (SO_PEERCRED): it records
// the connection in a PeerTable (peer.h), then hands the descriptor to gRPC
// (grpc::AddInsecureChannelFromFd), which serves it like any other connection and names its
// calls' peer "fd:N". Regions registered over such a connection are bound to that process
// (docs/DESIGN.md "Regions bound to their owner"). Unix sockets stay plaintext.
#ifndef SAMPLERD_SERVICE_GRPC_UNIX_LISTENER_H_
#define SAMPLERD_SERVICE_GRPC_UNIX_LISTENER_H_

#include <grpcpp/server.h>
#include <sys/types.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "service/grpc/peer.h"

namespace samplerd::grpc_transport {

// Whether `address` is a unix-socket address ("unix:PATH", "unix:///ABS/PATH",
// "unix-abstract:NAME"), which UnixListener serves, rather than a TCP one.
bool IsUnixAddress(absl::string_view address);

class UnixListener {
 public:
  // Binds and listens on every address of `addresses` (each IsUnixAddress). For a path: its
  // missing directories are created (mode 0750), a stale socket file there is replaced (as
  // gRPC does), and the socket gets `mode` before it listens. Errors: INVALID_ARGUMENT for a
  // malformed address or a path too long for a unix socket, FAILED_PRECONDITION when a
  // directory cannot be created or the mode cannot be set, UNAVAILABLE when binding fails
  // (address in use, missing permission). Nothing is left bound on error.
  static absl::StatusOr<std::unique_ptr<UnixListener>> Bind(
      const std::vector<std::string>& addresses, unsigned mode);

  ~UnixListener();  // Stop()
  UnixListener(const UnixListener&) = delete;
  UnixListener& operator=(const UnixListener&) = delete;

  // Accepts connections on a thread of its own: each is recorded in `peers`, then served by
  // `server` (started). Both must outlive Stop().
  void Start(grpc::Server* server, PeerTable* peers);

  // Stops accepting (connections already handed over stay gRPC's), closes the listening
  // sockets and removes the socket files this listener created. Idempotent.
  void Stop();

 private:
  struct Socket {
    int fd = -1;
    std::string path;  // empty for an abstract socket
    ino_t inode = 0;   // the socket file's, to remove only our own
  };
  UnixListener() = default;
  void Loop(grpc::Server* server, PeerTable* peers);

  std::vector<Socket> sockets_;
  int wake_fd_ = -1;  // eventfd: Stop wakes the thread
  std::thread thread_;
};

}  // namespace samplerd::grpc_transport

#endif  // SAMPLERD_SERVICE_GRPC_UNIX_LISTENER_H_
