// TLS and mutual TLS for the TCP listeners (--tls_cert, --tls_key, --tls_client_ca). Unix
// sockets stay plaintext: their file mode already says who may connect.
#ifndef SAMPLERD_SERVICE_GRPC_TLS_CREDENTIALS_H_
#define SAMPLERD_SERVICE_GRPC_TLS_CREDENTIALS_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace samplerd::grpc_transport {

struct TlsOptions {
  // PEM files. cert_file and key_file: both (TLS on TCP listeners) or neither (plaintext).
  std::string cert_file;  // the server's certificate chain, leaf first
  std::string key_file;   // its private key
  // CA certificates that client certificates must chain to; set: every TCP client must present
  // a valid certificate (mutual TLS). Needs cert_file and key_file.
  std::string client_ca_file;

  bool enabled() const { return !cert_file.empty() || !key_file.empty(); }
};

// Checks that the files are given in a usable combination (without reading them). Errors:
// INVALID_ARGUMENT naming the missing flag.
absl::Status ValidateTlsOptions(const TlsOptions& options);

// The credentials of TCP listeners: plaintext when TLS is off, else TLS (mutual TLS with a
// client CA) from the PEM files, read now. Errors: ValidateTlsOptions's; FAILED_PRECONDITION
// when a file cannot be read; INVALID_ARGUMENT when it holds no PEM block of the expected kind.
// Whether the key matches the certificate is checked by gRPC when the listener starts.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeTcpCredentials(
    const TlsOptions& options);

}  // namespace samplerd::grpc_transport

#endif  // SAMPLERD_SERVICE_GRPC_TLS_CREDENTIALS_H_
