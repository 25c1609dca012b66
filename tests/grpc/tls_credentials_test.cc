// TLS options: which flag combinations are usable, and what unreadable or non-PEM files give.
#include "service/grpc/tls_credentials.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace samplerd::grpc_transport {
namespace {

using ::testing::HasSubstr;

std::string Message(const absl::Status& status) { return std::string(status.message()); }

TEST(ValidateTlsOptions, NeitherOrBothAreFine) {
  EXPECT_TRUE(ValidateTlsOptions({}).ok());
  EXPECT_TRUE(ValidateTlsOptions({"c.pem", "k.pem", ""}).ok());
  EXPECT_TRUE(ValidateTlsOptions({"c.pem", "k.pem", "ca.pem"}).ok());
}

TEST(ValidateTlsOptions, OneWithoutTheOtherSaysWhichIsMissing) {
  absl::Status status = ValidateTlsOptions({"c.pem", "", ""});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(status), HasSubstr("expected both --tls_cert and --tls_key"));
  EXPECT_THAT(Message(status), HasSubstr("got only --tls_cert"));
  status = ValidateTlsOptions({"", "k.pem", ""});
  EXPECT_THAT(Message(status), HasSubstr("got only --tls_key"));
}

TEST(ValidateTlsOptions, ClientCaNeedsServerTls) {
  const absl::Status status = ValidateTlsOptions({"", "", "ca.pem"});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(status), HasSubstr("--tls_client_ca"));
}

TEST(MakeTcpCredentials, PlaintextWithoutFiles) { EXPECT_TRUE(MakeTcpCredentials({}).ok()); }

TEST(MakeTcpCredentials, UnreadableFileIsFailedPrecondition) {
  const absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials =
      MakeTcpCredentials({"/nonexistent/cert.pem", "/nonexistent/key.pem", ""});
  EXPECT_EQ(credentials.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(Message(credentials.status()), HasSubstr("--tls_cert=/nonexistent/cert.pem"));
}

TEST(MakeTcpCredentials, FileWithoutPemIsInvalidAndNotEchoed) {
  std::string dir = std::filesystem::temp_directory_path().string() + "/samplerd-tls-XXXXXX";
  ASSERT_NE(mkdtemp(dir.data()), nullptr);
  const std::string path = dir + "/cert.pem";
  std::ofstream(path) << "secret-material-not-pem";
  const absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials =
      MakeTcpCredentials({path, path, ""});
  EXPECT_EQ(credentials.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(credentials.status()), HasSubstr("expected a certificate in PEM form"));
  EXPECT_THAT(Message(credentials.status()), ::testing::Not(HasSubstr("secret-material")));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace samplerd::grpc_transport
