// Pieces of the Prometheus text exposition format 0.0.4: escaping, number formatting and name
// rules. Pure functions; the registry (registry.cc) assembles them into lines.
#ifndef SAMPLERD_SERVICE_METRICS_TEXT_FORMAT_H_
#define SAMPLERD_SERVICE_METRICS_TEXT_FORMAT_H_

#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace samplerd::metrics {

// The Content-Type of a scrape answer in this format.
inline constexpr char kExpositionContentType[] = "text/plain; version=0.0.4; charset=utf-8";

// HELP text: '\' becomes "\\" and a line feed "\n".
std::string EscapeHelp(absl::string_view text);

// A label value inside double quotes: '\' becomes "\\", '"' becomes "\"" and a line feed "\n".
std::string EscapeLabelValue(absl::string_view value);

// A sample value or `le` bound: "+Inf", "-Inf", "NaN", or the shortest decimal form that reads
// back to the same double (e.g. "0.005", "1e-05", "42").
std::string FormatValue(double value);

// {name="value",...} for parallel lists of names and escaped values; "" when both are empty.
std::string FormatLabels(const std::vector<std::string>& names,
                         const std::vector<std::string>& values);

// [a-zA-Z_:][a-zA-Z0-9_:]*
bool IsValidMetricName(absl::string_view name);
// [a-zA-Z_][a-zA-Z0-9_]* and not starting with "__" (reserved for Prometheus itself).
bool IsValidLabelName(absl::string_view name);

}  // namespace samplerd::metrics

#endif  // SAMPLERD_SERVICE_METRICS_TEXT_FORMAT_H_
