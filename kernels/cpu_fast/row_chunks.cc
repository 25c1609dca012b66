// LoadChunk: fp32, fp16 and bf16 logits to fp32, one chunk at a time.
#include "kernels/cpu_fast/row_chunks.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "kernels/cpu/half_float.h"

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

}  // namespace samplerd::kernels::cpu_fast_internal
