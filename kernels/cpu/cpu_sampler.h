// CPU reference sampler: the exact semantics of docs/DESIGN.md, written to be obviously right.
//
// It is the CPU backend of the server and the oracle the GPU kernels are tested against, so it
// favours clarity over speed (it sorts where a kernel would select). Pure C++: no gRPC, protobuf
// or Abseil; the caller spreads rows over threads.
#ifndef SAMPLERD_KERNELS_CPU_CPU_SAMPLER_H_
#define SAMPLERD_KERNELS_CPU_CPU_SAMPLER_H_

#include <cstdint>

#include "kernels/common/sampling_types.h"

namespace samplerd::kernels {

// Samples rows [row_begin, row_end) of `args` (host memory), writing their outputs.
//
// `args` must already be validated (shapes, parameter ranges, processor entries); rows with NaN
// or no finite logit get status kNan / kNoFinite, rows the logits processors leave with no
// logit above -inf kNoAllowed, and token -1, without disturbing other rows. Calls on disjoint
// row ranges of the same args may run concurrently. Cost: O(V log V) per row.
void CpuSampleRows(const SampleArgs& args, int64_t row_begin, int64_t row_end);

}  // namespace samplerd::kernels

#endif  // SAMPLERD_KERNELS_CPU_CPU_SAMPLER_H_
