#include "service/grpc/server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "grpc/health/v1/health.pb.h"

namespace samplerd::grpc_transport {
namespace {

constexpr char kUnixScheme[] = "unix:";
constexpr char kUnixAbstractScheme[] = "unix-abstract:";

bool IsUnixPath(const std::string& address) { return absl::StartsWith(address, kUnixScheme); }

// The filesystem path of a "unix:" address, read as gRPC reads it: "unix:PATH" (relative to the
// working directory, or absolute) or "unix:///ABSOLUTE/PATH". Errors: INVALID_ARGUMENT for an
// empty path or an authority ("unix://host/...", which gRPC refuses too).
absl::StatusOr<std::string> UnixSocketPath(const std::string& address) {
  absl::string_view rest = absl::string_view(address).substr(sizeof(kUnixScheme) - 1);
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
  // Create parents one by one.
  for (size_t pos = 1; pos <= dir.size(); ++pos) {
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

}  // namespace

absl::StatusOr<std::unique_ptr<SamplerServer>> SamplerServer::Start(const ServerOptions& options,
                                                                    core::SamplerCore* core) {
  if (options.listen.empty()) {
    return absl::InvalidArgumentError("expected at least one --listen address, got none");
  }
  // Keep the health descriptors in the binary so reflection clients can describe Health.
  (void)grpc::health::v1::HealthCheckRequest::descriptor();
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();

  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> tcp_credentials =
      MakeTcpCredentials(options.tls);
  if (!tcp_credentials.ok()) return tcp_credentials.status();

  std::unique_ptr<SamplerServer> server(new SamplerServer(core, options));
  grpc::ServerBuilder builder;
  std::vector<int> ports(options.listen.size(), 0);
  std::vector<std::string> socket_paths;
  for (size_t i = 0; i < options.listen.size(); ++i) {
    const std::string& address = options.listen[i];
    if (address.empty()) {
      return absl::InvalidArgumentError("expected a non-empty --listen address, got ''");
    }
    if (IsUnixPath(address)) {
      absl::StatusOr<std::string> path = UnixSocketPath(address);
      if (!path.ok()) return path.status();
      absl::Status made = MakeSocketDirectory(*path);
      if (!made.ok()) return made;
      socket_paths.push_back(*std::move(path));
    }
    const bool unix_socket = IsUnixPath(address) || absl::StartsWith(address, kUnixAbstractScheme);
    builder.AddListeningPort(
        address, unix_socket ? grpc::InsecureServerCredentials() : *tcp_credentials, &ports[i]);
  }
  builder.RegisterService(&server->service_);
  builder.SetMaxReceiveMessageSize(options.max_message_bytes);
  builder.SetMaxSendMessageSize(options.max_message_bytes);
  // Keepalive: ping idle connections every 30 s, drop them after 10 s without an answer, and
  // let engines ping as often as every 10 s (gRPC's default would answer GOAWAY below 5 min).
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, 30'000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 10'000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 10'000);
  // gRPC sets SO_REUSEPORT by default, so a second samplerd on the same TCP port would silently
  // share its connections; a taken port must fail startup instead.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);

  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr) {
    return absl::UnavailableError(absl::StrCat(
        "expected to bind every --listen address, got a failure (address in use, bad syntax ",
        options.tls.enabled() ? "or missing permission, or a TLS key that does not match its "
                                "certificate"
                              : "or missing permission",
        "; gRPC's log above says which)"));
  }
  if (!options.health_address.empty()) {
    absl::StatusOr<std::unique_ptr<HealthServer>> health =
        HealthServer::Start(options.health_address, kServiceName);
    if (!health.ok()) {
      server->Shutdown(absl::Now());
      return health.status();
    }
    server->health_ = *std::move(health);
  }
  server->SetServing(false);
  // gRPC binds sockets with mode 0777 minus the umask; narrow them to owner and group. Connecting
  // needs write permission, so under the usual umask 022 only the owner can connect meanwhile.
  for (const std::string& path : socket_paths) {
    if (chmod(path.c_str(), kUnixSocketMode) != 0) {
      const int error = errno;
      server->Shutdown(absl::Now());
      return absl::FailedPreconditionError(
          absl::StrCat("expected to restrict the socket ", path,
                       " to its owner and group (mode 0660), got: ", std::strerror(error)));
    }
  }
  for (size_t i = 0; i < options.listen.size(); ++i) {
    const std::string& address = options.listen[i];
    if (IsUnixPath(address) || absl::StartsWith(address, kUnixAbstractScheme)) {
      server->bound_.push_back(address);  // as given: there is no port to resolve
    } else {
      const size_t colon = address.rfind(':');
      server->bound_.push_back(absl::StrCat(address.substr(0, colon), ":", ports[i]));
    }
  }
  return server;
}

void SamplerServer::SetServing(bool serving) {
  grpc::HealthCheckServiceInterface* health = server_->GetHealthCheckService();
  health->SetServingStatus(serving);  // every service, "" included
  health->SetServingStatus(kServiceName, serving);
  if (health_ != nullptr) health_->SetServing(serving);
}

void SamplerServer::Shutdown(absl::Time deadline) {
  server_->Shutdown(absl::ToChronoTime(deadline));
  server_->Wait();
  if (health_ != nullptr) health_->Shutdown(absl::Now());
}

}  // namespace samplerd::grpc_transport
