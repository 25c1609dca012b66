// Phase 2 of FastCpuSampler: the top-k and top-p thresholds of a row by radix selection over
// the order-preserving keys of z (order_keys.h), at a cost bounded for any distribution.
//
// A stage's tokens are the finite z at or above its floor (top-k: the min-p survivors; top-p:
// the survivors of min-p and top-k, or in JOINT mode every finite z). Each histogram pass counts
// (top-k) or sums the quantised masses (top-p) of those tokens in <= kMaxBins bins of a key
// range, and the next pass refines only the bin holding the boundary: at most 4 passes per
// stage (32 key bits, 10 per pass). Once the tokens at or above the boundary bin number <=
// gather_cap, a gather pass collects them and the stage (and the draw, gumbel_draw.h) finishes
// on them, sorted into the oracle's order. Internal to kernels/cpu_fast.
#ifndef SAMPLERD_KERNELS_CPU_FAST_RADIX_SELECT_H_
#define SAMPLERD_KERNELS_CPU_FAST_RADIX_SELECT_H_

#include <cstdint>

#include "kernels/common/sampling_types.h"
#include "kernels/cpu_fast/row_state.h"

namespace samplerd::kernels::cpu_fast_internal {

// Sets up the first pass of r's current stage (r.stage): a histogram over the stage's key
// range, or a gather when the stage is known to hold <= gather_cap tokens.
void StartStage(int64_t gather_cap, RowState& r);

// The histogram pass over chunks [c0, c1) of row `row`: adds their tokens' counts (and, for
// top-p, masses) per bin into r. Thread-safe against other chunks of the same row.
void Histogram(const SampleArgs& args, int64_t row, int64_t c0, int64_t c1, RowState& r);

// The gather pass over chunks [c0, c1) of row `row`: appends their tokens with keys in
// [KeyOf(r.mx), r.gather_hi] to r.candidates. Thread-safe against other chunks of the same row.
void Gather(const SampleArgs& args, int64_t row, int64_t c0, int64_t c1, RowState& r);

// Runs once every chunk of the row's current pass is in. After a histogram pass: picks the bin
// holding the stage's boundary, then refines it, gathers the tokens at or above it, or (a single
// key) takes its value as the threshold. After a gather pass: finishes the stage on the gathered
// tokens. Then starts the next stage, or leaves r.plan as Plan::kDraw (draw over keys <=
// r.draw_key) or Plan::kDone (token drawn from the gathered tokens).
void Advance(int64_t gather_cap, RowState& r);

}  // namespace samplerd::kernels::cpu_fast_internal

#endif  // SAMPLERD_KERNELS_CPU_FAST_RADIX_SELECT_H_
