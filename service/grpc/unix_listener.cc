#include "service/grpc/unix_listener.h"

#include <grpcpp/server_posix.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "service/core/model/thread_name.h"

namespace samplerd::grpc_transport {
namespace {

constexpr absl::string_view kUnixScheme = "unix:";
constexpr absl::string_view kUnixAbstractScheme = "unix-abstract:";

// The filesystem path of a "unix:" address, read as gRPC reads it: "unix:PATH" (relative to the
// working directory, or absolute) or "unix:///ABSOLUTE/PATH". Errors: INVALID_ARGUMENT for an
// empty path or an authority ("unix://host/...", which gRPC refuses too).
absl::StatusOr<std::string> UnixSocketPath(const std::string& address) {
  absl::string_view rest = absl::string_view(address).substr(kUnixScheme.size());
  if (absl::ConsumePrefix(&rest, "//") && !absl::StartsWith(rest, "/")) rest = {};
  if (rest.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected a unix socket address unix:PATH or unix:///ABSOLUTE/PATH (e.g. "
                     "unix:///run/samplerd/samplerd.sock), got '",
                     address, "'"));
  }
  return std::string(rest);
}

// Creates the directories above the socket at `path` (mode 0750) when missing.
absl::Status MakeSocketDirectory(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos || slash == 0) return absl::OkStatus();  // cwd or "/"
  const std::string dir = path.substr(0, slash);
  struct stat st;
  if (stat(dir.c_str(), &st) == 0) return absl::OkStatus();
  for (size_t pos = 1; pos <= dir.size(); ++pos) {  // parents one by one
    if (pos == dir.size() || dir[pos] == '/') {
      const std::string prefix = dir.substr(0, pos);
      if (mkdir(prefix.c_str(), 0750) != 0 && errno != EEXIST) {
        return absl::FailedPreconditionError(absl::StrCat(
            "expected to create the socket directory ", prefix, ", got: ", std::strerror(errno)));
      }
    }
  }
  return absl::OkStatus();
}

// Makes `path` free for a new socket: nothing there, or a socket no server listens on any more
// (a killed server's), which is removed. A socket a server still accepts on is refused, like a
// TCP port another process holds: replacing it would leave that server running, unreachable.
// So are a directory or another file (never removed) and an old socket that cannot be removed.
absl::Status FreeSocketPath(const std::string& address, const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return absl::OkStatus();  // nothing there (or bind says)
  if (S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat("expected a socket path for --listen=", address, ", got the directory ", path,
                     " (name the socket inside it, e.g. unix://", path, "/samplerd.sock)"));
  }
  if (!S_ISSOCK(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat("expected nothing or an old socket at ", path, " for --listen=", address,
                     ", got a ", S_ISREG(st.st_mode) ? "regular file" : "file of another type",
                     " (samplerd replaces only sockets)"));
  }
  sockaddr_un addr = {};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());  // the caller checked the length
  const int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (probe >= 0) {
    const int connected = connect(probe, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr));
    const int error = errno;
    close(probe);
    // A full backlog (EAGAIN) is a live server too.
    if (connected == 0 || error == EAGAIN || error == EINPROGRESS) {
      return absl::FailedPreconditionError(
          absl::StrCat("expected no server listening on ", path, " for --listen=", address,
                       ", got one accepting connections (another samplerd? stop it, or choose "
                       "another path)"));
    }
  }
  if (unlink(path.c_str()) != 0 && errno != ENOENT) {
    return absl::FailedPreconditionError(absl::StrCat("expected to remove the old socket ", path,
                                                      " for --listen=", address,
                                                      ", got: ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace

bool IsUnixAddress(absl::string_view address) {
  return absl::StartsWith(address, kUnixScheme) || absl::StartsWith(address, kUnixAbstractScheme);
}

absl::StatusOr<std::unique_ptr<UnixListener>> UnixListener::Bind(
    const std::vector<std::string>& addresses, unsigned mode) {
  std::unique_ptr<UnixListener> listener(new UnixListener());  // its destructor cleans up
  for (const std::string& address : addresses) {
    sockaddr_un addr = {};
    addr.sun_family = AF_UNIX;
    socklen_t addr_length = 0;
    std::string path;
    std::string name;  // what sun_path holds: the path, or NUL + the abstract name
    if (absl::StartsWith(address, kUnixAbstractScheme)) {
      if (address.size() == kUnixAbstractScheme.size()) {  // an empty name no client can give
        return absl::InvalidArgumentError(absl::StrCat(
            "expected an abstract socket address unix-abstract:NAME with a name, got '", address,
            "'"));
      }
      name = std::string(1, '\0') + address.substr(kUnixAbstractScheme.size());
    } else {
      absl::StatusOr<std::string> parsed = UnixSocketPath(address);
      if (!parsed.ok()) return parsed.status();
      path = *std::move(parsed);
      name = path;
    }
    if (name.size() >= sizeof(addr.sun_path)) {
      return absl::InvalidArgumentError(absl::StrCat("expected a unix socket name of at most ",
                                                     sizeof(addr.sun_path) - 1, " bytes, got ",
                                                     name.size(), " in '", address, "'"));
    }
    std::memcpy(addr.sun_path, name.data(), name.size());
    addr_length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + name.size() +
                                         (path.empty() ? 0 : 1));
    if (!path.empty()) {
      absl::Status made = MakeSocketDirectory(path);
      if (!made.ok()) return made;
      absl::Status freed = FreeSocketPath(address, path);
      if (!freed.ok()) return freed;
    }
    Socket socket_info;
    socket_info.fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (socket_info.fd < 0 ||
        bind(socket_info.fd, reinterpret_cast<const sockaddr*>(&addr), addr_length) != 0) {
      const int error = errno;
      if (socket_info.fd >= 0) close(socket_info.fd);
      return absl::UnavailableError(
          absl::StrCat("expected to bind ", address, ", got: ", std::strerror(error)));
    }
    socket_info.path = path;
    struct stat st;
    if (!path.empty() && stat(path.c_str(), &st) == 0) socket_info.inode = st.st_ino;
    listener->sockets_.push_back(socket_info);
    // Before listen(): nobody outside owner and group may connect, even for a moment.
    if (!path.empty() && chmod(path.c_str(), mode) != 0) {
      char octal[8];
      std::snprintf(octal, sizeof(octal), "%04o", mode);
      return absl::FailedPreconditionError(absl::StrCat("expected to restrict the socket ", path,
                                                        " to its owner and group (mode ", octal,
                                                        "), got: ", std::strerror(errno)));
    }
    if (listen(socket_info.fd, SOMAXCONN) != 0) {
      return absl::UnavailableError(
          absl::StrCat("expected to listen on ", address, ", got: ", std::strerror(errno)));
    }
  }
  listener->wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (listener->wake_fd_ < 0) {
    return absl::UnavailableError(
        absl::StrCat("expected an eventfd for the unix listener, got: ", std::strerror(errno)));
  }
  return listener;
}

UnixListener::~UnixListener() { Stop(); }

void UnixListener::Start(grpc::Server* server, PeerTable* peers) {
  if (thread_.joinable() || sockets_.empty()) return;
  thread_ = std::thread([this, server, peers] {
    NameThisThread("sd-unix-accept");
    Loop(server, peers);
  });
}

void UnixListener::Loop(grpc::Server* server, PeerTable* peers) {
  std::vector<pollfd> fds;
  fds.push_back({wake_fd_, POLLIN, 0});
  for (const Socket& s : sockets_) fds.push_back({s.fd, POLLIN, 0});
  bool back_off = false;
  while (true) {
    if (back_off) {
      // Out of descriptors or memory: wait a little, for Stop alone. Polling the listeners too
      // would return at once (the connection not accepted keeps them readable): a busy loop.
      back_off = false;
      pollfd wake = fds[0];
      const int woken = poll(&wake, 1, 100);
      if (woken < 0 && errno != EINTR) return;
      if (woken > 0) return;  // Stop
    }
    const int ready = poll(fds.data(), fds.size(), -1);
    if (ready < 0 && errno != EINTR) return;
    if (fds[0].revents != 0) return;  // Stop
    for (size_t i = 1; ready > 0 && i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      const int fd = accept4(fds[i].fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        // Out of descriptors or memory: back off (above). Other errors concern one aborted
        // connection.
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
          back_off = true;
        }
        continue;
      }
      peers->Record(fd);
      grpc::AddInsecureChannelFromFd(server, fd);  // gRPC owns (and closes) fd from here
    }
  }
}

void UnixListener::Stop() {
  if (wake_fd_ >= 0 && thread_.joinable()) {
    const uint64_t one = 1;
    (void)!write(wake_fd_, &one, sizeof(one));
    thread_.join();
  }
  for (const Socket& s : sockets_) {
    close(s.fd);
    struct stat st;
    if (!s.path.empty() && stat(s.path.c_str(), &st) == 0 && st.st_ino == s.inode) {
      unlink(s.path.c_str());
    }
  }
  sockets_.clear();
  if (wake_fd_ >= 0) close(wake_fd_);
  wake_fd_ = -1;
}

}  // namespace samplerd::grpc_transport
