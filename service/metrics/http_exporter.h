// Serves a Registry at GET /metrics over plain HTTP/1.1, for Prometheus scrapes.
//
// Why civetweb (Debian's libcivetweb1) and not a hand-written server: parsing HTTP from the
// network (partial reads, pipelining, keep-alive, slow or hostile clients, timeouts) is easy to
// get subtly wrong, and civetweb is a small, embeddable, maintained server that does it with a
// bounded worker pool. It serves no files here (no document_root): /metrics answers, every
// other path is 404. No TLS: scrapes stay inside the pod network (see --metrics_address).
#ifndef SAMPLERD_SERVICE_METRICS_HTTP_EXPORTER_H_
#define SAMPLERD_SERVICE_METRICS_HTTP_EXPORTER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "service/metrics/registry.h"

struct mg_context;
struct mg_connection;

namespace samplerd::metrics {

class HttpExporter {
 public:
  // Listens on `address`:`port` ("0.0.0.0", "127.0.0.1"; port 0 picks a free one) with two
  // worker threads and answers GET or HEAD /metrics with registry->ExpositionText(). `registry`
  // must outlive the exporter. Errors: INVALID_ARGUMENT for a port outside [0, 65535] or an
  // address with characters civetweb would misread, UNAVAILABLE when the port cannot be bound
  // (with civetweb's reason).
  static absl::StatusOr<std::unique_ptr<HttpExporter>> Start(const std::string& address, int port,
                                                             const Registry* registry);

  // Stops listening and waits for requests being answered.
  ~HttpExporter();
  HttpExporter(const HttpExporter&) = delete;
  HttpExporter& operator=(const HttpExporter&) = delete;

  // The port actually bound (port 0 resolved).
  int port() const { return port_; }

 private:
  explicit HttpExporter(const Registry* registry) : registry_(registry) {}
  static int HandleMetrics(mg_connection* connection, void* self);

  const Registry* const registry_;
  std::string address_;  // as given to Start
  mg_context* context_ = nullptr;
  int port_ = 0;
};

}  // namespace samplerd::metrics

#endif  // SAMPLERD_SERVICE_METRICS_HTTP_EXPORTER_H_
