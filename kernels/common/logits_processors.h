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

// Whether token `t` is allowed by its row's bitmask words (`row_words` points at the row's
// first word).
SAMPLERD_HOST_DEVICE inline bool TokenAllowed(const uint32_t* row_words, int64_t t) {
  return (row_words[t >> 5] >> (t & 31)) & 1u;
}

// The value a disallowed token takes: -inf, or NaN kept (see AdjustLogit).
SAMPLERD_HOST_DEVICE inline float Disallowed(float x) {
  return x != x ? x : -__builtin_huge_valf();
}

}  // namespace samplerd::kernels

#endif  // SAMPLERD_KERNELS_COMMON_LOGITS_PROCESSORS_H_
