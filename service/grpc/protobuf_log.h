// libprotobuf's own log output, rate-limited. libprotobuf logs (GOOGLE_LOG) once for every
// request with a string field that is not valid UTF-8 ("String field '...' contains invalid
// UTF-8 data when parsing a protocol buffer"), and by default writes each such line to stderr:
// a client could flood the log (2.1 MB after one fuzz run, issue 12, edge 2). Routed through a
// LogRateLimiter, at most a few lines per window reach the server's log, and the rest are
// counted and reported in one line.
#ifndef SAMPLERD_SERVICE_GRPC_PROTOBUF_LOG_H_
#define SAMPLERD_SERVICE_GRPC_PROTOBUF_LOG_H_

#include <cstdint>
#include <functional>
#include <mutex>
#include <string>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace samplerd::grpc_transport {

// Passes at most `max_lines` lines per `window` to a sink and counts the rest. The count is
// reported as one line, "suppressed K more <what> log lines in the last window", before the
// first line of a later window, or by Flush(). Thread-safe; the sink is called under a lock
// (keep it short, and never log to the limiter from it).
class LogRateLimiter {
 public:
  using Sink = std::function<void(const std::string& line)>;
  using Clock = std::function<absl::Time()>;

  // `what` names the source in the suppression line (e.g. "libprotobuf").
  LogRateLimiter(std::string what, int max_lines, absl::Duration window, Sink sink,
                 Clock clock = absl::Now);

  // Writes `line` to the sink, or counts it when this window's lines are spent. Lines with
  // `always` (fatal ones) are written in any case and count against the window.
  void Write(const std::string& line, bool always = false);
  // Reports the lines suppressed so far, if any (e.g. at shutdown).
  void Flush();
  // Lines suppressed since the start, reported or not.
  int64_t suppressed_total() const;

 private:
  void ReportSuppressedLocked();

  const std::string what_;
  const int max_lines_;
  const absl::Duration window_;
  const Sink sink_;
  const Clock clock_;
  mutable std::mutex mu_;
  absl::Time window_start_ = absl::InfinitePast();
  int lines_in_window_ = 0;
  int64_t suppressed_unreported_ = 0;
  int64_t suppressed_total_ = 0;
};

// libprotobuf lines per minute that reach the server's log; the rest are counted.
inline constexpr int kProtobufLogLinesPerMinute = 10;

// Routes libprotobuf's log handler (google::protobuf::SetLogHandler, process-wide) to
// `limiter`, which must stay alive until RouteProtobufLogTo(nullptr) (which restores
// libprotobuf's default handler). Lines read "libprotobuf LEVEL file:line: message".
void RouteProtobufLogTo(LogRateLimiter* limiter);

}  // namespace samplerd::grpc_transport

#endif  // SAMPLERD_SERVICE_GRPC_PROTOBUF_LOG_H_
