#include "service/grpc/server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "grpc/health/v1/health.pb.h"

namespace samplerd::grpc_transport {
namespace {

// A TCP --listen address must end in ":PORT" with PORT in [0, 65535]: gRPC 1.51 keeps only the
// low 16 bits of a larger port, so "localhost:99999" would serve on port 34463.
absl::Status CheckTcpListenAddress(const std::string& address) {
  const size_t colon = address.rfind(':');
  const absl::string_view port = colon == std::string::npos
                                     ? absl::string_view()
                                     : absl::string_view(address).substr(colon + 1);
  int value = 0;
  bool ok = !port.empty() && port.size() <= 5;
  for (char c : port) {
    ok = ok && c >= '0' && c <= '9';
    value = value * 10 + (c - '0');
  }
  if (!ok || value > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "expected a --listen address unix:///abs/path.sock or HOST:PORT with PORT in [0, 65535] "
        "(e.g. 127.0.0.1:50051, [::]:50051), got '",
        address, "'"));
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
  std::vector<std::string> unix_addresses;
  for (size_t i = 0; i < options.listen.size(); ++i) {
    const std::string& address = options.listen[i];
    if (address.empty()) {
      return absl::InvalidArgumentError("expected a non-empty --listen address, got ''");
    }
    if (IsUnixAddress(address)) {
      unix_addresses.push_back(address);  // accepted by UnixListener, not by gRPC
    } else {
      if (absl::Status checked = CheckTcpListenAddress(address); !checked.ok()) return checked;
      builder.AddListeningPort(address, *tcp_credentials, &ports[i]);
    }
  }
  if (!unix_addresses.empty()) {
    absl::StatusOr<std::unique_ptr<UnixListener>> unix_listener =
        UnixListener::Bind(unix_addresses, kUnixSocketMode);
    if (!unix_listener.ok()) return unix_listener.status();
    server->unix_listener_ = *std::move(unix_listener);
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
  if (options.max_receive_bytes > 0) {
    // With a receive budget, a call waiting for its turn must not be sent its request anyway:
    // what it may be sent unread is the stream's flow-control window, 64 KiB, but gRPC's
    // bandwidth-delay probing grows that window to megabytes on a fast link (32 calls of 64 MiB
    // over a unix socket with 2 received at once: 1.2 GiB peak RSS with probing, 0.5 GiB
    // without; tests/bench/RECEIVE_BURST_RESULTS.md). A call reading its message is granted a
    // window of the message's size either way, so a large request is received as fast.
    builder.AddChannelArgument(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  }

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
  if (server->unix_listener_ != nullptr) {
    server->unix_listener_->Start(server->server_.get(), &server->peers_);
  }
  for (size_t i = 0; i < options.listen.size(); ++i) {
    const std::string& address = options.listen[i];
    if (IsUnixAddress(address)) {
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
  if (unix_listener_ != nullptr) unix_listener_->Stop();  // no new unix connections
  server_->Shutdown(absl::ToChronoTime(deadline));
  server_->Wait();
  if (health_ != nullptr) health_->Shutdown(absl::Now());
}

}  // namespace samplerd::grpc_transport
