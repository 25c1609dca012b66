// Order-preserving integer keys of fp32 values, the coordinates the radix selection of
// radix_select.h histograms and the draw of gumbel_draw.h filters on. Internal to
// kernels/cpu_fast.
#ifndef SAMPLERD_KERNELS_CPU_FAST_ORDER_KEYS_H_
#define SAMPLERD_KERNELS_CPU_FAST_ORDER_KEYS_H_

#include <cstdint>
#include <cstring>

#include "kernels/cpu_fast/cpu_features.h"

#if SAMPLERD_CPU_FAST_X86
#include <immintrin.h>
#endif

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

#if SAMPLERD_CPU_FAST_X86
// KeyOf of 8 values.
SAMPLERD_AVX2 inline __m256i KeyOf8(__m256 z) {
  const __m256i u = _mm256_castps_si256(_mm256_add_ps(z, _mm256_setzero_ps()));  // -0 -> +0
  return _mm256_xor_si256(
      u, _mm256_andnot_si256(_mm256_srai_epi32(u, 31), _mm256_set1_epi32(0x7FFFFFFF)));
}

// Bit i set when KeyOf(z[i]) - lo <= span (unsigned), for 8 values.
SAMPLERD_AVX2 inline uint32_t KeysInRange8(__m256 z, __m256i lo, __m256i span) {
  const __m256i offset = _mm256_sub_epi32(KeyOf8(z), lo);
  const __m256i in = _mm256_cmpeq_epi32(_mm256_min_epu32(offset, span), offset);
  return static_cast<uint32_t>(_mm256_movemask_ps(_mm256_castsi256_ps(in)));
}
#endif

}  // namespace samplerd::kernels::cpu_fast_internal

#endif  // SAMPLERD_KERNELS_CPU_FAST_ORDER_KEYS_H_
