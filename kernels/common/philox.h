// Philox4x32-10 counter-based RNG and the Gumbel noise every sampler backend draws with.
//
// Backend agreement (docs/DESIGN.md) requires the CPU reference, the HIP kernels and the CUDA
// build of those kernels to perturb token j of a row with exactly the same noise, so this header
// is the single definition of the stream. It compiles as host and device code: nothing from the
// standard library beyond <cstdint> (and the C math `logf`, which nvcc and hipcc provide on the
// device).
//
// Generator: Philox4x32 with 10 rounds (Salmon et al., "Parallel random numbers: as easy as 1, 2,
// 3", SC'11), multipliers M0 = 0xD2511F53, M1 = 0xCD9E8D57, Weyl key increments W0 = 0x9E3779B9,
// W1 = 0xBB67AE85. Checked against Random123's known-answer vectors (tests/kernels/philox_test.cc).
//
// Mapping, identical in every backend (changing it changes every sampled token):
//   key     = {lo32(seed), hi32(seed)}
//   counter = {lo32(j >> 2), hi32(j >> 2), lo32(position), hi32(position)}
//   bits_j  = Philox4x32-10(counter, key)[j & 3]
// where j is the token index (uint64) and position is the row's decode position. One block feeds
// four consecutive tokens; nothing depends on the row's place in the batch (batch invariance).
//
//   U_j = ((bits_j >> 9) + 0.5) * 2^-23   in fp32: the centre of one of 2^23 equal bins, so it is
//                                           exact and lies in [2^-24, 1 - 2^-24], strictly (0,1).
//   G_j = -logf(-logf(U_j))               in fp32 (standard Gumbel).
//
// Why 23 bits and not the top 24: with 24 bits, ((bits >> 8) + 0.5) * 2^-24 needs 25 significant
// bits, so in fp32 it rounds, and for bits >> 8 == 2^24 - 1 it rounds to exactly 1.0, which makes
// G = +inf and hands the token to whatever index drew it. With 23 bits every step is exact under
// any rounding mode, so all backends agree on U bit for bit; only logf may differ by an ulp.
#ifndef SAMPLERD_KERNELS_COMMON_PHILOX_H_
#define SAMPLERD_KERNELS_COMMON_PHILOX_H_

#include <cstdint>

#if !defined(__CUDACC__) && !defined(__HIPCC__)
#include <math.h>  // logf; the GPU compilers declare it for host and device themselves.
#endif

#include "kernels/common/host_device.h"

namespace samplerd::kernels {

inline constexpr uint32_t kPhiloxM0 = 0xD2511F53u;
inline constexpr uint32_t kPhiloxM1 = 0xCD9E8D57u;
inline constexpr uint32_t kPhiloxW0 = 0x9E3779B9u;
inline constexpr uint32_t kPhiloxW1 = 0xBB67AE85u;
inline constexpr int kPhiloxRounds = 10;

// 128-bit counter, also the shape of one output block.
struct PhiloxCounter {
  uint32_t word[4];
};

// 64-bit key.
struct PhiloxKey {
  uint32_t word[2];
};

// The 64-bit product of two 32-bit words. On NVIDIA one wide multiply: NVVM compiles the product
// of two zero-extended words as a 64-bit multiply (mul.lo.s64), which ptxas issued as the wide
// multiply plus an add of zero for the high half: ~20 of a Philox block's ~80 instructions
// (kernels/gpu/NOTES.md v46).
SAMPLERD_HOST_DEVICE inline uint64_t PhiloxWideProduct(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
  uint64_t product;
  asm("mul.wide.u32 %0, %1, %2;" : "=l"(product) : "r"(a), "r"(b));
  return product;
#else
  return static_cast<uint64_t>(a) * b;
#endif
}

// One Philox4x32 round: two 32x32->64 multiplies, then the S-box-like swap and xor with the key.
SAMPLERD_HOST_DEVICE inline PhiloxCounter PhiloxRound(const PhiloxCounter& ctr,
                                                      const PhiloxKey& key) {
  const uint64_t product0 = PhiloxWideProduct(kPhiloxM0, ctr.word[0]);
  const uint64_t product1 = PhiloxWideProduct(kPhiloxM1, ctr.word[2]);
  const uint32_t hi0 = static_cast<uint32_t>(product0 >> 32);
  const uint32_t lo0 = static_cast<uint32_t>(product0);
  const uint32_t hi1 = static_cast<uint32_t>(product1 >> 32);
  const uint32_t lo1 = static_cast<uint32_t>(product1);
  return PhiloxCounter{
      {hi1 ^ ctr.word[1] ^ key.word[0], lo1, hi0 ^ ctr.word[3] ^ key.word[1], lo0}};
}

// The raw block function Philox4x32-10(counter, key): the key is bumped by (W0, W1) between
// rounds, as in Random123.
SAMPLERD_HOST_DEVICE inline PhiloxCounter Philox4x32x10(PhiloxCounter ctr, PhiloxKey key) {
  ctr = PhiloxRound(ctr, key);
  for (int round = 1; round < kPhiloxRounds; ++round) {
    key.word[0] += kPhiloxW0;
    key.word[1] += kPhiloxW1;
    ctr = PhiloxRound(ctr, key);
  }
  return ctr;
}

// key = {lo32(seed), hi32(seed)}.
SAMPLERD_HOST_DEVICE inline PhiloxKey PhiloxKeyFromSeed(uint64_t seed) {
  return PhiloxKey{{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)}};
}

// counter = {lo32(token >> 2), hi32(token >> 2), lo32(position), hi32(position)}.
SAMPLERD_HOST_DEVICE inline PhiloxCounter PhiloxCounterFor(uint64_t position, uint64_t token) {
  const uint64_t block = token >> 2;
  return PhiloxCounter{{static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32),
                        static_cast<uint32_t>(position), static_cast<uint32_t>(position >> 32)}};
}

// The 32 random bits of token `token` at decode step `position` of the stream `seed`.
// A kernel that owns four consecutive tokens j..j+3 (j % 4 == 0) should call Philox4x32x10 once
// and use all four words; the result is the same.
SAMPLERD_HOST_DEVICE inline uint32_t PhiloxBits(uint64_t seed, uint64_t position, uint64_t token) {
  const PhiloxCounter out =
      Philox4x32x10(PhiloxCounterFor(position, token), PhiloxKeyFromSeed(seed));
  return out.word[token & 3];
}

// Maps 32 random bits to U = ((bits >> 9) + 0.5) * 2^-23, exactly, strictly inside (0, 1).
SAMPLERD_HOST_DEVICE inline float UniformFromBits(uint32_t bits) {
  return (static_cast<float>(bits >> 9) + 0.5f) * 0x1.0p-23f;
}

// Standard Gumbel noise -logf(-logf(u)) for u in (0, 1), in fp32.
SAMPLERD_HOST_DEVICE inline float GumbelFromUniform(float u) { return -logf(-logf(u)); }

// U_j of the mapping above.
SAMPLERD_HOST_DEVICE inline float PhiloxUniform(uint64_t seed, uint64_t position, uint64_t token) {
  return UniformFromBits(PhiloxBits(seed, position, token));
}

// G_j of the mapping above: the noise added to z_j in the Gumbel-max draw.
SAMPLERD_HOST_DEVICE inline float GumbelNoise(uint64_t seed, uint64_t position, uint64_t token) {
  return GumbelFromUniform(PhiloxUniform(seed, position, token));
}

}  // namespace samplerd::kernels

#endif  // SAMPLERD_KERNELS_COMMON_PHILOX_H_
