// Phase 2 of FastCpuSampler: the top-k and top-p thresholds of a row, at a cost bounded for any
// distribution.
//
// A stage's tokens are the finite z at or above its floor (top-k: the min-p survivors; top-p:
// the survivors of min-p and top-k, or in JOINT mode every finite z). Its first pass bins them
// on a grid below the row max (GridBin: 1,408 bins over the stage's span, at most 1/32 logit
// wide, then one bin for the rest), counting them (top-k) or summing their quantised masses
// (top-p, quantised_mass.h); the bin where the stage's boundary falls is then
//   - gathered with every token above it, when those are <= gather_cap: the stage (and the
//     draw, gumbel_draw.h) finishes on them, sorted into the oracle's order;
//   - gathered alone, when it holds <= gather_cap tokens: the threshold is found among them,
//     below the count and mass of the bins above, and the draw runs over the row;
//   - else refined by radix histogram passes over the order-preserving keys of z in its key
//     range (order_keys.h; <= kMaxBins bins per pass, at most 4 passes: 32 key bits, 10 per
//     pass), each ending the same three ways.
// At B = 1, V = 151,936 (randn * 3) a top-p 0.95 stage takes the grid pass and one gather of
// a few hundred tokens, where the radix passes alone took 3-4 passes with an exp per token in the
// first (tests/bench/HOST_PLANE_RESULTS.md, run 3); near-flat rows do the same since the grid
// spreads over the span (before, a radix pass too). No threshold depends on the grid: the
// counts and masses are exact, and the rule is applied token by token within the boundary bin.
// Internal to kernels/cpu_fast.
#ifndef SAMPLERD_KERNELS_CPU_FAST_RADIX_SELECT_H_
#define SAMPLERD_KERNELS_CPU_FAST_RADIX_SELECT_H_

#include <cstdint>

#include "kernels/common/sampling_types.h"
#include "kernels/cpu_fast/row_state.h"

namespace samplerd::kernels::cpu_fast_internal {

// Sets up the first pass of r's current stage (r.stage): a histogram over the stage's key
// range, or a gather when the stage is known to hold <= gather_cap tokens.
void StartStage(int64_t gather_cap, RowState& r);

// Whether row params `p` over `vocab` tokens may take NarrowMassWindow's sample (top-p, not
// greedy, a row of at least 16 x kWindowSample tokens): the stats pass then fills it.
bool WantsWindowSample(const RowParams& p, int64_t vocab);

// The stats pass's part of NarrowMassWindow's sample: the sampled tokens of [begin, begin + n)
// of row `row` into r.window_sample (sized kWindowSample). Tasks write disjoint entries.
void SampleForWindow(const SampleArgs& args, int64_t row, int64_t begin, int64_t n, RowState& r);

// Before the grid pass of a top-p stage (StartStage left r.pass == Pass::kHistogram, r.grid):
// estimates where the stage's boundary falls from the masses of a sample of the row's tokens
// and narrows the pass's exact bins to a window around it (RowState::window_lo), so that most
// tokens skip the per-bin add. A window that misses the boundary costs the grid pass again,
// never a different threshold (Advance). Leaves the window whole where the sample's masses are
// too uneven to say (a peaked row: few tokens hold the mass) or the row is short. Reads
// kWindowSample tokens: r.window_sample when the stats pass filled it (at B = 1 the row's
// tokens sit in the other threads' caches, and reading them here one by one cost ~20 µs on 12
// threads), else the row.
void NarrowMassWindow(const SampleArgs& args, int64_t row, RowState& r);

// The histogram pass over tokens [t0, t1) of row `row` (t0 % 4 == 0): adds their counts (and, for
// top-p, masses) per bin into r. Thread-safe against other chunks of the same row.
void Histogram(const SampleArgs& args, int64_t row, int64_t t0, int64_t t1, RowState& r);

// The gather pass over tokens [t0, t1) of row `row`: appends those with keys in
// [KeyOf(r.mx), r.gather_hi] to r.candidates. Thread-safe against other chunks of the same row.
void Gather(const SampleArgs& args, int64_t row, int64_t t0, int64_t t1, RowState& r);

// Runs once every chunk of the row's current pass is in. After a histogram pass: picks the bin
// holding the stage's boundary, then refines it, gathers the tokens at or above it, or (a single
// key) takes its value as the threshold; if the bin lies outside the pass's window
// (NarrowMassWindow), starts the grid pass again with every bin exact. After a gather pass:
// finishes the stage on the gathered tokens. Then starts the next stage, or leaves r.plan as
// Plan::kDraw (draw over keys <= r.draw_key) or Plan::kDone (token drawn from the gathered
// tokens).
void Advance(int64_t gather_cap, RowState& r);

}  // namespace samplerd::kernels::cpu_fast_internal

#endif  // SAMPLERD_KERNELS_CPU_FAST_RADIX_SELECT_H_
