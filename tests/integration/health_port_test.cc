// --health_port on the real binary: grpc.health.v1 over TCP mirrors the server (SERVING once
// ready, NOT_SERVING from SIGTERM through the grace period), and nothing else is served there.
#include <signal.h>

#include <memory>
#include <string>

#include "grpc/health/v1/health.grpc.pb.h"
#include "tests/integration/integration_fixture.h"

namespace samplerd::integration {
namespace {

using grpc::health::v1::Health;
using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

constexpr char kService[] = "samplerd.v1.SamplerService";

std::chrono::system_clock::time_point In(std::chrono::seconds seconds) {
  return std::chrono::system_clock::now() + seconds;
}

class HealthPortTest : public ::testing::Test {
 protected:
  void SetUp() override {
    port_ = PickFreeTcpPort();
    ASSERT_GT(port_, 0);
    ServerProcess::Options options = CpuServerOptions();
    options.extra_args.push_back("--health_port=" + std::to_string(port_));
    options.extra_args.push_back("--health_address=127.0.0.1");
    std::string error;
    server_ = ServerProcess::Start(options, &error);
    ASSERT_NE(server_, nullptr) << error;
    channel_ = grpc::CreateChannel(HealthTarget(), grpc::InsecureChannelCredentials());
    health_ = Health::NewStub(channel_);
  }
  void TearDown() override {
    if (HasFailure() && server_ != nullptr) std::cerr << server_->Log();
  }

  std::string HealthTarget() const { return "127.0.0.1:" + std::to_string(port_); }

  // Check over the health port; fills *status.
  HealthCheckResponse::ServingStatus Check(const std::string& service, grpc::Status* status) {
    grpc::ClientContext context;
    context.set_deadline(In(std::chrono::seconds(10)));
    HealthCheckRequest request;
    request.set_service(service);
    HealthCheckResponse response;
    *status = health_->Check(&context, request, &response);
    return response.status();
  }

  int port_ = 0;
  std::unique_ptr<ServerProcess> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<Health::Stub> health_;
};

TEST_F(HealthPortTest, CheckOverTcpIsServing) {
  grpc::Status status;
  EXPECT_EQ(Check(kService, &status), HealthCheckResponse::SERVING);
  EXPECT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(Check("", &status), HealthCheckResponse::SERVING);
  EXPECT_TRUE(MentionsAny(server_->Log(), {"health on 127.0.0.1:" + std::to_string(port_)}));
  EXPECT_EQ(server_->Stop(), 0) << server_->Log();
}

TEST_F(HealthPortTest, TheSamplingApiIsNotOnTheHealthPort) {
  std::unique_ptr<v1::SamplerService::Stub> sampler = v1::SamplerService::NewStub(channel_);
  const GreedyCase c = KnownGreedyBatch();
  grpc::ClientContext context;
  context.set_deadline(In(std::chrono::seconds(10)));
  v1::SampleResponse response;
  const grpc::Status status = sampler->Sample(&context, c.logits.Request({Greedy()}), &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNIMPLEMENTED) << status.error_message();
  {
    // ... while the main listener serves it. (The client goes before Stop: an idle sync
    // client would hold the drain for gRPC's 5 s poll, see lifecycle_test.cc.)
    Client client(server_->target());
    ASSERT_TRUE(client.Sample(c.logits.Request({Greedy()}), &response).ok());
    EXPECT_EQ(Tokens(response), c.expected);
  }
  EXPECT_EQ(server_->Stop(), 0) << server_->Log();
}

TEST_F(HealthPortTest, SigtermTurnsItNotServingDuringTheGracePeriod) {
  // An open stream keeps the server draining (up to --grace_period=5s) after SIGTERM.
  Client client(server_->target());
  std::unique_ptr<SampleSession> session = client.OpenStream();
  const GreedyCase c = KnownGreedyBatch();
  v1::SampleResponse response;
  ASSERT_TRUE(session->Step(c.logits.Request({Greedy()}), &response).ok());

  grpc::ClientContext context;
  context.set_deadline(In(std::chrono::seconds(20)));
  HealthCheckRequest request;
  request.set_service(kService);
  std::unique_ptr<grpc::ClientReader<HealthCheckResponse>> watch =
      health_->Watch(&context, request);
  HealthCheckResponse update;
  ASSERT_TRUE(watch->Read(&update));
  EXPECT_EQ(update.status(), HealthCheckResponse::SERVING);

  ASSERT_EQ(kill(server_->pid(), SIGTERM), 0);
  ASSERT_TRUE(watch->Read(&update));
  EXPECT_EQ(update.status(), HealthCheckResponse::NOT_SERVING);
  // A fresh probe during the grace period says the same.
  grpc::Status status;
  EXPECT_EQ(Check(kService, &status), HealthCheckResponse::NOT_SERVING);
  EXPECT_TRUE(status.ok()) << status.error_message();

  // Let the drain finish: close the stream, then the server exits 0.
  EXPECT_TRUE(session->Close().ok());
  context.TryCancel();
  watch->Finish();
  EXPECT_EQ(server_->Stop(std::chrono::seconds(20)), 0) << server_->Log();
}

TEST(HealthPortFlags, ATakenPortFailsStartupWithExitCode2) {
  const int port = PickFreeTcpPort();
  ServerProcess::Options options = CpuServerOptions();
  options.extra_args.push_back("--health_port=" + std::to_string(port));
  options.extra_args.push_back("--health_address=127.0.0.1");
  std::string error;
  std::unique_ptr<ServerProcess> first = ServerProcess::Start(options, &error);
  ASSERT_NE(first, nullptr) << error;
  EXPECT_EQ(ServerProcess::Start(options, &error), nullptr);
  EXPECT_TRUE(MentionsAny(error, {"exited with status 2"})) << error;
  EXPECT_TRUE(MentionsAny(error, {"expected to bind the health address"})) << error;
  EXPECT_EQ(first->Stop(), 0) << first->Log();
}

TEST(HealthPortFlags, APortOutOfRangeFailsStartupWithExitCode2) {
  ServerProcess::Options options = CpuServerOptions();
  options.extra_args.push_back("--health_port=-1");
  std::string error;
  EXPECT_EQ(ServerProcess::Start(options, &error), nullptr);
  EXPECT_TRUE(MentionsAny(error, {"expected --health_port in [0, 65535]"})) << error;
}

}  // namespace
}  // namespace samplerd::integration
