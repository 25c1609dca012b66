// Reading a row of logits in fixed chunks of kChunk tokens, as fp32 and scaled by the
// temperature: the unit of work of every FastCpuSampler pass. Internal to kernels/cpu_fast.
#ifndef SAMPLERD_KERNELS_CPU_FAST_ROW_CHUNKS_H_
#define SAMPLERD_KERNELS_CPU_FAST_ROW_CHUNKS_H_

#include <cstdint>

#include "kernels/common/sampling_types.h"

namespace samplerd::kernels::cpu_fast_internal {

// Tokens per chunk. Fixed, so that no decision depends on how a row was split over tasks.
inline constexpr int64_t kChunk = 8192;

// Reads tokens [begin, begin + n) of row `row` of args.logits as fp32 into x[0, n).
// n <= kChunk; NaNs for an unknown dtype.
void LoadChunk(const SampleArgs& args, int64_t row, int64_t begin, int64_t n, float* x);

// z = x / T in place (the oracle's fp32 division).
inline void Scale(float* x, int64_t n, float temperature) {
  for (int64_t j = 0; j < n; ++j) x[j] = x[j] / temperature;
}

// The bytes of token `begin` of row `row` when the logits are fp32 (read them in place: no
// copy), else null. The pointer need not be 4-byte aligned.
inline const unsigned char* Fp32Chunk(const SampleArgs& args, int64_t row, int64_t begin) {
  if (args.dtype != DType::kFp32) return nullptr;
  return static_cast<const unsigned char*>(args.logits) + (row * args.row_stride + begin) * 4;
}

// z = x / T for tokens [begin, begin + n) of row `row`: LoadChunk then Scale, in one pass.
// Returns the values: `scratch` (n floats), or the logits themselves when they are fp32,
// 4-byte aligned and T == 1 (x / 1 == x for every x).
const float* ScaledChunk(const SampleArgs& args, int64_t row, int64_t begin, int64_t n,
                         float temperature, float* scratch);

}  // namespace samplerd::kernels::cpu_fast_internal

#endif  // SAMPLERD_KERNELS_CPU_FAST_ROW_CHUNKS_H_
