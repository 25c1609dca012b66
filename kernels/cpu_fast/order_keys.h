// Order-preserving integer keys of fp32 values, the coordinates the radix selection of
// radix_select.h histograms and the draw of gumbel_draw.h filters on. Internal to
// kernels/cpu_fast.
#ifndef SAMPLERD_KERNELS_CPU_FAST_ORDER_KEYS_H_
#define SAMPLERD_KERNELS_CPU_FAST_ORDER_KEYS_H_

#include <cstdint>
#include <cstring>

namespace samplerd::kernels::cpu_fast_internal {

// Order-reversing integer key of z: a larger z has a smaller key, equal z (-0 and +0 included)
// the same key, -inf the largest key of all non-NaN values.
inline uint32_t KeyOf(float z) {
  uint32_t u;
  const float canonical = z + 0.0f;  // -0 -> +0
  std::memcpy(&u, &canonical, 4);
  return (u >> 31) != 0 ? u : u ^ 0x7FFFFFFFu;
}

// The value whose key is `key` (the inverse of KeyOf on canonical values).
inline float ValueOf(uint32_t key) {
  const uint32_t u = key >= 0x80000000u ? key : key ^ 0x7FFFFFFFu;
  float z;
  std::memcpy(&z, &u, 4);
  return z;
}

}  // namespace samplerd::kernels::cpu_fast_internal

#endif  // SAMPLERD_KERNELS_CPU_FAST_ORDER_KEYS_H_
