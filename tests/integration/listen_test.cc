// Listeners of the real binary: both unix address forms serve, the socket's directories are
// created, and the socket file is owner-and-group only (mode 0660).
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

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

// CPU time (user + system, clock ticks) of `pid`'s threads named `name`.
long ThreadTicks(pid_t pid, const std::string& name) {
  long ticks = 0;
  const std::string dir = "/proc/" + std::to_string(pid) + "/task";
  std::error_code ignored;
  for (const auto& task : std::filesystem::directory_iterator(dir, ignored)) {
    std::ifstream in(task.path() / "stat");
    std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const size_t open = stat.find('(');
    const size_t close = stat.rfind(')');
    if (open == std::string::npos || close == std::string::npos) continue;
    if (stat.substr(open + 1, close - open - 1) != name) continue;
    std::istringstream fields(stat.substr(close + 2));
    std::string field;
    for (int i = 0; i < 11; ++i) fields >> field;  // state .. cmajflt
    long utime = 0;
    long stime = 0;
    fields >> utime >> stime;
    ticks += utime + stime;
  }
  return ticks;
}

// A server out of file descriptors (its connections hold them all) cannot accept the next
// connection; its accept thread must then wait, not spin on the listener that stays readable.
TEST(Listen, OutOfDescriptorsTheAcceptThreadWaitsInsteadOfSpinning) {
  // The server inherits a low descriptor limit from this process, for the time of its start.
  struct rlimit saved;
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &saved), 0);
  struct rlimit low = saved;
  low.rlim_cur = 64;
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &low), 0);
  std::string error;
  std::unique_ptr<ServerProcess> server = ServerProcess::Start(CpuServerOptions(), &error);
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &saved), 0);
  ASSERT_NE(server, nullptr) << error;
  const std::string path = server->target().substr(std::strlen("unix://"));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  ASSERT_LT(path.size(), sizeof(addr.sun_path));
  std::memcpy(addr.sun_path, path.data(), path.size());

  std::vector<int> connections;  // silent clients: each holds one of the server's descriptors
  for (int i = 0; i < 80; ++i) {
    const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)), 0);
    connections.push_back(fd);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const long before = ThreadTicks(server->pid(), "sd-unix-accept");
  std::this_thread::sleep_for(std::chrono::seconds(2));
  const long spent = ThreadTicks(server->pid(), "sd-unix-accept") - before;
  EXPECT_LT(spent, sysconf(_SC_CLK_TCK) / 5) << "ticks of CPU in 2 s";  // spinning: ~2 s

  for (int fd : connections) close(fd);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // at most one back-off
  ExpectServes(*server);
  EXPECT_EQ(server->Stop(), 0) << server->Log();
}

}  // namespace
}  // namespace samplerd::integration
