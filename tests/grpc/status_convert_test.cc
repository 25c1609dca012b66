#include "service/grpc/status_convert.h"

#include <gtest/gtest.h>

namespace samplerd::grpc_transport {
namespace {

TEST(ToGrpcStatus, KeepsCodeAndMessage) {
  const struct {
    absl::Status in;
    grpc::StatusCode code;
  } cases[] = {
      {absl::InvalidArgumentError("expected a, got b"), grpc::StatusCode::INVALID_ARGUMENT},
      {absl::ResourceExhaustedError("too big"), grpc::StatusCode::RESOURCE_EXHAUSTED},
      {absl::FailedPreconditionError("no gpu"), grpc::StatusCode::FAILED_PRECONDITION},
      {absl::UnavailableError("draining"), grpc::StatusCode::UNAVAILABLE},
      {absl::NotFoundError("no region"), grpc::StatusCode::NOT_FOUND},
      {absl::CancelledError("gone"), grpc::StatusCode::CANCELLED},
      {absl::UnimplementedError("later"), grpc::StatusCode::UNIMPLEMENTED},
      {absl::InternalError("fault"), grpc::StatusCode::INTERNAL},
  };
  for (const auto& c : cases) {
    grpc::Status out = ToGrpcStatus(c.in);
    EXPECT_EQ(out.error_code(), c.code) << c.in;
    EXPECT_EQ(out.error_message(), std::string(c.in.message()));
  }
}

TEST(ToGrpcStatus, OkIsOk) { EXPECT_TRUE(ToGrpcStatus(absl::OkStatus()).ok()); }

TEST(ToGrpcStatus, UnknownCodesBecomeUnknown) {
  absl::Status odd(static_cast<absl::StatusCode>(99), "odd");
  EXPECT_EQ(ToGrpcStatus(odd).error_code(), grpc::StatusCode::UNKNOWN);
}

}  // namespace
}  // namespace samplerd::grpc_transport
