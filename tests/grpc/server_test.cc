// SamplerServer's listeners, in process: unix address forms, socket directory and mode, and the
// addresses it reports.
#include "service/grpc/server.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <filesystem>
#include <memory>
#include <string>

#include "absl/time/clock.h"
#include "service/core/backend/cpu_sampler.h"

namespace samplerd::grpc_transport {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

class ServerListen : public ::testing::Test {
 protected:
  ServerListen() {
    core_ = std::make_unique<core::SamplerCore>(
        core::CoreOptions{}, std::make_unique<core::CpuSampler>(1), /*seed_start=*/7);
    std::string dir = std::filesystem::temp_directory_path().string() + "/samplerd-srv-XXXXXX";
    if (mkdtemp(dir.data()) != nullptr) dir_ = dir;
  }
  ~ServerListen() override {
    if (server_ != nullptr) server_->Shutdown(absl::Now());
    std::error_code ignored;
    if (!dir_.empty()) std::filesystem::remove_all(dir_, ignored);
  }

  absl::Status Start(std::vector<std::string> listen) {
    ServerOptions options;
    options.listen = std::move(listen);
    absl::StatusOr<std::unique_ptr<SamplerServer>> server =
        SamplerServer::Start(options, core_.get());
    if (!server.ok()) return server.status();
    server_ = *std::move(server);
    return absl::OkStatus();
  }

  // Permission bits of `path`, or -1 when it does not exist.
  static int Mode(const std::string& path) {
    struct stat st;
    return stat(path.c_str(), &st) == 0 ? static_cast<int>(st.st_mode & 07777) : -1;
  }

  std::unique_ptr<core::SamplerCore> core_;
  std::unique_ptr<SamplerServer> server_;
  std::string dir_;
};

TEST_F(ServerListen, SingleSlashUnixAddressIsAUnixSocketReportedAsGiven) {
  ASSERT_FALSE(dir_.empty());
  const std::string path = dir_ + "/a/b/s.sock";
  ASSERT_TRUE(Start({"unix:" + path}).ok());
  EXPECT_THAT(server_->bound_addresses(), ElementsAre("unix:" + path));
  // Created directories are 0750 minus the umask (-1, a missing one, has every bit set).
  EXPECT_EQ(Mode(dir_ + "/a") & ~0750, 0);
  EXPECT_EQ(Mode(dir_ + "/a/b") & ~0750, 0);
  EXPECT_EQ(Mode(path), 0660);
}

TEST_F(ServerListen, TripleSlashUnixAddressIsAUnixSocketReportedAsGiven) {
  ASSERT_FALSE(dir_.empty());
  const std::string path = dir_ + "/run/s.sock";
  ASSERT_TRUE(Start({"unix://" + path, "127.0.0.1:0"}).ok());
  ASSERT_EQ(server_->bound_addresses().size(), 2u);
  EXPECT_EQ(server_->bound_addresses()[0], "unix://" + path);
  EXPECT_THAT(server_->bound_addresses()[1], HasSubstr("127.0.0.1:"));
  EXPECT_NE(server_->bound_addresses()[1], "127.0.0.1:0");
  EXPECT_EQ(Mode(dir_ + "/run") & ~0750, 0);
  EXPECT_EQ(Mode(path), 0660);
}

TEST_F(ServerListen, UnixAddressWithAnAuthorityIsInvalid) {
  const absl::Status status = Start({"unix://localhost/tmp/s.sock"});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr("expected"));
}

TEST_F(ServerListen, EmptyUnixPathIsInvalid) {
  EXPECT_EQ(Start({"unix:"}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Start({"unix://"}).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace samplerd::grpc_transport
