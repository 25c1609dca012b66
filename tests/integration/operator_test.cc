// The real binary as an operator meets it: what it prints and how it exits for bad command lines
// and unusable listen addresses, and how it stops on signals.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tests/integration/integration_fixture.h"

namespace samplerd::integration {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// A private directory removed with everything in it.
class ScratchDir {
 public:
  ScratchDir() {
    std::string dir = std::filesystem::temp_directory_path().string() + "/samplerd-op-XXXXXX";
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

bool Exists(const std::string& path) {
  struct stat st;
  return lstat(path.c_str(), &st) == 0;
}

// samplerd run as a child with its stdout and stderr on one pipe that this process reads (and
// may close, as a log collector that dies would).
class Child {
 public:
  // `address_space` > 0: the child's RLIMIT_AS, in bytes.
  explicit Child(const std::vector<std::string>& args, rlim_t address_space = 0) {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) return;
    std::vector<std::string> argv_storage = {SAMPLERD_BINARY};
    argv_storage.insert(argv_storage.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (std::string& a : argv_storage) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_ = fork();
    if (pid_ == 0) {
      if (address_space > 0) {
        const rlimit limit = {address_space, address_space};
        setrlimit(RLIMIT_AS, &limit);
      }
      dup2(fds[1], 1);
      dup2(fds[1], 2);
      execv(argv[0], argv.data());
      _exit(127);
    }
    close(fds[1]);
    out_fd_ = fds[0];
  }
  ~Child() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    CloseOutput();
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  bool started() const { return pid_ > 0 && out_fd_ >= 0; }

  // Reads the child's output until it holds `text` (true), or until EOF or `timeout` (false).
  bool WaitForOutput(const std::string& text, milliseconds timeout = milliseconds(20000)) {
    const auto deadline = Clock::now() + timeout;
    while (output_.find(text) == std::string::npos) {
      if (!ReadSome(deadline)) return false;
    }
    return true;
  }

  // The reader goes away: the child's next write to stdout or stderr raises SIGPIPE.
  void CloseOutput() {
    if (out_fd_ >= 0) close(out_fd_);
    out_fd_ = -1;
  }

  void Signal(int signal_number) { kill(pid_, signal_number); }

  // Waits for the child to exit, reading its output meanwhile. Returns its exit code, 128 + N
  // when signal N ended it, or -1 when it outlived `timeout` (it is then killed).
  int Wait(milliseconds timeout = milliseconds(20000)) {
    const auto deadline = Clock::now() + timeout;
    while (out_fd_ >= 0 && ReadSome(deadline)) {
    }
    int status = 0;
    while (true) {
      const pid_t done = waitpid(pid_, &status, WNOHANG);
      if (done == pid_) break;
      if (Clock::now() > deadline) {
        kill(pid_, SIGKILL);
        waitpid(pid_, nullptr, 0);
        pid_ = -1;
        return -1;
      }
      usleep(10'000);
    }
    pid_ = -1;
    if (WIFEXITED(status)) return WEXITSTATUS(status);
    return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : -1;
  }

  const std::string& output() const { return output_; }

 private:
  // Appends what the pipe has; false at EOF, on error or at the deadline.
  bool ReadSome(Clock::time_point deadline) {
    if (out_fd_ < 0) return false;
    const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return false;
    pollfd p = {out_fd_, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(left)) <= 0) return false;
    char buffer[4096];
    const ssize_t n = read(out_fd_, buffer, sizeof(buffer));
    if (n <= 0) {
      CloseOutput();
      return false;
    }
    output_.append(buffer, static_cast<size_t>(n));
    return true;
  }

  pid_t pid_ = -1;
  int out_fd_ = -1;
  std::string output_;
};

// Runs samplerd with `args` to its exit; returns the exit code and stores its output.
int RunToExit(const std::vector<std::string>& args, std::string* output) {
  Child child(args);
  if (!child.started()) return -1;
  const int code = child.Wait(milliseconds(10000));
  *output = child.output();
  return code;
}

std::vector<std::string> CpuArgs(const std::string& listen) {
  return {"--listen=" + listen, "--backend=cpu", "--threads=2", "--grace_period=2s"};
}

// Lines of `text` (a final newline ends the last one).
int Lines(const std::string& text) {
  int lines = 0;
  for (char c : text) lines += c == '\n';
  return lines;
}

TEST(CommandLine, ABadCommandLineExits2WithOneExpectedGotLine) {
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"--threads=abc"},
       "bad flags: INVALID_ARGUMENT: expected --threads to be an integer in [-2147483648, "
       "2147483647], got 'abc'"},
      {{"--max_vocab=99999999999999999999"},
       "expected --max_vocab to be an integer in [-9223372036854775808, 9223372036854775807], got "
       "'99999999999999999999'"},
      // Bounded, so that no request's byte count overflows (2^62 let an empty request through
      // the size check and abort the server).
      {{"--max_vocab=4611686018427387904"},
       "expected --max_vocab in [1, 2147483647] (token ids are int32), got 4611686018427387904"},
      {{"--max_batch=16777217"}, "expected --max_batch in [1, 16777216], got 16777217"},
      {{"--max_host_session_bytes=-1"},
       "expected --max_host_session_bytes >= 0 (0 = no limit), got -1"},
      // A budget without room for one message would let no unary request in.
      {{"--max_message_bytes=1048576", "--max_receive_bytes=1048575"},
       "expected --max_receive_bytes of 0 (no limit) or at least --max_message_bytes (1048576), "
       "got 1048575"},
      {{"--grace_period=10"},
       "expected --grace_period to be a duration with its unit, e.g. 10s or 500ms, got '10'"},
      {{"--allow_remote_regions=maybe"},
       "expected --allow_remote_regions to be true or false, got 'maybe'"},
      {{"--no_such_flag=1"},
       "expected a flag of samplerd --help, got the unknown flag '--no_such_flag=1'"},
      {{"--max_batch=8", "16"},
       "expected only --flags (a value goes as --flag=VALUE), got the argument '16'"},
      {{"--", "serve"}, "expected only --flags, got the argument 'serve' after '--'"},
      {{"--listen"}, "expected --listen=VALUE (a value), got no value"},
  };
  for (const Case& c : cases) {
    std::string output;
    EXPECT_EQ(RunToExit(c.args, &output), 2) << c.args.front() << ": " << output;
    EXPECT_TRUE(MentionsAny(output, {c.message})) << output;
    EXPECT_EQ(Lines(output), 1) << output;
  }
}

TEST(CommandLine, EveryFormAbseilAcceptsStillStartsTheServer) {
  ScratchDir scratch;
  ASSERT_FALSE(scratch.path().empty());
  // "--flag value", a single dash, a bool's "--noflag" and "--flag=false" forms.
  Child child({"--listen", "unix://" + scratch.path() + "/s.sock", "-backend=cpu", "--threads", "2",
               "--noallow_remote_regions", "--allow_remote_regions=false", "--grace_period=2s"});
  ASSERT_TRUE(child.started());
  ASSERT_TRUE(child.WaitForOutput("listening on")) << child.output();
  child.Signal(SIGTERM);
  EXPECT_EQ(child.Wait(), 0) << child.output();
}

TEST(CommandLine, HelpNamesTheProgramOnce) {
  std::string output;
  RunToExit({"--help"}, &output);
  EXPECT_TRUE(MentionsAny(output, {"samplerd: samples the next token"})) << output;
  EXPECT_FALSE(MentionsAny(output, {"samplerd: samplerd:"})) << output;
}

TEST(CommandLine, HelpNamesTheFlagsFileByItsPathInTheSourceTreeNotTheBuildMachines) {
  // It printed "Flags from work/main/service/flags.cc:", the checkout path of the machine that
  // built the binary (__FILE__); the top-level CMakeLists.txt maps the source directory away.
  std::string output;
  RunToExit({"--help"}, &output);
  EXPECT_TRUE(MentionsAny(output, {"Flags from service/flags.cc:"})) << output;
  const std::string source_dir = SAMPLERD_SOURCE_DIR;  // e.g. /work/main
  ASSERT_FALSE(source_dir.empty());
  EXPECT_FALSE(MentionsAny(output, {source_dir.substr(1) + "/"})) << output;  // with or without /
}

TEST(Signals, AGoneLogReaderDoesNotKillTheServerOnItsNextLogLine) {
  // The log collector (a pipe's reader) exits; the server's next log line, the one SIGTERM
  // writes, must not kill it by SIGPIPE before it drains and removes its socket.
  ScratchDir scratch;
  ASSERT_FALSE(scratch.path().empty());
  const std::string socket = scratch.path() + "/s.sock";
  Child child(CpuArgs("unix://" + socket));
  ASSERT_TRUE(child.started());
  ASSERT_TRUE(child.WaitForOutput("listening on")) << child.output();
  child.CloseOutput();
  child.Signal(SIGTERM);
  EXPECT_EQ(child.Wait(), 0) << "128 + 13: killed by SIGPIPE";
  EXPECT_FALSE(Exists(socket)) << "the socket file stayed behind";
}

TEST(Signals, SighupDrainsAndRemovesTheSocketLikeSigterm) {
  // The terminal of a foreground server closes: a hang-up, not a kill on the spot.
  ScratchDir scratch;
  ASSERT_FALSE(scratch.path().empty());
  const std::string socket = scratch.path() + "/s.sock";
  Child child(CpuArgs("unix://" + socket));
  ASSERT_TRUE(child.started());
  ASSERT_TRUE(child.WaitForOutput("listening on")) << child.output();
  child.Signal(SIGHUP);
  EXPECT_EQ(child.Wait(), 0) << "128 + 1: killed by SIGHUP\n" << child.output();
  EXPECT_TRUE(MentionsAny(child.output(), {"SIGHUP: NOT_SERVING, draining"})) << child.output();
  EXPECT_FALSE(Exists(socket)) << "the socket file stayed behind";
}

TEST(Listen, AnAbstractSocketWithoutANameFailsStartup) {
  // It used to bind the empty abstract name and report SERVING where no client could connect.
  std::string output;
  EXPECT_EQ(RunToExit(CpuArgs("unix-abstract:"), &output), 2) << output;
  EXPECT_TRUE(MentionsAny(
      output, {"expected an abstract socket address unix-abstract:NAME with a name, got "
               "'unix-abstract:'"}))
      << output;
}

TEST(Listen, ATcpPortOutOfRangeFailsStartupInsteadOfServingOnAnother) {
  // gRPC keeps a port's low 16 bits: 99999 would have served on 34463.
  for (const std::string address : {"127.0.0.1:99999", "127.0.0.1:-1", "localhost", "[::1]:x"}) {
    std::string output;
    EXPECT_EQ(RunToExit(CpuArgs(address), &output), 2) << address << ": " << output;
    EXPECT_TRUE(MentionsAny(output, {"expected a --listen address unix:///abs/path.sock or "
                                     "HOST:PORT with PORT in [0, 65535] (e.g. 127.0.0.1:50051, "
                                     "[::]:50051), got '" +
                                     address + "'"}))
        << output;
  }
}

// Sanitizer builds reserve terabytes of address space for their shadow memory: an RLIMIT_AS
// stops them before main().
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitizerBuild = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
constexpr bool kSanitizerBuild = true;
#else
constexpr bool kSanitizerBuild = false;
#endif
#else
constexpr bool kSanitizerBuild = false;
#endif

TEST(CommandLine, MoreThreadsThanTheProcessCanStartFailStartupWithExitCode2) {
  if (kSanitizerBuild) GTEST_SKIP() << "an address-space limit cannot run a sanitizer build";
  // 1 GB of address space holds ~100 thread stacks of 8 MB: thread 101 cannot start. It used to
  // abort the process (an uncaught std::system_error, exit 134 and a core dump).
  ScratchDir scratch;
  ASSERT_FALSE(scratch.path().empty());
  std::vector<std::string> args = CpuArgs("unix://" + scratch.path() + "/s.sock");
  args.push_back("--threads=100000");
  Child child(args, rlim_t{1} << 30);
  ASSERT_TRUE(child.started());
  EXPECT_EQ(child.Wait(milliseconds(10000)), 2) << child.output();
  EXPECT_TRUE(
      MentionsAny(child.output(), {"cannot start the sampler: RESOURCE_EXHAUSTED: expected "
                                   "to start 100000 CPU sampler threads (--threads), got: "}))
      << child.output();
}

// A socket file at `path` that no server listens on, as a SIGKILLed server leaves it.
bool MakeStaleSocket(const std::string& path) {
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr = {};
  addr.sun_family = AF_UNIX;
  if (fd < 0 || path.size() >= sizeof(addr.sun_path)) return false;
  std::memcpy(addr.sun_path, path.data(), path.size());
  const bool bound = bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0;
  close(fd);
  return bound;
}

TEST(Listen, ASecondServerOnALiveSocketFailsStartupAndTheFirstKeepsServing) {
  std::string error;
  std::unique_ptr<ServerProcess> first = ServerProcess::Start(CpuServerOptions(), &error);
  ASSERT_NE(first, nullptr) << error;
  std::string output;
  EXPECT_EQ(RunToExit(CpuArgs(first->target()), &output), 2) << output;
  EXPECT_TRUE(MentionsAny(output, {"expected no server listening on"})) << output;

  // The first server's socket is still its own: a new connection reaches it.
  Client client(first->target());
  const GreedyCase c = KnownGreedyBatch();
  v1::SampleResponse response;
  const grpc::Status status = client.Sample(c.logits.Request({Greedy()}), &response);
  EXPECT_TRUE(status.ok()) << status.error_code() << ": " << status.error_message();
  EXPECT_EQ(first->Stop(), 0) << first->Log();
}

TEST(Listen, TheSameSocketTwiceInListenFailsStartup) {
  ScratchDir scratch;
  ASSERT_FALSE(scratch.path().empty());
  const std::string address = "unix://" + scratch.path() + "/s.sock";
  std::string output;
  EXPECT_EQ(RunToExit(CpuArgs(address + "," + address), &output), 2) << output;
  EXPECT_TRUE(MentionsAny(output, {"expected no server listening on"})) << output;
}

TEST(Listen, AStaleSocketOfAKilledServerIsReplacedAndRemovedAtExit) {
  ScratchDir scratch;
  ASSERT_FALSE(scratch.path().empty());
  const std::string socket = scratch.path() + "/s.sock";
  ASSERT_TRUE(MakeStaleSocket(socket));
  Child child(CpuArgs("unix://" + socket));
  ASSERT_TRUE(child.started());
  ASSERT_TRUE(child.WaitForOutput("listening on")) << child.output();
  child.Signal(SIGTERM);
  EXPECT_EQ(child.Wait(), 0) << child.output();
  EXPECT_FALSE(Exists(socket));
}

TEST(Listen, ARegularFileOrADirectoryAtTheSocketPathFailsStartupAndIsKept) {
  ScratchDir scratch;
  ASSERT_FALSE(scratch.path().empty());
  const std::string file = scratch.path() + "/config.yaml";
  {
    std::ofstream out(file);
    out << "keep me\n";
  }
  std::string output;
  EXPECT_EQ(RunToExit(CpuArgs("unix://" + file), &output), 2) << output;
  EXPECT_TRUE(MentionsAny(output, {"got a regular file"})) << output;
  std::ifstream in(file);
  std::string line;
  EXPECT_TRUE(std::getline(in, line) && line == "keep me") << "the file was replaced";

  EXPECT_EQ(RunToExit(CpuArgs("unix://" + scratch.path()), &output), 2) << output;
  EXPECT_TRUE(MentionsAny(output, {"got the directory " + scratch.path()})) << output;
}

}  // namespace
}  // namespace samplerd::integration
