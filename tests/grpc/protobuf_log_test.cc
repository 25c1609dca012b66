#include "service/grpc/protobuf_log.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "samplerd/v1/sampler.pb.h"

namespace samplerd::grpc_transport {
namespace {

class LogRateLimiterTest : public ::testing::Test {
 protected:
  LogRateLimiter Limiter(int max_lines) {
    return LogRateLimiter(
        "x", max_lines, absl::Minutes(1),
        [this](const std::string& line) { lines_.push_back(line); }, [this] { return now_; });
  }

  absl::Time now_ = absl::FromUnixSeconds(1000);
  std::vector<std::string> lines_;
};

TEST_F(LogRateLimiterTest, PassesTheFirstLinesOfAWindowAndCountsTheRest) {
  LogRateLimiter limiter = Limiter(3);
  for (int i = 0; i < 5; ++i) limiter.Write("line " + std::to_string(i));
  EXPECT_EQ(lines_, (std::vector<std::string>{"line 0", "line 1", "line 2"}));
  EXPECT_EQ(limiter.suppressed_total(), 2);

  now_ += absl::Seconds(59);  // the same window
  limiter.Write("line 5");
  EXPECT_EQ(lines_.size(), 3u);

  now_ += absl::Seconds(1);  // the next window reports the count, then passes lines again
  limiter.Write("line 6");
  ASSERT_EQ(lines_.size(), 5u);
  EXPECT_EQ(lines_[3], "suppressed 3 more x log lines (at most 3 per 1m)");
  EXPECT_EQ(lines_[4], "line 6");
  EXPECT_EQ(limiter.suppressed_total(), 3);
}

TEST_F(LogRateLimiterTest, FlushReportsWhatIsSuppressedOnce) {
  LogRateLimiter limiter = Limiter(1);
  limiter.Flush();
  EXPECT_TRUE(lines_.empty());
  limiter.Write("a");
  limiter.Write("b");
  limiter.Flush();
  limiter.Flush();
  EXPECT_EQ(lines_,
            (std::vector<std::string>{"a", "suppressed 1 more x log lines (at most 1 per 1m)"}));
}

TEST_F(LogRateLimiterTest, AlwaysLinesPassEvenWhenTheWindowIsSpent) {
  LogRateLimiter limiter = Limiter(1);
  limiter.Write("a");
  limiter.Write("fatal", /*always=*/true);
  EXPECT_EQ(lines_, (std::vector<std::string>{"a", "fatal"}));
}

// A string field that is not UTF-8 makes libprotobuf log an error while parsing: routed, the
// line reaches the limiter instead of stderr, and a flood is capped.
TEST_F(LogRateLimiterTest, RoutesLibprotobufErrors) {
  LogRateLimiter limiter = Limiter(2);
  RouteProtobufLogTo(&limiter);
  v1::SampleRequest request;
  request.set_request_id(std::string("\xff\xfe", 2));
  const std::string bytes = request.SerializeAsString();  // logs once itself
  v1::SampleRequest parsed;
  for (int i = 0; i < 10; ++i) EXPECT_FALSE(parsed.ParseFromString(bytes));
  RouteProtobufLogTo(nullptr);
  ASSERT_EQ(lines_.size(), 2u);
  EXPECT_EQ(lines_[0].rfind("libprotobuf ERROR ", 0), 0u) << lines_[0];
  EXPECT_NE(lines_[1].find("invalid UTF-8"), std::string::npos) << lines_[1];
  EXPECT_EQ(limiter.suppressed_total(), 9);
}

}  // namespace
}  // namespace samplerd::grpc_transport
