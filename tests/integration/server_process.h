// Runs the real samplerd binary as a child process, for integration tests and benchmarks.
//
//   ServerProcess::Options options;
//   options.binary = SAMPLERD_BINARY;
//   std::string error;
//   std::unique_ptr<ServerProcess> server = ServerProcess::Start(options, &error);
//   samplerd::Client client(server->target());
//   ...
//   EXPECT_EQ(server->Stop(), 0);  // SIGTERM, drain, exit status
//
// Readiness is event-driven: Start() returns once grpc.health.v1 answers SERVING (no sleeps).
// The child's stdout and stderr go to a log file (Log()), so failing tests can print it.
#ifndef SAMPLERD_TESTS_INTEGRATION_SERVER_PROCESS_H_
#define SAMPLERD_TESTS_INTEGRATION_SERVER_PROCESS_H_

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

namespace samplerd::integration {

class ServerProcess {
 public:
  struct Options {
    // Path of the samplerd binary (tests get it from the SAMPLERD_BINARY compile definition).
    std::string binary;
    // Value of --listen: "unix:///abs/path.sock" or "127.0.0.1:PORT". Empty: a unix socket
    // s.sock inside the process's private temporary directory.
    std::string listen;
    // Value of --backend; empty: the flag is not passed.
    std::string backend = "cpu";
    // More flags, e.g. "--max_message_bytes=65536".
    std::vector<std::string> extra_args;
    // Health service whose SERVING status means ready ("" is the whole server).
    std::string health_service = "samplerd.v1.SamplerService";
    // Where readiness is asked, over plaintext: empty means the listen address. Set it to the
    // health port ("127.0.0.1:PORT", with --health_port=PORT in extra_args) when the listen
    // address speaks TLS.
    std::string health_target;
    // How long Start() waits for SERVING before giving up.
    std::chrono::milliseconds ready_timeout{30000};
  };

  // Forks and execs the server, then waits until its health service answers SERVING.
  // Returns null and stores the reason (with the server's log) in *error when the binary cannot
  // be run, exits early, or is not SERVING within ready_timeout. `error` must not be null.
  static std::unique_ptr<ServerProcess> Start(const Options& options, std::string* error);

  // Kills the server (SIGKILL) if it still runs, and removes its temporary directory.
  ~ServerProcess();
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;

  // Sends SIGTERM and waits up to `timeout` for the server to exit. Returns its exit code
  // (0 after a clean drain), 128 + N when signal N ended it, or -1 when it outlived `timeout`
  // (it is then killed with SIGKILL). A second call returns the first call's result.
  int Stop(std::chrono::milliseconds timeout = std::chrono::seconds(30));

  // gRPC target for clients: "unix:///.../s.sock" or "127.0.0.1:PORT".
  const std::string& target() const { return target_; }
  // The child's process id (-1 once reaped).
  pid_t pid() const { return pid_; }
  // The server's stdout and stderr so far.
  std::string Log() const;

 private:
  ServerProcess() = default;

  // Waits until the health service answers SERVING; false (and *error) on exit or timeout.
  bool WaitUntilServing(const Options& options, std::string* error);
  // Reaps the child if it has exited, without blocking; returns true when it was reaped.
  bool ReapIfExited();

  pid_t pid_ = -1;
  int pidfd_ = -1;  // pollable process handle (Linux >= 5.3); -1 where unsupported
  int exit_result_ = -1;
  std::string temp_dir_;
  std::string log_path_;
  std::string target_;
};

// Returns a TCP port on 127.0.0.1 that was free a moment ago (bound to port 0, then released),
// or -1 on failure. Another process may take it before the server binds it: hermetic enough
// for tests on one machine.
int PickFreeTcpPort();

}  // namespace samplerd::integration

#endif  // SAMPLERD_TESTS_INTEGRATION_SERVER_PROCESS_H_
