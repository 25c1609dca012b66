// A threshold on z = x / T as a threshold on x, so that a pass over a row compares each token's
// x with it instead of dividing (kernels/gpu/NOTES.md v13).
//
// x / T, rounded to fp32, is monotone (non-decreasing) in x for T > 0. So for any c the tokens
// with z >= c are exactly those with x >= the smallest x that reaches c: a binary search over
// the order-preserving bit patterns of the floats, run once per row or block, not per token.
#ifndef SAMPLERD_KERNELS_COMMON_TEMPERATURE_THRESHOLD_H_
#define SAMPLERD_KERNELS_COMMON_TEMPERATURE_THRESHOLD_H_

#include <cstdint>

#include "kernels/common/host_device.h"

namespace samplerd::kernels {

// The float whose order-preserving key is `key` (a > b <=> key(a) > key(b) for non-NaN floats;
// keys below 0x80000000 are the negative floats, -0 at 0x7fffffff).
SAMPLERD_HOST_DEVICE inline float FloatFromOrderKey(uint32_t key) {
  const uint32_t bits = (key & 0x80000000u) ? (key & 0x7fffffffu) : ~key;
  float f;
  __builtin_memcpy(&f, &bits, sizeof f);
  return f;
}

// The smallest non-NaN x with x / t (fp32) >= c, for t > 0 and -inf < c <= +inf: then
// x / t >= c <=> x >= SmallestXReaching(c, t) for every non-NaN x. t = 1 returns c.
SAMPLERD_HOST_DEVICE inline float SmallestXReaching(float c, float t) {
  if (t == 1.0f) return c;
  uint32_t lo = 0x007fffffu;  // key of -inf: -inf / t = -inf < c
  uint32_t hi = 0xff800000u;  // key of +inf: +inf / t = +inf >= c
  while (hi - lo > 1) {
    const uint32_t mid = lo + (hi - lo) / 2;
    if (FloatFromOrderKey(mid) / t >= c) {
      hi = mid;
    } else {
      lo = mid;
    }
  }
  return FloatFromOrderKey(hi);
}

}  // namespace samplerd::kernels

#endif  // SAMPLERD_KERNELS_COMMON_TEMPERATURE_THRESHOLD_H_
