#include "service/grpc/protobuf_log.h"

#include <google/protobuf/stubs/logging.h>

#include <atomic>
#include <utility>

#include "absl/strings/str_cat.h"

namespace samplerd::grpc_transport {

LogRateLimiter::LogRateLimiter(std::string what, int max_lines, absl::Duration window, Sink sink,
                               Clock clock)
    : what_(std::move(what)),
      max_lines_(max_lines),
      window_(window),
      sink_(std::move(sink)),
      clock_(std::move(clock)) {}

void LogRateLimiter::Write(const std::string& line, bool always) {
  std::lock_guard<std::mutex> lock(mu_);
  const absl::Time now = clock_();
  if (now - window_start_ >= window_) {
    ReportSuppressedLocked();
    window_start_ = now;
    lines_in_window_ = 0;
  }
  if (lines_in_window_ >= max_lines_ && !always) {
    ++suppressed_unreported_;
    ++suppressed_total_;
    return;
  }
  ++lines_in_window_;
  sink_(line);
}

void LogRateLimiter::Flush() {
  std::lock_guard<std::mutex> lock(mu_);
  ReportSuppressedLocked();
}

int64_t LogRateLimiter::suppressed_total() const {
  std::lock_guard<std::mutex> lock(mu_);
  return suppressed_total_;
}

void LogRateLimiter::ReportSuppressedLocked() {
  if (suppressed_unreported_ == 0) return;
  sink_(absl::StrCat("suppressed ", suppressed_unreported_, " more ", what_, " log lines (at most ",
                     max_lines_, " per ", absl::FormatDuration(window_), ")"));
  suppressed_unreported_ = 0;
}

namespace {

std::atomic<LogRateLimiter*> protobuf_limiter{nullptr};
google::protobuf::LogHandler* default_handler = nullptr;  // libprotobuf's, while ours is set

const char* LevelName(google::protobuf::LogLevel level) {
  switch (level) {
    case google::protobuf::LOGLEVEL_INFO:
      return "INFO";
    case google::protobuf::LOGLEVEL_WARNING:
      return "WARNING";
    case google::protobuf::LOGLEVEL_ERROR:
      return "ERROR";
    case google::protobuf::LOGLEVEL_FATAL:
      return "FATAL";
  }
  return "?";
}

void HandleProtobufLog(google::protobuf::LogLevel level, const char* filename, int line,
                       const std::string& message) {
  LogRateLimiter* limiter = protobuf_limiter.load(std::memory_order_acquire);
  if (limiter == nullptr) return;
  limiter->Write(
      absl::StrCat("libprotobuf ", LevelName(level), " ", filename, ":", line, ": ", message),
      /*always=*/level == google::protobuf::LOGLEVEL_FATAL);
}

}  // namespace

void RouteProtobufLogTo(LogRateLimiter* limiter) {
  protobuf_limiter.store(limiter, std::memory_order_release);
  if (limiter != nullptr && default_handler == nullptr) {
    default_handler = google::protobuf::SetLogHandler(&HandleProtobufLog);
  } else if (limiter == nullptr && default_handler != nullptr) {
    google::protobuf::SetLogHandler(default_handler);
    default_handler = nullptr;
  }
}

}  // namespace samplerd::grpc_transport
