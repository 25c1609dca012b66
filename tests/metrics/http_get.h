// A minimal blocking HTTP/1.0 client for tests: one request, read until the server closes; and
// silent connections that hold a server's workers.
#ifndef SAMPLERD_TESTS_METRICS_HTTP_GET_H_
#define SAMPLERD_TESTS_METRICS_HTTP_GET_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

namespace samplerd::testing_http {

struct HttpResponse {
  int status = 0;       // 0: no answer (connection failed)
  std::string headers;  // the status line and headers, as received
  std::string body;
};

// A TCP connection to 127.0.0.1:`port`, or -1.
inline int ConnectLoopback(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// Sends "`method` `path` HTTP/1.0" to 127.0.0.1:`port` and returns the answer. HTTP/1.0 without
// keep-alive: the server closes the connection after the body. Gives up after 10 s.
inline HttpResponse HttpRequest(int port, const std::string& method, const std::string& path) {
  HttpResponse response;
  const int fd = ConnectLoopback(port);
  if (fd < 0) return response;
  timeval timeout{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
  const std::string request = method + " " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
  if (send(fd, request.data(), request.size(), MSG_NOSIGNAL) !=
      static_cast<ssize_t>(request.size())) {
    close(fd);
    return response;
  }
  std::string raw;
  char buffer[4096];
  ssize_t n;
  while ((n = recv(fd, buffer, sizeof(buffer), 0)) > 0) raw.append(buffer, static_cast<size_t>(n));
  close(fd);
  const size_t end = raw.find("\r\n\r\n");
  if (raw.rfind("HTTP/", 0) != 0 || end == std::string::npos) return response;
  response.headers = raw.substr(0, end);
  response.body = raw.substr(end + 4);
  const size_t space = raw.find(' ');
  response.status = std::atoi(raw.c_str() + space + 1);
  return response;
}

inline HttpResponse HttpGet(int port, const std::string& path) {
  return HttpRequest(port, "GET", path);
}

// `count` TCP connections to 127.0.0.1:`port` that send nothing, as idle or hostile clients hold
// them; the caller closes them. Stops at the first connection that fails.
inline std::vector<int> OpenSilentConnections(int port, int count) {
  std::vector<int> fds;
  for (int i = 0; i < count; ++i) {
    const int fd = ConnectLoopback(port);
    if (fd < 0) break;
    fds.push_back(fd);
  }
  return fds;
}

}  // namespace samplerd::testing_http

#endif  // SAMPLERD_TESTS_METRICS_HTTP_GET_H_
