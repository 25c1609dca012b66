// Token masses exp(z - mx) as integers in 2^-62 units, so that sums of masses (top-p) are exact
// and do not depend on how a row's tokens were split over tasks. The exp is a branch-free table
// method within ~2 ulp; its per-token cost is why these are inline. Internal to kernels/cpu_fast.
#ifndef SAMPLERD_KERNELS_CPU_FAST_QUANTISED_MASS_H_
#define SAMPLERD_KERNELS_CPU_FAST_QUANTISED_MASS_H_

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/cpu_fast/cpu_features.h"

#if SAMPLERD_CPU_FAST_X86
#include <immintrin.h>
#endif

namespace samplerd::kernels::cpu_fast_internal {

inline constexpr double kMassScale = 0x1p62;  // masses exp(z - mx) <= 1 as integers

// 2^(i / 64), i in [0, 64), for ExpNonPositive.
struct ExpTable {
  double value[64];
  ExpTable() {
    for (int i = 0; i < 64; ++i) value[i] = std::exp2(i / 64.0);
  }
};

// The table, built at the first call (FastCpuSampler's constructor makes that call).
inline const ExpTable& Exp2Table() {
  static const ExpTable table;
  return table;
}

// The constants of ExpNonPositive and its vector forms: x = kd * ln 2 / 64 + r.
inline constexpr double kInvLn2N = 64.0 / 0.69314718055994530942;
inline constexpr double kLn2HiN = 0x1.62e42fefa0000p-7;   // ln 2 / 64, high part
inline constexpr double kLn2LoN = 0x1.cf79abc9e3b3ap-46;  // ln 2 / 64 - kLn2HiN
inline constexpr double kShift = 0x1.8p52;                // rounds x * kInvLn2N to an integer

// exp(x) for x in [-44, 0] within ~2 ulp, branch-free: x = (k + i / 64) ln 2 + r with
// |r| <= ln 2 / 128, exp(r) by its Taylor series to r^6 (error < 1e-17), 2^(i/64) from a table
// and 2^k added to the exponent bits.
inline double ExpNonPositive(double x) {
  const double kd_shifted = x * kInvLn2N + kShift;
  uint64_t ki;
  std::memcpy(&ki, &kd_shifted, 8);
  const double kd = kd_shifted - kShift;
  const double r = (x - kd * kLn2HiN) - kd * kLn2LoN;
  const int64_t k = static_cast<int64_t>(ki << 12) >> 12;  // the integer in the low 52 bits
  uint64_t scale_bits;
  std::memcpy(&scale_bits, &Exp2Table().value[k & 63], 8);
  scale_bits += static_cast<uint64_t>(k >> 6) << 52;
  double scale;
  std::memcpy(&scale, &scale_bits, 8);
  const double r2 = r * r;
  const double poly =
      1.0 + r + r2 * (0.5 + r * (1.0 / 6 + r * (1.0 / 24 + r * (1.0 / 120 + r * (1.0 / 720)))));
  return scale * poly;
}

// exp(z - mx) as an integer in 2^-62 units (0 below 2^-62, where the exp is not needed).
inline uint64_t QuantisedMass(float z, float mx) {
  const double x = static_cast<double>(z) - mx;
  if (!(x >= -44.0)) return 0;
  return static_cast<uint64_t>(static_cast<int64_t>(ExpNonPositive(x) * kMassScale));
}

#if SAMPLERD_CPU_FAST_X86
// ExpNonPositive of four lanes: the same double operations in the same order (bit-identical
// results), the table read by a gather.
SAMPLERD_AVX2 inline __m256d ExpNonPositive4(__m256d x) {
  const __m256d shift = _mm256_set1_pd(kShift);
  const __m256d kd_shifted = _mm256_add_pd(_mm256_mul_pd(x, _mm256_set1_pd(kInvLn2N)), shift);
  const __m256i ki = _mm256_castpd_si256(kd_shifted);
  const __m256d kd = _mm256_sub_pd(kd_shifted, shift);
  const __m256d r = _mm256_sub_pd(_mm256_sub_pd(x, _mm256_mul_pd(kd, _mm256_set1_pd(kLn2HiN))),
                                  _mm256_mul_pd(kd, _mm256_set1_pd(kLn2LoN)));
  // Bits 6..17 of ki are those of the scalar path's sign-extended k; nothing else survives the
  // shift to the exponent field.
  const __m256i index = _mm256_and_si256(ki, _mm256_set1_epi64x(63));
  const __m256d table = _mm256_i64gather_pd(Exp2Table().value, index, 8);
  const __m256d scale = _mm256_castsi256_pd(_mm256_add_epi64(
      _mm256_castpd_si256(table), _mm256_slli_epi64(_mm256_srli_epi64(ki, 6), 52)));
  const __m256d r2 = _mm256_mul_pd(r, r);
  __m256d inner =
      _mm256_add_pd(_mm256_set1_pd(1.0 / 120), _mm256_mul_pd(r, _mm256_set1_pd(1.0 / 720)));
  inner = _mm256_add_pd(_mm256_set1_pd(1.0 / 24), _mm256_mul_pd(r, inner));
  inner = _mm256_add_pd(_mm256_set1_pd(1.0 / 6), _mm256_mul_pd(r, inner));
  inner = _mm256_add_pd(_mm256_set1_pd(0.5), _mm256_mul_pd(r, inner));
  const __m256d poly =
      _mm256_add_pd(_mm256_add_pd(_mm256_set1_pd(1.0), r), _mm256_mul_pd(r2, inner));
  return _mm256_mul_pd(scale, poly);
}

// QuantisedMass of four tokens, x = (double)z - mx per lane: ExpNonPositive4 (bit-identical to
// the scalar path), then the truncation to an integer done on the bits (AVX2 has no double ->
// int64 conversion).
SAMPLERD_AVX2 inline __m256i QuantisedMass4(__m256d x) {
  const __m256d v = _mm256_mul_pd(ExpNonPositive4(x), _mm256_set1_pd(kMassScale));
  // trunc(v) for v in [0, 2^63): the mantissa shifted by (biased exponent - 1075); the shift
  // the other way is out of range (0) in each lane.
  const __m256i bits = _mm256_castpd_si256(v);
  const __m256i exponent = _mm256_srli_epi64(bits, 52);
  const __m256i mantissa = _mm256_or_si256(
      _mm256_and_si256(bits, _mm256_set1_epi64x((1LL << 52) - 1)), _mm256_set1_epi64x(1LL << 52));
  const __m256i up =
      _mm256_sllv_epi64(mantissa, _mm256_sub_epi64(exponent, _mm256_set1_epi64x(1075)));
  const __m256i down =
      _mm256_srlv_epi64(mantissa, _mm256_sub_epi64(_mm256_set1_epi64x(1075), exponent));
  const __m256i in_range = _mm256_castpd_si256(_mm256_cmp_pd(x, _mm256_set1_pd(-44.0), _CMP_GE_OQ));
  return _mm256_and_si256(_mm256_or_si256(up, down), in_range);
}

SAMPLERD_AVX512_WARNINGS_OFF

// The 64 table entries in 8 registers, for QuantisedMass8.
struct ExpTable512 {
  __m512d part[8];
  SAMPLERD_AVX512 ExpTable512() {
    for (int i = 0; i < 8; ++i) part[i] = _mm512_loadu_pd(Exp2Table().value + 8 * i);
  }
};

// ExpNonPositive of eight lanes with AVX-512 F + DQ: the same double operations in the same
// order (bit-identical results), the table read by permutes.
SAMPLERD_AVX512 inline __m512d ExpNonPositive8(__m512d x, const ExpTable512& t) {
  const __m512d shift = _mm512_set1_pd(kShift);
  const __m512d kd_shifted = _mm512_add_pd(_mm512_mul_pd(x, _mm512_set1_pd(kInvLn2N)), shift);
  const __m512i ki = _mm512_castpd_si512(kd_shifted);
  const __m512d kd = _mm512_sub_pd(kd_shifted, shift);
  const __m512d r = _mm512_sub_pd(_mm512_sub_pd(x, _mm512_mul_pd(kd, _mm512_set1_pd(kLn2HiN))),
                                  _mm512_mul_pd(kd, _mm512_set1_pd(kLn2LoN)));
  // table[ki & 63]: 16 entries per permute (index bits 0-3), bits 4 and 5 pick the permute.
  const __m512i index = _mm512_and_si512(ki, _mm512_set1_epi64(63));
  const __m512d q0 = _mm512_permutex2var_pd(t.part[0], index, t.part[1]);
  const __m512d q1 = _mm512_permutex2var_pd(t.part[2], index, t.part[3]);
  const __m512d q2 = _mm512_permutex2var_pd(t.part[4], index, t.part[5]);
  const __m512d q3 = _mm512_permutex2var_pd(t.part[6], index, t.part[7]);
  const __mmask8 bit4 = _mm512_test_epi64_mask(index, _mm512_set1_epi64(16));
  const __mmask8 bit5 = _mm512_test_epi64_mask(index, _mm512_set1_epi64(32));
  const __m512d table = _mm512_mask_blend_pd(bit5, _mm512_mask_blend_pd(bit4, q0, q1),
                                             _mm512_mask_blend_pd(bit4, q2, q3));
  const __m512d scale = _mm512_castsi512_pd(_mm512_add_epi64(
      _mm512_castpd_si512(table), _mm512_slli_epi64(_mm512_srli_epi64(ki, 6), 52)));
  const __m512d r2 = _mm512_mul_pd(r, r);
  __m512d inner =
      _mm512_add_pd(_mm512_set1_pd(1.0 / 120), _mm512_mul_pd(r, _mm512_set1_pd(1.0 / 720)));
  inner = _mm512_add_pd(_mm512_set1_pd(1.0 / 24), _mm512_mul_pd(r, inner));
  inner = _mm512_add_pd(_mm512_set1_pd(1.0 / 6), _mm512_mul_pd(r, inner));
  inner = _mm512_add_pd(_mm512_set1_pd(0.5), _mm512_mul_pd(r, inner));
  const __m512d poly =
      _mm512_add_pd(_mm512_add_pd(_mm512_set1_pd(1.0), r), _mm512_mul_pd(r2, inner));
  return _mm512_mul_pd(scale, poly);
}

// QuantisedMass4 for 8 tokens with AVX-512 F + DQ: ExpNonPositive8, then the truncation by
// vcvttpd2uqq (exact below 2^64).
SAMPLERD_AVX512 inline __m512i QuantisedMass8(__m512d x, const ExpTable512& t) {
  const __m512d v = _mm512_mul_pd(ExpNonPositive8(x, t), _mm512_set1_pd(kMassScale));
  const __mmask8 in_range = _mm512_cmp_pd_mask(x, _mm512_set1_pd(-44.0), _CMP_GE_OQ);
  return _mm512_maskz_mov_epi64(in_range, _mm512_cvttpd_epu64(v));
}

SAMPLERD_AVX512_WARNINGS_ON
#endif

}  // namespace samplerd::kernels::cpu_fast_internal

#endif  // SAMPLERD_KERNELS_CPU_FAST_QUANTISED_MASS_H_
