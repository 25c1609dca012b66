// A sampling request after validation: what a Sampler (backend/sampler.h) samples.
#ifndef SAMPLERD_SERVICE_CORE_MODEL_VALIDATED_BATCH_H_
#define SAMPLERD_SERVICE_CORE_MODEL_VALIDATED_BATCH_H_

#include <cstdint>
#include <vector>

#include "kernels/common/sampling_types.h"

namespace samplerd::core {

// A request that passed validation, with defaults applied: ready for a Sampler.
struct ValidatedBatch {
  kernels::DType dtype = kernels::DType::kFp32;
  int64_t batch = 0;
  int64_t vocab = 0;
  int64_t row_stride = 0;  // elements, >= vocab
  // One entry (broadcast) or `batch` entries. Rows without a client seed get their own
  // server seed, so a broadcast without a seed is expanded to one entry per row.
  std::vector<kernels::RowParams> params;
  int32_t top_logprobs = -1;  // -1: no logprobs
  kernels::LogprobSource logprob_source = kernels::LogprobSource::kRaw;
  // The seed each row uses (returned to the client).
  std::vector<uint64_t> seeds;
  // Logits processors (empty / 0: none). The bias, history and penalties merged per row:
  // row r's entries are adjusts[adjust_offsets[r] .. adjust_offsets[r + 1]), sorted by token,
  // no token twice (kernels::SampleArgs). The bitmask's words are in SampleIo::bitmask.
  std::vector<uint32_t> adjust_offsets;  // batch + 1 entries, or empty
  std::vector<kernels::TokenAdjust> adjusts;
  int64_t bitmask_words = 0;  // ceil(vocab / 32) when the request has a bitmask, else 0
};

// Bytes the inline data (or region slice) of a [batch, vocab] tensor with `row_stride` must hold.
inline int64_t InlineBytes(kernels::DType dtype, int64_t batch, int64_t vocab, int64_t row_stride) {
  const int64_t stride = row_stride == 0 ? vocab : row_stride;
  return ((batch - 1) * stride + vocab) * kernels::DTypeSize(dtype);
}

}  // namespace samplerd::core

#endif  // SAMPLERD_SERVICE_CORE_MODEL_VALIDATED_BATCH_H_
