// The pieces of the text exposition format: escaping, numbers, labels and name rules.
#include "service/metrics/text_format.h"

#include <gtest/gtest.h>

#include <limits>

namespace samplerd::metrics {
namespace {

TEST(EscapeHelp, EscapesBackslashAndLineFeedButNotQuotes) {
  EXPECT_EQ(EscapeHelp("a\\b\nc \"d\""), "a\\\\b\\nc \"d\"");
}

TEST(EscapeLabelValue, EscapesBackslashQuoteAndLineFeed) {
  EXPECT_EQ(EscapeLabelValue("a\\b\"c\nd"), "a\\\\b\\\"c\\nd");
  EXPECT_EQ(EscapeLabelValue("NVIDIA H200"), "NVIDIA H200");
  EXPECT_EQ(EscapeLabelValue(""), "");
}

TEST(FormatValue, WritesTheShortestExactDecimal) {
  EXPECT_EQ(FormatValue(0), "0");
  EXPECT_EQ(FormatValue(42), "42");
  EXPECT_EQ(FormatValue(-3.5), "-3.5");
  EXPECT_EQ(FormatValue(0.005), "0.005");
  EXPECT_EQ(FormatValue(25e-6), "2.5e-05");
  EXPECT_EQ(FormatValue(0.1 + 0.2), "0.30000000000000004");  // needs all 17 digits
  EXPECT_EQ(FormatValue(1e300), "1e+300");
}

TEST(FormatValue, WritesInfinitiesAndNanAsPrometheusDoes) {
  EXPECT_EQ(FormatValue(std::numeric_limits<double>::infinity()), "+Inf");
  EXPECT_EQ(FormatValue(-std::numeric_limits<double>::infinity()), "-Inf");
  EXPECT_EQ(FormatValue(std::numeric_limits<double>::quiet_NaN()), "NaN");
}

TEST(FormatLabels, JoinsNamesAndEscapedValues) {
  EXPECT_EQ(FormatLabels({}, {}), "");
  EXPECT_EQ(FormatLabels({"method", "code"}, {"Sample", "OK"}), "{method=\"Sample\",code=\"OK\"}");
  EXPECT_EQ(FormatLabels({"name"}, {"say \"hi\"\n"}), "{name=\"say \\\"hi\\\"\\n\"}");
}

TEST(NameRules, MetricNamesAllowColonsAndNoLeadingDigit) {
  EXPECT_TRUE(IsValidMetricName("samplerd_requests_total"));
  EXPECT_TRUE(IsValidMetricName("job:rate5m"));
  EXPECT_TRUE(IsValidMetricName("_x"));
  EXPECT_FALSE(IsValidMetricName(""));
  EXPECT_FALSE(IsValidMetricName("1abc"));
  EXPECT_FALSE(IsValidMetricName("a-b"));
  EXPECT_FALSE(IsValidMetricName("a b"));
  EXPECT_FALSE(IsValidMetricName("caf\xc3\xa9"));
}

TEST(NameRules, LabelNamesRefuseColonsAndTheReservedPrefix) {
  EXPECT_TRUE(IsValidLabelName("method"));
  EXPECT_TRUE(IsValidLabelName("_private"));
  EXPECT_FALSE(IsValidLabelName("__name__"));
  EXPECT_FALSE(IsValidLabelName("a:b"));
  EXPECT_FALSE(IsValidLabelName("9"));
  EXPECT_FALSE(IsValidLabelName(""));
}

}  // namespace
}  // namespace samplerd::metrics
