// Token masses exp(z - mx) as integers in 2^-62 units, so that sums of masses (top-p) are exact
// and do not depend on how a row's tokens were split over tasks. The exp is a branch-free table
// method within ~2 ulp; its per-token cost is why these are inline. Internal to kernels/cpu_fast.
#ifndef SAMPLERD_KERNELS_CPU_FAST_QUANTISED_MASS_H_
#define SAMPLERD_KERNELS_CPU_FAST_QUANTISED_MASS_H_

#include <cmath>
#include <cstdint>
#include <cstring>

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

// exp(x) for x in [-44, 0] within ~2 ulp, branch-free: x = (k + i / 64) ln 2 + r with
// |r| <= ln 2 / 128, exp(r) by its Taylor series to r^6 (error < 1e-17), 2^(i/64) from a table
// and 2^k added to the exponent bits.
inline double ExpNonPositive(double x) {
  constexpr double kInvLn2N = 64.0 / 0.69314718055994530942;
  constexpr double kLn2HiN = 0x1.62e42fefa0000p-7;   // ln 2 / 64, high part
  constexpr double kLn2LoN = 0x1.cf79abc9e3b3ap-46;  // ln 2 / 64 - kLn2HiN
  constexpr double kShift = 0x1.8p52;
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

}  // namespace samplerd::kernels::cpu_fast_internal

#endif  // SAMPLERD_KERNELS_CPU_FAST_QUANTISED_MASS_H_
