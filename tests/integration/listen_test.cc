// Listeners of the real binary: both unix address forms serve, the socket's directories are
// created, and the socket file is owner-and-group only (mode 0660).
#include <stdlib.h>
#include <sys/stat.h>

#include <filesystem>
#include <memory>
#include <string>

#include "tests/integration/integration_fixture.h"

namespace samplerd::integration {
namespace {

// Permission bits of `path`, or -1 when it does not exist.
int Mode(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 ? static_cast<int>(st.st_mode & 07777) : -1;
}

bool IsSocket(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode);
}

// Expects `server` to answer a greedy request correctly.
void ExpectServes(const ServerProcess& server) {
  Client client(server.target());
  const GreedyCase c = KnownGreedyBatch();
  v1::SampleResponse response;
  const grpc::Status status = client.Sample(c.logits.Request({Greedy()}), &response);
  ASSERT_TRUE(status.ok()) << status.error_code() << ": " << status.error_message();
  EXPECT_EQ(Tokens(response), c.expected);
}

// A private directory removed with everything in it.
class ScratchDir {
 public:
  ScratchDir() {
    std::string dir = std::filesystem::temp_directory_path().string() + "/samplerd-listen-XXXXXX";
    if (mkdtemp(dir.data()) != nullptr) path_ = dir;
  }
  ~ScratchDir() {
    std::error_code ignored;
    if (!path_.empty()) std::filesystem::remove_all(path_, ignored);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

TEST(Listen, SingleSlashUnixAddressCreatesTheDirectoryAndServes) {
  ScratchDir scratch;
  ASSERT_FALSE(scratch.path().empty());
  const std::string path = scratch.path() + "/nested/run/s.sock";
  ServerProcess::Options options = CpuServerOptions();
  options.listen = "unix:" + path;  // gRPC's single-slash form, not a TCP host "unix"
  std::string error;
  std::unique_ptr<ServerProcess> server = ServerProcess::Start(options, &error);
  ASSERT_NE(server, nullptr) << error;
  EXPECT_TRUE(IsSocket(path)) << server->Log();
  EXPECT_EQ(Mode(path), 0660);
  EXPECT_TRUE(MentionsAny(server->Log(), {"listening on unix:" + path})) << server->Log();
  ExpectServes(*server);
  EXPECT_EQ(server->Stop(), 0) << server->Log();
}

TEST(Listen, UnixSocketIsOwnerAndGroupOnly) {
  std::string error;
  std::unique_ptr<ServerProcess> server = ServerProcess::Start(CpuServerOptions(), &error);
  ASSERT_NE(server, nullptr) << error;
  const std::string prefix = "unix://";  // the harness listens on unix:///tmp/.../s.sock
  ASSERT_EQ(server->target().rfind(prefix, 0), 0u) << server->target();
  const std::string path = server->target().substr(prefix.size());
  EXPECT_TRUE(IsSocket(path));
  EXPECT_EQ(Mode(path), 0660);
  ExpectServes(*server);
  EXPECT_EQ(server->Stop(), 0) << server->Log();
}

}  // namespace
}  // namespace samplerd::integration
