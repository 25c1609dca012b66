// samplerd: flags -> options, then parse -> init -> serve -> signal -> drain -> stop.
//
// Exit codes: 0 after SIGTERM/SIGINT and a drain; 2 when the flags are bad or startup fails;
// 3 after a sticky backend fault (e.g. a GPU error that poisons the context), so that the
// orchestrator restarts the process.
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "service/core/host_shm.h"
#include "service/core/sampler_core.h"
#include "service/core/status_macros.h"
#include "service/grpc/server.h"

ABSL_FLAG(std::string, listen, "unix:///run/samplerd/samplerd.sock",
          "Comma-separated gRPC listen addresses: unix:///abs/path.sock, unix:path.sock "
          "(relative or absolute) or HOST:PORT (port 0 picks a free one). A unix socket's "
          "missing directories are created (mode 0750) and the socket gets mode 0660 (owner and "
          "group may connect).");
ABSL_FLAG(std::string, backend, "auto",
          "Where sampling runs: auto (GPU when present, else CPU), cpu, or gpu (fail when no "
          "GPU is usable).");
ABSL_FLAG(int64_t, max_message_bytes, 256 << 20,
          "Largest gRPC message received or sent, in bytes (at most 2147483647).");
ABSL_FLAG(int32_t, threads, 0, "Host threads of the CPU backend; 0 = one per core.");
ABSL_FLAG(int64_t, max_batch, 4096, "Largest batch size B accepted.");
ABSL_FLAG(int64_t, max_vocab, 1 << 22, "Largest vocabulary size V accepted.");
ABSL_FLAG(int32_t, max_top_logprobs, 64, "Largest LogprobOptions.top_n accepted.");
ABSL_FLAG(std::string, shm_prefix, "/samplerd-",
          "Required start of host shared-memory keys in RegisterRegion (a '/' and at least one "
          "more character, no further '/' or \"..\"). Keys are refused otherwise.");
ABSL_FLAG(bool, allow_remote_regions, false,
          "Serve RegisterRegion, UnregisterRegion, ListRegions and requests that name a region "
          "to TCP clients too. By default only clients on a unix socket may use regions.");
ABSL_FLAG(absl::Duration, grace_period, absl::Seconds(10),
          "On SIGTERM/SIGINT or a backend fault: how long in-flight calls may take to finish "
          "(e.g. 10s, 500ms).");

namespace {

constexpr int kExitStartupFailed = 2;
constexpr int kExitBackendFault = 3;
// Raised to ourselves by the core's on_fatal (on the executor thread) to wake the main thread's
// sigwait. Sent from outside while the backend works, it is logged and ignored.
constexpr int kFaultSignal = SIGUSR1;

void Log(const std::string& line) {
  std::fprintf(stderr, "%s samplerd: %s\n",
               absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::Now(), absl::UTCTimeZone()).c_str(),
               line.c_str());
}

int Fail(const std::string& what, const absl::Status& status) {
  Log(absl::StrCat(what, ": ", status.ToString()));
  return kExitStartupFailed;
}

absl::StatusOr<samplerd::core::CoreOptions> CoreOptionsFromFlags() {
  samplerd::core::CoreOptions options;
  const std::string backend = absl::GetFlag(FLAGS_backend);
  if (backend == "auto") {
    options.backend = samplerd::core::BackendChoice::kAuto;
  } else if (backend == "cpu") {
    options.backend = samplerd::core::BackendChoice::kCpu;
  } else if (backend == "gpu") {
    options.backend = samplerd::core::BackendChoice::kGpu;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("expected --backend=auto|cpu|gpu, got '", backend, "'"));
  }
  options.threads = absl::GetFlag(FLAGS_threads);
  const int64_t max_message = absl::GetFlag(FLAGS_max_message_bytes);
  if (max_message < 1024 || max_message > std::numeric_limits<int>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected --max_message_bytes in [1024, 2147483647], got ", max_message));
  }
  options.limits.max_message_bytes = max_message;
  options.limits.max_batch = absl::GetFlag(FLAGS_max_batch);
  options.limits.max_vocab = absl::GetFlag(FLAGS_max_vocab);
  options.limits.max_top_logprobs = absl::GetFlag(FLAGS_max_top_logprobs);
  if (options.limits.max_batch < 1 || options.limits.max_vocab < 1 ||
      options.limits.max_top_logprobs < 0) {
    return absl::InvalidArgumentError(
        "expected --max_batch >= 1, --max_vocab >= 1 and --max_top_logprobs >= 0");
  }
  options.regions.shm_prefix = absl::GetFlag(FLAGS_shm_prefix);
  RETURN_IF_ERROR(samplerd::core::ValidateShmPrefix(options.regions.shm_prefix));
  if (absl::GetFlag(FLAGS_grace_period) < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("expected --grace_period >= 0");
  }
  options.on_fatal = [](const absl::Status& status) {
    Log(absl::StrCat("backend fault, stopping: ", status.ToString()));
    kill(getpid(), kFaultSignal);  // async-signal-safe; only main's sigwait takes it
  };
  return options;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "samplerd: samples the next token for LLM inference engines over gRPC.\n"
      "Usage: samplerd [--listen=unix:///run/samplerd/samplerd.sock] [--backend=auto]\n"
      "Exit codes: 0 stopped by SIGTERM/SIGINT, 2 bad flags or startup failure, 3 backend fault "
      "(restart the process).");
  absl::ParseCommandLine(argc, argv);

  // Block the stop signals before gRPC and the core start threads (they inherit the mask), so
  // that only sigwait() below sees them.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, kFaultSignal);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  absl::StatusOr<samplerd::core::CoreOptions> core_options = CoreOptionsFromFlags();
  if (!core_options.ok()) return Fail("bad flags", core_options.status());
  absl::StatusOr<std::unique_ptr<samplerd::core::SamplerCore>> core =
      samplerd::core::SamplerCore::Create(*core_options);
  if (!core.ok()) return Fail("cannot start the sampler", core.status());

  samplerd::grpc_transport::ServerOptions server_options;
  server_options.listen = absl::StrSplit(absl::GetFlag(FLAGS_listen), ',', absl::SkipEmpty());
  server_options.max_message_bytes = static_cast<int>(core_options->limits.max_message_bytes);
  server_options.allow_remote_regions = absl::GetFlag(FLAGS_allow_remote_regions);
  absl::StatusOr<std::unique_ptr<samplerd::grpc_transport::SamplerServer>> server =
      samplerd::grpc_transport::SamplerServer::Start(server_options, core->get());
  if (!server.ok()) return Fail("cannot start the gRPC server", server.status());

  const samplerd::core::ServerInfo info = (*core)->Info();
  Log(absl::StrCat("version ", info.version, ", backend ",
                   info.backend == samplerd::core::BackendKind::kGpu ? "gpu" : "cpu", " (",
                   info.devices.front().name, ")"));
  Log(absl::StrCat("listening on ", absl::StrJoin((*server)->bound_addresses(), ", ")));
  (*server)->SetServing(true);

  int signal_number = 0;
  while (true) {
    sigwait(&stop_signals, &signal_number);
    if (signal_number != kFaultSignal || (*core)->faulted()) break;
    Log("SIGUSR1 ignored: samplerd raises it itself when the backend faults");
  }
  const absl::Duration grace = absl::GetFlag(FLAGS_grace_period);
  Log(absl::StrCat(signal_number == SIGTERM  ? "SIGTERM"
                   : signal_number == SIGINT ? "SIGINT"
                                             : "backend fault",
                   ": NOT_SERVING, draining (grace ", absl::FormatDuration(grace), ")"));
  (*server)->SetServing(false);
  const absl::Time deadline = absl::Now() + grace;
  (*server)->Shutdown(deadline);
  const bool drained = (*core)->Drain(deadline);
  // Unmap every region and close the cached IPC events once nothing uses them. Work still in
  // flight at the deadline may read a region: then the core's destructor closes them after
  // its executor has finished.
  if (drained) (*core)->CloseRegions();
  // Also a fault during a SIGTERM drain: the device needs a new process either way.
  const bool faulted = (*core)->faulted();
  server->reset();
  core->reset();
  Log(absl::StrCat(
      drained ? "stopped" : "stopped with work still in flight at the deadline",
      faulted ? absl::StrCat(", exit code ", kExitBackendFault, " (backend fault)") : ""));
  return faulted ? kExitBackendFault : 0;
}
