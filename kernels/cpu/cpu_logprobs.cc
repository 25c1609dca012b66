// Logprob outputs of the CPU sampler; see cpu_logprobs.h.
#include "kernels/cpu/cpu_logprobs.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

namespace samplerd::kernels {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr float kInfF = std::numeric_limits<float>::infinity();

}  // namespace

void LogSoftmax(const float* values, int64_t n, double* out) {
  int64_t n_infinite = 0;
  for (int64_t j = 0; j < n; ++j) n_infinite += values[j] == kInfF;
  if (n_infinite > 0) {
    const double share = -std::log(static_cast<double>(n_infinite));
    for (int64_t j = 0; j < n; ++j) out[j] = values[j] == kInfF ? share : -kInf;
    return;
  }
  const double mx = *std::max_element(values, values + n);
  double sum = 0.0;
  for (int64_t j = 0; j < n; ++j) sum += std::exp(values[j] - mx);
  const double log_sum = std::log(sum);
  // (x_j - mx) first: it is exact for nearby values, which keeps close logprobs distinct.
  for (int64_t j = 0; j < n; ++j) out[j] = (values[j] - mx) - log_sum;
}

void MaskedLogSoftmax(const float* z, const uint8_t* keep, float mx, int64_t n, double* out) {
  double sum = 0.0;
  for (int64_t j = 0; j < n; ++j) {
    if (keep[j]) sum += std::exp(static_cast<double>(z[j]) - mx);
  }
  const double log_sum = std::log(sum);
  for (int64_t j = 0; j < n; ++j) {
    out[j] = keep[j] ? (static_cast<double>(z[j]) - mx) - log_sum : -kInf;
  }
}

void UniformLogprobs(const uint8_t* keep, int64_t n, double* out) {
  int64_t kept = 0;
  for (int64_t j = 0; j < n; ++j) kept += keep[j] != 0;
  const double value = -std::log(static_cast<double>(kept));
  for (int64_t j = 0; j < n; ++j) out[j] = keep[j] ? value : -kInf;
}

void PointMassLogprobs(int32_t token, int64_t n, double* out) {
  for (int64_t j = 0; j < n; ++j) out[j] = j == token ? 0.0 : -kInf;
}

void WriteLogprobs(const double* logprob, int64_t n, int32_t token, int32_t top_n, int32_t* scratch,
                   const LogprobOutputs& out) {
  const double sampled = logprob[token];
  if (out.sampled_logprob != nullptr) *out.sampled_logprob = static_cast<float>(sampled);
  if (out.sampled_rank != nullptr) {
    int64_t above = 0;
    for (int64_t j = 0; j < n; ++j) above += logprob[j] > sampled;
    *out.sampled_rank = 1 + above;
  }
  if (top_n <= 0) return;

  const int64_t listed = std::min<int64_t>(top_n, n);
  for (int64_t j = 0; j < n; ++j) scratch[j] = static_cast<int32_t>(j);
  std::partial_sort(scratch, scratch + listed, scratch + n, [logprob](int32_t a, int32_t b) {
    return logprob[a] > logprob[b] || (logprob[a] == logprob[b] && a < b);
  });
  for (int64_t i = 0; i < top_n; ++i) {
    const bool real = i < listed;
    if (out.top_ids != nullptr) out.top_ids[i] = real ? scratch[i] : -1;
    if (out.top_values != nullptr) {
      out.top_values[i] = real ? static_cast<float>(logprob[scratch[i]]) : -kInfF;
    }
  }
}

void WriteInvalidLogprobs(int32_t top_n, const LogprobOutputs& out) {
  if (out.sampled_logprob != nullptr) *out.sampled_logprob = -kInfF;
  if (out.sampled_rank != nullptr) *out.sampled_rank = 0;
  for (int32_t i = 0; i < top_n; ++i) {
    if (out.top_ids != nullptr) out.top_ids[i] = -1;
    if (out.top_values != nullptr) out.top_values[i] = -kInfF;
  }
}

}  // namespace samplerd::kernels
