#include "tests/bench/gpu/transport_report.h"

#include <algorithm>
#include <cstdio>
#include <utility>

namespace samplerd::bench {
namespace {

std::string JsonEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += (static_cast<unsigned char>(c) < 0x20) ? ' ' : c;
  }
  return out;
}

}  // namespace

double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = static_cast<size_t>(q * static_cast<double>(v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

double Mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0 : s / static_cast<double>(v.size());
}

void WriteReport(const std::vector<Row>& rows, int64_t vocab, const std::string& device_name,
                 const std::string& json_path, const std::string& markdown_path) {
  // Bare kernel p50 per batch, for the "over the kernel" column.
  auto kernel_p50 = [&rows](int64_t b) {
    for (const Row& r : rows) {
      if (r.transport == "kernel" && r.batch == b && r.error.empty()) return r.p50_us;
    }
    return -1.0;
  };
  std::string md = "GPU: " + device_name + ", V = " + std::to_string(vocab) +
                   " fp32, T = 0.8 + top-k 50 + top-p 0.9, C++ client over a unix socket, one "
                   "thread, back-to-back calls.\n\n"
                   "| transport | B | calls | p50 µs | p99 µs | mean µs | calls/s | rows/s | "
                   "GB/s at p50 | server compute p50 µs | p50 over kernel µs |\n"
                   "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
  std::string json = "[\n";
  char line[1024];
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    const double gbs = r.p50_us > 0 ? static_cast<double>(r.batch * vocab * 4) / r.p50_us / 1e3 : 0;
    const double calls_per_s = r.mean_us > 0 ? 1e6 / r.mean_us : 0;
    const double over =
        kernel_p50(r.batch) >= 0 && r.transport != "kernel" ? r.p50_us - kernel_p50(r.batch) : 0;
    if (!r.error.empty()) {
      std::snprintf(line, sizeof(line), "| %s | %lld | failed: %s |||||||||\n", r.transport.c_str(),
                    static_cast<long long>(r.batch), r.error.c_str());
    } else {
      std::snprintf(
          line, sizeof(line),
          "| %s | %lld | %d | %.1f | %.1f | %.1f | %.0f | %.0f | %.1f | %s | %s |\n",
          r.transport.c_str(), static_cast<long long>(r.batch), r.calls, r.p50_us, r.p99_us,
          r.mean_us, calls_per_s, calls_per_s * static_cast<double>(r.batch), gbs,
          r.server_compute_p50_us >= 0
              ? std::to_string(static_cast<int64_t>(r.server_compute_p50_us)).c_str()
              : "",
          r.transport == "kernel" ? "" : std::to_string(static_cast<int64_t>(over)).c_str());
    }
    md += line;
    std::snprintf(
        line, sizeof(line),
        "  {\"transport\": \"%s\", \"batch\": %lld, \"vocab\": %lld, \"calls\": %d, "
        "\"p50_us\": %.2f, \"p99_us\": %.2f, \"mean_us\": %.2f, \"calls_per_s\": %.1f, "
        "\"server_compute_p50_us\": %.2f, \"p50_over_kernel_us\": %.2f, \"error\": \"%s\"}%s\n",
        r.transport.c_str(), static_cast<long long>(r.batch), static_cast<long long>(vocab),
        r.calls, r.p50_us, r.p99_us, r.mean_us, calls_per_s, r.server_compute_p50_us, over,
        JsonEscape(r.error).c_str(), i + 1 < rows.size() ? "," : "");
    json += line;
  }
  json += "]\n";
  std::fputs(md.c_str(), stdout);
  for (const auto& [path, text] :
       {std::make_pair(json_path, json), std::make_pair(markdown_path, md)}) {
    if (path.empty()) continue;
    if (FILE* f = std::fopen(path.c_str(), "w")) {
      std::fputs(text.c_str(), f);
      std::fclose(f);
    }
  }
}

}  // namespace samplerd::bench
