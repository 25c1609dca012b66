// samplerd's command-line flags (defined in flags.cc, listed by --help) and their conversion into
// the options of the core, the gRPC server and the metrics exporter.
#ifndef SAMPLERD_SERVICE_FLAGS_H_
#define SAMPLERD_SERVICE_FLAGS_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "service/core/options.h"
#include "service/grpc/server.h"

namespace samplerd {

struct ProcessOptions {
  core::CoreOptions core;                // on_fatal and metrics are left for main() to set
  grpc_transport::ServerOptions server;  // metrics is left for main() to set
  // GET /metrics on metrics_address:metrics_port; port 0: no metrics listener.
  std::string metrics_address = "0.0.0.0";
  int metrics_port = 0;
  // How long in-flight calls may take to finish after SIGTERM or a backend fault.
  absl::Duration grace_period = absl::Seconds(10);
};

// Sets the --help text (the usage message) and makes --help and --helpshort list the flags of
// this file. Call before absl::ParseCommandLine.
void SetUpFlagsUsage();

// Checks the command line before absl::ParseCommandLine, whose errors exit with status 1 and
// say nothing of what was expected: arguments that are not flags, unknown flags, and values
// that do not parse (e.g. --threads=abc, --grace_period=10) are INVALID_ARGUMENT with "expected
// X, got Y". Abseil's own flags (--help, --version, --flagfile, ...) are left to it.
absl::Status CheckCommandLine(int argc, char** argv);

// Reads the parsed flags. Errors: INVALID_ARGUMENT (with "expected X, got Y") for a value out of
// range, an unknown backend, an unsafe --shm_prefix or an incomplete TLS combination.
absl::StatusOr<ProcessOptions> OptionsFromFlags();

}  // namespace samplerd

#endif  // SAMPLERD_SERVICE_FLAGS_H_
