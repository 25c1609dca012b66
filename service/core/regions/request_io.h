// Binding a validated request to where its bytes are: the region leases it holds while it runs,
// the SampleIo a backend reads, and the checks that regions and events suit the backend.
#ifndef SAMPLERD_SERVICE_CORE_REGIONS_REQUEST_IO_H_
#define SAMPLERD_SERVICE_CORE_REGIONS_REQUEST_IO_H_

#include <vector>

#include "absl/status/statusor.h"
#include "service/core/backend/sampler.h"
#include "service/core/model/request.h"
#include "service/core/model/validated_batch.h"
#include "service/core/regions/ipc_event_cache.h"
#include "service/core/regions/region_registry.h"

namespace samplerd::core {

// What one request holds while it runs. Releasing it (destruction) releases the leases.
struct BoundIo {
  SampleIo io;
  RegionLease logits;   // empty for inline logits
  RegionLease output;   // empty without an output region
  RegionLease bitmask;  // empty without a token_bitmask region
  // Empty without a logit_bias / token_history region (ReadProcessorLists).
  RegionLease logit_bias;
  RegionLease token_history;
};

// Leases `request`'s regions in `regions` (the logits slice: InlineBytes of the batch; the
// output slice: B * 4 bytes; the token_bitmask slice: B * bitmask_words * 4 bytes) and opens
// its events through `events` (null: this server has no GPU IPC). `devices` names the
// server's devices in messages. io.logits (io.bitmask) points into request.inline_data
// (token_bitmask->inline_words) for inline data: the request must outlive the result.
//
// Errors: Acquire's (NOT_FOUND, OUT_OF_RANGE, INVALID_ARGUMENT for a malformed name), prefixed
// with the field; FAILED_PRECONDITION when a GPU region is not on `sampler`'s device, when the
// output is not in the same memory as the logits (host shm with host logits, GPU IPC with GPU
// IPC logits) or cannot be written, or when events reach a server without IPC events;
// INVALID_ARGUMENT for ready_event without GPU IPC logits or done_event without a GPU IPC
// output; RESOURCE_EXHAUSTED or OpenEvent's errors for a new event.
absl::StatusOr<BoundIo> BindSampleIo(const SampleRequest& request, const ValidatedBatch& batch,
                                     const Sampler& sampler, const RegionRegistry& regions,
                                     IpcEventCache* events, const std::vector<DeviceInfo>& devices);

// Reads the packed lists of request->logit_bias and token_history that name a region slice
// (processors.proto: LogitBias.region, TokenHistory.region) into their vectors for `batch`
// rows, sets their region_read, and keeps the leases in `bound` (after BindSampleIo, whose
// ready event a GPU IPC copy waits for). Lists given inline are left alone; ValidateProcessors
// then checks the lists read here as it checks inline ones. Host shm slices are copied with
// GuardedCopy, GPU IPC slices (on `sampler`'s device) through `ipc`. Cost: one copy of the
// slice's (B + 1) * 4 + N * 8 (bias) or + N * 9 (history) bytes for N = row_offsets[B], and one
// more into the vectors.
//
// Errors, prefixed with "<list>.region": Acquire's (NOT_FOUND; OUT_OF_RANGE when the region
// does not hold the offsets or the N entries they announce); INVALID_ARGUMENT for a slice not
// aligned to 4 bytes or N > B * V (no row can hold a token twice); RESOURCE_EXHAUSTED for a
// slice of more than `max_list_bytes` (Limits::max_region_list_bytes), checked before anything
// is allocated; FAILED_PRECONDITION for a GPU region off the sampler's device or a CPU server, a
// shm object truncated under us, or a failed device copy.
absl::Status ReadProcessorLists(int64_t batch, int64_t vocab, int64_t max_list_bytes,
                                const Sampler& sampler, const RegionRegistry& regions, GpuIpc* ipc,
                                const std::vector<DeviceInfo>& devices, SampleRequest* request,
                                BoundIo* bound);

}  // namespace samplerd::core

#endif  // SAMPLERD_SERVICE_CORE_REGIONS_REQUEST_IO_H_
