// Scraping a real server's /metrics in integration tests, and reading one series from the text.
#ifndef SAMPLERD_TESTS_INTEGRATION_METRICS_SCRAPE_H_
#define SAMPLERD_TESTS_INTEGRATION_METRICS_SCRAPE_H_

#include <cstdlib>
#include <sstream>
#include <string>

#include "tests/metrics/http_get.h"

namespace samplerd::integration {

// The body of GET /metrics on 127.0.0.1:`port`; empty when the answer is not 200.
inline std::string ScrapeMetrics(int port) {
  const testing_http::HttpResponse response = testing_http::HttpGet(port, "/metrics");
  return response.status == 200 ? response.body : std::string();
}

// The value of the sample line `series` (name plus labels exactly as exposed: prometheus-cpp
// sorts labels by name, e.g. samplerd_requests_total{code="OK",method="Sample"}); -1 when the
// series is absent.
inline double SeriesValue(const std::string& text, const std::string& series) {
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.size() > series.size() && line.compare(0, series.size(), series) == 0 &&
        line[series.size()] == ' ') {
      return std::strtod(line.c_str() + series.size() + 1, nullptr);
    }
  }
  return -1;
}

// samplerd_requests_total{code="`code`",method="`method`"}, 0 when absent.
inline double Requests(const std::string& text, const std::string& method,
                       const std::string& code) {
  const double value =
      SeriesValue(text, "samplerd_requests_total{code=\"" + code + "\",method=\"" + method + "\"}");
  return value < 0 ? 0 : value;
}

}  // namespace samplerd::integration

#endif  // SAMPLERD_TESTS_INTEGRATION_METRICS_SCRAPE_H_
