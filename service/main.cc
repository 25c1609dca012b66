// samplerd: flags -> options, then parse -> init -> serve -> signal -> drain -> stop.
//
// Exit codes: 0 after SIGTERM/SIGINT/SIGHUP and a drain; 1 after --help or --version output
// (Abseil's usage flags); 2 when the flags are bad or startup fails; 3 after a sticky backend
// fault (e.g. a GPU error that poisons the context), so that the orchestrator restarts the
// process.
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>

#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "service/core/idle_trimmer.h"
#include "service/core/sampler_core.h"
#include "service/flags.h"
#include "service/grpc/protobuf_log.h"
#include "service/grpc/server.h"
#include "service/metrics/http_exporter.h"
#include "service/metrics/registry.h"
#include "service/metrics/sampler_metrics.h"

namespace {

constexpr int kExitStartupFailed = 2;
constexpr int kExitBackendFault = 3;
// Raised to ourselves by the core's on_fatal (on the executor thread) to wake the main thread's
// sigwait. Sent from outside while the backend works, it is logged and ignored.
constexpr int kFaultSignal = SIGUSR1;
// How long after the grace period gRPC cancels the calls still open. Before it, the core cancels
// its own work in flight and answers it UNAVAILABLE (a CPU batch stops within one row per
// thread), so that clients get the documented status rather than gRPC's; after it only calls
// with no work in the core (an idle SampleStream) are left. The process exits within the grace
// period plus this window plus teardown: the "1 s" bound of README.md and docs/DESIGN.md.
constexpr absl::Duration kCancelWindow = absl::Milliseconds(500);

void Log(const std::string& line) {
  std::fprintf(stderr, "%s samplerd: %s\n",
               absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::Now(), absl::UTCTimeZone()).c_str(),
               line.c_str());
}

int Fail(const std::string& what, const absl::Status& status) {
  Log(absl::StrCat(what, ": ", status.ToString()));
  return kExitStartupFailed;
}

}  // namespace

int main(int argc, char** argv) {
  // A write to a closed pipe or socket must fail with EPIPE, not kill the server: when the
  // reader of its stderr is gone (a log collector that died, `run.sh | tee` ended), the log line
  // SIGTERM writes would otherwise end the process before it drains and removes its socket.
  signal(SIGPIPE, SIG_IGN);
  samplerd::SetUpFlagsUsage();
  // Bad command lines exit 2 with one "expected X, got Y" line, like every other bad flag.
  if (absl::Status checked = samplerd::CheckCommandLine(argc, argv); !checked.ok()) {
    return Fail("bad flags", checked);
  }
  absl::ParseCommandLine(argc, argv);

  // A GPU-plane device session parks a stream on a wait for the engine's doorbell, and a
  // waiting stream blocks the hardware queue it is mapped to (CUDA: CUDA_DEVICE_MAX_CONNECTIONS
  // queues, 8 by default; HIP: GPU_MAX_HW_QUEUES, 4). More queues keep an idle engine's session
  // from stalling other sessions and the unary path. Set before the runtime starts; an
  // operator's own value wins.
  setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", /*overwrite=*/0);
  setenv("GPU_MAX_HW_QUEUES", "8", /*overwrite=*/0);

  // Block the stop signals before gRPC, civetweb and the core start threads (they inherit the
  // mask), so that only sigwait() below sees them.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  // A hang-up (the terminal of a foreground run.sh closed) stops the server like SIGINT, with a
  // drain and its socket removed, instead of killing it on the spot (SIGHUP's default).
  sigaddset(&stop_signals, SIGHUP);
  sigaddset(&stop_signals, kFaultSignal);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  // libprotobuf logs a line for every request with a string that is not UTF-8: at most
  // kProtobufLogLinesPerMinute of them reach the log, the rest are counted (protobuf_log.h).
  // Static: the handler stays installed until the process exits.
  static samplerd::grpc_transport::LogRateLimiter protobuf_log(
      "libprotobuf", samplerd::grpc_transport::kProtobufLogLinesPerMinute, absl::Minutes(1),
      [](const std::string& line) { Log(line); });
  samplerd::grpc_transport::RouteProtobufLogTo(&protobuf_log);

  absl::StatusOr<samplerd::ProcessOptions> options = samplerd::OptionsFromFlags();
  if (!options.ok()) return Fail("bad flags", options.status());

  samplerd::metrics::Registry registry;
  absl::StatusOr<std::unique_ptr<samplerd::metrics::SamplerMetrics>> metrics =
      samplerd::metrics::SamplerMetrics::Create(&registry);
  if (!metrics.ok()) return Fail("cannot set up metrics", metrics.status());
  options->core.metrics = metrics->get();
  options->server.metrics = metrics->get();
  options->core.on_fatal = [](const absl::Status& status) {
    Log(absl::StrCat("backend fault, stopping: ", status.ToString()));
    kill(getpid(), kFaultSignal);  // async-signal-safe; only main's sigwait takes it
  };

  absl::StatusOr<std::unique_ptr<samplerd::core::SamplerCore>> core =
      samplerd::core::SamplerCore::Create(options->core);
  if (!core.ok()) return Fail("cannot start the sampler", core.status());
  const samplerd::core::ServerInfo info = (*core)->Info();
  const char* backend = info.backend == samplerd::core::BackendKind::kGpu ? "gpu" : "cpu";
  (*metrics)->SetBuildInfo({info.version, backend});

  absl::StatusOr<std::unique_ptr<samplerd::grpc_transport::SamplerServer>> server =
      samplerd::grpc_transport::SamplerServer::Start(options->server, core->get());
  if (!server.ok()) return Fail("cannot start the gRPC server", server.status());
  std::unique_ptr<samplerd::metrics::HttpExporter> exporter;
  if (options->metrics_port != 0) {
    absl::StatusOr<std::unique_ptr<samplerd::metrics::HttpExporter>> started =
        samplerd::metrics::HttpExporter::Start(options->metrics_address, options->metrics_port,
                                               &registry);
    if (!started.ok()) {
      (*server)->Shutdown(absl::Now());
      return Fail("cannot start the metrics listener", started.status());
    }
    exporter = *std::move(started);
  }

  Log(absl::StrCat("version ", info.version, ", backend ", backend, " (", info.devices.front().name,
                   ")"));
  Log(absl::StrCat(
      "listening on ", absl::StrJoin((*server)->bound_addresses(), ", "),
      options->server.tls.enabled()
          ? (options->server.tls.client_ca_file.empty() ? " (TCP: TLS)" : " (TCP: mutual TLS)")
          : ""));
  if (!(*server)->health_address().empty()) {
    Log(absl::StrCat("health on ", (*server)->health_address()));
  }
  if (exporter != nullptr) {
    Log(absl::StrCat("metrics on http://", options->metrics_address, ":", exporter->port(),
                     "/metrics"));
  }
  // Gives the memory a burst of requests freed back to the system once the server is idle
  // (service/core/idle_trimmer.h); stopped before the core.
  auto trimmer = std::make_unique<samplerd::core::IdleTrimmer>(samplerd::core::IdleTrimmer::Hooks{
      [&core] { return (*core)->admitted(); }, [&core] { return (*core)->admissions(); }, nullptr});
  (*server)->SetServing(true);

  int signal_number = 0;
  while (true) {
    sigwait(&stop_signals, &signal_number);
    if (signal_number != kFaultSignal || (*core)->faulted()) break;
    Log("SIGUSR1 ignored: samplerd raises it itself when the backend faults");
  }
  const absl::Duration grace = options->grace_period;
  Log(absl::StrCat(signal_number == SIGTERM  ? "SIGTERM"
                   : signal_number == SIGINT ? "SIGINT"
                   : signal_number == SIGHUP ? "SIGHUP"
                                             : "backend fault",
                   ": NOT_SERVING, draining (grace ", absl::FormatDuration(grace), ")"));
  (*server)->SetServing(false);
  // Device sessions end first: their engines' waits complete with ABORTED at once, and their
  // calls end UNAVAILABLE, so that Shutdown need not wait for them.
  (*core)->sessions().CloseAll();
  const absl::Time deadline = absl::Now() + grace;
  // gRPC stops accepting calls now and waits for those open, on its own thread, while the core
  // drains here; at the deadline the core cancels what is left (issue 12: a CPU batch used to
  // run to its end and hold the process 8 s past a 1 s grace period).
  std::thread shutdown([&server, deadline] { (*server)->Shutdown(deadline + kCancelWindow); });
  bool drained = (*core)->Drain(deadline);
  if (!drained) {
    Log("grace period over: cancelling the work still in flight");
    drained = (*core)->CancelInFlight(deadline + kCancelWindow);
  }
  shutdown.join();
  // Unmap every region and close the cached IPC events once nothing uses them. Work still in
  // flight at the deadline may read a region: then the core's destructor closes them after
  // its executor has finished.
  if (drained) (*core)->CloseRegions();
  // Also a fault during a SIGTERM drain: the device needs a new process either way.
  const bool faulted = (*core)->faulted();
  trimmer.reset();
  server->reset();
  core->reset();
  exporter.reset();  // after the core: its last requests are still counted
  protobuf_log.Flush();
  Log(absl::StrCat(
      drained ? "stopped" : "stopped with work still in flight at the deadline",
      faulted ? absl::StrCat(", exit code ", kExitBackendFault, " (backend fault)") : ""));
  return faulted ? kExitBackendFault : 0;
}
