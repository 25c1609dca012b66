// Validation of sampling requests: every rule that makes a request INVALID_ARGUMENT (or
// RESOURCE_EXHAUSTED for limits), with messages of the form "expected X, got Y".
#ifndef SAMPLERD_SERVICE_CORE_VALIDATION_H_
#define SAMPLERD_SERVICE_CORE_VALIDATION_H_

#include <cstdint>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "kernels/common/sampling_types.h"
#include "service/core/model/limits.h"
#include "service/core/model/request.h"
#include "service/core/model/validated_batch.h"

namespace samplerd::core {

// Checks `request` against the semantics and `limits`, and returns the batch to sample.
// `next_seed` is called once per row that needs a server-chosen seed.
// Errors: INVALID_ARGUMENT for malformed requests (inline bytes that do not match the shape,
// no or two logits sources, event handles that are not 64 bytes, done_event without output,
// parameters out of range, malformed logits processors: ValidateProcessors in processors.h),
// RESOURCE_EXHAUSTED for requests over `limits`. Region slices are checked later, when they are
// leased (BindSampleIo). Messages never echo the logits or handles.
absl::StatusOr<ValidatedBatch> ValidateSampleRequest(const SampleRequest& request,
                                                     const Limits& limits,
                                                     absl::FunctionRef<uint64_t()> next_seed);

// The byte count of `request`'s logits as inline data (InlineBytes of its dtype and shape), with
// the same errors as ValidateSampleRequest for the dtype and the shape (limits included). Lets a
// transport that assembles a step from pieces refuse it, or bound it, before collecting it.
absl::StatusOr<int64_t> ExpectedInlineBytes(const SampleRequest& request, const Limits& limits);

}  // namespace samplerd::core

#endif  // SAMPLERD_SERVICE_CORE_VALIDATION_H_
