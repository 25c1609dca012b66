// Validation of sampling requests: every rule that makes a request INVALID_ARGUMENT (or
// RESOURCE_EXHAUSTED for limits), with messages of the form "expected X, got Y".
#ifndef SAMPLERD_SERVICE_CORE_VALIDATION_H_
#define SAMPLERD_SERVICE_CORE_VALIDATION_H_

#include <cstdint>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "kernels/common/sampling_types.h"
#include "service/core/options.h"
#include "service/core/request.h"

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
};

// Checks `request` against the semantics and `limits`, and returns the batch to sample.
// `next_seed` is called once per row that needs a server-chosen seed.
// Errors: INVALID_ARGUMENT for malformed requests (inline bytes that do not match the shape,
// no or two logits sources, event handles that are not 64 bytes, done_event without output),
// RESOURCE_EXHAUSTED for requests over `limits`. Region slices are checked later, when they are
// leased (BindSampleIo). Messages never echo the logits or handles.
absl::StatusOr<ValidatedBatch> ValidateSampleRequest(const SampleRequest& request,
                                                     const Limits& limits,
                                                     absl::FunctionRef<uint64_t()> next_seed);

// Bytes the inline data (or region slice) of a [batch, vocab] tensor with `row_stride` must hold.
int64_t InlineBytes(kernels::DType dtype, int64_t batch, int64_t vocab, int64_t row_stride);

}  // namespace samplerd::core

#endif  // SAMPLERD_SERVICE_CORE_VALIDATION_H_
