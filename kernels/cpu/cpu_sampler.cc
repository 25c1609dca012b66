// CPU reference sampler: docs/DESIGN.md "Sampling semantics", one row at a time.
//
// Written to be read next to the spec, not to be fast: every filter is a plain pass over the row
// (the k-th value and the top-p mass come from one sort by z), and every reduction that can move a
// decision runs in double in a fixed order, so repeated runs are bitwise identical. Rows with
// temperature alone are drawn by inverse CDF (inverse_cdf_draw.h), the others by Gumbel-max. The
// choices the spec leaves open are listed in kernels/README.md ("CPU semantics"). The logits
// processors (logit bias, penalties, allowed-token bitmask) act on the row before everything else,
// through kernels/common/logits_processors.h, the transform the GPU kernels share.
#include "kernels/cpu/cpu_sampler.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/common/inverse_cdf.h"
#include "kernels/common/logits_processors.h"
#include "kernels/common/philox.h"
#include "kernels/common/sampling_types.h"
#include "kernels/cpu/cpu_logprobs.h"
#include "kernels/cpu/half_float.h"
#include "kernels/cpu/inverse_cdf_draw.h"

namespace samplerd::kernels {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// Buffers reused across the rows of one call, so a batch allocates once.
struct RowScratch {
  std::vector<float> x;         // logits as fp32, after the row's processors
  std::vector<float> raw;       // the unmodified logits, kept for raw logprobs when processed
  std::vector<float> z;         // x / T
  std::vector<uint8_t> keep;    // survivor mask
  std::vector<int32_t> order;   // token ids by z descending, id ascending
  std::vector<double> logprob;  // per token, when logprobs are asked
  std::vector<int32_t> ranked;  // scratch for the top-N selection
};

// Reads row `row` of the logits as fp32 into x[0, vocab).
void LoadRow(const SampleArgs& args, int64_t row, float* x) {
  const int64_t first = row * args.row_stride;
  const auto* bytes = static_cast<const unsigned char*>(args.logits);
  switch (args.dtype) {
    case DType::kFp32:
      std::memcpy(x, bytes + first * 4, static_cast<size_t>(args.vocab) * 4);
      return;
    case DType::kFp16:
    case DType::kBf16:
      for (int64_t j = 0; j < args.vocab; ++j) {
        uint16_t bits;  // memcpy: the buffer need not be 2-byte aligned
        std::memcpy(&bits, bytes + (first + j) * 2, sizeof(bits));
        x[j] = args.dtype == DType::kFp16 ? HalfBitsToFloat(bits) : Bf16BitsToFloat(bits);
      }
      return;
  }
  // Unknown dtype (validation lets none through): poison the row rather than read garbage.
  std::fill(x, x + args.vocab, std::numeric_limits<float>::quiet_NaN());
}

// kNan if any value is NaN, else kNoFinite if every value is -inf, else kOk.
RowStatus Classify(const float* values, int64_t n) {
  bool all_negative_infinite = true;
  for (int64_t j = 0; j < n; ++j) {
    if (std::isnan(values[j])) return RowStatus::kNan;
    if (values[j] != -kInf) all_negative_infinite = false;
  }
  return all_negative_infinite ? RowStatus::kNoFinite : RowStatus::kOk;
}

bool HasProcessors(const SampleArgs& args, int64_t row) {
  return args.allowed_bitmask != nullptr ||
         (args.adjusts != nullptr && args.adjust_offsets[row] != args.adjust_offsets[row + 1]);
}

// The logits processors of `row` on x (DESIGN.md, "Logits processors"): the TokenAdjust
// entries (bias, then penalties), then the bitmask. Returns kNoAllowed when no x is above -inf
// afterwards, else kOk. x must hold no NaN (Classify ran first).
RowStatus ApplyProcessors(const SampleArgs& args, int64_t row, float* x) {
  const int64_t n = args.vocab;
  if (args.adjusts != nullptr) {
    for (uint32_t e = args.adjust_offsets[row]; e < args.adjust_offsets[row + 1]; ++e) {
      const TokenAdjust& adjust = args.adjusts[e];
      x[adjust.token] = AdjustLogit(x[adjust.token], adjust);
    }
  }
  if (args.allowed_bitmask != nullptr) {
    const uint32_t* words = args.allowed_bitmask + row * args.bitmask_words;
    for (int64_t j = 0; j < n; ++j) {
      if (!TokenAllowed(words, j)) x[j] = Disallowed(x[j]);
    }
  }
  for (int64_t j = 0; j < n; ++j) {
    if (x[j] != -kInf) return RowStatus::kOk;
  }
  return RowStatus::kNoAllowed;
}

// Index of the largest value, lowest index on ties (+inf is the largest). No NaN allowed.
int32_t ArgMax(const float* values, int64_t n) {
  int64_t best = 0;
  for (int64_t j = 1; j < n; ++j) {
    if (values[j] > values[best]) best = j;
  }
  return static_cast<int32_t>(best);
}

// Gumbel-max draw: argmax over kept j of score(j) + G_j in fp32, lowest index on ties.
// `scores` may be null (all zero), which draws uniformly over the kept tokens.
int32_t GumbelArgMax(const float* scores, const uint8_t* keep, int64_t n, const RowParams& p) {
  int64_t best = -1;
  float best_score = 0.0f;
  for (int64_t j = 0; j < n; ++j) {
    if (!keep[j]) continue;
    const float noise = GumbelNoise(p.seed, p.position, static_cast<uint64_t>(j));
    const float score = scores != nullptr ? scores[j] + noise : noise;
    if (best < 0 || score > best_score) {
      best = j;
      best_score = score;
    }
  }
  return static_cast<int32_t>(best);
}

// min-p: keep j iff z_j >= mx + logf(m). The threshold is fp32 and written exactly so, because
// the GPU kernels compute it the same way (the spec's softmax form is the same test in exact
// arithmetic: exp(z_j - mx) >= m).
void ApplyMinP(const float* z, float mx, float min_p, int64_t n, uint8_t* keep) {
  if (!(min_p > 0.0f)) return;
  const float threshold = mx + logf(min_p);
  for (int64_t j = 0; j < n; ++j) {
    if (keep[j] && !(z[j] >= threshold)) keep[j] = 0;
  }
}

// top-k: keep survivors with z_j >= t, t the k-th largest survivor z counting duplicates, so
// every token tied with the k-th value stays. `order` sorts all tokens by z descending.
void ApplyTopK(const float* z, const int32_t* order, int32_t top_k, int64_t n, uint8_t* keep) {
  if (top_k <= 0) return;
  int64_t survivors_seen = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int32_t j = order[i];
    if (!keep[j]) continue;
    if (++survivors_seen == top_k) {
      const float kth = z[j];
      for (int64_t t = 0; t < n; ++t) {
        if (keep[t] && !(z[t] >= kth)) keep[t] = 0;
      }
      return;
    }
  }
  // Fewer than k survivors: top-k keeps them all.
}

// top-p: keep survivor j iff mass(z_i > z_j) < p * total, masses e_i = exp(z_i - mx) in double
// summed along `order` (a fixed order). TOP_K_FIRST sums over the survivors of min-p and top-k;
// JOINT over the whole row. Ties share the mass strictly above them, so they stay together.
void ApplyTopP(const float* z, const int32_t* order, float mx, const RowParams& p, int64_t n,
               uint8_t* keep) {
  // p <= 0 is rejected by validation; treating it as "off" here keeps the row non-empty anyway.
  if (!(p.top_p > 0.0f && p.top_p < 1.0f)) return;
  const bool joint = p.top_p_mode == TopPMode::kJoint;
  auto mass = [&](int32_t j) { return std::exp(static_cast<double>(z[j]) - mx); };
  double total = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    if (joint || keep[order[i]]) total += mass(order[i]);
  }
  const double limit = static_cast<double>(p.top_p) * total;
  double prefix = 0.0;      // mass of the tokens visited so far
  double mass_above = 0.0;  // mass of the tokens strictly above the current tie group
  for (int64_t i = 0; i < n; ++i) {
    const int32_t j = order[i];
    if (i == 0 || z[j] != z[order[i - 1]]) mass_above = prefix;
    const bool survivor = keep[j] != 0;
    if (joint || survivor) prefix += mass(j);
    if (survivor && !(mass_above < limit)) keep[j] = 0;
  }
}

// Which distribution the row was drawn from; decides the processed logprobs.
enum class DrawKind {
  kPointMass,  // greedy: all mass on the token
  kTopTies,    // max x / T is not finite: uniform over the tokens whose x is the row's max
  kFiltered,   // softmax(z) over the survivors in `keep`
};

struct RowDraw {
  int32_t token = -1;
  DrawKind kind = DrawKind::kPointMass;
  float mx = 0.0f;  // max z when kind == kFiltered
};

// Steps 1-6 of the spec for one valid row (no NaN, some logit > -inf). Fills s.z and s.keep;
// sorts by z only for rows with a filter.
// Returns token -1 only for a NaN z, which needs an unvalidated temperature (NaN or +inf).
RowDraw DrawRow(const RowParams& p, int64_t n, RowScratch& s) {
  const float* x = s.x.data();
  if (p.temperature < kGreedyTemperature) return {ArgMax(x, n), DrawKind::kPointMass};

  float* z = s.z.data();
  uint8_t* keep = s.keep.data();
  for (int64_t j = 0; j < n; ++j) {
    z[j] = x[j] / p.temperature;
    if (std::isnan(z[j])) return {};
  }
  // x / T is monotone in x, so max z = max x / T. When that is +inf (a +inf logit, or x / T
  // overflowed) or -inf (every finite x / T underflowed), every token below the max x is at
  // least ~1e31 below it in exact z (DESIGN.md, "Arithmetic"): the distribution is uniform
  // over the tokens at the max x, and every filter keeps them. No rescaling pass is needed.
  const float mx = *std::max_element(z, z + n);
  if (mx == kInf || mx == -kInf) {
    const float top_x = *std::max_element(x, x + n);
    for (int64_t j = 0; j < n; ++j) keep[j] = x[j] == top_x;
    return {GumbelArgMax(nullptr, keep, n, p), DrawKind::kTopTies};
  }
  // -inf tokens have probability 0: they never survive, so no filter has to think about them.
  for (int64_t j = 0; j < n; ++j) keep[j] = z[j] != -kInf;
  // Temperature alone: the inverse-CDF draw (step 6), which needs neither the order nor noise.
  // z and keep stay filled: the processed logprobs are softmax(z) over them all.
  if (IsPlainTemperature(p, n)) return {InverseCdfDraw(x, n, p), DrawKind::kFiltered, mx};

  int32_t* order = s.order.data();
  for (int64_t j = 0; j < n; ++j) order[j] = static_cast<int32_t>(j);
  std::sort(order, order + n,
            [z](int32_t a, int32_t b) { return z[a] > z[b] || (z[a] == z[b] && a < b); });

  ApplyMinP(z, mx, p.min_p, n, keep);
  ApplyTopK(z, order, p.top_k, n, keep);
  ApplyTopP(z, order, mx, p, n, keep);
  // Top-p alone: the chunked inverse-CDF draw over the kept set (kernels/common/inverse_cdf.h).
  if (IsTopPAlone(p, n)) return {ChunkedInverseCdfDraw(z, keep, n, mx, p), DrawKind::kFiltered, mx};
  return {GumbelArgMax(z, keep, n, p), DrawKind::kFiltered, mx};
}

// Per-token logprobs (double) of the distribution `source` selects, for a drawn row.
// `raw` holds the unmodified logits (s.raw when the row was processed, else s.x).
void FillLogprobs(const SampleArgs& args, const RowDraw& draw, int64_t n, const float* raw,
                  RowScratch& s) {
  double* out = s.logprob.data();
  if (args.logprob_source == LogprobSource::kRaw) {
    LogSoftmax(raw, n, out);
    return;
  }
  switch (draw.kind) {
    case DrawKind::kPointMass:
      PointMassLogprobs(draw.token, n, out);
      return;
    case DrawKind::kTopTies:
      UniformLogprobs(s.keep.data(), n, out);
      return;
    case DrawKind::kFiltered:
      MaskedLogSoftmax(s.z.data(), s.keep.data(), draw.mx, n, out);
      return;
  }
}

}  // namespace

bool CpuSampleRows(const SampleArgs& args, int64_t row_begin, int64_t row_end,
                   const std::atomic<bool>* stop) {
  const int64_t n = args.vocab;
  const int32_t top_n = args.top_logprobs;
  RowScratch s;
  s.x.resize(n);
  s.z.resize(n);
  s.keep.resize(n);
  s.order.resize(n);
  if (top_n >= 0) {
    s.logprob.resize(n);
    s.ranked.resize(n);
  }

  for (int64_t row = row_begin; row < row_end; ++row) {
    // Relaxed: the flag orders nothing, it only has to be seen within a row or so.
    if (stop != nullptr && stop->load(std::memory_order_relaxed)) return false;
    const RowParams& params = args.params[args.params_count == 1 ? 0 : row];
    LoadRow(args, row, s.x.data());
    // NaN and all -inf are judged on the raw row, before any processor (DESIGN.md).
    RowStatus status = Classify(s.x.data(), n);
    const float* raw = s.x.data();
    if (status == RowStatus::kOk && HasProcessors(args, row)) {
      if (top_n >= 0 && args.logprob_source == LogprobSource::kRaw) {
        s.raw.assign(s.x.begin(), s.x.end());
        raw = s.raw.data();
      }
      status = ApplyProcessors(args, row, s.x.data());
    }
    RowDraw draw;
    if (status == RowStatus::kOk) {
      draw = DrawRow(params, n, s);
      if (draw.token < 0) status = RowStatus::kNan;
    }
    args.token_ids[row] = status == RowStatus::kOk ? draw.token : -1;
    args.status[row] = status;
    if (top_n < 0) continue;

    // Null buffers are skipped, so a caller that wants only part of the outputs may omit the rest.
    LogprobOutputs out;
    if (args.sampled_logprob != nullptr) out.sampled_logprob = args.sampled_logprob + row;
    if (args.sampled_rank != nullptr) out.sampled_rank = args.sampled_rank + row;
    if (top_n > 0 && args.top_ids != nullptr) out.top_ids = args.top_ids + row * top_n;
    if (top_n > 0 && args.top_values != nullptr) out.top_values = args.top_values + row * top_n;
    if (status != RowStatus::kOk) {
      WriteInvalidLogprobs(top_n, out);
      continue;
    }
    FillLogprobs(args, draw, n, raw, s);
    WriteLogprobs(s.logprob.data(), n, draw.token, top_n, s.ranked.data(), out);
  }
  return true;
}

}  // namespace samplerd::kernels
