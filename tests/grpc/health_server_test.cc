// The health-only listener, in process: it mirrors SamplerServer's status (Check and Watch) and
// serves nothing else (no SamplerService, no reflection).
#include "service/grpc/health_server.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "absl/time/clock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "samplerd/v1/sampler.grpc.pb.h"
#include "service/core/backend/cpu_sampler.h"
#include "service/grpc/server.h"

namespace samplerd::grpc_transport {
namespace {

using grpc::health::v1::Health;
using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;
using ::testing::HasSubstr;

HealthCheckResponse::ServingStatus Check(Health::Stub& stub, const std::string& service,
                                         grpc::Status* status) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  HealthCheckRequest request;
  request.set_service(service);
  HealthCheckResponse response;
  *status = stub.Check(&context, request, &response);
  return response.status();
}

class HealthPort : public ::testing::Test {
 protected:
  void SetUp() override {
    core_ = std::make_unique<core::SamplerCore>(
        core::CoreOptions{}, std::make_unique<core::CpuSampler>(1), /*seed_start=*/7);
    ServerOptions options;
    options.listen = {"127.0.0.1:0"};
    options.health_address = "127.0.0.1:0";
    absl::StatusOr<std::unique_ptr<SamplerServer>> server =
        SamplerServer::Start(options, core_.get());
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    ASSERT_THAT(server_->health_address(), HasSubstr("127.0.0.1:"));
    ASSERT_NE(server_->health_address(), "127.0.0.1:0");
    channel_ = grpc::CreateChannel(server_->health_address(), grpc::InsecureChannelCredentials());
    health_ = Health::NewStub(channel_);
  }
  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown(absl::Now());
  }

  std::unique_ptr<core::SamplerCore> core_;
  std::unique_ptr<SamplerServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<Health::Stub> health_;
};

TEST_F(HealthPort, FollowsTheServersStatusForTheServerAndTheService) {
  grpc::Status status;
  EXPECT_EQ(Check(*health_, "", &status), HealthCheckResponse::NOT_SERVING);
  EXPECT_TRUE(status.ok()) << status.error_message();
  server_->SetServing(true);
  EXPECT_EQ(Check(*health_, "", &status), HealthCheckResponse::SERVING);
  EXPECT_EQ(Check(*health_, kServiceName, &status), HealthCheckResponse::SERVING);
  EXPECT_TRUE(status.ok());
  server_->SetServing(false);
  EXPECT_EQ(Check(*health_, kServiceName, &status), HealthCheckResponse::NOT_SERVING);
}

TEST_F(HealthPort, UnknownServiceIsNotFound) {
  grpc::Status status;
  Check(*health_, "no.such.Service", &status);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(HealthPort, WatchSeesTheChange) {
  server_->SetServing(true);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  HealthCheckRequest request;
  request.set_service(kServiceName);
  std::unique_ptr<grpc::ClientReader<HealthCheckResponse>> watch =
      health_->Watch(&context, request);
  HealthCheckResponse response;
  ASSERT_TRUE(watch->Read(&response));
  EXPECT_EQ(response.status(), HealthCheckResponse::SERVING);
  server_->SetServing(false);
  ASSERT_TRUE(watch->Read(&response));
  EXPECT_EQ(response.status(), HealthCheckResponse::NOT_SERVING);
  context.TryCancel();
  watch->Finish();
}

TEST_F(HealthPort, ServesNoSamplingApi) {
  std::unique_ptr<v1::SamplerService::Stub> sampler = v1::SamplerService::NewStub(channel_);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::GetServerInfoResponse info;
  const grpc::Status status = sampler->GetServerInfo(&context, {}, &info);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNIMPLEMENTED);
}

TEST(HealthServer, RefusesAnAddressWithoutAPort) {
  EXPECT_EQ(HealthServer::Start("127.0.0.1", "s").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(HealthServer::Start("127.0.0.1:", "s").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(HealthServer::Start("[::1]", "s").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(HealthServer, ATakenPortIsUnavailable) {
  absl::StatusOr<std::unique_ptr<HealthServer>> first = HealthServer::Start("127.0.0.1:0", "s");
  ASSERT_TRUE(first.ok()) << first.status();
  absl::StatusOr<std::unique_ptr<HealthServer>> second =
      HealthServer::Start((*first)->bound_address(), "s");
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  (*first)->Shutdown(absl::Now());
}

}  // namespace
}  // namespace samplerd::grpc_transport
