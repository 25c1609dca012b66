// CPU reference sampler: the exact semantics of docs/DESIGN.md, written to be obviously right.
//
// It is the CPU backend of the server and the oracle the GPU kernels are tested against, so it
// favours clarity over speed (it sorts where a kernel would select). Pure C++: no gRPC, protobuf
// or Abseil; the caller spreads rows over threads.
#ifndef SAMPLERD_KERNELS_CPU_CPU_SAMPLER_H_
#define SAMPLERD_KERNELS_CPU_CPU_SAMPLER_H_

#include <atomic>
#include <cstdint>

#include "kernels/common/sampling_types.h"

namespace samplerd::kernels {

// Samples rows [row_begin, row_end) of `args` (host memory), writing their outputs.
//
// `args` must already be validated (shapes, parameter ranges, processor entries); rows with NaN
// or no finite logit get status kNan / kNoFinite, rows the logits processors leave with no
// logit above -inf kNoAllowed, and token -1, without disturbing other rows. Calls on disjoint
// row ranges of the same args may run concurrently. Cost: O(V log V) per row.
//
// `stop` (may be null) is read before each row: once it is true, the remaining rows are left
// unwritten and the call returns false, so that a server draining its work gives up a batch
// within one row per thread. Returns true when every row of the range was sampled.
bool CpuSampleRows(const SampleArgs& args, int64_t row_begin, int64_t row_end,
                   const std::atomic<bool>* stop = nullptr);

}  // namespace samplerd::kernels

#endif  // SAMPLERD_KERNELS_CPU_CPU_SAMPLER_H_
