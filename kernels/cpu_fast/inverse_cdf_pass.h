// Phase 3 of FastCpuSampler for plain-temperature rows (Plan::kInverseCdf): the inverse-CDF draw
// of kernels/common/inverse_cdf.h, with the oracle's token (kernels/cpu/inverse_cdf_draw.h).
//
//   1. MassPieces, in parallel over a row's task ranges: the mass sum of each piece of kPiece
//      tokens (a piece cut short where a task range starts or ends), the masses by the
//      vectorised table exp of quantised_mass.h (within 2^-47 of the oracle's std::exp; one
//      glibc exp a token would cost ~8 ns, 3x the whole Gumbel draw), tokens far below the
//      row's max x left out (kSkipLogits).
//   2. FinishInverseCdf, in the row's last task to finish step 1: the pieces' sums combined in
//      index order, the piece where the running sum crosses u * total, that piece scanned
//      token by token in index order to the crossing token, with the oracle's own masses
//      (InverseCdfMass). The sums differ from the oracle's index-order prefix sums by at most
//      a proven margin (the comment of FinishInverseCdf in inverse_cdf_pass.cc); when the
//      target lies within that margin of the token's lower or upper boundary, or nothing
//      crosses, the row is drawn by the oracle's InverseCdfDraw itself. So the token is always
//      the oracle's; the fallback costs one more pass over the row on one thread and comes in
//      ~6 V^2 2^-53 of rows or fewer (1.5e-5 at V = 151,936; 7e-7 at 32,000).
// Internal to kernels/cpu_fast.
#ifndef SAMPLERD_KERNELS_CPU_FAST_INVERSE_CDF_PASS_H_
#define SAMPLERD_KERNELS_CPU_FAST_INVERSE_CDF_PASS_H_

#include <cstdint>

#include "kernels/common/sampling_types.h"
#include "kernels/cpu_fast/row_state.h"

namespace samplerd::kernels::cpu_fast_internal {

// Tokens per piece: the unit the finish scans (kChunk is a multiple of it).
inline constexpr int64_t kPiece = 512;

// Tokens with (x_max - x) / T beyond this (mass < e^-36 ~ 2.3e-16) are left out of the sums;
// their possible mass joins the margin (counted: left-out tokens x 2.3e-16 of a total >= 1,
// no more than the margin's rounding part, ~3 V 2^-53). 36 < 44 keeps every argument inside
// ExpNonPositive's domain. (At 28 the left-out part dominated the margin: ~5e-4 of randn * 3
// rows fell back at V = 32,000.)
inline constexpr double kSkipLogits = 36.0;

// Tokens [begin, begin + n) of row `row` as fp32 (n <= kChunk, inside one chunk): the logits
// themselves when they are fp32 and 4-byte aligned, else a copy in `scratch`.
const float* ReadX(const SampleArgs& args, int64_t row, int64_t begin, int64_t n, float* scratch);

// The approximate mass sum of the tokens of x[0, n) in the set (x >= r.keep_from), those left
// out (x < r.skip_below) excepted and counted in `left_out`: each mass ExpNonPositive((x -
// r.top_x) * r.inv_t), within 2^-47 of the oracle's exp (see FinishInverseCdf), in no set order.
double PieceMass(const float* x, int64_t n, const RowState& r, int64_t& left_out);

// The relative error allowed to PieceMass's masses (ExpNonPositive against std::exp; 2^-47
// proven in FinishInverseCdf's comment).
inline constexpr double kPieceMassError = 0x1.0p-40;

// The proven distance (FinishInverseCdf's comment) within which a sum formed here may differ
// from the oracle's sum of the same tokens' masses in index order, a target included: our
// masses are within `mass_error` (relative) of the oracle's; the oracle's terms pass through at
// most `oracle_depth` additions, ours through `our_depth`; `total` is our sum of everything,
// `left_out_tokens` tokens are missing from it with a mass of at most `skip_bound` each;
// `extra_margin` x total is added (tests force fallbacks so).
double ProvenMargin(double mass_error, double oracle_depth, double our_depth, double total,
                    int64_t left_out_tokens, double skip_bound, double extra_margin);

// Sets r.skip_below to `threshold` rounded up to a float (-inf below the floats) and
// r.skip_bound to the largest mass of a token below it (r.top_x and r.inv_t set).
void SetSkipBelow(double threshold, RowState& r);

// Prepares r (Plan::kInverseCdf, r.top_x the row's max x, r.p its parameters) for MassPieces.
void StartInverseCdf(RowState& r);

// Adds the mass sums of the pieces of tokens [t0, t1) of row `row` to r.pieces (under r.mu).
// Returns true in the one task whose range completes the row: that task calls FinishInverseCdf
// (the mutex orders every other task's pieces before it).
bool MassPieces(const SampleArgs& args, int64_t row, int64_t t0, int64_t t1, RowState& r);

// Sets r.token from r.pieces (every token of the row covered once). `extra_margin` (>= 0, a
// fraction of the row's total mass) widens the proven margin: tests set it to force the
// fallback. Returns true when the row was drawn by the oracle's InverseCdfDraw. Uses the
// thread's scratch.
bool FinishInverseCdf(const SampleArgs& args, int64_t row, double extra_margin, RowState& r);

}  // namespace samplerd::kernels::cpu_fast_internal

#endif  // SAMPLERD_KERNELS_CPU_FAST_INVERSE_CDF_PASS_H_
