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

// The order-preserving key of a non-NaN float (-0 and +0 keep their own keys, next to each
// other); FloatFromOrderKey inverts it.
SAMPLERD_HOST_DEVICE inline uint32_t OrderKeyOfFloat(float f) {
  uint32_t bits;
  __builtin_memcpy(&bits, &f, sizeof bits);
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

// The smallest non-NaN x with x / t (fp32) >= c, for t > 0 and -inf < c <= +inf: then
// x / t >= c <=> x >= SmallestXReaching(c, t) for every non-NaN x. t = 1 returns c.
//
// The answer is within a few ulps of c * t wherever that product is a normal float, so the
// search first tries the keys kBracket either side of it (three divides, checked at both ends,
// so a bracket that misses only costs two divides more); else it searches every key (~31).
SAMPLERD_HOST_DEVICE inline float SmallestXReaching(float c, float t) {
  if (t == 1.0f) return c;
  constexpr uint32_t kNegInf = 0x007fffffu;  // key of -inf: -inf / t = -inf < c
  constexpr uint32_t kPosInf = 0xff800000u;  // key of +inf: +inf / t = +inf >= c
  constexpr uint32_t kBracket = 4;
  auto reaches = [&](uint32_t key) { return FloatFromOrderKey(key) / t >= c; };
  uint32_t lo = kNegInf;
  uint32_t hi = kPosInf;
  const float guess = c * t;
  if (guess - guess == 0.0f) {  // finite
    const uint32_t k = OrderKeyOfFloat(guess);
    if (k > kNegInf + kBracket && k < kPosInf - kBracket && !reaches(k - kBracket) &&
        reaches(k + kBracket)) {
      lo = k - kBracket;
      hi = k + kBracket;
    }
  }
  while (hi - lo > 1) {
    const uint32_t mid = lo + (hi - lo) / 2;
    if (reaches(mid)) {
      hi = mid;
    } else {
      lo = mid;
    }
  }
  return FloatFromOrderKey(hi);
}

}  // namespace samplerd::kernels

#endif  // SAMPLERD_KERNELS_COMMON_TEMPERATURE_THRESHOLD_H_
