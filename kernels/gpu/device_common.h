// Device helpers shared by the sampling kernels: order-preserving keys, native dtype loads,
// fixed-point masses and deterministic block reductions. HIP names only (platform.h).
#ifndef SAMPLERD_KERNELS_GPU_DEVICE_COMMON_H_
#define SAMPLERD_KERNELS_GPU_DEVICE_COMMON_H_

#include <cstdint>

#include "kernels/common/philox.h"
#include "kernels/common/sampling_types.h"
#include "kernels/common/temperature_threshold.h"
#include "kernels/gpu/platform.h"

namespace samplerd::kernels::gpu {

inline constexpr float kInfF = __builtin_huge_valf();

// Masses exp(z - max) in [0, 1] are summed as integers in units of 2^-31, so that sums do not
// depend on the order of atomics (bitwise-repeatable top-p), one token's mass fits 32 bits and
// a row of 2^22 tokens fits 53 bits (exact in double). Tokens below 2^-32 of the top token
// weigh 0 (the CPU oracle sums them in double: decisions can only differ when p * mass lands
// within ~1e-9 * V of a token boundary).
inline constexpr float kMassScale = 2147483648.0f;  // 2^31

// Order-preserving key: a > b as floats <=> Key(a) > Key(b) as unsigned. -0 maps onto +0
// because the float comparisons of the CPU oracle treat them as equal. Not for NaN.
__device__ __forceinline__ uint32_t OrderedKey(float f) {
  uint32_t bits = __float_as_uint(f);
  if ((bits << 1) == 0) bits = 0;
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

__device__ __forceinline__ float KeyToFloat(uint32_t key) {
  const uint32_t bits = (key & 0x80000000u) ? (key & 0x7fffffffu) : ~key;
  return __uint_as_float(bits);
}

inline constexpr uint32_t kNegInfKey = 0x007fffffu;  // OrderedKey(-inf)

// IEEE binary16 bits to fp32, exact for every value (subnormals without relying on the
// device's denormal mode).
__device__ __forceinline__ float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  const uint32_t mantissa = h & 0x3ffu;
  float magnitude;
  if (exponent == 0) {
    magnitude = static_cast<float>(mantissa) * 0x1.0p-24f;
  } else if (exponent == 0x1f) {
    magnitude = __uint_as_float(0x7f800000u | (mantissa << 13));
  } else {
    magnitude = __uint_as_float(((exponent + 112u) << 23) | (mantissa << 13));
  }
  return __uint_as_float(__float_as_uint(magnitude) | sign);
}

// Element i of a logits row, read in its storage type and widened to fp32.
template <DType kDType>
__device__ __forceinline__ float LoadLogit(const void* row, int64_t i) {
  if constexpr (kDType == DType::kFp32) {
    return static_cast<const float*>(row)[i];
  } else if constexpr (kDType == DType::kBf16) {
    return __uint_as_float(static_cast<uint32_t>(static_cast<const uint16_t*>(row)[i]) << 16);
  } else {
    return HalfToFloat(static_cast<const uint16_t*>(row)[i]);
  }
}

// Bytes of one group of 4 logits, and the alignment of its vector load.
template <DType kDType>
inline constexpr int kGroupBytes = kDType == DType::kFp32 ? 16 : 8;

// Whether every group at a 4-aligned index of a row starting at `row` is aligned for one vector
// load (LoadAlignedGroup).
template <DType kDType>
__device__ __forceinline__ bool GroupsAligned(const void* row) {
  return (reinterpret_cast<uintptr_t>(row) & (kGroupBytes<kDType> - 1)) == 0;
}

// The 4 logits at `p`, which is aligned to kGroupBytes: one vector load, no test.
template <DType kDType>
__device__ __forceinline__ void LoadAlignedGroup(const void* p, float* out) {
  if constexpr (kDType == DType::kFp32) {
    const float4 v = *static_cast<const float4*>(p);
    out[0] = v.x;
    out[1] = v.y;
    out[2] = v.z;
    out[3] = v.w;
  } else {
    const uint2 v = *static_cast<const uint2*>(p);
    const uint16_t h[4] = {static_cast<uint16_t>(v.x), static_cast<uint16_t>(v.x >> 16),
                           static_cast<uint16_t>(v.y), static_cast<uint16_t>(v.y >> 16)};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      out[e] = kDType == DType::kBf16 ? __uint_as_float(static_cast<uint32_t>(h[e]) << 16)
                                      : HalfToFloat(h[e]);
    }
  }
}

// Loads the 4 consecutive elements at `j` (4-aligned) of a row: one vector load when the
// address allows, else element by element; past `end` reads -inf.
template <DType kDType>
__device__ __forceinline__ void LoadGroup(const void* row, int64_t j, int64_t end, float* out) {
  if (j + 3 < end) {
    const char* p = static_cast<const char*>(row) + j * (kGroupBytes<kDType> / 4);
    if ((reinterpret_cast<uintptr_t>(p) & (kGroupBytes<kDType> - 1)) == 0) {
      LoadAlignedGroup<kDType>(p, out);
      return;
    }
  }
#pragma unroll
  for (int e = 0; e < 4; ++e) out[e] = j + e < end ? LoadLogit<kDType>(row, j + e) : -kInfF;
}

// Fixed-point mass of z given the row max.
__device__ __forceinline__ uint64_t FixedMass(float z, float row_max) {
  return static_cast<uint64_t>(expf(z - row_max) * kMassScale);
}

// The Philox key of `seed` and a decode position, in registers the compiler knows hold the same
// value in every lane (WaveUniform): the key schedule's adds are then made once, not per block,
// and the first round's product of the position once. The same bits as PhiloxKeyFromSeed. Every
// lane of the wave must call, with the same values (a row's parameters).
__device__ __forceinline__ PhiloxKey WaveUniformKey(uint64_t seed) {
  return PhiloxKey{
      {WaveUniform(static_cast<uint32_t>(seed)), WaveUniform(static_cast<uint32_t>(seed >> 32))}};
}
__device__ __forceinline__ uint64_t WaveUniformU64(uint64_t v) {
  return static_cast<uint64_t>(WaveUniform(static_cast<uint32_t>(v))) |
         static_cast<uint64_t>(WaveUniform(static_cast<uint32_t>(v >> 32))) << 32;
}

// U_j and G_j (philox.h) with a key and position from WaveUniformKey and WaveUniformU64: the
// same bits as PhiloxUniform and GumbelNoise.
__device__ __forceinline__ float UniformOf(const PhiloxKey& key, uint64_t position,
                                           uint64_t token) {
  return UniformFromBits(Philox4x32x10(PhiloxCounterFor(position, token), key).word[token & 3]);
}
__device__ __forceinline__ float GumbelOf(const PhiloxKey& key, uint64_t position, uint64_t token) {
  return GumbelFromUniform(UniformOf(key, position, token));
}

// A candidate for an argmax with the lowest index winning ties.
struct ArgMaxPair {
  float value;
  int64_t index;
};

__device__ __forceinline__ bool Better(const ArgMaxPair& a, const ArgMaxPair& b) {
  return a.value > b.value || (a.value == b.value && a.index < b.index);
}

// Reductions within one wave (kWaveSize lanes) by butterfly shuffles: a fixed tree, so the
// same inputs always give the same bits, and every lane gets the result.
__device__ __forceinline__ float WaveMax(float v) {
  for (int o = kWaveSize / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor(v, o, kWaveSize));
  return v;
}
__device__ __forceinline__ float WaveSum(float v) {
  for (int o = kWaveSize / 2; o > 0; o >>= 1) v += __shfl_xor(v, o, kWaveSize);
  return v;
}
__device__ __forceinline__ uint64_t WaveSumU64(uint64_t v) {
  for (int o = kWaveSize / 2; o > 0; o >>= 1) {
    v += static_cast<uint64_t>(__shfl_xor(static_cast<unsigned long long>(v), o, kWaveSize));
  }
  return v;
}
// A fixed butterfly: every lane gets the same bits, on every run.
__device__ __forceinline__ double WaveSumF64(double v) {
  for (int o = kWaveSize / 2; o > 0; o >>= 1) v += __shfl_xor(v, o, kWaveSize);
  return v;
}
__device__ __forceinline__ uint32_t WaveOr(uint32_t v) {
  for (int o = kWaveSize / 2; o > 0; o >>= 1) v |= __shfl_xor(v, o, kWaveSize);
  return v;
}
// True in every lane when `p` holds in any lane of the wave.
__device__ __forceinline__ bool WaveAny(bool p) {
#if defined(SAMPLERD_GPU_EMULATE)
  return WaveOr(p ? 1u : 0u) != 0u;
#elif defined(__HIPCC__)
  return __any(p) != 0;
#else
  return __any_sync(0xffffffffu, p) != 0;
#endif
}
__device__ __forceinline__ uint32_t WaveAnd(uint32_t v) {
  for (int o = kWaveSize / 2; o > 0; o >>= 1) v &= __shfl_xor(v, o, kWaveSize);
  return v;
}
__device__ __forceinline__ int WaveMinInt(int v) {
  for (int o = kWaveSize / 2; o > 0; o >>= 1) v = min(v, __shfl_xor(v, o, kWaveSize));
  return v;
}
__device__ __forceinline__ ArgMaxPair WaveArgMax(ArgMaxPair v) {
  for (int o = kWaveSize / 2; o > 0; o >>= 1) {
    const ArgMaxPair other{
        __shfl_xor(v.value, o, kWaveSize),
        static_cast<int64_t>(__shfl_xor(static_cast<long long>(v.index), o, kWaveSize))};
    if (Better(other, v)) v = other;
  }
  return v;
}

// Exclusive prefix sum of one int per lane, in lane order; *total gets the wave's sum (in every
// lane).
__device__ __forceinline__ int WaveExclusiveSum(int v, int* total) {
  const int lane = static_cast<int>(threadIdx.x) % kWaveSize;
  int inclusive = v;
  for (int o = 1; o < kWaveSize; o <<= 1) {
    const int up = __shfl_up(inclusive, o, kWaveSize);
    if (lane >= o) inclusive += up;
  }
  *total = __shfl(inclusive, kWaveSize - 1, kWaveSize);
  return inclusive - v;
}

// True in every thread of the block that arrives last among the `blocks` blocks counting on
// `ticket`; its reads then see every other block's writes. Every thread must call.
__device__ inline bool LastToArrive(uint32_t* ticket, uint32_t blocks, uint32_t* shared_ticket) {
  __threadfence();  // this block's writes are visible device-wide before its ticket is
  __syncthreads();
  if (threadIdx.x == 0) *shared_ticket = atomicAdd(ticket, 1u);
  __syncthreads();
  const bool last = *shared_ticket == blocks - 1;
  if (last) __threadfence();
  return last;
}

// Block-wide reductions: a wave reduction, then every thread combines the per-wave results in
// wave order. Two barriers per call; the result is the same bits in every thread. `kThreads`
// is the block size, a multiple of every wave size; every thread must call.
template <int kThreads>
struct BlockReduce {
  static constexpr int kMaxWaves = kThreads / kMinWaveSize;

  struct Storage {
    float f[kMaxWaves];
    int64_t i[kMaxWaves];
    uint64_t u[kMaxWaves];
    double d[kMaxWaves];
  };

  __device__ static int Waves() { return kThreads / kWaveSize; }
  __device__ static int Wave() { return static_cast<int>(threadIdx.x) / kWaveSize; }
  __device__ static bool Leader() { return threadIdx.x % kWaveSize == 0; }

  __device__ static float Max(Storage& s, float v) {
    v = WaveMax(v);
    if (Leader()) s.f[Wave()] = v;
    __syncthreads();
    float out = s.f[0];
    for (int w = 1; w < Waves(); ++w) out = fmaxf(out, s.f[w]);
    __syncthreads();
    return out;
  }

  __device__ static float Min(Storage& s, float v) { return -Max(s, -v); }

  // Max of *max_v and min of *min_v over the block, with the barriers of one reduction.
  __device__ static void MaxAndMin(Storage& s, float* max_v, float* min_v) {
    const float a = WaveMax(*max_v);
    const float b = -WaveMax(-*min_v);
    if (Leader()) {
      s.f[Wave()] = a;
      s.d[Wave()] = b;  // a float, exactly
    }
    __syncthreads();
    float max_out = s.f[0];
    float min_out = static_cast<float>(s.d[0]);
    for (int w = 1; w < Waves(); ++w) {
      max_out = fmaxf(max_out, s.f[w]);
      min_out = fminf(min_out, static_cast<float>(s.d[w]));
    }
    __syncthreads();
    *max_v = max_out;
    *min_v = min_out;
  }

  __device__ static float Sum(Storage& s, float v) {
    v = WaveSum(v);
    if (Leader()) s.f[Wave()] = v;
    __syncthreads();
    float out = s.f[0];
    for (int w = 1; w < Waves(); ++w) out += s.f[w];
    __syncthreads();
    return out;
  }

  __device__ static uint64_t SumU64(Storage& s, uint64_t v) {
    v = WaveSumU64(v);
    if (Leader()) s.u[Wave()] = v;
    __syncthreads();
    uint64_t out = 0;
    for (int w = 0; w < Waves(); ++w) out += s.u[w];
    __syncthreads();
    return out;
  }

  // Sum of doubles in a fixed order (the same bits on every run, whatever the timing).
  __device__ static double SumF64(Storage& s, double v) {
    for (int o = kWaveSize / 2; o > 0; o >>= 1) v += __shfl_xor(v, o, kWaveSize);
    if (Leader()) s.d[Wave()] = v;
    __syncthreads();
    double out = 0.0;
    for (int w = 0; w < Waves(); ++w) out += s.d[w];
    __syncthreads();
    return out;
  }

  __device__ static ArgMaxPair ArgMax(Storage& s, ArgMaxPair v) {
    v = WaveArgMax(v);
    if (Leader()) {
      s.f[Wave()] = v.value;
      s.i[Wave()] = v.index;
    }
    __syncthreads();
    ArgMaxPair out{s.f[0], s.i[0]};
    for (int w = 1; w < Waves(); ++w) {
      const ArgMaxPair other{s.f[w], s.i[w]};
      if (Better(other, out)) out = other;
    }
    __syncthreads();
    return out;
  }

  // Exclusive prefix sum of one value per thread (in thread order); *total gets the sum.
  __device__ static uint64_t ExclusiveScan(Storage& s, uint64_t v, uint64_t* total) {
    const int lane = static_cast<int>(threadIdx.x) % kWaveSize;
    uint64_t inclusive = v;
    for (int o = 1; o < kWaveSize; o <<= 1) {
      const uint64_t up = static_cast<uint64_t>(
          __shfl_up(static_cast<unsigned long long>(inclusive), o, kWaveSize));
      if (lane >= o) inclusive += up;
    }
    if (lane == kWaveSize - 1) s.u[Wave()] = inclusive;
    __syncthreads();
    uint64_t before = 0, sum = 0;
    for (int w = 0; w < Waves(); ++w) {
      if (w < Wave()) before += s.u[w];
      sum += s.u[w];
    }
    __syncthreads();
    *total = sum;
    return before + inclusive - v;
  }

  // Exclusive prefix sum of doubles in thread order, in a fixed order of additions (so the
  // same bits on every run); *total gets the sum.
  __device__ static double ExclusiveScanF64(Storage& s, double v, double* total) {
    const int lane = static_cast<int>(threadIdx.x) % kWaveSize;
    double inclusive = v;
    for (int o = 1; o < kWaveSize; o <<= 1) {
      const double up = __shfl_up(inclusive, o, kWaveSize);
      if (lane >= o) inclusive += up;
    }
    const double exclusive_in_wave = __shfl_up(inclusive, 1, kWaveSize);
    if (lane == kWaveSize - 1) s.d[Wave()] = inclusive;
    __syncthreads();
    double before = 0.0, sum = 0.0;
    for (int w = 0; w < Waves(); ++w) {
      if (w < Wave()) before += s.d[w];
      sum += s.d[w];
    }
    __syncthreads();
    *total = sum;
    return before + (lane == 0 ? 0.0 : exclusive_in_wave);
  }
};

// Whether a drawn token is one of the row's. Always, unless the logits changed between the
// launches of one call (an engine writing its buffers during a device-session step): then every
// filter may keep nothing that pass 1 saw, and a draw over nothing gives -1 or INT64_MAX.
__device__ __forceinline__ bool TokenInRow(int64_t token, int64_t vocab) {
  return token >= 0 && token < vocab;
}

// A row's token and status, by one thread: kOk, or, for a token outside the row (TokenInRow),
// -1 and kNoFinite, never an OK row with token -1.
__device__ __forceinline__ void WriteRowToken(int32_t* token_ids, RowStatus* status, int64_t row,
                                              int64_t token, int64_t vocab) {
  const bool ok = TokenInRow(token, vocab);
  token_ids[row] = ok ? static_cast<int32_t>(token) : -1;
  status[row] = ok ? RowStatus::kOk : RowStatus::kNoFinite;
}

}  // namespace samplerd::kernels::gpu

#endif  // SAMPLERD_KERNELS_GPU_DEVICE_COMMON_H_
