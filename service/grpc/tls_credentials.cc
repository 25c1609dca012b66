#include "service/grpc/tls_credentials.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace samplerd::grpc_transport {
namespace {

// The contents of the PEM file that `flag` names; `marker` must occur in it (e.g.
// "-----BEGIN CERTIFICATE-----"). Never echoes the contents.
absl::StatusOr<std::string> ReadPem(const std::string& flag, const std::string& path,
                                    const std::string& marker, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::FailedPreconditionError(
        absl::StrCat("expected to read ", flag, "=", path, ", got: ", std::strerror(errno)));
  }
  std::stringstream contents;
  contents << in.rdbuf();
  std::string pem = contents.str();
  if (!absl::StrContains(pem, marker)) {
    return absl::InvalidArgumentError(absl::StrCat("expected ", what, " in PEM form (", marker,
                                                   ") in ", flag, "=", path, ", got none"));
  }
  return pem;
}

}  // namespace

absl::Status ValidateTlsOptions(const TlsOptions& options) {
  if (options.cert_file.empty() != options.key_file.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected both --tls_cert and --tls_key, or neither; got only ",
                     options.cert_file.empty() ? "--tls_key" : "--tls_cert"));
  }
  if (!options.client_ca_file.empty() && options.cert_file.empty()) {
    return absl::InvalidArgumentError(
        "expected --tls_cert and --tls_key with --tls_client_ca (mutual TLS needs server TLS), "
        "got neither");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeTcpCredentials(
    const TlsOptions& options) {
  absl::Status valid = ValidateTlsOptions(options);
  if (!valid.ok()) return valid;
  if (!options.enabled()) return grpc::InsecureServerCredentials();

  absl::StatusOr<std::string> cert =
      ReadPem("--tls_cert", options.cert_file, "-----BEGIN CERTIFICATE-----", "a certificate");
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key =
      ReadPem("--tls_key", options.key_file, "PRIVATE KEY-----", "a private key");
  if (!key.ok()) return key.status();
  grpc::SslServerCredentialsOptions ssl(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  ssl.pem_key_cert_pairs.push_back({*std::move(key), *std::move(cert)});
  if (!options.client_ca_file.empty()) {
    absl::StatusOr<std::string> ca = ReadPem("--tls_client_ca", options.client_ca_file,
                                             "-----BEGIN CERTIFICATE-----", "CA certificates");
    if (!ca.ok()) return ca.status();
    ssl.pem_root_certs = *std::move(ca);
    ssl.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  return grpc::SslServerCredentials(ssl);
}

}  // namespace samplerd::grpc_transport
