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
#include <math.h>  // exp, floorf; the GPU compilers declare it for host and device themselves.
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

// True when the row's only filter is top-p (no top-k, min-p 0, not greedy): the chunked draw
// below. Host and device. (Without top-k and min-p the two top-p modes keep the same set.)
SAMPLERD_HOST_DEVICE inline bool IsTopPAlone(const RowParams& p, int64_t vocab) {
  return !(p.temperature < kGreedyTemperature) && !(p.top_k > 0 && p.top_k < vocab) &&
         p.top_p > 0.0f && p.top_p < 1.0f && !(p.min_p > 0.0f);
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

// ---- Top-p alone: the chunked inverse-CDF draw (kernels v47, level 0 v48) ------------------
//
// A row whose only filter is top-p (IsTopPAlone above) with a finite max z
// draws from its kept set K (select.h's rule, unchanged) in four levels:
//   m_j      = exp(double(z_j) - double(z_max)) for j in K, else 0       (KeptMass; z = x / T)
//   level 0  K's head H and tail T: b = DrawBin(z_c), z_c the lowest z of K; H = the tokens of K
//            with DrawBin(z_j) > b, T = the rest of K (never empty: it holds z_c). W_H and W_T
//            are their m_j summed in index order (double); the part is H iff
//            u0 x (W_H + W_T) < W_H (HeadIsDrawn), else T. Levels 1-3 then draw from that part
//            alone (m_j = 0 outside it), each by the same rule:
//   level 1  the units are chunks of kDrawChunk tokens of the row, u = u1;
//   level 2  the units are segments of kDrawSegment tokens of the chosen chunk, u = u2;
//   level 3  the units are the tokens of the chosen segment, u = u3;
//   at each level: a unit's weight is the sum of its m_j in index order (double); the total is
//   the sum of the weights in unit order; the chosen unit is the lowest whose running weight is
//   > u x total, or, if rounding leaves none, the last unit of weight > 0.
// P(j) = W_part / W x W_chunk / W_part x W_segment / W_chunk x m_j / W_segment = m_j / W: the
// softmax of z over K (W = W_H + W_T).
// Why level 0: T is K's part of the bin where the top-p cut falls. A backend that bins the row's
// masses in one pass knows each chunk's W_H share and an upper bound on W_T (the whole bin's mass)
// from that pass alone; when u0 x (W_H + that bound) < W_H, H is drawn for certain and the row is
// never read again to find the cut (kernels/gpu/mass_plan.h), which is most rows: the cut's bin
// (1/8 logit) holds a few percent of K's mass on dense rows.
// Each level needs its weights only to the precision of its own boundaries, so a backend may
// take the chunk and segment weights from cheaper sums (fixed point, float exps) and compute
// exact double masses for one segment only; its token then differs from these exact sums only
// when u1 x W or u2 x W_chunk lies within that error of a boundary between two units.
inline constexpr int64_t kDrawChunk = 8192;
inline constexpr int64_t kDrawSegment = 32;

// A 32-bit word as a uniform in (0, 1): (w + 1/2) x 2^-32.
SAMPLERD_HOST_DEVICE inline double UniformFromWord(uint32_t w) {
  return (static_cast<double>(w) + 0.5) * 0x1.0p-32;
}

// The Philox token index of level 0's uniform: block 2^62 - 2, the block before the row
// uniform's, which no token of a row reaches either.
inline constexpr uint64_t kRowPartToken = ~uint64_t{0} - 7;

// The four uniforms: u1 from words 0 and 1 of the row's Philox block (RowUniform's), u2 from
// word 2, u3 from word 3; u0 from word 0 of the block at kRowPartToken.
struct ChunkedUniforms {
  double u0;
  double u1;
  double u2;
  double u3;
};

// u0 alone (the GPU's plan decides level 0 before the other levels run).
SAMPLERD_HOST_DEVICE inline double RowPartUniform(uint64_t seed, uint64_t position) {
  return UniformFromWord(
      Philox4x32x10(PhiloxCounterFor(position, kRowPartToken), PhiloxKeyFromSeed(seed)).word[0]);
}

SAMPLERD_HOST_DEVICE inline ChunkedUniforms RowChunkedUniforms(uint64_t seed, uint64_t position) {
  const PhiloxCounter out =
      Philox4x32x10(PhiloxCounterFor(position, kRowUniformToken), PhiloxKeyFromSeed(seed));
  return {RowPartUniform(seed, position), UniformDoubleFromBits(out.word[0], out.word[1]),
          UniformFromWord(out.word[2]), UniformFromWord(out.word[3])};
}

// Level 0's bins: floor(kDrawBinsPerLogit x z), exact in fp32 (x 8 is) for |z| < 2^21.
inline constexpr float kDrawBinsPerLogit = 8.0f;

SAMPLERD_HOST_DEVICE inline float DrawBin(float z) { return floorf(z * kDrawBinsPerLogit); }

// Level 0's rule: the head is drawn iff u0 x (W_H + W_T) < W_H.
SAMPLERD_HOST_DEVICE inline bool HeadIsDrawn(double w_head, double w_tail, double u0) {
  return u0 * (w_head + w_tail) < w_head;
}

// m_j of a kept token: exp(z - z_max) in double (z <= z_max, both finite).
SAMPLERD_HOST_DEVICE inline double KeptMass(float z, double z_max) {
  return exp(static_cast<double>(z) - z_max);
}

}  // namespace samplerd::kernels

#endif  // SAMPLERD_KERNELS_COMMON_INVERSE_CDF_H_
