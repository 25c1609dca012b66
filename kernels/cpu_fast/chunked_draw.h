// Phase 3 of FastCpuSampler for top-p-alone rows (Plan::kChunkedDraw): the chunked inverse-CDF
// draw of kernels/common/inverse_cdf.h over the kept set, with the oracle's token
// (kernels/cpu/inverse_cdf_draw.h, ChunkedInverseCdfDraw). No Philox word per kept token.
//
// The kept set is z >= keep_from (z = x / T, the oracle's fp32 division; keep_from the value of
// the selection's draw_key, the lowest kept z), the masses m_j = exp(z_j - z_max); its head is
// z >= head_from (the tokens above keep_from's DrawBin, computed once a row), its tail the rest.
//   1. ChunkedMassPieces, in parallel over the row's task ranges, on z and the kept set: the
//      approximate masses of each piece's head and tail (a piece: a task range cut at the
//      draw's chunks), by the float exp of float_mass.h (within 2^-22 of the oracle's masses,
//      16 tokens a step; with AVX-512 or AVX2, a piece that keeps fewer than half its tokens
//      packs them first), one exp a token and the two parts' sums told apart by a mask.
//   2. FinishChunkedDraw, in the task that completes the row: level 0 (head or tail) from the
//      pieces' two sums; level 1 from the chosen part's sums per chunk of kDrawChunk tokens;
//      level 2 from the chosen chunk's segment sums of that part, by the same float exp (or,
//      for the ~4e-4 of targets within its margin of a segment boundary, by the double exp of
//      inverse_cdf_pass.h, PieceMass, within 2^-47); level 3 from the chosen segment's exact
//      masses of that part (KeptMass), exactly as the oracle. Levels 0, 1 and 2 take their unit
//      only when the target clears its boundaries by a proven margin (ProvenMargin, with the
//      masses' error); otherwise the row is drawn by the oracle's ChunkedInverseCdfDraw itself
//      (~3e-5 of rows), so the token is always the oracle's.
// Rows whose kept tokens were all gathered by the selection draw from them directly
// (DrawChunkedGathered), with the oracle's own sums, level 0 included.
// Internal to kernels/cpu_fast.
#ifndef SAMPLERD_KERNELS_CPU_FAST_CHUNKED_DRAW_H_
#define SAMPLERD_KERNELS_CPU_FAST_CHUNKED_DRAW_H_

#include <cstdint>

#include "kernels/common/sampling_types.h"
#include "kernels/cpu_fast/row_state.h"

namespace samplerd::kernels::cpu_fast_internal {

// Prepares r (Plan::kChunkedDraw: r.mx the row's max z, r.draw_key its kept keys' bound) for
// ChunkedMassPieces.
void StartChunkedDraw(RowState& r);

// Adds the float mass sums of tokens [t0, t1) of row `row`, one piece per draw chunk they
// touch, to r.pieces (under r.mu). Returns true in the one task whose range completes the row:
// that task calls FinishChunkedDraw (the mutex orders every other task's pieces before it).
bool ChunkedMassPieces(const SampleArgs& args, int64_t row, int64_t t0, int64_t t1, RowState& r);

// Sets r.token from r.pieces (every token of the row covered once). `extra_margin` as
// FinishInverseCdf's. Returns true when the row was drawn by the oracle's
// ChunkedInverseCdfDraw. Uses the thread's scratch.
bool FinishChunkedDraw(const SampleArgs& args, int64_t row, double extra_margin, RowState& r);

// Draws over r.candidates[0, kept), every kept token of the row (any order), with the oracle's
// sums; sets r.token and Plan::kDone.
void DrawChunkedGathered(int64_t kept, RowState& r);

}  // namespace samplerd::kernels::cpu_fast_internal

#endif  // SAMPLERD_KERNELS_CPU_FAST_CHUNKED_DRAW_H_
