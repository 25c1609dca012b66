// Who may use regions (unix-socket peers always, TCP peers only with --allow_remote_regions),
// and who is behind a unix-socket connection (PeerTable).
#include "service/grpc/peer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

namespace samplerd::grpc_transport {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(IsUnixPeer, KnowsGrpcsPeerForms) {
  EXPECT_TRUE(IsUnixPeer("unix:"));
  EXPECT_TRUE(IsUnixPeer("unix:/run/samplerd/samplerd.sock"));
  EXPECT_TRUE(IsUnixPeer("unix-abstract:samplerd"));
  EXPECT_TRUE(IsUnixPeer("fd:12"));  // a connection accepted by UnixListener
  EXPECT_FALSE(IsUnixPeer("ipv4:127.0.0.1:50000"));
  EXPECT_FALSE(IsUnixPeer("ipv6:[::1]:50000"));
  EXPECT_FALSE(IsUnixPeer(""));
  EXPECT_FALSE(IsUnixPeer("unixish:x"));
}

TEST(CheckRegionPeer, RefusesTcpUnlessAllowedAndSaysHow) {
  EXPECT_TRUE(CheckRegionPeer("unix:", false).ok());
  EXPECT_TRUE(CheckRegionPeer("ipv4:10.0.0.7:4242", true).ok());
  const absl::Status status = CheckRegionPeer("ipv4:10.0.0.7:4242", false);
  EXPECT_EQ(status.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(status.message()), HasSubstr("--allow_remote_regions"));
  EXPECT_THAT(std::string(status.message()), HasSubstr("expected"));
  EXPECT_THAT(std::string(status.message()), Not(HasSubstr("10.0.0.7")));
}

TEST(PeerTable, KnowsTheProcessBehindARecordedConnection) {
  int pair[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, pair), 0);
  PeerTable peers;
  const std::string peer = "fd:" + std::to_string(pair[0]);
  EXPECT_EQ(peers.PidOf(peer), 0);  // not recorded
  peers.Record(pair[0]);
  EXPECT_EQ(peers.PidOf(peer), getpid());  // SO_PEERCRED of a socketpair: this process
  EXPECT_EQ(peers.PidOf("unix:"), 0);
  EXPECT_EQ(peers.PidOf("ipv4:127.0.0.1:5"), 0);
  EXPECT_EQ(peers.PidOf("fd:"), 0);
  EXPECT_EQ(peers.PidOf("fd:x1"), 0);
  EXPECT_EQ(peers.PidOf("fd:-1"), 0);

  // The connection closes and its number goes to another socket: not believed any more.
  const int number = pair[0];
  close(pair[0]);
  close(pair[1]);
  EXPECT_EQ(peers.PidOf(peer), 0);
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, pair), 0);
  if (pair[0] == number || pair[1] == number) {
    EXPECT_EQ(peers.PidOf(peer), 0);
  }
  close(pair[0]);
  close(pair[1]);
}

}  // namespace
}  // namespace samplerd::grpc_transport
