// The logits processors of one token, shared by every backend so that the CPU reference and
// the GPU kernels transform a logit bit for bit the same way (DESIGN.md, "Logits processors").
//
// Included from host and device code: plain C++, no standard-library containers.
#ifndef SAMPLERD_KERNELS_COMMON_LOGITS_PROCESSORS_H_
#define SAMPLERD_KERNELS_COMMON_LOGITS_PROCESSORS_H_

#include <cstdint>

#include "kernels/common/host_device.h"
#include "kernels/common/sampling_types.h"

namespace samplerd::kernels {

// x after the bias, repetition and presence/frequency penalties of `adjust`. A NaN stays NaN
// (the row is invalid whatever the processors); an infinite bias sets the logit to it.
SAMPLERD_HOST_DEVICE inline float AdjustLogit(float x, const TokenAdjust& adjust) {
  if (x != x) return x;
  const float bias = adjust.bias;
  x = (bias - bias != 0.0f) ? bias : x + bias;  // bias - bias is NaN only for +-inf
  if (adjust.repetition != 1.0f) x = x > 0.0f ? x / adjust.repetition : x * adjust.repetition;
  return x - adjust.penalty;
}

// Sets the penalty part of `adjust` for a token of a row's history seen `count` times in the
// output (and in the prompt when `in_prompt`), under the row's penalties: repetition applies to
// a token seen anywhere; penalty = frequency * count + presence * (count > 0), rounded in float32
// exactly as written (the product is rounded before the sum on the GPU too, never fused), so
// that every backend and both session planes build the same value.
SAMPLERD_HOST_DEVICE inline void HistoryAdjust(uint32_t count, bool in_prompt, float repetition,
                                               float presence, float frequency,
                                               TokenAdjust* adjust) {
  if (in_prompt || count > 0) adjust->repetition = repetition;
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
  const float f = __fmul_rn(frequency, static_cast<float>(count));
  const float p = __fmul_rn(presence, count > 0 ? 1.0f : 0.0f);
  adjust->penalty = __fadd_rn(f, p);
#else
  const float f = frequency * static_cast<float>(count);
  const float p = presence * (count > 0 ? 1.0f : 0.0f);
  adjust->penalty = f + p;
#endif
}

// Whether `adjust` changes no logit (bias 0, repetition 1, penalty 0): such entries are dropped.
SAMPLERD_HOST_DEVICE inline bool IsNoOpAdjust(const TokenAdjust& adjust) {
  return adjust.bias == 0.0f && adjust.repetition == 1.0f && adjust.penalty == 0.0f;
}

// Whether token `t` is allowed by its row's bitmask words (`row_words` points at the row's
// first word).
SAMPLERD_HOST_DEVICE inline bool TokenAllowed(const uint32_t* row_words, int64_t t) {
  return (row_words[t >> 5] >> (t & 31)) & 1u;
}

// The value a disallowed token takes: -inf, or NaN kept (see AdjustLogit).
// One subtraction (-|x| - inf) rather than a NaN test and a select: NaN stays NaN, every other
// value (finite or infinite) becomes -inf.
SAMPLERD_HOST_DEVICE inline float Disallowed(float x) {
  return -__builtin_fabsf(x) - __builtin_huge_valf();
}

}  // namespace samplerd::kernels

#endif  // SAMPLERD_KERNELS_COMMON_LOGITS_PROCESSORS_H_
