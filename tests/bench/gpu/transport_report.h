// The transport benchmark's results: one row per (transport, batch), their statistics, and the
// JSON and Markdown files written from them (bench_transports.cc measures).
#ifndef SAMPLERD_TESTS_BENCH_GPU_TRANSPORT_REPORT_H_
#define SAMPLERD_TESTS_BENCH_GPU_TRANSPORT_REPORT_H_

#include <cstdint>
#include <string>
#include <vector>

namespace samplerd::bench {

// One measured cell. Latencies are client round trips in microseconds (the GPU's own time for
// the "kernel" rows).
struct Row {
  std::string transport;
  int64_t batch = 0;
  int calls = 0;
  double p50_us = 0, p99_us = 0, mean_us = 0;
  double server_compute_p50_us = -1;  // -1: not reported (kernel rows)
  std::string error;                  // non-empty: the cell failed
};

// The q-quantile (0..1) of `v`, nearest rank; 0 for an empty `v`.
double Percentile(std::vector<double> v, double q);
double Mean(const std::vector<double>& v);

// Prints the Markdown table to stdout and writes it to `markdown_path` and the rows as a JSON
// array to `json_path` (either may be empty: not written). Each row also gets calls/s and rows/s
// of back-to-back calls (1 / mean), the logits' GB/s at p50 (B x `vocab` fp32) and its p50 minus
// the "kernel" row's p50 of the same batch.
void WriteReport(const std::vector<Row>& rows, int64_t vocab, const std::string& device_name,
                 const std::string& json_path, const std::string& markdown_path);

}  // namespace samplerd::bench

#endif  // SAMPLERD_TESTS_BENCH_GPU_TRANSPORT_REPORT_H_
