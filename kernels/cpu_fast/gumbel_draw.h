// Phase 3 of FastCpuSampler: the Gumbel-max draw over a row's survivors, with the oracle's
// Philox stream (kernels/common/philox.h) and the oracle's token.
//
// A token skips the noise when z + kGumbelAbove cannot reach the best score so far (or
// mx - kGumbelBelow, which the row's maximum always reaches); otherwise its Philox bits are
// drawn (one block per 4 tokens; with AVX2, 8 such blocks per call, with AVX-512 16) and the
// logs are taken only if z + (an upper bound of G for those bits' top 10 bits) can still reach
// it. The vector draws check that bound for a whole step of 256 tokens at once: bits below the
// lowest 10-bit bucket that the step's largest z needs are dropped with one compare, so on a
// near-flat row, where every token survives, the draw is its Philox calls. Every skip is exact.
// Internal to kernels/cpu_fast.
#ifndef SAMPLERD_KERNELS_CPU_FAST_GUMBEL_DRAW_H_
#define SAMPLERD_KERNELS_CPU_FAST_GUMBEL_DRAW_H_

#include <cstdint>

#include "kernels/common/sampling_types.h"
#include "kernels/cpu_fast/row_state.h"

namespace samplerd::kernels::cpu_fast_internal {

inline constexpr float kGumbelAbove = 16.7f;  // > the largest Gumbel noise, 16.636
inline constexpr float kGumbelBelow = 2.9f;   // > minus the smallest Gumbel noise, 2.812

// Builds the table of noise bounds the draw uses (otherwise built at the first draw).
void WarmNoiseBounds();

// Draws over tokens [t0, t1) of row `row` (t0 % 4 == 0: whole Philox blocks) and offers their
// best to r (under r.mu).
// Plan::kDraw: over the survivors, keys in [KeyOf(r.mx), r.draw_key]; Plan::kTopTiesDraw:
// uniformly over the tokens whose x is r.top_x.
void DrawChunks(const SampleArgs& args, int64_t row, int64_t t0, int64_t t1, RowState& r);

// Draws over r.candidates[0, kept) (sorted by z descending, then id) and offers the winner to
// r. Stops at the first candidate below r.min_threshold or r.k_threshold (JOINT: not a
// survivor), or once z plus the largest noise cannot reach the best score.
void DrawSorted(int64_t kept, RowState& r);

}  // namespace samplerd::kernels::cpu_fast_internal

#endif  // SAMPLERD_KERNELS_CPU_FAST_GUMBEL_DRAW_H_
