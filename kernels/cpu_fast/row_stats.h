// Phase 1 of FastCpuSampler: one pass over each row's chunks for the statistics that decide
// the row (NaN / -inf / +inf flags, max x, max and min finite z, the greedy argmax), and the
// decision itself: an output, or the plan of the passes the row still needs. Internal to
// kernels/cpu_fast.
#ifndef SAMPLERD_KERNELS_CPU_FAST_ROW_STATS_H_
#define SAMPLERD_KERNELS_CPU_FAST_ROW_STATS_H_

#include <cstdint>

#include "kernels/common/sampling_types.h"
#include "kernels/cpu_fast/row_state.h"

namespace samplerd::kernels::cpu_fast_internal {

// Phase 1 output of one (row, chunk).
struct ChunkStats {
  float max_value = -kInf;  // of x (greedy) or z
  float max_x = -kInf;      // of x (every row)
  float min_finite = kInf;  // smallest z > -inf
  int64_t arg = 0;          // greedy: first index of max_value
  bool nan_x = false;
  bool any_above_neg_inf = false;  // some x != -inf
  bool nan_z = false;
  bool pos_inf_z = false;
};

// The statistics of tokens [begin, begin + n) of row `row` (n <= kChunk), sampled with `p`.
// Uses the thread's scratch.
ChunkStats ComputeChunkStats(const SampleArgs& args, int64_t row, int64_t begin, int64_t n,
                             const RowParams& p);

// Combines the statistics of the row's consecutive token ranges stats[0, chunks) (any cut of
// the row gives the same result) in order and resets `r` for this call: sets its status and
// either its token (Plan::kDone) or its plan. A row to filter by top-k / top-p gets
// Plan::kSelect and its first stage; the caller then starts that stage (StartStage in
// radix_select.h). r.p must hold the row's parameters.
void Decide(const SampleArgs& args, const ChunkStats* stats, int64_t chunks, RowState& r);

}  // namespace samplerd::kernels::cpu_fast_internal

#endif  // SAMPLERD_KERNELS_CPU_FAST_ROW_STATS_H_
