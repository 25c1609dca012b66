// Levels 0-2 of the chunked draw's masses in float (chunked_draw.h): m'_j = exp(z_j - z_max)
// for a kept token, z_j in [z_max - 40, z_max], within kFloatMassError of the oracle's KeptMass
// (kernels/common/inverse_cdf.h), 16 lanes a step with AVX-512, 8 with AVX2. Levels 0-2
// need their weights only to pick a unit; their margins (FinishChunkedDraw) cover this error,
// and the exact-precision double exp of inverse_cdf_pass.h cost ~3x as much per token
// (HOST_PLANE_RESULTS "Run 11": level 1 was most of the chunked draw's 110-179 µs at V =
// 151,936). The vector forms fuse five multiply-adds (AVX-512 CPUs have FMA; AVX2 ones are
// checked, UseAvx2Fma; ~1.6x the throughput on Zen 4): each fused step rounds once where the
// scalar form rounds twice, so the bound below holds for them as well; they are bit-identical
// to FloatKeptMassFma (no other contraction: cpu_features.h). Internal to kernels/cpu_fast.
//
// The method, and why m' is within 2.3 u of exp(d), d = z - z_max exactly (u = 2^-24, float's
// unit roundoff; "fl" a float operation, rounded to nearest):
//   1. s = fl(z - z_max), and e its exact error by Knuth's TwoSum (6 operations, exact in
//      round-to-nearest without overflow): s + e = d, |e| <= u |s|, |s| <= |d| <= 40.
//   2. kd = the integer nearest fl(s x kSixteenOverLn2) (the 1.5 x 2^23 shift; exact below 2^22).
//      kSixteenOverLn2 and the product carry < 2.01 u relative, so |s x 16 / ln 2 - kd| <=
//      0.5 + 2.01 u x 924 < 0.50012, |kd| <= 924, and |s - kd ln2/16| <= 0.021666.
//   3. r = fl(fl(fl(s - kd x kLn2Over16Hi) - fl(kd x kLn2Over16Lo)) + e). kLn2Over16Hi = 2839 x
//      2^-16 (12 bits): kd x Hi is exact (22 bits). s - kd x Hi is exact: for kd = 0 it is s;
//      else |s| >= 0.0216 > 2^-6, so s and kd x Hi are multiples of 2^-29, and their
//      difference, of magnitude <= 0.021666 + 924 |ln2/16 - Hi| < 0.0236 < 2^-5, has at most 24
//      bits. kd x Lo (|.| < 1.9e-3) rounds by < 1.2e-10; Hi + Lo misses ln2/16 by 1.1e-13, x kd
//      < 1.1e-10; the two additions, of results below 0.02167, round by < 1.3e-9 each. So r is
//      within 2.8e-9 (0.05 u) of rho = d - kd ln2/16, |rho|, |r| <= 0.0217.
//   4. h = fl(r + fl(fl(r x r) x fl(0.5 + fl(r x kOneSixth)))), the Taylor series of e^r - 1 to
//      r^3: the remainder is < r^4/24 x 1.03 < 9.5e-9 (0.16 u); the rounding of the inner terms
//      (|r^2 (1/2 + r/6)| < 2.4e-4, 3.1 u relative) < 0.001 u, that of h (|h| < 0.0220) < 0.022 u:
//      |h - (e^r - 1)| < 0.19 u.
//   5. S = 2^(kd / 16): kExp2Sixteenths[kd mod 16] (correctly rounded, < u) with floor(kd / 16)
//      added to its exponent (exact: results stay normal, > 2^-60).
//   6. m' = fl(S + fl(S x h)): S x h rounds by < 0.022 u x S, the sum by < u.
// Together |m' - e^d| < (u + 0.19 u / 0.978 + 0.022 u + u + 0.05 u) e^d < 2.3 u e^d. The oracle's
// mass exp(double(z) - z_max) is within 42 x 2^-53 of e^d (the double subtraction, glibc's exp),
// so |m' - m| < 2.3 u m + 5e-15 m. The vector sums add two tokens' masses in float before
// widening to double (one more rounding, < u of the pair): a term of a sum then carries < 3.3 u,
// and kFloatMassError = 4 u covers it. (The dense pieces' tail sums add more in float:
// kTailMassError, chunk_weights.h.) Checked against std::exp over a sweep in
// tests/kernels/fast_cpu_sampler_test.cc (FloatMassesAreWithinTheirProvenBoundOfStdExp).
#ifndef SAMPLERD_KERNELS_CPU_FAST_FLOAT_MASS_H_
#define SAMPLERD_KERNELS_CPU_FAST_FLOAT_MASS_H_

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/cpu_fast/cpu_features.h"

#if SAMPLERD_CPU_FAST_X86
#include <immintrin.h>
#endif

namespace samplerd::kernels::cpu_fast_internal {

// The relative error the margins allow a float mass, or a float sum of two, against the
// oracle's masses (3.3 u proven above).
inline constexpr double kFloatMassError = 0x1.0p-22;

// 2^(i / 16) rounded to float, i in [0, 16).
alignas(64) inline constexpr float kExp2Sixteenths[16] = {
    0x1.000000p+0f, 0x1.0b5586p+0f, 0x1.172b84p+0f, 0x1.2387a6p+0f, 0x1.306fe0p+0f, 0x1.3dea64p+0f,
    0x1.4bfdaep+0f, 0x1.5ab07ep+0f, 0x1.6a09e6p+0f, 0x1.7a1148p+0f, 0x1.8ace54p+0f, 0x1.9c4918p+0f,
    0x1.ae89fap+0f, 0x1.c199bep+0f, 0x1.d5818ep+0f, 0x1.ea4afap+0f};
inline constexpr float kSixteenOverLn2 = 0x1.715476p+4f;  // 16 / ln 2
inline constexpr float kLn2Over16Hi = 0x1.62ep-5f;        // 2839 x 2^-16
inline constexpr float kLn2Over16Lo = 0x1.0bfbe8p-19f;    // ln 2 / 16 - kLn2Over16Hi
inline constexpr float kOneSixth = 0x1.555556p-3f;
inline constexpr float kRoundShift = 0x1.8p23f;  // x + this - this: x rounded to an integer

// m' for one kept token: z in [z_max - 40, z_max], both finite.
inline float FloatKeptMass(float z, float z_max) {
  const float s = z - z_max;
  const float b = s - z;
  const float a = s - b;
  const float e = (z - a) + (-z_max - b);
  const float kd_shifted = s * kSixteenOverLn2 + kRoundShift;
  const float kd = kd_shifted - kRoundShift;
  const float r = ((s - kd * kLn2Over16Hi) - kd * kLn2Over16Lo) + e;
  const float h = r + (r * r) * (0.5f + r * kOneSixth);
  uint32_t ki;
  std::memcpy(&ki, &kd_shifted, 4);  // 2^22 + kd in the low 23 bits
  uint32_t scale_bits;
  std::memcpy(&scale_bits, &kExp2Sixteenths[ki & 15], 4);
  scale_bits += (ki >> 4) << 23;  // floor(kd / 16) into the exponent, modulo 2^9
  float scale;
  std::memcpy(&scale, &scale_bits, 4);
  return scale + scale * h;
}

// FloatKeptMass with the vector forms' fused multiply-adds (std::fmaf: slow without hardware
// FMA; the tests' reference for FloatKeptMass8 and FloatKeptMass16).
inline float FloatKeptMassFma(float z, float z_max) {
  const float s = z - z_max;
  const float b = s - z;
  const float a = s - b;
  const float e = (z - a) + (-z_max - b);
  const float kd_shifted = std::fma(s, kSixteenOverLn2, kRoundShift);
  const float kd = kd_shifted - kRoundShift;
  const float r = std::fma(-kd, kLn2Over16Lo, std::fma(-kd, kLn2Over16Hi, s)) + e;
  const float h = std::fma(r * r, std::fma(r, kOneSixth, 0.5f), r);
  uint32_t ki;
  std::memcpy(&ki, &kd_shifted, 4);
  uint32_t scale_bits;
  std::memcpy(&scale_bits, &kExp2Sixteenths[ki & 15], 4);
  scale_bits += (ki >> 4) << 23;
  float scale;
  std::memcpy(&scale, &scale_bits, 4);
  return std::fma(scale, h, scale);
}

#if SAMPLERD_CPU_FAST_X86
// FloatKeptMassFma of 8 lanes with AVX2 + FMA; the table in two registers (entries 0-7, 8-15).
// Lanes outside the domain (-inf included) give anything: callers mask them.
SAMPLERD_AVX2_FMA inline __m256 FloatKeptMass8(__m256 z, __m256 z_max, __m256 table_lo,
                                               __m256 table_hi) {
  const __m256 s = _mm256_sub_ps(z, z_max);
  const __m256 b = _mm256_sub_ps(s, z);
  const __m256 a = _mm256_sub_ps(s, b);
  const __m256 e = _mm256_add_ps(_mm256_sub_ps(z, a),
                                 _mm256_sub_ps(_mm256_xor_ps(z_max, _mm256_set1_ps(-0.0f)), b));
  const __m256 shift = _mm256_set1_ps(kRoundShift);
  const __m256 kd_shifted = _mm256_fmadd_ps(s, _mm256_set1_ps(kSixteenOverLn2), shift);
  const __m256 kd = _mm256_sub_ps(kd_shifted, shift);
  const __m256 r =
      _mm256_add_ps(_mm256_fnmadd_ps(kd, _mm256_set1_ps(kLn2Over16Lo),
                                     _mm256_fnmadd_ps(kd, _mm256_set1_ps(kLn2Over16Hi), s)),
                    e);
  const __m256 inner = _mm256_fmadd_ps(r, _mm256_set1_ps(kOneSixth), _mm256_set1_ps(0.5f));
  const __m256 h = _mm256_fmadd_ps(_mm256_mul_ps(r, r), inner, r);
  const __m256i ki = _mm256_castps_si256(kd_shifted);
  // Entry ki & 15: the permutes read bits 0-2, bit 3 (moved to the sign) picks the register.
  const __m256 entry = _mm256_blendv_ps(_mm256_permutevar8x32_ps(table_lo, ki),
                                        _mm256_permutevar8x32_ps(table_hi, ki),
                                        _mm256_castsi256_ps(_mm256_slli_epi32(ki, 28)));
  const __m256 scale = _mm256_castsi256_ps(_mm256_add_epi32(
      _mm256_castps_si256(entry), _mm256_slli_epi32(_mm256_srli_epi32(ki, 4), 23)));
  return _mm256_fmadd_ps(scale, h, scale);
}

SAMPLERD_AVX512_WARNINGS_OFF

// FloatKeptMassFma of 16 lanes with AVX-512 F + DQ; the table in one register
// (kExp2Sixteenths). Lanes outside the domain give anything: callers mask them.
SAMPLERD_AVX512 inline __m512 FloatKeptMass16(__m512 z, __m512 z_max, __m512 table) {
  const __m512 s = _mm512_sub_ps(z, z_max);
  const __m512 b = _mm512_sub_ps(s, z);
  const __m512 a = _mm512_sub_ps(s, b);
  const __m512 e = _mm512_add_ps(_mm512_sub_ps(z, a),
                                 _mm512_sub_ps(_mm512_xor_ps(z_max, _mm512_set1_ps(-0.0f)), b));
  const __m512 shift = _mm512_set1_ps(kRoundShift);
  const __m512 kd_shifted = _mm512_fmadd_ps(s, _mm512_set1_ps(kSixteenOverLn2), shift);
  const __m512 kd = _mm512_sub_ps(kd_shifted, shift);
  const __m512 r =
      _mm512_add_ps(_mm512_fnmadd_ps(kd, _mm512_set1_ps(kLn2Over16Lo),
                                     _mm512_fnmadd_ps(kd, _mm512_set1_ps(kLn2Over16Hi), s)),
                    e);
  const __m512 inner = _mm512_fmadd_ps(r, _mm512_set1_ps(kOneSixth), _mm512_set1_ps(0.5f));
  const __m512 h = _mm512_fmadd_ps(_mm512_mul_ps(r, r), inner, r);
  const __m512i ki = _mm512_castps_si512(kd_shifted);
  const __m512 entry = _mm512_permutexvar_ps(ki, table);  // reads bits 0-3 of each index
  const __m512 scale = _mm512_castsi512_ps(_mm512_add_epi32(
      _mm512_castps_si512(entry), _mm512_slli_epi32(_mm512_srli_epi32(ki, 4), 23)));
  return _mm512_fmadd_ps(scale, h, scale);
}

SAMPLERD_AVX512_WARNINGS_ON
#endif

}  // namespace samplerd::kernels::cpu_fast_internal

#endif  // SAMPLERD_KERNELS_CPU_FAST_FLOAT_MASS_H_
