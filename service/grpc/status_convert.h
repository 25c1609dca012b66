// The one conversion from the core's absl::Status to grpc::Status.
#ifndef SAMPLERD_SERVICE_GRPC_STATUS_CONVERT_H_
#define SAMPLERD_SERVICE_GRPC_STATUS_CONVERT_H_

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace samplerd::grpc_transport {

// Same code (absl and gRPC share the canonical code numbers), same message.
grpc::Status ToGrpcStatus(const absl::Status& status);

}  // namespace samplerd::grpc_transport

#endif  // SAMPLERD_SERVICE_GRPC_STATUS_CONVERT_H_
