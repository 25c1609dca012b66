// ServerProcess: fork/exec of samplerd, readiness through grpc.health.v1, SIGTERM + waitpid.
#include "tests/integration/server_process.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <grpcpp/alarm.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "grpc/health/v1/health.grpc.pb.h"

namespace samplerd::integration {
namespace {

using grpc::health::v1::Health;
using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;
using Clock = std::chrono::system_clock;

// Longest single health RPC: bounds how late an early exit of the server is noticed.
constexpr auto kHealthAttempt = std::chrono::milliseconds(250);

// Maps a waitpid status to Stop()'s convention: exit code, or 128 + signal.
int DecodeWaitStatus(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

std::string ErrnoMessage(const char* what) {
  return std::string(what) + ": " + std::strerror(errno);
}

// A channel that reconnects within ~10-100 ms instead of gRPC's default 1 s initial backoff, so
// that a wait_for_ready call notices the socket as soon as the server creates it.
std::shared_ptr<grpc::Channel> FastReconnectChannel(const std::string& target) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 10);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 10);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 100);
  return grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
}

}  // namespace

std::unique_ptr<ServerProcess> ServerProcess::Start(const Options& options, std::string* error) {
  std::unique_ptr<ServerProcess> server(new ServerProcess());

  const char* tmp = std::getenv("TMPDIR");
  std::string dir_template =
      std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/samplerd-test-XXXXXX";
  if (mkdtemp(dir_template.data()) == nullptr) {
    *error = ErrnoMessage("mkdtemp");
    return nullptr;
  }
  server->temp_dir_ = dir_template;
  server->log_path_ = server->temp_dir_ + "/server.log";
  const std::string listen =
      options.listen.empty() ? "unix://" + server->temp_dir_ + "/s.sock" : options.listen;
  server->target_ = listen;

  // Everything the child needs is built before fork(): after it, only async-signal-safe calls.
  std::vector<std::string> args = {options.binary, "--listen=" + listen};
  if (!options.backend.empty()) args.push_back("--backend=" + options.backend);
  args.insert(args.end(), options.extra_args.begin(), options.extra_args.end());
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);

  const int log_fd =
      open(server->log_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (log_fd < 0) {
    *error = ErrnoMessage("open server log");
    return nullptr;
  }
  // The child writes errno here if execv fails; a successful exec closes it (O_CLOEXEC).
  int exec_pipe[2];
  if (pipe2(exec_pipe, O_CLOEXEC) != 0) {
    close(log_fd);
    *error = ErrnoMessage("pipe2");
    return nullptr;
  }
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    close(log_fd);
    close(exec_pipe[0]);
    close(exec_pipe[1]);
    *error = ErrnoMessage("fork");
    return nullptr;
  }
  if (pid == 0) {
    // Child: die with the test process, log to the file, run the server.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    dup2(log_fd, STDOUT_FILENO);
    dup2(log_fd, STDERR_FILENO);
    execv(argv[0], argv.data());
    const int exec_errno = errno;
    ssize_t ignored = write(exec_pipe[1], &exec_errno, sizeof(exec_errno));
    (void)ignored;
    _exit(127);
  }
  server->pid_ = pid;
  close(log_fd);
  close(exec_pipe[1]);
  // The pipe closes at the child's exec, or carries its errno; a child stuck before exec is
  // given up on after 30 s (the destructor SIGKILLs it) instead of being waited for forever.
  int exec_errno = 0;
  ssize_t n = -1;
  pollfd exec_fd = {exec_pipe[0], POLLIN, 0};
  int ready;
  do {
    ready = poll(&exec_fd, 1, 30000);
  } while (ready < 0 && errno == EINTR);
  if (ready > 0) {
    do {
      n = read(exec_pipe[0], &exec_errno, sizeof(exec_errno));
    } while (n < 0 && errno == EINTR);
  }
  close(exec_pipe[0]);
  if (ready <= 0) {
    *error = "samplerd's child did not reach exec within 30 s";
    return nullptr;
  }
  if (n > 0) {
    *error = "cannot execute " + options.binary + ": " + std::strerror(exec_errno);
    return nullptr;  // the destructor reaps the child
  }
#ifdef SYS_pidfd_open
  server->pidfd_ = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
#endif

  if (!server->WaitUntilServing(options, error)) return nullptr;
  return server;
}

bool ServerProcess::WaitUntilServing(const Options& options, std::string* error) {
  std::unique_ptr<Health::Stub> health = Health::NewStub(
      FastReconnectChannel(options.health_target.empty() ? target_ : options.health_target));
  HealthCheckRequest request;
  request.set_service(options.health_service);
  const Clock::time_point deadline = Clock::now() + options.ready_timeout;
  std::string last = "no answer";
  while (true) {
    if (ReapIfExited()) {
      *error = "samplerd exited with status " + std::to_string(exit_result_) +
               " before serving; its log:\n" + Log();
      return false;
    }
    if (Clock::now() >= deadline) {
      *error = "samplerd was not SERVING within " + std::to_string(options.ready_timeout.count()) +
               " ms (last health answer: " + last + "); its log:\n" + Log();
      return false;
    }
    const Clock::time_point attempt_deadline = std::min(deadline, Clock::now() + kHealthAttempt);
    // Check blocks (wait_for_ready) until the socket accepts a connection.
    {
      grpc::ClientContext context;
      context.set_wait_for_ready(true);
      context.set_deadline(attempt_deadline);
      HealthCheckResponse response;
      const grpc::Status status = health->Check(&context, request, &response);
      if (status.ok() && response.status() == HealthCheckResponse::SERVING) return true;
      last = status.ok()
                 ? HealthCheckResponse::ServingStatus_Name(response.status())
                 : "code " + std::to_string(status.error_code()) + " " + status.error_message();
      if (status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED ||
          status.error_code() == grpc::StatusCode::UNAVAILABLE) {
        continue;  // not listening yet
      }
    }
    // Up but not SERVING yet (warming up, or the service not registered yet): Watch pushes the
    // next status change instead of us polling for it.
    grpc::ClientContext context;
    context.set_deadline(attempt_deadline);
    std::unique_ptr<grpc::ClientReader<HealthCheckResponse>> watch =
        health->Watch(&context, request);
    HealthCheckResponse response;
    while (watch->Read(&response)) {
      if (response.status() == HealthCheckResponse::SERVING) {
        context.TryCancel();
        watch->Finish().ok();
        return true;
      }
      last = HealthCheckResponse::ServingStatus_Name(response.status());
    }
    const grpc::Status status = watch->Finish();
    if (status.error_code() == grpc::StatusCode::UNIMPLEMENTED) {
      // No Watch on this server: pace the Check polls by the per-attempt deadline instead.
      grpc::CompletionQueue queue;
      grpc::Alarm alarm;
      alarm.Set(&queue, attempt_deadline, nullptr);
      void* tag;
      bool ok;
      queue.Next(&tag, &ok);
      queue.Shutdown();
      while (queue.Next(&tag, &ok)) {
      }
    }
  }
}

bool ServerProcess::ReapIfExited() {
  if (pid_ <= 0) return true;
  int status = 0;
  const pid_t reaped = waitpid(pid_, &status, WNOHANG);
  if (reaped != pid_) return false;
  exit_result_ = DecodeWaitStatus(status);
  pid_ = -1;
  return true;
}

int ServerProcess::Stop(std::chrono::milliseconds timeout) {
  if (pid_ <= 0) return exit_result_;
  kill(pid_, SIGTERM);
  bool exited = true;
  if (pidfd_ >= 0) {
    pollfd fd = {pidfd_, POLLIN, 0};
    int ready;
    do {
      ready = poll(&fd, 1, static_cast<int>(timeout.count()));
    } while (ready < 0 && errno == EINTR);
    exited = ready > 0;
  } else {  // no pidfd (an old kernel, or a sandbox that refuses pidfd_open): poll waitpid
    const Clock::time_point deadline = Clock::now() + timeout;
    int status = 0;
    pid_t reaped;
    while (true) {
      reaped = waitpid(pid_, &status, WNOHANG);
      if (reaped < 0 && errno == EINTR) continue;
      if (reaped != 0 || Clock::now() >= deadline) break;
      usleep(10'000);
    }
    if (reaped != 0) {  // reaped, or not a child of ours any more (-1)
      exit_result_ = reaped == pid_ ? DecodeWaitStatus(status) : -1;
      pid_ = -1;
      return exit_result_;
    }
    exited = false;
  }
  if (!exited) kill(pid_, SIGKILL);
  int status = 0;
  while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
  exit_result_ = exited ? DecodeWaitStatus(status) : -1;
  pid_ = -1;
  return exit_result_;
}

ServerProcess::~ServerProcess() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    while (waitpid(pid_, nullptr, 0) < 0 && errno == EINTR) {
    }
  }
  if (pidfd_ >= 0) close(pidfd_);
  if (!temp_dir_.empty()) {
    std::error_code ignored;
    std::filesystem::remove_all(temp_dir_, ignored);
  }
}

std::string ServerProcess::Log() const {
  std::ifstream in(log_path_);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

int PickFreeTcpPort() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  int port = -1;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

}  // namespace samplerd::integration
