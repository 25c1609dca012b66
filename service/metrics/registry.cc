#include "service/metrics/registry.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "service/metrics/text_format.h"

namespace samplerd::metrics {
namespace {

uint64_t ToBits(double value) {
  uint64_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

double FromBits(uint64_t bits) {
  double value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

// *bits += amount, as doubles, lock-free.
void AtomicAdd(std::atomic<uint64_t>* bits, double amount) {
  uint64_t old = bits->load(std::memory_order_relaxed);
  while (!bits->compare_exchange_weak(old, ToBits(FromBits(old) + amount),
                                      std::memory_order_relaxed)) {
  }
}

const char* TypeName(MetricType type) {
  switch (type) {
    case MetricType::kCounter:
      return "counter";
    case MetricType::kGauge:
      return "gauge";
    case MetricType::kHistogram:
      return "histogram";
  }
  return "untyped";
}

void AppendHeader(const std::string& name, const std::string& help, MetricType type,
                  std::string* out) {
  absl::StrAppend(out, "# HELP ", name, " ", EscapeHelp(help), "\n# TYPE ", name, " ",
                  TypeName(type), "\n");
}

void AppendCounter(const CounterFamily& family, std::string* out) {
  family.ForEach([&](const std::vector<std::string>& values, const Counter& counter) {
    absl::StrAppend(out, family.name(), FormatLabels(family.label_names(), values), " ",
                    counter.Value(), "\n");
  });
}

void AppendGauge(const GaugeFamily& family, std::string* out) {
  family.ForEach([&](const std::vector<std::string>& values, const Gauge& gauge) {
    absl::StrAppend(out, family.name(), FormatLabels(family.label_names(), values), " ",
                    FormatValue(gauge.Value()), "\n");
  });
}

void AppendHistogram(const HistogramFamily& family, std::string* out) {
  std::vector<std::string> bucket_names = family.label_names();
  bucket_names.push_back("le");
  family.ForEach([&](const std::vector<std::string>& values, const Histogram& histogram) {
    const std::vector<uint64_t> counts = histogram.CumulativeCounts();
    std::vector<std::string> bucket_values = values;
    bucket_values.push_back("");
    for (size_t i = 0; i < counts.size(); ++i) {
      bucket_values.back() =
          i < histogram.bounds().size() ? FormatValue(histogram.bounds()[i]) : "+Inf";
      absl::StrAppend(out, family.name(), "_bucket", FormatLabels(bucket_names, bucket_values), " ",
                      counts[i], "\n");
    }
    const std::string labels = FormatLabels(family.label_names(), values);
    absl::StrAppend(out, family.name(), "_sum", labels, " ", FormatValue(histogram.Sum()), "\n");
    absl::StrAppend(out, family.name(), "_count", labels, " ", counts.back(), "\n");
  });
}

absl::Status CheckBounds(const std::vector<double>& bounds) {
  if (bounds.empty()) {
    return absl::InvalidArgumentError("expected at least one histogram bound, got none");
  }
  for (size_t i = 0; i < bounds.size(); ++i) {
    if (!std::isfinite(bounds[i])) {
      return absl::InvalidArgumentError(absl::StrCat(
          "expected finite histogram bounds (+Inf is implicit), got ", FormatValue(bounds[i])));
    }
    if (i > 0 && !(bounds[i] > bounds[i - 1])) {
      return absl::InvalidArgumentError(
          absl::StrCat("expected strictly increasing histogram bounds, got ",
                       FormatValue(bounds[i]), " after ", FormatValue(bounds[i - 1])));
    }
  }
  return absl::OkStatus();
}

}  // namespace

// ---- Gauge, Histogram --------------------------------------------------------------------------

void Gauge::Set(double value) { bits_.store(ToBits(value), std::memory_order_relaxed); }

void Gauge::Add(double amount) { AtomicAdd(&bits_, amount); }

double Gauge::Value() const { return FromBits(bits_.load(std::memory_order_relaxed)); }

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(new std::atomic<uint64_t>[bounds_.size() + 1]) {
  for (size_t i = 0; i <= bounds_.size(); ++i) counts_[i].store(0, std::memory_order_relaxed);
}

void Histogram::Observe(double value) {
  // lower_bound: the first bound >= value; NaN compares false everywhere and lands in +Inf.
  const size_t bucket =
      std::isnan(value)
          ? bounds_.size()
          : static_cast<size_t>(std::lower_bound(bounds_.begin(), bounds_.end(), value) -
                                bounds_.begin());
  counts_[bucket].fetch_add(1, std::memory_order_relaxed);
  AtomicAdd(&sum_bits_, value);
}

std::vector<uint64_t> Histogram::CumulativeCounts() const {
  std::vector<uint64_t> out(bounds_.size() + 1);
  uint64_t total = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    total += counts_[i].load(std::memory_order_relaxed);
    out[i] = total;
  }
  return out;
}

double Histogram::Sum() const { return FromBits(sum_bits_.load(std::memory_order_relaxed)); }

// ---- Family ------------------------------------------------------------------------------------

template <>
std::unique_ptr<Counter> Family<Counter>::Make() const {
  return std::make_unique<Counter>();
}
template <>
std::unique_ptr<Gauge> Family<Gauge>::Make() const {
  return std::make_unique<Gauge>();
}
template <>
std::unique_ptr<Histogram> Family<Histogram>::Make() const {
  return std::make_unique<Histogram>(bounds_);
}

template <typename Metric>
absl::StatusOr<Metric*> Family<Metric>::WithLabels(absl::Span<const std::string> values) {
  if (values.size() != label_names_.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "expected ", label_names_.size(), " label values for ", name_, ", got ", values.size()));
  }
  std::vector<std::string> key(values.begin(), values.end());
  std::lock_guard<std::mutex> lock(mu_);
  std::unique_ptr<Metric>& child = children_[std::move(key)];
  if (child == nullptr) child = Make();
  return child.get();
}

template class Family<Counter>;
template class Family<Gauge>;
template class Family<Histogram>;

// ---- Registry ----------------------------------------------------------------------------------

absl::Status Registry::CheckNewLocked(const std::string& name,
                                      const std::vector<std::string>& label_names,
                                      MetricType type) const {
  if (!IsValidMetricName(name)) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected a metric name [a-zA-Z_:][a-zA-Z0-9_:]*, got \"", name, "\""));
  }
  for (const Entry& entry : families_) {
    const std::string& taken = entry.counter ? entry.counter->name()
                               : entry.gauge ? entry.gauge->name()
                                             : entry.histogram->name();
    if (taken == name) {
      return absl::AlreadyExistsError(
          absl::StrCat("expected a new metric name, got \"", name, "\", which is registered"));
    }
  }
  std::set<std::string> seen;
  for (const std::string& label : label_names) {
    if (!IsValidLabelName(label)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "expected label names [a-zA-Z_][a-zA-Z0-9_]* not starting with \"__\", got \"", label,
          "\" for ", name));
    }
    if (type == MetricType::kHistogram && label == "le") {
      return absl::InvalidArgumentError(
          absl::StrCat("expected no \"le\" label on histogram ", name, " (it names buckets)"));
    }
    if (!seen.insert(label).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("expected distinct label names for ", name, ", got \"", label, "\" twice"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<CounterFamily*> Registry::AddCounter(const std::string& name,
                                                    const std::string& help,
                                                    std::vector<std::string> label_names) {
  std::lock_guard<std::mutex> lock(mu_);
  absl::Status status = CheckNewLocked(name, label_names, MetricType::kCounter);
  if (!status.ok()) return status;
  Entry entry{MetricType::kCounter, nullptr, nullptr, nullptr};
  entry.counter.reset(new CounterFamily(name, help, std::move(label_names), {}));
  families_.push_back(std::move(entry));
  return families_.back().counter.get();
}

absl::StatusOr<GaugeFamily*> Registry::AddGauge(const std::string& name, const std::string& help,
                                                std::vector<std::string> label_names) {
  std::lock_guard<std::mutex> lock(mu_);
  absl::Status status = CheckNewLocked(name, label_names, MetricType::kGauge);
  if (!status.ok()) return status;
  Entry entry{MetricType::kGauge, nullptr, nullptr, nullptr};
  entry.gauge.reset(new GaugeFamily(name, help, std::move(label_names), {}));
  families_.push_back(std::move(entry));
  return families_.back().gauge.get();
}

absl::StatusOr<HistogramFamily*> Registry::AddHistogram(const std::string& name,
                                                        const std::string& help,
                                                        std::vector<double> bounds,
                                                        std::vector<std::string> label_names) {
  std::lock_guard<std::mutex> lock(mu_);
  absl::Status status = CheckNewLocked(name, label_names, MetricType::kHistogram);
  if (status.ok()) status = CheckBounds(bounds);
  if (!status.ok()) return status;
  Entry entry{MetricType::kHistogram, nullptr, nullptr, nullptr};
  entry.histogram.reset(new HistogramFamily(name, help, std::move(label_names), std::move(bounds)));
  families_.push_back(std::move(entry));
  return families_.back().histogram.get();
}

std::string Registry::ExpositionText() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string out;
  for (const Entry& entry : families_) {
    switch (entry.type) {
      case MetricType::kCounter:
        AppendHeader(entry.counter->name(), entry.counter->help(), entry.type, &out);
        AppendCounter(*entry.counter, &out);
        break;
      case MetricType::kGauge:
        AppendHeader(entry.gauge->name(), entry.gauge->help(), entry.type, &out);
        AppendGauge(*entry.gauge, &out);
        break;
      case MetricType::kHistogram:
        AppendHeader(entry.histogram->name(), entry.histogram->help(), entry.type, &out);
        AppendHistogram(*entry.histogram, &out);
        break;
    }
  }
  return out;
}

std::vector<double> LatencyBucketsSeconds() {
  return {25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3,
          25e-3, 50e-3, 100e-3, 250e-3, 500e-3, 1.0,  2.5,    5.0,  10.0};
}

}  // namespace samplerd::metrics
