// Server lifecycle: SIGTERM drains and exits 0 (also with an open stream), and the harness
// reports a server that cannot start.
#include <memory>
#include <string>

#include "tests/integration/integration_fixture.h"

namespace samplerd::integration {
namespace {

std::unique_ptr<ServerProcess> StartOrFail(const ServerProcess::Options& options) {
  std::string error;
  std::unique_ptr<ServerProcess> server = ServerProcess::Start(options, &error);
  EXPECT_NE(server, nullptr) << error;
  return server;
}

TEST(Lifecycle, SigtermAfterServingExitsZero) {
  std::unique_ptr<ServerProcess> server = StartOrFail(CpuServerOptions());
  ASSERT_NE(server, nullptr);
  {
    // The client goes first: a sync client polls an idle connection only every 5 s (gRPC's
    // backup poller), so a server shutting down would wait that long for it to read GOAWAY.
    Client client(server->target());
    const GreedyCase c = KnownGreedyBatch();
    v1::SampleResponse response;
    ASSERT_TRUE(client.Sample(c.logits.Request({Greedy()}), &response).ok());
  }
  EXPECT_EQ(server->Stop(), 0) << server->Log();
}

TEST(Lifecycle, SigtermWithAnOpenStreamExitsZeroWithinTheGracePeriod) {
  ServerProcess::Options options = CpuServerOptions();
  options.extra_args.push_back("--grace_period=1s");
  std::unique_ptr<ServerProcess> server = StartOrFail(options);
  ASSERT_NE(server, nullptr);
  Client client(server->target());
  std::unique_ptr<SampleSession> session = client.OpenStream();
  const GreedyCase c = KnownGreedyBatch();
  v1::SampleResponse response;
  ASSERT_TRUE(session->Step(c.logits.Request({Greedy()}), &response).ok());

  // The idle stream must not hold the server past its grace period (1 s; 20 s of slack).
  EXPECT_EQ(server->Stop(std::chrono::seconds(20)), 0) << server->Log();
  // The stream is gone with the server: the next step fails and closes the session.
  EXPECT_FALSE(session->Step(c.logits.Request({Greedy()}), &response).ok());
  EXPECT_FALSE(session->open());
}

TEST(Lifecycle, HarnessReportsABinaryThatCannotRun) {
  ServerProcess::Options options = CpuServerOptions();
  options.binary = "/nonexistent/samplerd";
  std::string error;
  EXPECT_EQ(ServerProcess::Start(options, &error), nullptr);
  EXPECT_TRUE(MentionsAny(error, {"cannot execute"})) << error;
}

TEST(Lifecycle, HarnessReportsAServerThatExitsBeforeServing) {
  ServerProcess::Options options = CpuServerOptions();
  options.backend = "no-such-backend";  // refused by flag parsing: exit status 2
  std::string error;
  EXPECT_EQ(ServerProcess::Start(options, &error), nullptr);
  EXPECT_TRUE(MentionsAny(error, {"exited with status"})) << error;
}

}  // namespace
}  // namespace samplerd::integration
