// RowsIn: the rows every sampling pass reads (logits, per-row parameters, the chunk count, the
// device sessions' batch word and the logits processors), shared by the passes' parameter
// structs.
#ifndef SAMPLERD_KERNELS_GPU_ROWS_IN_H_
#define SAMPLERD_KERNELS_GPU_ROWS_IN_H_

#include <cstdint>

#include "kernels/common/sampling_types.h"
#include "kernels/gpu/device_common.h"
#include "kernels/gpu/platform.h"
#include "kernels/gpu/row_processors.h"

namespace samplerd::kernels::gpu {

struct RowsIn {
  const void* logits;  // [batch, row_stride] of the launch's dtype
  int64_t vocab;
  int64_t row_stride;       // elements
  const RowParams* params;  // [params_count]: 1 (every row) or batch
  int64_t params_count;
  int chunks;                    // per row (chunk_stats.h)
  const uint32_t* device_batch;  // null, or rows >= *device_batch exit (SampleArgs)
  RowProcessors procs;           // the logits processors (row_processors.h), or none

  // Device sessions launch for max_batch rows; a block of a row past the step's batch leaves at
  // once (a uniform branch, before any barrier).
  __device__ bool Skipped(int64_t row) const {
    return device_batch != nullptr && row >= *device_batch;
  }
  __device__ const RowParams& Params(int64_t row) const {
    return params[params_count == 1 ? 0 : row];
  }
  template <DType kDType>
  __device__ const void* Row(int64_t row) const {
    constexpr size_t kElem = kDType == DType::kFp32 ? 4 : 2;
    return static_cast<const char*>(logits) + row * row_stride * kElem;
  }
};

}  // namespace samplerd::kernels::gpu

#endif  // SAMPLERD_KERNELS_GPU_ROWS_IN_H_
