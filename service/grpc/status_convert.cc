#include "service/grpc/status_convert.h"

#include <string>

namespace samplerd::grpc_transport {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  const int code = static_cast<int>(status.code());
  // absl may grow codes gRPC lacks; anything outside gRPC's range is UNKNOWN.
  const grpc::StatusCode grpc_code =
      (code > 0 && code <= static_cast<int>(grpc::StatusCode::UNAUTHENTICATED))
          ? static_cast<grpc::StatusCode>(code)
          : grpc::StatusCode::UNKNOWN;
  return grpc::Status(grpc_code, std::string(status.message()));
}

}  // namespace samplerd::grpc_transport
