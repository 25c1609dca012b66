// A small Prometheus metrics registry: counters, gauges and fixed-bucket histograms with
// low-cardinality labels, exposed in the text format 0.0.4 (registry.cc, text_format.h).
//
// Why not prometheus-cpp: Debian 12 does not package it, and samplerd needs only this much.
//
//   Registry registry;
//   absl::StatusOr<CounterFamily*> requests =
//       registry.AddCounter("samplerd_requests_total", "Requests answered.", {"method", "code"});
//   Counter& ok = (*requests)->WithLabels({"Sample", "OK"});   // look up once (takes a lock)
//   ok.Increment();                                            // hot path: one relaxed atomic
//   std::string text = registry.ExpositionText();              // GET /metrics
//
// Thread-safety: everything may be called from any thread. Increment/Set/Add/Observe are
// lock-free (atomics only); WithLabels takes the family's lock, so hot paths look children up
// once and keep the reference (children live as long as the registry and never move).
// ExpositionText reads the atomics without stopping writers: a scrape sees each value at some
// moment during the scrape (a histogram's _count always equals its +Inf bucket).
#ifndef SAMPLERD_SERVICE_METRICS_REGISTRY_H_
#define SAMPLERD_SERVICE_METRICS_REGISTRY_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace samplerd::metrics {

// A count that only goes up (requests, rows, bytes). Lock-free.
class Counter {
 public:
  void Increment(uint64_t amount = 1) { value_.fetch_add(amount, std::memory_order_relaxed); }
  uint64_t Value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> value_{0};
};

// A value that goes up and down (requests in flight, regions). Lock-free.
class Gauge {
 public:
  void Set(double value);
  void Add(double amount);
  double Value() const;

 private:
  std::atomic<uint64_t> bits_{0};  // the double's bits (C++17 has no atomic<double>::fetch_add)
};

// Observations counted into fixed buckets, with their sum (latencies, in seconds). Lock-free:
// Observe is a binary search over the bounds and two relaxed atomic adds (bucket, sum).
class Histogram {
 public:
  // `bounds`: the finite upper bounds, strictly increasing (validated by the registry); the
  // +Inf bucket is implicit.
  explicit Histogram(std::vector<double> bounds);

  // Counts `value` in the first bucket whose bound is >= value (Prometheus' `le`). NaN is
  // counted in +Inf only and added to the sum as Prometheus clients do.
  void Observe(double value);

  const std::vector<double>& bounds() const { return bounds_; }
  // Cumulative counts per bound, then +Inf (bounds().size() + 1 entries).
  std::vector<uint64_t> CumulativeCounts() const;
  double Sum() const;

 private:
  const std::vector<double> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> counts_;  // per bucket, not cumulative; +Inf last
  std::atomic<uint64_t> sum_bits_{0};
};

enum class MetricType { kCounter, kGauge, kHistogram };

// The children of one metric name, one per combination of label values.
template <typename Metric>
class Family {
 public:
  // The child with these label values (one per label name, in order), created at first use
  // with value 0. Label values are free text (escaped on exposition) but must come from a small
  // fixed set: every combination is a time series kept forever. Takes a lock: call once and keep
  // the reference. INVALID_ARGUMENT when the count of values is not the count of label names.
  absl::StatusOr<Metric*> WithLabels(absl::Span<const std::string> values);

  // The only child of a family without labels. Never fails.
  Metric& Get() { return **WithLabels({}); }

  const std::string& name() const { return name_; }
  const std::string& help() const { return help_; }
  const std::vector<std::string>& label_names() const { return label_names_; }

  // Calls fn(label_values, metric) for every child, sorted by label values (under the lock).
  template <typename Fn>
  void ForEach(Fn fn) const {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [values, metric] : children_) fn(values, *metric);
  }

 private:
  friend class Registry;
  Family(std::string name, std::string help, std::vector<std::string> label_names,
         std::vector<double> bounds)
      : name_(std::move(name)),
        help_(std::move(help)),
        label_names_(std::move(label_names)),
        bounds_(std::move(bounds)) {}
  std::unique_ptr<Metric> Make() const;

  const std::string name_;
  const std::string help_;
  const std::vector<std::string> label_names_;
  const std::vector<double> bounds_;  // histograms only
  mutable std::mutex mu_;
  std::map<std::vector<std::string>, std::unique_ptr<Metric>> children_;
};

using CounterFamily = Family<Counter>;
using GaugeFamily = Family<Gauge>;
using HistogramFamily = Family<Histogram>;

class Registry {
 public:
  Registry() = default;
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // Adds a metric family. The name must match [a-zA-Z_:][a-zA-Z0-9_:]* and be new; label names
  // [a-zA-Z_][a-zA-Z0-9_]*, distinct, not starting with "__" (reserved), and not "le" for a
  // histogram. A counter's name should end in "_total" (not enforced). Histogram `bounds` must
  // be finite and strictly increasing (at least one). Errors: INVALID_ARGUMENT for a bad name,
  // label or bounds; ALREADY_EXISTS for a taken name. The family lives as long as the registry.
  absl::StatusOr<CounterFamily*> AddCounter(const std::string& name, const std::string& help,
                                            std::vector<std::string> label_names = {});
  absl::StatusOr<GaugeFamily*> AddGauge(const std::string& name, const std::string& help,
                                        std::vector<std::string> label_names = {});
  absl::StatusOr<HistogramFamily*> AddHistogram(const std::string& name, const std::string& help,
                                                std::vector<double> bounds,
                                                std::vector<std::string> label_names = {});

  // Every family, in the order they were added, in the Prometheus text exposition format
  // 0.0.4: "# HELP" and "# TYPE" lines, then one sample line per child (histograms: _bucket
  // lines with `le`, then _sum and _count). A family without children shows only HELP and
  // TYPE. Cost: proportional to the number of series; takes each family's lock briefly.
  std::string ExpositionText() const;

 private:
  // Checks `name` and `label_names` and reserves the name (mu_ held).
  absl::Status CheckNewLocked(const std::string& name, const std::vector<std::string>& label_names,
                              MetricType type) const;

  struct Entry {
    MetricType type;
    std::unique_ptr<CounterFamily> counter;
    std::unique_ptr<GaugeFamily> gauge;
    std::unique_ptr<HistogramFamily> histogram;
  };
  mutable std::mutex mu_;
  std::vector<Entry> families_;  // registration order
};

// Fixed histogram bounds for request latencies, in seconds: 25 µs to 10 s, roughly 1-2.5-5
// per decade (a sampling call takes tens of µs on a GPU, ms on the CPU; queueing can add more).
std::vector<double> LatencyBucketsSeconds();

}  // namespace samplerd::metrics

#endif  // SAMPLERD_SERVICE_METRICS_REGISTRY_H_
