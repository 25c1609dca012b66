// Test helpers for the CPU sampler: run rows through CpuSampleRows, and an independent reference
// of the sampling semantics (docs/DESIGN.md) to compare against.
//
// The reference deliberately avoids the sampler's structure: no sorting, O(V^2) pairwise
// counting for top-k and top-p, min-p in its softmax form (exp(z_j - mx) >= m) in double. Tests
// keep their inputs away from float-rounding boundaries so that both formulations agree.
#ifndef SAMPLERD_TESTS_KERNELS_SAMPLER_TEST_UTIL_H_
#define SAMPLERD_TESTS_KERNELS_SAMPLER_TEST_UTIL_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <vector>

#include "kernels/common/inverse_cdf.h"
#include "kernels/common/philox.h"
#include "kernels/common/sampling_types.h"
#include "kernels/cpu/cpu_sampler.h"

namespace samplerd::kernels::testing {

inline constexpr float kInf = std::numeric_limits<float>::infinity();
inline constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Outputs of one sampled row.
struct RowResult {
  int32_t token = -2;
  RowStatus status = RowStatus::kOk;
  float logprob = 0.0f;
  int64_t rank = -1;
  std::vector<int32_t> top_ids;
  std::vector<float> top_values;
};

// Parameters with temperature `t` and everything else at its default (filters off).
inline RowParams Params(float t, uint64_t seed = 0, uint64_t position = 0) {
  RowParams p;
  p.temperature = t;
  p.seed = seed;
  p.position = position;
  return p;
}

// Samples a row-major fp32 batch (rows of equal length) with `params` broadcast (size 1) or per
// row. top_logprobs >= 0 also collects logprobs. `configure` (may be empty) may set more of the
// SampleArgs (the logits processors) before the rows are sampled.
inline std::vector<RowResult> SampleBatch(
    const std::vector<std::vector<float>>& rows, const std::vector<RowParams>& params,
    int32_t top_logprobs = -1, LogprobSource source = LogprobSource::kRaw,
    const std::function<void(SampleArgs&)>& configure = nullptr) {
  const int64_t batch = static_cast<int64_t>(rows.size());
  const int64_t vocab = static_cast<int64_t>(rows[0].size());
  std::vector<float> logits;
  for (const auto& row : rows) logits.insert(logits.end(), row.begin(), row.end());
  const int64_t n_top = top_logprobs > 0 ? top_logprobs : 0;
  std::vector<int32_t> tokens(batch, -2);
  std::vector<RowStatus> status(batch, static_cast<RowStatus>(99));
  std::vector<float> logprob(batch, 99.0f);
  std::vector<int64_t> rank(batch, -99);
  std::vector<int32_t> top_ids(batch * n_top + 1, -99);
  std::vector<float> top_values(batch * n_top + 1, 99.0f);

  SampleArgs args;
  args.logits = logits.data();
  args.dtype = DType::kFp32;
  args.batch = batch;
  args.vocab = vocab;
  args.row_stride = vocab;
  args.params = params.data();
  args.params_count = static_cast<int64_t>(params.size());
  args.top_logprobs = top_logprobs;
  args.logprob_source = source;
  args.token_ids = tokens.data();
  args.status = status.data();
  args.sampled_logprob = logprob.data();
  args.sampled_rank = rank.data();
  args.top_ids = top_ids.data();
  args.top_values = top_values.data();
  if (configure) configure(args);
  CpuSampleRows(args, 0, batch);

  std::vector<RowResult> results(batch);
  for (int64_t r = 0; r < batch; ++r) {
    results[r].token = tokens[r];
    results[r].status = status[r];
    results[r].logprob = logprob[r];
    results[r].rank = rank[r];
    results[r].top_ids.assign(top_ids.begin() + r * n_top, top_ids.begin() + (r + 1) * n_top);
    results[r].top_values.assign(top_values.begin() + r * n_top,
                                 top_values.begin() + (r + 1) * n_top);
  }
  return results;
}

inline RowResult SampleOne(const std::vector<float>& x, const RowParams& p,
                           int32_t top_logprobs = -1, LogprobSource source = LogprobSource::kRaw) {
  return SampleBatch({x}, {p}, top_logprobs, source)[0];
}

// Tokens of `draws` rows holding `x`, with `p` at positions 0, 1, ..., draws - 1.
inline std::vector<int32_t> DrawTokens(const std::vector<float>& x, RowParams p, int draws) {
  std::vector<RowParams> params(draws, p);
  for (int i = 0; i < draws; ++i) params[i].position = static_cast<uint64_t>(i);
  std::vector<std::vector<float>> rows(draws, x);
  std::vector<int32_t> tokens;
  for (const RowResult& r : SampleBatch(rows, params)) tokens.push_back(r.token);
  return tokens;
}

// Which tokens were drawn at least once.
inline std::vector<bool> Seen(const std::vector<int32_t>& tokens, size_t vocab) {
  std::vector<bool> seen(vocab, false);
  for (int32_t t : tokens) {
    if (t >= 0 && static_cast<size_t>(t) < vocab) seen[t] = true;
  }
  return seen;
}

// z = x / T in fp32, as the spec defines it.
inline std::vector<float> Scaled(const std::vector<float>& x, float t) {
  std::vector<float> z(x.size());
  for (size_t j = 0; j < x.size(); ++j) z[j] = x[j] / t;
  return z;
}

// The set of tokens that may be drawn (non-greedy rows without NaN).
// Whether max z is +inf or -inf: the row is uniform over the tokens at its max x (DESIGN.md,
// "Arithmetic").
inline bool TopTiesRow(const std::vector<float>& z) {
  const float mx = *std::max_element(z.begin(), z.end());
  return mx == kInf || mx == -kInf;
}

inline std::vector<bool> ReferenceSupport(const std::vector<float>& x, const RowParams& p) {
  const size_t n = x.size();
  const std::vector<float> z = Scaled(x, p.temperature);
  std::vector<bool> keep(n, false);
  if (TopTiesRow(z)) {
    const float top = *std::max_element(x.begin(), x.end());
    for (size_t j = 0; j < n; ++j) keep[j] = x[j] == top;
    return keep;
  }
  double mx = -kInf;
  for (float v : z) mx = std::fmax(mx, v);
  std::vector<double> e(n);
  for (size_t j = 0; j < n; ++j) e[j] = std::exp(static_cast<double>(z[j]) - mx);
  for (size_t j = 0; j < n; ++j) keep[j] = z[j] != -kInf && (p.min_p <= 0 || e[j] >= p.min_p);
  if (p.top_k > 0) {
    std::vector<bool> after_k = keep;
    for (size_t j = 0; j < n; ++j) {
      int64_t greater = 0;
      for (size_t i = 0; i < n; ++i) greater += keep[i] && z[i] > z[j];
      after_k[j] = keep[j] && greater < p.top_k;
    }
    keep = after_k;
  }
  if (p.top_p < 1.0f) {
    const bool joint = p.top_p_mode == TopPMode::kJoint;
    double total = 0.0;
    for (size_t i = 0; i < n; ++i) total += (joint || keep[i]) ? e[i] : 0.0;
    std::vector<bool> after_p = keep;
    for (size_t j = 0; j < n; ++j) {
      double above = 0.0;
      for (size_t i = 0; i < n; ++i) above += ((joint || keep[i]) && z[i] > z[j]) ? e[i] : 0.0;
      after_p[j] = keep[j] && above < p.top_p * total;
    }
    keep = after_p;
  }
  return keep;
}

// The exact distribution draws follow: softmax(z) renormalised over the support, in double
// (uniform over the tokens at the max x when max z is not finite).
inline std::vector<double> ReferenceDistribution(const std::vector<float>& x, const RowParams& p) {
  const std::vector<bool> keep = ReferenceSupport(x, p);
  const std::vector<float> z = Scaled(x, p.temperature);
  const bool uniform = TopTiesRow(z);
  double mx = -kInf;
  for (float v : z) mx = std::fmax(mx, v);
  std::vector<double> prob(x.size(), 0.0);
  double total = 0.0;
  for (size_t j = 0; j < x.size(); ++j) {
    if (keep[j]) prob[j] = uniform ? 1.0 : std::exp(static_cast<double>(z[j]) - mx);
    total += prob[j];
  }
  for (double& q : prob) q /= total;
  return prob;
}

// The token the Gumbel-max draw returns: argmax over the reference support of z_j + G_j in
// fp32 (G_j alone when max z is not finite), lowest index on ties. Uses the Philox stream that
// philox_test.cc checks against known answers.
inline int32_t ReferenceGumbelDraw(const std::vector<float>& x, const RowParams& p) {
  const std::vector<bool> keep = ReferenceSupport(x, p);
  const std::vector<float> z = Scaled(x, p.temperature);
  const bool uniform = TopTiesRow(z);
  int32_t best = -1;
  float best_score = -kInf;
  for (size_t j = 0; j < x.size(); ++j) {
    if (!keep[j]) continue;
    const float g = GumbelNoise(p.seed, p.position, j);
    const float score = uniform ? g : z[j] + g;
    if (best < 0 || score > best_score) {
      best = static_cast<int32_t>(j);
      best_score = score;
    }
  }
  return best;
}

// The token the inverse-CDF draw of a plain-temperature row returns (finite max z), written
// from kernels/common/inverse_cdf.h without the oracle's code: all masses first, then the
// prefix sums, then the first prefix above u * total (the last token of mass > 0 if none is).
inline int32_t ReferenceInverseCdfDraw(const std::vector<float>& x, const RowParams& p) {
  const double x_max = *std::max_element(x.begin(), x.end());
  const double inv_t = InverseTemperature(p.temperature);
  std::vector<double> prefix(x.size());
  double sum = 0.0;
  for (size_t j = 0; j < x.size(); ++j) {
    sum += InverseCdfMass(x[j], x_max, inv_t);
    prefix[j] = sum;
  }
  const double target = RowUniform(p.seed, p.position) * sum;
  int32_t last = -1;
  for (size_t j = 0; j < x.size(); ++j) {
    const bool has_mass = InverseCdfMass(x[j], x_max, inv_t) > 0.0;
    if (has_mass && prefix[j] > target) return static_cast<int32_t>(j);
    if (has_mass) last = static_cast<int32_t>(j);
  }
  return last;
}

// The token the chunked inverse-CDF draw of a top-p-alone row returns (finite max z), written
// from kernels/common/inverse_cdf.h without the oracle's code: every kept token's mass first,
// then each level's unit weights and their running sums.
inline int32_t ReferenceChunkedDraw(const std::vector<float>& x, const RowParams& p) {
  const std::vector<bool> keep = ReferenceSupport(x, p);
  const std::vector<float> z = Scaled(x, p.temperature);
  const double z_max = *std::max_element(z.begin(), z.end());
  const int64_t n = static_cast<int64_t>(x.size());
  const ChunkedUniforms u = RowChunkedUniforms(p.seed, p.position);
  // Level 0: the bin (floor(8 z)) of K's lowest z splits K into a head above it and a tail.
  float z_low = INFINITY;
  for (int64_t j = 0; j < n; ++j) {
    if (keep[j]) z_low = std::min(z_low, z[j]);
  }
  auto in_head = [&](int64_t j) { return std::floor(z[j] * 8.0f) > std::floor(z_low * 8.0f); };
  double head_weight = 0.0, tail_weight = 0.0;
  for (int64_t j = 0; j < n; ++j) {
    if (keep[j]) (in_head(j) ? head_weight : tail_weight) += std::exp(double{z[j]} - z_max);
  }
  const bool head = u.u0 * (head_weight + tail_weight) < head_weight;
  std::vector<double> mass(x.size());
  for (int64_t j = 0; j < n; ++j) {
    mass[j] = keep[j] && in_head(j) == head ? std::exp(double{z[j]} - z_max) : 0.0;
  }
  // Units [begin, end) of `unit` tokens: the first token of the chosen one.
  auto level = [&](int64_t begin, int64_t end, int64_t unit, double uniform) {
    std::vector<double> weight;
    for (int64_t first = begin; first < end; first += unit) {
      double w = 0.0;
      for (int64_t j = first; j < std::min(end, first + unit); ++j) w += mass[j];
      weight.push_back(w);
    }
    double total = 0.0;
    for (double w : weight) total += w;
    double running = 0.0;
    int64_t last = -1;
    for (size_t k = 0; k < weight.size(); ++k) {
      if (weight[k] == 0.0) continue;
      running += weight[k];
      const int64_t first = begin + static_cast<int64_t>(k) * unit;
      if (running > uniform * total) return first;
      last = first;
    }
    return last;
  };
  const int64_t chunk = level(0, n, kDrawChunk, u.u1);
  const int64_t chunk_end = std::min(n, chunk + kDrawChunk);
  const int64_t segment = level(chunk, chunk_end, kDrawSegment, u.u2);
  return static_cast<int32_t>(level(segment, std::min(chunk_end, segment + kDrawSegment), 1, u.u3));
}

// The token the sampler must return for a non-greedy row without NaN: the inverse-CDF draw for
// plain-temperature rows with a finite max z, the chunked inverse-CDF draw for top-p-alone rows
// with a finite max z, else the Gumbel-max draw (DESIGN.md step 6).
inline int32_t ReferenceDraw(const std::vector<float>& x, const RowParams& p) {
  const int64_t n = static_cast<int64_t>(x.size());
  const bool top_ties = TopTiesRow(Scaled(x, p.temperature));
  if (IsPlainTemperature(p, n) && !top_ties) return ReferenceInverseCdfDraw(x, p);
  if (IsTopPAlone(p, n) && !top_ties) return ReferenceChunkedDraw(x, p);
  return ReferenceGumbelDraw(x, p);
}

// Deterministic logits uniform in [lo, hi) from a fixed-seed mt19937 (its raw output is fully
// specified by the standard, unlike the distributions).
inline std::vector<float> RandomLogits(size_t n, uint32_t seed, float lo = -4.0f, float hi = 4.0f) {
  std::mt19937 gen(seed);
  std::vector<float> x(n);
  for (float& v : x) v = lo + (hi - lo) * static_cast<float>(gen() >> 8) * 0x1.0p-24f;
  return x;
}

}  // namespace samplerd::kernels::testing

#endif  // SAMPLERD_TESTS_KERNELS_SAMPLER_TEST_UTIL_H_
