// Test helpers for the logits processors of the CPU sampler: rows sampled with per-row
// TokenAdjust entries and bitmasks, and the processed logits written out from the rules of
// docs/DESIGN.md ("Logits processors") to compare against.
#ifndef SAMPLERD_TESTS_KERNELS_PROCESSORS_TEST_UTIL_H_
#define SAMPLERD_TESTS_KERNELS_PROCESSORS_TEST_UTIL_H_

#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/common/sampling_types.h"
#include "tests/kernels/sampler_test_util.h"

namespace samplerd::kernels::testing {

// The processors of a batch: per row, its TokenAdjust entries (sorted by token) and its
// bitmask words (ceil(V / 32) of them). Either list may be empty (none of that kind).
struct BatchProcessors {
  std::vector<std::vector<TokenAdjust>> adjusts;
  std::vector<std::vector<uint32_t>> masks;
};

// SampleBatch with the processors of `proc` packed into the SampleArgs.
inline std::vector<RowResult> SampleProcessed(const std::vector<std::vector<float>>& rows,
                                              const std::vector<RowParams>& params,
                                              const BatchProcessors& proc,
                                              int32_t top_logprobs = -1,
                                              LogprobSource source = LogprobSource::kRaw) {
  std::vector<uint32_t> offsets{0};
  std::vector<TokenAdjust> adjusts;
  for (const auto& row : proc.adjusts) {
    adjusts.insert(adjusts.end(), row.begin(), row.end());
    offsets.push_back(static_cast<uint32_t>(adjusts.size()));
  }
  std::vector<uint32_t> words;
  for (const auto& row : proc.masks) words.insert(words.end(), row.begin(), row.end());
  const int64_t row_words = proc.masks.empty() ? 0 : static_cast<int64_t>(proc.masks[0].size());
  return SampleBatch(rows, params, top_logprobs, source, [&](SampleArgs& args) {
    if (!proc.adjusts.empty()) {
      args.adjusts = adjusts.data();
      args.adjust_offsets = offsets.data();
    }
    if (!proc.masks.empty()) {
      args.allowed_bitmask = words.data();
      args.bitmask_words = row_words;
    }
  });
}

// One row with `adjusts` and (when not empty) the bitmask `mask`.
inline RowResult SampleOneProcessed(const std::vector<float>& x, const RowParams& p,
                                    const std::vector<TokenAdjust>& adjusts,
                                    const std::vector<uint32_t>& mask = {},
                                    int32_t top_logprobs = -1,
                                    LogprobSource source = LogprobSource::kRaw) {
  BatchProcessors proc;
  proc.adjusts.push_back(adjusts);
  if (!mask.empty()) proc.masks.push_back(mask);
  return SampleProcessed({x}, {p}, proc, top_logprobs, source)[0];
}

// A bitmask for `vocab` tokens allowing exactly `allowed`.
inline std::vector<uint32_t> MaskAllowing(int64_t vocab, const std::vector<int32_t>& allowed) {
  std::vector<uint32_t> words((vocab + 31) / 32, 0u);
  for (int32_t t : allowed) words[t / 32] |= 1u << (t % 32);
  return words;
}

inline TokenAdjust Bias(int32_t token, float bias) {
  TokenAdjust a;
  a.token = token;
  a.bias = bias;
  return a;
}

inline TokenAdjust Penalised(int32_t token, float repetition, float penalty) {
  TokenAdjust a;
  a.token = token;
  a.repetition = repetition;
  a.penalty = penalty;
  return a;
}

// The processed logits, from the rules as DESIGN.md writes them: bias (an infinite one sets
// the logit), repetition, penalty, then the mask.
inline std::vector<float> ExpectedProcessed(std::vector<float> x,
                                            const std::vector<TokenAdjust>& adjusts,
                                            const std::vector<uint32_t>& mask = {}) {
  for (const TokenAdjust& a : adjusts) {
    float v = x[a.token];
    v = std::isinf(a.bias) ? a.bias : v + a.bias;
    v = v > 0.0f ? v / a.repetition : v * a.repetition;
    x[a.token] = v - a.penalty;
  }
  if (!mask.empty()) {
    for (size_t t = 0; t < x.size(); ++t) {
      if (((mask[t / 32] >> (t % 32)) & 1u) == 0) x[t] = -kInf;
    }
  }
  return x;
}

}  // namespace samplerd::kernels::testing

#endif  // SAMPLERD_TESTS_KERNELS_PROCESSORS_TEST_UTIL_H_
