// Which path a row takes through the kernels, decided from its parameters alone (so every
// block of every pass agrees without talking): the one place to change when a stage is added.
//
//   greedy            argmax in pass 1, written by the finish
//   plain temperature pass 1 sums each chunk's mass; the finish draws by inverse CDF
//                     (IsPlainTemperature, kernels/common/inverse_cdf.h; inverse_cdf.h)
//   candidates        top-k <= kMaxCandidateK (with or without min-p / top-p): pass 1 emits a
//                     superset of the top-k per chunk; one finish block sorts it
//   mass              top-p alone, no logprobs: two multi-block passes (mass_plan.h,
//                     mass_draw.h); rows they cannot take fall back to the one-block finish
//   one block         everything else (min-p alone, large k, logprobs): one finish block reads
//                     the row again (row_finish.h, select.h)
#ifndef SAMPLERD_KERNELS_GPU_ROW_PATH_H_
#define SAMPLERD_KERNELS_GPU_ROW_PATH_H_

#include <cstdint>

#include "kernels/common/inverse_cdf.h"
#include "kernels/common/sampling_types.h"
#include "kernels/gpu/platform.h"

namespace samplerd::kernels::gpu {

inline constexpr int kMaxCandidateK = 256;  // top-k above this reads the row in pass 2 instead

__device__ __forceinline__ bool IsGreedy(const RowParams& p) {
  return p.temperature < kGreedyTemperature;
}

__device__ __forceinline__ bool TopKActive(const RowParams& p, int64_t vocab) {
  return p.top_k > 0 && p.top_k < vocab;
}

__device__ __forceinline__ bool TopPActive(const RowParams& p) {
  return p.top_p > 0.0f && p.top_p < 1.0f;
}

// Rows whose top-k is resolved from the chunk candidates.
__device__ __forceinline__ bool UsesCandidates(const RowParams& p, int64_t vocab) {
  return !IsGreedy(p) && TopKActive(p, vocab) && p.top_k <= kMaxCandidateK;
}

// Rows whose only filter is top-p. Host and device (HasTopPRows asks it on the host).
// (Without top-k and min-p the two top-p modes keep the same set.)
__host__ __device__ inline bool TopPAlone(const RowParams& p, int64_t vocab) {
  return !(p.temperature < kGreedyTemperature) && !(p.top_k > 0 && p.top_k < vocab) &&
         p.top_p > 0.0f && p.top_p < 1.0f && !(p.min_p > 0.0f);
}

// Rows on the two-pass mass path: top-p alone, when the launch has it enabled (no logprobs
// asked for, SampleArgs::top_p_rows).
__device__ __forceinline__ bool IsMassRow(const RowParams& p, int64_t vocab, bool mass_enabled) {
  return mass_enabled && TopPAlone(p, vocab);
}

}  // namespace samplerd::kernels::gpu

#endif  // SAMPLERD_KERNELS_GPU_ROW_PATH_H_
