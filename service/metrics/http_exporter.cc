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
  // civetweb gives each connection a worker for as long as it is open, including while it waits
  // for a request's headers: with two workers and a 10 s request timeout, two clients that sent
  // half a request stalled every scrape for ~10 s. Eight workers leave room for a scraper or two
  // next to a few such clients, and a client that has not sent its whole request within 2 s is
  // dropped (a scrape request is one small packet). No keep-alive: a kept-alive connection holds
  // its worker while idle, so eight idle HTTP/1.1 clients (a scraper's connection pool, a few
  // dashboards) stalled every scrape for the keep-alive timeout (30 s). A scrape every 15 s or
  // more gains nothing from keeping its connection.
  try {
    exporter->exposer_ = std::make_unique<prometheus::Exposer>(
        std::vector<std::string>{"listening_ports", ports, "num_threads", "8", "request_timeout_ms",
                                 "2000", "enable_keep_alive", "no"});
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
