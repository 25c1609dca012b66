// Serves a Registry at GET /metrics over plain HTTP/1.1, for Prometheus scrapes: prometheus-cpp's
// Exposer (Debian's libprometheus-cpp-pull, on civetweb), started with samplerd's checks, its
// errors as statuses and a fast stop.
//
// The exposer serves no files (no document_root): GET /metrics answers, every other path or
// method is 404. No TLS: scrapes stay inside the pod network (see --metrics_address).
#ifndef SAMPLERD_SERVICE_METRICS_HTTP_EXPORTER_H_
#define SAMPLERD_SERVICE_METRICS_HTTP_EXPORTER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "prometheus/exposer.h"
#include "service/metrics/registry.h"

namespace samplerd::metrics {

class HttpExporter {
 public:
  // Listens on `address`:`port` ("0.0.0.0", "127.0.0.1"; port 0 picks a free one) with 64
  // worker threads, one per open connection (a connection that has not sent its whole request
  // within 1 s is closed, and each serves one request: a scrape behind N silent connections waits
  // ~ceil((N + 1) / 64) s), and answers GET /metrics with the exposer's own exposer_* series
  // followed by registry->ExpositionText() (gzip-compressed when the client accepts it).
  // `registry` must outlive the exporter. Errors: INVALID_ARGUMENT for a port outside [0, 65535]
  // or an address with characters civetweb would misread, UNAVAILABLE when the port cannot be
  // bound (with the reason: bind()'s error, or an IPv6 address on a civetweb without IPv6).
  static absl::StatusOr<std::unique_ptr<HttpExporter>> Start(const std::string& address, int port,
                                                             const Registry* registry);

  // Stops listening and waits for requests being answered.
  ~HttpExporter();
  HttpExporter(const HttpExporter&) = delete;
  HttpExporter& operator=(const HttpExporter&) = delete;

  // Whether the civetweb linked in can listen on IPv6 addresses (Debian 12's cannot).
  static bool CanServeIpv6();

  // The port actually bound (port 0 resolved).
  int port() const { return port_; }

 private:
  HttpExporter() = default;

  std::unique_ptr<prometheus::Exposer> exposer_;
  std::string address_;  // as given to Start
  int port_ = 0;
};

}  // namespace samplerd::metrics

#endif  // SAMPLERD_SERVICE_METRICS_HTTP_EXPORTER_H_
