// A second gRPC server, on TCP, that serves only grpc.health.v1.Health (Check and Watch): the
// target of Kubernetes' native gRPC probes while the sampling API stays on its own listeners
// (a unix socket by default).
//
// Always plaintext: kubelet's gRPC probes cannot speak TLS, and health reveals nothing but
// SERVING / NOT_SERVING. No reflection, no other service: any other method is UNIMPLEMENTED.
#ifndef SAMPLERD_SERVICE_GRPC_HEALTH_SERVER_H_
#define SAMPLERD_SERVICE_GRPC_HEALTH_SERVER_H_

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace samplerd::grpc_transport {

class HealthServer {
 public:
  // Listens on `address` ("0.0.0.0:8081", "[::]:8081", "127.0.0.1:0"; port 0 picks a free
  // one). Health starts NOT_SERVING for "" and `service_name`. Errors: INVALID_ARGUMENT for an
  // address without a port, UNAVAILABLE when it cannot be bound.
  static absl::StatusOr<std::unique_ptr<HealthServer>> Start(const std::string& address,
                                                             const std::string& service_name);

  // SERVING or NOT_SERVING, for "" and the service name. Watchers get the change at once.
  void SetServing(bool serving);

  // The address bound, port 0 resolved.
  const std::string& bound_address() const { return bound_; }

  // Stops accepting calls; open Watch streams are cancelled at `deadline`.
  void Shutdown(absl::Time deadline);

 private:
  HealthServer() = default;

  std::string service_name_;
  // Answers every method but health's UNIMPLEMENTED. Also gives the server a callback method,
  // which gRPC requires of a server without completion queues before it adds the default
  // health service.
  grpc::CallbackGenericService unimplemented_;
  std::unique_ptr<grpc::Server> server_;
  std::string bound_;
};

}  // namespace samplerd::grpc_transport

#endif  // SAMPLERD_SERVICE_GRPC_HEALTH_SERVER_H_
