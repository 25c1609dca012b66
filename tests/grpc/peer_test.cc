// Who may use regions: unix-socket peers always, TCP peers only with --allow_remote_regions.
#include "service/grpc/peer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

namespace samplerd::grpc_transport {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(IsUnixPeer, KnowsGrpcsPeerForms) {
  EXPECT_TRUE(IsUnixPeer("unix:"));
  EXPECT_TRUE(IsUnixPeer("unix:/run/samplerd/samplerd.sock"));
  EXPECT_TRUE(IsUnixPeer("unix-abstract:samplerd"));
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

}  // namespace
}  // namespace samplerd::grpc_transport
