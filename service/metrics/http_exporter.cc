#include "service/metrics/http_exporter.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <exception>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "civetweb.h"

namespace samplerd::metrics {
namespace {

// civetweb's listening_ports syntax is "ADDRESS:PORT" with separators of its own (',' and 's'
// or 'r' suffixes): accept addresses made of address characters only.
bool IsPlainAddress(const std::string& address) {
  if (address.empty()) return false;
  for (char c : address) {
    if (!absl::ascii_isxdigit(static_cast<unsigned char>(c)) && c != '.' && c != ':' && c != '[' &&
        c != ']') {
      return false;
    }
  }
  return true;
}

// Opens and closes one TCP connection to `address`:`port` (a wildcard address means this
// host's loopback), ignoring failures.
void Knock(std::string address, int port) {
  if (!address.empty() && address.front() == '[') address = address.substr(1, address.size() - 2);
  sockaddr_storage storage = {};
  socklen_t length = 0;
  auto* v4 = reinterpret_cast<sockaddr_in*>(&storage);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&storage);
  if (inet_pton(AF_INET, address == "0.0.0.0" ? "127.0.0.1" : address.c_str(), &v4->sin_addr) ==
      1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(static_cast<uint16_t>(port));
    length = sizeof(*v4);
  } else if (inet_pton(AF_INET6, address == "::" ? "::1" : address.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(static_cast<uint16_t>(port));
    length = sizeof(*v6);
  } else {
    return;
  }
  const int fd = socket(storage.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return;
  (void)connect(fd, reinterpret_cast<sockaddr*>(&storage), length);
  close(fd);
}

// Why civetweb could not listen on `address`:`port` (its own exception says only "null context
// when constructing CivetServer. Possible problem binding to port."): no IPv6 in this civetweb,
// or the error of a bind() tried the same way.
std::string WhyNotServed(std::string address, int port, const std::string& civetweb_error) {
  const bool ipv6 = address.find(':') != std::string::npos;
  if (ipv6 && !HttpExporter::CanServeIpv6()) {
    return "an IPv6 address, which this build's civetweb cannot serve (built without IPv6); use "
           "an IPv4 address such as 0.0.0.0 or 127.0.0.1";
  }
  if (!address.empty() && address.front() == '[') address = address.substr(1, address.size() - 2);
  sockaddr_storage storage = {};
  socklen_t length = 0;
  auto* v4 = reinterpret_cast<sockaddr_in*>(&storage);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&storage);
  if (inet_pton(AF_INET, address.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(static_cast<uint16_t>(port));
    length = sizeof(*v4);
  } else if (inet_pton(AF_INET6, address.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(static_cast<uint16_t>(port));
    length = sizeof(*v6);
  } else {
    return civetweb_error;
  }
  const int fd = socket(storage.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return civetweb_error;
  const int on = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));  // as civetweb does
  const bool bound = bind(fd, reinterpret_cast<sockaddr*>(&storage), length) == 0;
  const int error = errno;
  close(fd);
  return bound ? civetweb_error : std::strerror(error);
}

}  // namespace

absl::StatusOr<std::unique_ptr<HttpExporter>> HttpExporter::Start(const std::string& address,
                                                                  int port,
                                                                  const Registry* registry) {
  if (port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected a metrics port in [0, 65535], got ", port));
  }
  if (!IsPlainAddress(address)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "expected a numeric metrics address such as 0.0.0.0 or 127.0.0.1, got '", address, "'"));
  }
  std::unique_ptr<HttpExporter> exporter(new HttpExporter());
  exporter->address_ = address;
  const std::string ports = absl::StrCat(address, ":", port);
  // civetweb gives each accepted connection a worker thread for as long as it is open, including
  // while it waits for the request's headers, and hands connections to workers in arrival order
  // (its connection_queue and the listen backlog are FIFO too): a scrape that arrives behind N
  // connections that send nothing waits about ceil((N + 1) / workers) x request_timeout_ms. With
  // 8 workers and 2 s, 40 silent TCP connections (an outside tester's) delayed every scrape by
  // 10 s, Prometheus' default scrape timeout, and 64 by 16 s. With 64 workers and 1 s, 64 silent
  // connections cost a scrape ~1 s (measured 0.95 s), 200 ~3 s. The timeout bounds a whole
  // request, not each read (a client sending a byte every 100 ms is dropped after 1 s too), and
  // each blocked write of the answer; a scrape request is one small packet and its answer tens of
  // kB. A worker costs ~17 kB resident (64: +1.5 MB). No keep-alive: a kept-alive connection
  // holds its worker while idle for keep_alive_timeout_ms (30 s), so a few idle HTTP/1.1 clients
  // (a scraper's connection pool, dashboards) stalled every scrape; a scrape every 15 s gains
  // nothing from it. tests/metrics/http_exporter_test.cc and tests/integration/metrics_test.cc
  // hold these bounds.
  try {
    exporter->exposer_ = std::make_unique<prometheus::Exposer>(
        std::vector<std::string>{"listening_ports", ports, "num_threads", "64",
                                 "request_timeout_ms", "1000", "enable_keep_alive", "no"});
  } catch (const std::exception& e) {  // civetweb's CivetException
    return absl::UnavailableError(absl::StrCat("expected to serve metrics on ", ports,
                                               ", got: ", WhyNotServed(address, port, e.what())));
  }
  // civetweb matches a handler's URI as a prefix unless it ends in '$': "/metrics" alone would
  // also answer /metrics/anything.
  exporter->exposer_->RegisterCollectable(registry->collectable(), "/metrics$");
  const std::vector<int> bound = exporter->exposer_->GetListeningPorts();
  exporter->port_ = bound.empty() ? port : bound.front();
  return exporter;
}

bool HttpExporter::CanServeIpv6() {
  constexpr unsigned kCivetwebIpv6 = 8;  // mg_check_feature: "IPv6 support"
  return mg_check_feature(kCivetwebIpv6) != 0;
}

HttpExporter::~HttpExporter() {
  if (exposer_ == nullptr) return;
  // civetweb's listening thread sees the stop only when its poll() returns, which it does every
  // 2 s (a compile-time quantum) or on a new connection: knock until mg_stop is through, so that
  // stopping takes milliseconds, not up to 2 s (measured: 2.0 s per stop without this).
  std::atomic<bool> stopped{false};
  std::thread stopper([this, &stopped] {
    exposer_.reset();  // civetweb's mg_stop
    stopped.store(true, std::memory_order_release);
  });
  for (int i = 0; i < 300 && !stopped.load(std::memory_order_acquire); ++i) {
    Knock(address_, port_);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  stopper.join();
}

}  // namespace samplerd::metrics
