#include "service/grpc/health_server.h"

#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/impl/server_builder_option.h>

#include <vector>

#include "absl/strings/str_cat.h"

namespace samplerd::grpc_transport {
namespace {

// Drops the builder plugins registered process-wide (the reflection plugin that the main server
// enables), so that this server serves health and nothing else.
class WithoutPlugins final : public grpc::ServerBuilderOption {
 public:
  void UpdateArguments(grpc::ChannelArguments*) override {}
  void UpdatePlugins(std::vector<std::unique_ptr<grpc::ServerBuilderPlugin>>* plugins) override {
    plugins->clear();
  }
};

}  // namespace

absl::StatusOr<std::unique_ptr<HealthServer>> HealthServer::Start(const std::string& address,
                                                                  const std::string& service_name) {
  const size_t colon = address.rfind(':');
  const size_t bracket = address.rfind(']');  // an IPv6 host: [::1]:8081
  if (colon == std::string::npos || colon + 1 == address.size() ||
      (bracket != std::string::npos && bracket > colon)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "expected a health address HOST:PORT (e.g. 0.0.0.0:8081), got '", address, "'"));
  }
  grpc::EnableDefaultHealthCheckService(true);
  std::unique_ptr<HealthServer> server(new HealthServer());
  server->service_name_ = service_name;
  grpc::ServerBuilder builder;
  builder.SetOption(std::make_unique<WithoutPlugins>());
  builder.RegisterCallbackGenericService(&server->unimplemented_);
  int port = 0;
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &port);
  // gRPC sets SO_REUSEPORT by default: a second process could then share (and answer on) the
  // port. A taken port must fail startup instead.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // Probes are tiny; bound what a stranger on the port can make us buffer.
  builder.SetMaxReceiveMessageSize(4096);
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || port == 0) {
    return absl::UnavailableError(absl::StrCat(
        "expected to bind the health address ", address,
        ", got a failure (address in use or missing permission; gRPC's log above says which)"));
  }
  server->bound_ = absl::StrCat(address.substr(0, colon), ":", port);
  server->SetServing(false);
  return server;
}

void HealthServer::SetServing(bool serving) {
  grpc::HealthCheckServiceInterface* health = server_->GetHealthCheckService();
  health->SetServingStatus(serving);  // every service, "" included
  health->SetServingStatus(service_name_, serving);
}

void HealthServer::Shutdown(absl::Time deadline) {
  server_->Shutdown(absl::ToChronoTime(deadline));
  server_->Wait();
}

}  // namespace samplerd::grpc_transport
