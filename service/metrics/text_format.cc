#include "service/metrics/text_format.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/ascii.h"

namespace samplerd::metrics {
namespace {

// Escapes '\' and line feeds, and '"' when `quote`.
std::string Escape(absl::string_view text, bool quote) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '"' && quote) {
      out += "\\\"";
    } else {
      out += c;
    }
  }
  return out;
}

bool IsNameChar(char c, bool first, bool colon) {
  return absl::ascii_isalpha(static_cast<unsigned char>(c)) || c == '_' || (colon && c == ':') ||
         (!first && absl::ascii_isdigit(static_cast<unsigned char>(c)));
}

bool IsValidName(absl::string_view name, bool colon) {
  if (name.empty()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    if (!IsNameChar(name[i], i == 0, colon)) return false;
  }
  return true;
}

}  // namespace

std::string EscapeHelp(absl::string_view text) { return Escape(text, /*quote=*/false); }

std::string EscapeLabelValue(absl::string_view value) { return Escape(value, /*quote=*/true); }

std::string FormatValue(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  // The shortest of %.15g .. %.17g that reads back exactly: "0.005", not "0.0050000000000000001".
  char buffer[32];
  for (int precision = 15; precision <= 17; ++precision) {
    std::snprintf(buffer, sizeof(buffer), "%.*g", precision, value);
    if (std::strtod(buffer, nullptr) == value) break;
  }
  return buffer;
}

std::string FormatLabels(const std::vector<std::string>& names,
                         const std::vector<std::string>& values) {
  if (names.empty()) return "";
  std::string out = "{";
  for (size_t i = 0; i < names.size() && i < values.size(); ++i) {
    if (i > 0) out += ',';
    out += names[i];
    out += "=\"";
    out += EscapeLabelValue(values[i]);
    out += '"';
  }
  out += '}';
  return out;
}

bool IsValidMetricName(absl::string_view name) { return IsValidName(name, /*colon=*/true); }

bool IsValidLabelName(absl::string_view name) {
  return IsValidName(name, /*colon=*/false) && name.substr(0, 2) != "__";
}

}  // namespace samplerd::metrics
