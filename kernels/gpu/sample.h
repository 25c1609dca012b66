// Host launchers of the GPU sampling kernels (kernels/gpu/*.hip).
//
// Plain C++ on purpose: the server (compiled by the host compiler) includes it without HIP or
// CUDA headers. Streams travel as void* (hipStream_t / cudaStream_t); errors as the runtime's
// integer error code (0 = success), described by runtime.h's ErrorString.
#ifndef SAMPLERD_KERNELS_GPU_SAMPLE_H_
#define SAMPLERD_KERNELS_GPU_SAMPLE_H_

#include <cstddef>
#include <cstdint>

#include "kernels/common/sampling_types.h"

namespace samplerd::kernels::gpu {

using Stream = void*;

// Device workspace bytes that Sample needs for [batch, vocab] with `top_logprobs` (-1: none).
size_t SampleWorkspaceBytes(int64_t batch, int64_t vocab, int32_t top_logprobs);

// Samples `args` on `stream`. Every pointer in args (logits, params, outputs) is device memory
// of the current device; `workspace` holds SampleWorkspaceBytes(...) device bytes, zero-filled
// before the first call that uses it (ZeroDevice, runtime.h): a launch leaves its workspace fit
// for the next one of any shape, so a workspace is zeroed once, when it is allocated. Enqueues
// the work and returns without waiting. Same semantics as kernels/cpu (same Philox streams): greedy
// tokens are identical, sampled tokens differ only on float near-ties.
// Returns 0, or the runtime's error code from the launches.
int Sample(const SampleArgs& args, void* workspace, size_t workspace_bytes, Stream stream);

// Whether any of the `count` rows of `params` (host memory) has top-p as its only filter: the
// value for SampleArgs::top_p_rows when the caller has the params on the host.
bool HasTopPRows(const RowParams* params, int64_t count, int64_t vocab);

// Whether all `count` (> 0) rows of `params` (host memory) are greedy: the value for
// SampleArgs::all_greedy when the caller has the params on the host.
bool AllGreedy(const RowParams* params, int64_t count);

}  // namespace samplerd::kernels::gpu

#endif  // SAMPLERD_KERNELS_GPU_SAMPLE_H_
