// Software conversion of IEEE fp16 and bfloat16 storage to fp32, for the CPU sampler (and fp32
// to the nearest bf16, for tests).
//
// The CPU backend must read the same values a GPU reads natively, on any host compiler, so this
// decodes the bit patterns by hand instead of relying on _Float16 or F16C: subnormals, signed
// zeros, infinities and NaN all map exactly (every fp16 and bf16 value is representable in fp32).
#ifndef SAMPLERD_KERNELS_CPU_HALF_FLOAT_H_
#define SAMPLERD_KERNELS_CPU_HALF_FLOAT_H_

#include <cstdint>
#include <cstring>

namespace samplerd::kernels {

// fp32 value of the bit pattern `bits`.
inline float FloatFromBits(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

// IEEE binary16 (1 sign, 5 exponent, 10 mantissa bits) to fp32.
inline float HalfBitsToFloat(uint16_t half) {
  const uint32_t sign = static_cast<uint32_t>(half >> 15) << 31;
  const uint32_t exponent = (half >> 10) & 0x1fu;
  const uint32_t mantissa = half & 0x3ffu;
  if (exponent == 0) {
    // Zero or subnormal: mantissa * 2^-24, exact in fp32 (which keeps these values normal).
    const float magnitude = static_cast<float>(mantissa) * 0x1.0p-24f;
    return sign != 0 ? -magnitude : magnitude;
  }
  if (exponent == 0x1f) {
    // Infinity (mantissa 0) or NaN; the payload moves to the top of the fp32 mantissa.
    return FloatFromBits(sign | 0x7f800000u | (mantissa << 13));
  }
  // Normal: rebias the exponent from 15 to 127 and widen the mantissa.
  return FloatFromBits(sign | ((exponent + (127 - 15)) << 23) | (mantissa << 13));
}

// bfloat16 is the top half of an fp32, so widening is a shift.
inline float Bf16BitsToFloat(uint16_t bf16) {
  return FloatFromBits(static_cast<uint32_t>(bf16) << 16);
}

// A finite fp32 `x` rounded to the nearest bfloat16 (ties to even), as fp32: the logits of an
// engine whose model computes in bf16 and hands them over as fp32 (tests and benchmarks).
inline float RoundToBf16(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return FloatFromBits(bits & 0xffff0000u);
}

}  // namespace samplerd::kernels

#endif  // SAMPLERD_KERNELS_CPU_HALF_FLOAT_H_
