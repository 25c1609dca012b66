// The inverse-CDF draw of plain-temperature rows: the one definition every backend follows
// (docs/DESIGN.md, "Sampling semantics", step 6).
//
// A row is plain temperature when temperature is its only parameter (IsPlainTemperature): no
// top-k, top-p 1, min-p 0, not greedy. When its max z = x / T is finite, its token is drawn
// without noise per token:
//   x_max    = the largest x of the row (after the logits processors), finite;
//   inv_t    = 1.0 / double(T);
//   mass_j   = exp((double(x_j) - double(x_max)) * inv_t)      (InverseCdfMass; -inf x: 0)
//   total    = sum of mass_j over the row, in index order, in double;
//   u        = the row's uniform in [0, 1), 53 bits (RowUniform);
//   token    = the lowest j whose prefix sum (mass_0 + ... + mass_j) is > u * total;
//              if rounding leaves none, the last token with mass > 0.
// A token of mass 0 is never drawn. Backends that sum in another order (the GPU sums per chunk,
// cpu_fast per task) differ from the index-order sums by a few double ulps of the total, so
// their token can differ only when u * total lies within ~1e-15 of the total from a prefix
// boundary.
//
// Rows whose max z is +-inf keep the uniform Gumbel draw over the tokens at the max x; filtered
// rows keep the Gumbel-max draw (kernels/common/philox.h).
#ifndef SAMPLERD_KERNELS_COMMON_INVERSE_CDF_H_
#define SAMPLERD_KERNELS_COMMON_INVERSE_CDF_H_

#include <cstdint>

#if !defined(__CUDACC__) && !defined(__HIPCC__)
#include <math.h>  // exp; the GPU compilers declare it for host and device themselves.
#endif

#include "kernels/common/host_device.h"
#include "kernels/common/philox.h"
#include "kernels/common/sampling_types.h"

namespace samplerd::kernels {

// True when the row's only parameter is its temperature. Host and device.
SAMPLERD_HOST_DEVICE inline bool IsPlainTemperature(const RowParams& p, int64_t vocab) {
  return !(p.temperature < kGreedyTemperature) && !(p.top_k > 0 && p.top_k < vocab) &&
         !(p.top_p < 1.0f) && !(p.min_p > 0.0f);
}

// The Philox token index of the row's uniform: block 2^62 - 1, the last block of the counter's
// token half, which no token of a row (index < 2^31) reaches.
inline constexpr uint64_t kRowUniformToken = ~uint64_t{0} - 3;

// 53 random bits as a double in [0, 1): (hi << 21 | lo >> 11) * 2^-53, exact.
SAMPLERD_HOST_DEVICE inline double UniformDoubleFromBits(uint32_t hi, uint32_t lo) {
  const uint64_t bits = (static_cast<uint64_t>(hi) << 21) | (lo >> 11);
  return static_cast<double>(bits) * 0x1.0p-53;
}

// The row's uniform u: words 0 and 1 of Philox4x32-10 at (position, kRowUniformToken).
SAMPLERD_HOST_DEVICE inline double RowUniform(uint64_t seed, uint64_t position) {
  const PhiloxCounter out =
      Philox4x32x10(PhiloxCounterFor(position, kRowUniformToken), PhiloxKeyFromSeed(seed));
  return UniformDoubleFromBits(out.word[0], out.word[1]);
}

// 1 / T in double: the scale of every mass.
SAMPLERD_HOST_DEVICE inline double InverseTemperature(float temperature) {
  return 1.0 / static_cast<double>(temperature);
}

// mass_j = exp((x - reference) * inv_t), reference finite. -inf x gives 0.
SAMPLERD_HOST_DEVICE inline double InverseCdfMass(float x, double reference, double inv_t) {
  return exp((static_cast<double>(x) - reference) * inv_t);
}

}  // namespace samplerd::kernels

#endif  // SAMPLERD_KERNELS_COMMON_INVERSE_CDF_H_
