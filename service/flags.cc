#include "service/flags.h"

#include <limits>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "service/core/model/limits.h"
#include "service/core/model/status_macros.h"
#include "service/core/regions/host_shm.h"
#include "service/core/regions/region_registry.h"

ABSL_FLAG(std::string, listen, "unix:///run/samplerd/samplerd.sock",
          "Comma-separated gRPC listen addresses: unix:///abs/path.sock, unix:path.sock "
          "(relative or absolute) or HOST:PORT (port 0 picks a free one). A unix socket's "
          "missing directories are created (mode 0750) and the socket gets mode 0660 (owner and "
          "group may connect). Unix sockets are always plaintext; TCP addresses use TLS when "
          "--tls_cert and --tls_key are set.");
ABSL_FLAG(std::string, backend, "auto",
          "Where sampling runs: auto (GPU when present, else CPU), cpu, or gpu (fail when no "
          "GPU is usable).");
ABSL_FLAG(int64_t, max_message_bytes, 256 << 20,
          "Largest gRPC message received or sent, in bytes (at most 2147483647). A larger "
          "message is refused with RESOURCE_EXHAUSTED; a SampleStream step may be sent in "
          "chunks instead. Also bounds a logit-bias list or token history read from a region "
          "(its packed bytes).");
ABSL_FLAG(std::string, gpu, "",
          "The GPU to sample on, by PCI bus id (e.g. 0000:3b:00.0, as nvidia-smi or rocm-smi "
          "print it) or UUID; empty = the first GPU the runtime lists (in a container given "
          "one GPU: that one). GetServerInfo lists it first. Needs --backend=gpu or auto.");
ABSL_FLAG(int32_t, threads, 0, "Host threads of the CPU backend; 0 = one per core.");
ABSL_FLAG(int64_t, max_batch, 4096,
          "Largest batch size B accepted (at most 16777216); larger is RESOURCE_EXHAUSTED.");
ABSL_FLAG(int64_t, max_vocab, 1 << 22,
          "Largest vocabulary size V accepted (at most 2147483647: token ids are int32); larger "
          "is RESOURCE_EXHAUSTED.");
ABSL_FLAG(int32_t, max_top_logprobs, 64,
          "Largest LogprobOptions.top_n accepted; larger is INVALID_ARGUMENT.");
ABSL_FLAG(int64_t, max_inflight, 256,
          "Sampling requests plus SampleStream steps admitted at once (queued or running); "
          "one more is answered RESOURCE_EXHAUSTED (\"server busy\") at once and the server "
          "keeps serving. 0 = no limit.");
// 0 by default: the server cannot know its memory limit, and every request the server served
// before this flag existed is still served; a deployment sets it from its limit (deploy/k8s).
ABSL_FLAG(int64_t, max_inflight_bytes, 0,
          "Inline logits bytes in flight at once: those of the sampling requests and SampleStream "
          "steps admitted, plus those of chunked steps being assembled (reserved from the "
          "step's shape at its first message). One that would pass it is answered "
          "RESOURCE_EXHAUSTED (\"retry later\"; a stream step on its own response) and the "
          "server keeps serving; one larger than the whole budget can never fit. The server "
          "holds ~2.5x a message's bytes while it is received, admitted or not, and admitted "
          "logits once: size it so that 256 MiB + this + 2.5 x (max_receive_bytes + "
          "max_inflight x max_message_bytes) fits the memory limit. "
          "0 = no limit (then chunked steps, up to 1 GiB each, are bounded by nothing).");
// 0 by default, as --max_inflight_bytes: the server cannot know its memory limit, a budget
// makes small requests wait behind large ones being received, and serving the unary methods
// through it costs each call a little (gated_unary_call.h); a deployment sets it (deploy/k8s).
ABSL_FLAG(int64_t, max_receive_bytes, 0,
          "Request bytes the server receives at once before admission. gRPC reads a request "
          "whole before --max_inflight and --max_inflight_bytes can refuse it, so without this "
          "a burst of large requests is held whole, however many. A unary call (Sample, the "
          "region calls, GetServerInfo) reads its request only while it holds "
          "--max_message_bytes of this budget (its size is unknown until it has arrived), so "
          "this / --max_message_bytes requests are received at once; the others wait their "
          "turn, first come first served, until their deadline (they are not refused); one "
          "whose request has not arrived --chunk_timeout_ms after its turn came is answered "
          "DEADLINE_EXCEEDED. SampleStream and DeviceSession messages are not counted. "
          "0 = no limit, and the unary methods are served as plain gRPC unary methods; "
          "otherwise at least --max_message_bytes.");
// No 0 = "no deadline": a chunked step holds its bytes of --max_inflight_bytes (and its buffer)
// until its last chunk, so one with no deadline lets a stalled client hold them for ever. A
// deployment whose clients send slowly sets a longer one.
ABSL_FLAG(int64_t, chunk_timeout_ms, 10000,
          "Longest time from a chunked SampleStream step's first message to its last, in "
          "milliseconds (1 to 86400000). When it passes first, the step is answered "
          "DEADLINE_EXCEEDED at once, its reserved bytes are freed, the rest of its chunks are "
          "skipped and the stream goes on. With --max_receive_bytes, also the longest a unary "
          "request may take to arrive once its turn to be received came (then "
          "DEADLINE_EXCEEDED, and the turn passes on). Allow the largest step's or request's "
          "transfer time (1 GiB takes ~9 s at 1 Gbit/s).");
ABSL_FLAG(int32_t, max_device_sessions, 8,
          "Most device sessions (DeviceSession calls) open at once; one more is "
          "RESOURCE_EXHAUSTED. Each host-plane session holds CPU threads. 0 = none.");
// Each host-plane session reserves a host copy of a full step's logits when it opens; the
// reservation is virtual, so without this bound the sessions --max_device_sessions allows could
// together touch 8 x 32 GiB (M = 2,048, V = 4,194,304 fp32) on a host with memory to spare.
ABSL_FLAG(int64_t, max_host_session_bytes, int64_t{8} << 30,
          "Most bytes the open host-plane device sessions reserve in total for their copies of a "
          "step's logits (max_batch x vocab x the dtype's size each; GPU-plane sessions do not "
          "count); an open past it is RESOURCE_EXHAUSTED until sessions close. 0 = no limit.");
ABSL_FLAG(int32_t, host_plane_threads, 0,
          "CPU threads that sample one host-plane device-session step; 0 = one per core, at "
          "most 8.");
ABSL_FLAG(
    int32_t, session_spin_us, 20000,
    "How long a device session's poller (either plane) spins on its doorbell after a step, in "
    "microseconds, before it falls back to sleeping polls (spinning costs a core; "
    "sleeping adds up to 50 us to a step). 0 = never spin.");
ABSL_FLAG(std::string, shm_prefix, "/samplerd-",
          "Required start of host shared-memory keys in RegisterRegion (a '/' and at least one "
          "more character, no further '/' or \"..\"). Keys are refused otherwise.");
ABSL_FLAG(int64_t, max_regions, 4096,
          "Most regions registered at once (RegisterRegion); one more is RESOURCE_EXHAUSTED until "
          "one is unregistered. Each host shm region is a mapping of its own and the kernel "
          "limits a process's mappings (vm.max_map_count). 0 = no limit.");
ABSL_FLAG(int64_t, max_region_bytes, samplerd::core::RegionOptions{}.max_region_bytes,
          "Most bytes of registered regions in total (RegisterRegion's byte_size, host shm and "
          "GPU IPC); a registration past it is RESOURCE_EXHAUSTED until regions are "
          "unregistered (one still used by a request or device session counts until that "
          "ends). Each region is mapped into the server's address space whole, even over a "
          "sparse object. Default 4 TiB; 0 = no limit.");
ABSL_FLAG(bool, allow_remote_regions, false,
          "Serve RegisterRegion, UnregisterRegion, ListRegions and requests that name a region "
          "to TCP clients too. By default only clients on a unix socket may use regions.");
ABSL_FLAG(
    absl::Duration, grace_period, absl::Seconds(10),
    "On SIGTERM/SIGINT/SIGHUP or a backend fault: how long in-flight calls may take to finish "
    "(e.g. 10s, 500ms). Health turns NOT_SERVING at once.");
ABSL_FLAG(int32_t, health_port, 0,
          "TCP port of a second, plaintext gRPC listener that serves only grpc.health.v1.Health "
          "(Check, Watch) with the server's status: SERVING once ready, NOT_SERVING while "
          "draining or after a backend fault. For Kubernetes gRPC probes (which cannot use "
          "TLS). 0 = off.");
ABSL_FLAG(std::string, health_address, "0.0.0.0",
          "Address the --health_port listener binds (e.g. 0.0.0.0, [::], 127.0.0.1).");
ABSL_FLAG(int32_t, metrics_port, 0,
          "TCP port serving Prometheus metrics (text format 0.0.4) at GET /metrics over plain "
          "HTTP. 0 = off.");
ABSL_FLAG(std::string, metrics_address, "0.0.0.0",
          "Address the --metrics_port listener binds (e.g. 0.0.0.0, 127.0.0.1). IPv4 only with "
          "Debian 12's civetweb, which is built without IPv6.");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate chain of the server (leaf first). With --tls_key: TCP listeners "
          "speak TLS; both or neither. Unix sockets and the health port stay plaintext.");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert.");
ABSL_FLAG(std::string, tls_client_ca, "",
          "PEM CA certificates. When set, every TCP client must present a certificate that "
          "chains to one of them (mutual TLS); needs --tls_cert and --tls_key.");

namespace samplerd {
namespace {

// The longest --chunk_timeout_ms: a day (a bound, so that deadlines never overflow).
constexpr int64_t kMaxChunkTimeoutMs = int64_t{24} * 60 * 60 * 1000;

absl::Status CheckPort(const char* flag, int32_t port) {
  if (port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected --", flag, " in [0, 65535] (0 = off), got ", port));
  }
  return absl::OkStatus();
}

absl::StatusOr<core::BackendChoice> BackendFromFlag() {
  const std::string backend = absl::GetFlag(FLAGS_backend);
  if (backend == "auto") return core::BackendChoice::kAuto;
  if (backend == "cpu") return core::BackendChoice::kCpu;
  if (backend == "gpu") return core::BackendChoice::kGpu;
  return absl::InvalidArgumentError(
      absl::StrCat("expected --backend=auto|cpu|gpu, got '", backend, "'"));
}

// --max_message_bytes (the transport's limit) and the core's request limits.
absl::Status LimitsFromFlags(int* max_message_bytes, core::Limits* limits) {
  const int64_t max_message = absl::GetFlag(FLAGS_max_message_bytes);
  if (max_message < 1024 || max_message > std::numeric_limits<int>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected --max_message_bytes in [1024, 2147483647], got ", max_message));
  }
  *max_message_bytes = static_cast<int>(max_message);
  limits->max_region_list_bytes = max_message;
  limits->max_batch = absl::GetFlag(FLAGS_max_batch);
  limits->max_vocab = absl::GetFlag(FLAGS_max_vocab);
  limits->max_top_logprobs = absl::GetFlag(FLAGS_max_top_logprobs);
  limits->max_inflight = absl::GetFlag(FLAGS_max_inflight);
  limits->max_inflight_bytes = absl::GetFlag(FLAGS_max_inflight_bytes);
  // Bounded so that no byte count of a request within them overflows int64 (B x row stride
  // x 4 bytes, the stride <= 16 V): a larger --max_vocab let a request of empty data through
  // the size check, and its buffer's size then aborted the server.
  if (limits->max_batch < 1 || limits->max_batch > core::kMaxBatchLimit) {
    return absl::InvalidArgumentError(absl::StrCat(
        "expected --max_batch in [1, ", core::kMaxBatchLimit, "], got ", limits->max_batch));
  }
  if (limits->max_vocab < 1 || limits->max_vocab > core::kMaxVocabLimit) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected --max_vocab in [1, ", core::kMaxVocabLimit,
                     "] (token ids are int32), got ", limits->max_vocab));
  }
  if (limits->max_top_logprobs < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected --max_top_logprobs >= 0, got ", limits->max_top_logprobs));
  }
  if (limits->max_inflight < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected --max_inflight >= 0 (0 = no limit), got ", limits->max_inflight));
  }
  if (limits->max_inflight_bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "expected --max_inflight_bytes >= 0 (0 = no limit), got ", limits->max_inflight_bytes));
  }
  return absl::OkStatus();
}

// --max_receive_bytes: 0, or room for at least one message of --max_message_bytes.
absl::StatusOr<int64_t> ReceiveBytesFromFlag(int64_t max_message_bytes) {
  const int64_t budget = absl::GetFlag(FLAGS_max_receive_bytes);
  if (budget != 0 && budget < max_message_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "expected --max_receive_bytes of 0 (no limit) or at least --max_message_bytes (",
        max_message_bytes, "), got ", budget));
  }
  return budget;
}

absl::Status SessionsFromFlags(core::DeviceSessionOptions* sessions) {
  sessions->max_sessions = absl::GetFlag(FLAGS_max_device_sessions);
  sessions->max_host_session_bytes = absl::GetFlag(FLAGS_max_host_session_bytes);
  sessions->host.threads = absl::GetFlag(FLAGS_host_plane_threads);
  sessions->host.spin_us = absl::GetFlag(FLAGS_session_spin_us);
  sessions->gpu.spin_us = sessions->host.spin_us;
  if (sessions->max_sessions < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "expected --max_device_sessions >= 0 (0 = none), got ", sessions->max_sessions));
  }
  if (sessions->max_host_session_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected --max_host_session_bytes >= 0 (0 = no limit), got ",
                     sessions->max_host_session_bytes));
  }
  if (sessions->host.threads < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "expected --host_plane_threads >= 0 (0 = auto), got ", sessions->host.threads));
  }
  if (sessions->host.spin_us < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected --session_spin_us >= 0, got ", sessions->host.spin_us));
  }
  return absl::OkStatus();
}

bool IsThisFile(absl::string_view file) { return absl::EndsWith(file, "service/flags.cc"); }

// Abseil's own flags that ParseCommandLine handles (help and version output, flag files).
bool IsAbseilBuiltin(absl::string_view name) {
  for (absl::string_view builtin :
       {"help", "helpfull", "helpshort", "helppackage", "helpon", "helpmatch", "version",
        "only_check_args", "flagfile", "fromenv", "tryfromenv", "undefok"}) {
    if (name == builtin) return true;
  }
  return false;
}

// What a value of `flag` looks like, for "expected ..." messages.
std::string ExpectedValue(const absl::CommandLineFlag& flag) {
  if (flag.IsOfType<int32_t>()) {
    return absl::StrCat("an integer in [", std::numeric_limits<int32_t>::min(), ", ",
                        std::numeric_limits<int32_t>::max(), "]");
  }
  if (flag.IsOfType<int64_t>()) {
    return absl::StrCat("an integer in [", std::numeric_limits<int64_t>::min(), ", ",
                        std::numeric_limits<int64_t>::max(), "]");
  }
  if (flag.IsOfType<bool>()) return "true or false";
  if (flag.IsOfType<absl::Duration>()) return "a duration with its unit, e.g. 10s or 500ms";
  return "a value";
}

}  // namespace

void SetUpFlagsUsage() {
  absl::SetProgramUsageMessage(
      "samples the next token for LLM inference engines over gRPC.\n"
      "Usage: samplerd [--listen=unix:///run/samplerd/samplerd.sock] [--backend=auto]\n"
      "  [--health_port=8081] [--metrics_port=9090] [--tls_cert=F --tls_key=F "
      "[--tls_client_ca=F]]\n"
      "Unix sockets are plaintext (their mode, 0660, says who may connect); TCP listeners use "
      "TLS with --tls_cert/--tls_key; the health and metrics ports are always plaintext.\n"
      "Exit codes: 0 stopped by SIGTERM/SIGINT/SIGHUP, 1 after --help or --version output, 2 "
      "bad flags or startup failure, 3 backend fault (restart the process).");
  absl::FlagsUsageConfig config;
  config.contains_help_flags = IsThisFile;
  config.contains_helpshort_flags = IsThisFile;
  absl::SetFlagsUsageConfig(config);
}

absl::Status CheckCommandLine(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const absl::string_view arg = argv[i];
    if (arg == "--") {
      if (i + 1 < argc) {
        return absl::InvalidArgumentError(
            absl::StrCat("expected only --flags, got the argument '", argv[i + 1], "' after '--'"));
      }
      break;
    }
    absl::string_view name = arg;
    if (arg.size() < 2 || !absl::ConsumePrefix(&name, "-")) {
      return absl::InvalidArgumentError(absl::StrCat(
          "expected only --flags (a value goes as --flag=VALUE), got the argument '", arg, "'"));
    }
    absl::ConsumePrefix(&name, "-");
    absl::string_view value;
    const size_t equals = name.find('=');
    const bool has_value = equals != absl::string_view::npos;
    if (has_value) {
      value = name.substr(equals + 1);
      name = name.substr(0, equals);
    }
    if (IsAbseilBuiltin(name)) continue;  // Abseil's parser handles these and their values
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag == nullptr && !has_value && absl::StartsWith(name, "no")) {
      flag = absl::FindCommandLineFlag(name.substr(2));  // --noallow_remote_regions
      if (flag != nullptr && flag->IsOfType<bool>()) continue;
      flag = nullptr;
    }
    if (flag == nullptr || flag->IsRetired()) {
      return absl::InvalidArgumentError(
          absl::StrCat("expected a flag of samplerd --help, got the unknown flag '", arg, "'"));
    }
    if (!has_value) {
      if (flag->IsOfType<bool>()) continue;
      if (i + 1 >= argc) {  // "--flag VALUE" takes the next argument
        return absl::InvalidArgumentError(absl::StrCat("expected --", name, "=", "VALUE (",
                                                       ExpectedValue(*flag), "), got no value"));
      }
      value = argv[++i];
    }
    // Parsing sets the flag; absl::ParseCommandLine sets it again to the same value.
    std::string error;
    if (!flag->ParseFrom(value, &error)) {
      return absl::InvalidArgumentError(absl::StrCat("expected --", name, " to be ",
                                                     ExpectedValue(*flag), ", got '", value, "'"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<ProcessOptions> OptionsFromFlags() {
  ProcessOptions options;
  ASSIGN_OR_RETURN(options.core.backend, BackendFromFlag());
  options.core.threads = absl::GetFlag(FLAGS_threads);
  options.core.gpu = absl::GetFlag(FLAGS_gpu);
  RETURN_IF_ERROR(LimitsFromFlags(&options.server.max_message_bytes, &options.core.limits));
  ASSIGN_OR_RETURN(options.server.max_receive_bytes,
                   ReceiveBytesFromFlag(options.server.max_message_bytes));
  options.core.regions.shm_prefix = absl::GetFlag(FLAGS_shm_prefix);
  RETURN_IF_ERROR(core::ValidateShmPrefix(options.core.regions.shm_prefix));
  options.core.regions.max_regions = absl::GetFlag(FLAGS_max_regions);
  if (options.core.regions.max_regions < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "expected --max_regions >= 0 (0 = no limit), got ", options.core.regions.max_regions));
  }
  options.core.regions.max_region_bytes = absl::GetFlag(FLAGS_max_region_bytes);
  if (options.core.regions.max_region_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected --max_region_bytes >= 0 (0 = no limit), got ",
                     options.core.regions.max_region_bytes));
  }

  RETURN_IF_ERROR(SessionsFromFlags(&options.core.sessions));

  options.grace_period = absl::GetFlag(FLAGS_grace_period);
  if (options.grace_period < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("expected --grace_period >= 0, got ",
                                                   absl::FormatDuration(options.grace_period)));
  }

  grpc_transport::ServerOptions& server = options.server;
  server.listen = absl::StrSplit(absl::GetFlag(FLAGS_listen), ',', absl::SkipEmpty());
  server.allow_remote_regions = absl::GetFlag(FLAGS_allow_remote_regions);
  const int64_t chunk_timeout_ms = absl::GetFlag(FLAGS_chunk_timeout_ms);
  if (chunk_timeout_ms < 1 || chunk_timeout_ms > kMaxChunkTimeoutMs) {
    return absl::InvalidArgumentError(absl::StrCat("expected --chunk_timeout_ms in [1, ",
                                                   kMaxChunkTimeoutMs, "] (1 ms to 1 day), got ",
                                                   chunk_timeout_ms));
  }
  server.chunk_timeout = absl::Milliseconds(chunk_timeout_ms);
  server.tls.cert_file = absl::GetFlag(FLAGS_tls_cert);
  server.tls.key_file = absl::GetFlag(FLAGS_tls_key);
  server.tls.client_ca_file = absl::GetFlag(FLAGS_tls_client_ca);
  RETURN_IF_ERROR(grpc_transport::ValidateTlsOptions(server.tls));

  const int32_t health_port = absl::GetFlag(FLAGS_health_port);
  RETURN_IF_ERROR(CheckPort("health_port", health_port));
  if (health_port != 0) {
    server.health_address = absl::StrCat(absl::GetFlag(FLAGS_health_address), ":", health_port);
  }
  options.metrics_port = absl::GetFlag(FLAGS_metrics_port);
  RETURN_IF_ERROR(CheckPort("metrics_port", options.metrics_port));
  options.metrics_address = absl::GetFlag(FLAGS_metrics_address);
  return options;
}

}  // namespace samplerd
