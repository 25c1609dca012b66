// LoadChunk: fp32, fp16 and bf16 logits to fp32, one chunk at a time.
#include "kernels/cpu_fast/row_chunks.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "kernels/cpu/half_float.h"
#include "kernels/cpu_fast/cpu_features.h"

#if SAMPLERD_CPU_FAST_X86
#include <immintrin.h>
#endif

namespace samplerd::kernels::cpu_fast_internal {

void LoadChunk(const SampleArgs& args, int64_t row, int64_t begin, int64_t n, float* x) {
  const int64_t first = row * args.row_stride + begin;
  const auto* bytes = static_cast<const unsigned char*>(args.logits);
  switch (args.dtype) {
    case DType::kFp32:
      std::memcpy(x, bytes + first * 4, static_cast<size_t>(n) * 4);
      return;
    case DType::kFp16:
      for (int64_t j = 0; j < n; ++j) {
        uint16_t bits;
        std::memcpy(&bits, bytes + (first + j) * 2, sizeof(bits));
        x[j] = HalfBitsToFloat(bits);
      }
      return;
    case DType::kBf16:
      for (int64_t j = 0; j < n; ++j) {
        uint16_t bits;
        std::memcpy(&bits, bytes + (first + j) * 2, sizeof(bits));
        x[j] = Bf16BitsToFloat(bits);
      }
      return;
  }
  std::fill(x, x + n, std::numeric_limits<float>::quiet_NaN());
}

namespace {

#if SAMPLERD_CPU_FAST_X86
SAMPLERD_AVX2 void DivideAvx2(const unsigned char* x, int64_t n, float temperature, float* z) {
  const __m256 t = _mm256_set1_ps(temperature);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    _mm256_storeu_ps(z + j,
                     _mm256_div_ps(_mm256_loadu_ps(reinterpret_cast<const float*>(x + j * 4)), t));
  }
  for (; j < n; ++j) {
    float v;
    std::memcpy(&v, x + j * 4, 4);
    z[j] = v / temperature;
  }
}
#endif

}  // namespace

const float* ScaledChunk(const SampleArgs& args, int64_t row, int64_t begin, int64_t n,
                         float temperature, float* scratch) {
  const unsigned char* x = Fp32Chunk(args, row, begin);
  if (x == nullptr) {
    LoadChunk(args, row, begin, n, scratch);
    Scale(scratch, n, temperature);
    return scratch;
  }
  if (temperature == 1.0f && reinterpret_cast<uintptr_t>(x) % alignof(float) == 0) {
    return reinterpret_cast<const float*>(x);
  }
#if SAMPLERD_CPU_FAST_X86
  if (UseAvx2()) {
    DivideAvx2(x, n, temperature, scratch);
    return scratch;
  }
#endif
  for (int64_t j = 0; j < n; ++j) {
    float v;
    std::memcpy(&v, x + j * 4, 4);
    scratch[j] = v / temperature;
  }
  return scratch;
}

}  // namespace samplerd::kernels::cpu_fast_internal
