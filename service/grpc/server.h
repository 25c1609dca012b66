// Builds and runs the gRPC server: listeners (TLS on TCP when configured; unix sockets accepted
// by UnixListener, which knows each client's pid), SamplerService, health (also on an optional
// health-only TCP port), reflection, keepalive.
#ifndef SAMPLERD_SERVICE_GRPC_SERVER_H_
#define SAMPLERD_SERVICE_GRPC_SERVER_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "service/core/sampler_core.h"
#include "service/grpc/health_server.h"
#include "service/grpc/sampler_service.h"
#include "service/grpc/tls_credentials.h"
#include "service/grpc/unix_listener.h"
#include "service/metrics/sampler_metrics.h"

namespace samplerd::grpc_transport {

// Mode of the unix socket files the server creates: owner and group may connect, others not
// (connecting needs write permission). Run the engine as the same user or a member of the group.
inline constexpr unsigned kUnixSocketMode = 0660;

struct ServerOptions {
  // gRPC listen addresses: "unix:///run/samplerd/samplerd.sock" (absolute), "unix:PATH"
  // (relative or absolute), "unix-abstract:NAME", "127.0.0.1:50051", "[::]:0", ... A unix
  // socket's missing directories are created (mode 0750) and the socket is set to
  // kUnixSocketMode once bound. Port 0 picks a free port.
  std::vector<std::string> listen = {"unix:///run/samplerd/samplerd.sock"};
  // Largest message received or sent, bytes (--max_message_bytes); GetServerInfo reports it.
  int max_message_bytes = 256 << 20;
  // Request bytes received at once before admission (--max_receive_bytes; 0 = no limit, else
  // >= max_message_bytes): a unary call reads its request only while it holds max_message_bytes
  // of them, and waits for its turn otherwise (receive_gate.h). 0: the unary methods are plain
  // gRPC unary methods, as if there were no gate. GetServerInfo reports it.
  int64_t max_receive_bytes = 0;
  // How long a chunked SampleStream step may take from its first message to its last
  // (--chunk_timeout_ms; > 0): then it fails DEADLINE_EXCEEDED and its reserved bytes are free.
  // With max_receive_bytes, also how long a unary request may take to arrive once its turn came.
  absl::Duration chunk_timeout = absl::Seconds(10);
  // Serve region calls (and requests naming regions) to TCP clients too, not only to clients on
  // a unix socket (--allow_remote_regions).
  bool allow_remote_regions = false;
  // TLS (or mutual TLS) for the TCP addresses of `listen`; unix sockets stay plaintext. Off when
  // no files are set.
  TlsOptions tls;
  // A second, plaintext TCP listener serving only grpc.health.v1.Health with the same status
  // ("0.0.0.0:8081"; port 0 picks one); empty: none. See health_server.h.
  std::string health_address;
  // Where answered calls are counted (null: nowhere); must outlive the server.
  metrics::SamplerMetrics* metrics = nullptr;
};

// The service name health reports on, besides "".
inline constexpr char kServiceName[] = "samplerd.v1.SamplerService";

class SamplerServer {
 public:
  // Starts serving on every address of `options` (and the health address); health starts
  // NOT_SERVING (call SetServing). `core` must outlive the server. Errors: INVALID_ARGUMENT for
  // a malformed address or TLS options, UNAVAILABLE when an address cannot be bound (or gRPC
  // refuses the TLS key pair), FAILED_PRECONDITION when a socket's directory cannot be created
  // or its mode cannot be set, or a TLS file cannot be read.
  static absl::StatusOr<std::unique_ptr<SamplerServer>> Start(const ServerOptions& options,
                                                              core::SamplerCore* core);

  // Health for "" and kServiceName, on the main listeners and the health address: SERVING or
  // NOT_SERVING.
  void SetServing(bool serving);

  // The addresses actually bound, in the order of options.listen: TCP port 0 resolved, unix
  // addresses as given.
  const std::vector<std::string>& bound_addresses() const { return bound_; }
  // The health address as bound (port 0 resolved); empty without one.
  std::string health_address() const { return health_ ? health_->bound_address() : ""; }
  // The budget the unary calls' requests are received within (--max_receive_bytes; unused
  // without one).
  const ReceiveGate& receive_gate() const { return service_.receive_gate(); }

  // Stops accepting calls and waits for those in flight until `deadline`, then cancels them;
  // then stops the health listener (it answers NOT_SERVING, once SetServing(false), until then).
  void Shutdown(absl::Time deadline);

 private:
  SamplerServer(core::SamplerCore* core, const ServerOptions& options)
      : service_(core, options.allow_remote_regions,
                 TransportLimits{options.max_message_bytes, options.max_receive_bytes,
                                 options.chunk_timeout},
                 options.metrics, &peers_) {}

  PeerTable peers_;  // before service_, which looks callers up in it
  SamplerServiceImpl service_;
  std::unique_ptr<grpc::Server> server_;
  // The unix addresses of `listen` (null: none). After server_: its thread, which feeds
  // server_, stops first.
  std::unique_ptr<UnixListener> unix_listener_;
  std::unique_ptr<HealthServer> health_;
  std::vector<std::string> bound_;
};

}  // namespace samplerd::grpc_transport

#endif  // SAMPLERD_SERVICE_GRPC_SERVER_H_
