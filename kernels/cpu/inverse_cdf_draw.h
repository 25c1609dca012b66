// The CPU oracle's inverse-CDF draw of a plain-temperature row: kernels/common/inverse_cdf.h
// written out literally, one pass after another, in index order. kernels/cpu_fast falls back to
// it when its own sums cannot decide a row.
#ifndef SAMPLERD_KERNELS_CPU_INVERSE_CDF_DRAW_H_
#define SAMPLERD_KERNELS_CPU_INVERSE_CDF_DRAW_H_

#include <cstdint>

#include "kernels/common/sampling_types.h"

namespace samplerd::kernels {

// The token of the inverse-CDF draw over x[0, n), the row's logits after its processors, with
// p's temperature, seed and position (its filters are not read: the caller has checked
// IsPlainTemperature). Requires n >= 1, no NaN, and a finite max x / T (so the max x is finite
// and its mass is 1). Returns the lowest j whose index-order prefix sum of masses exceeds
// u * total; a token of mass 0 (x = -inf, or too far below the max) is never returned.
// Cost: two passes over the row, one exp per token. Thread-safe (reads only its arguments).
int32_t InverseCdfDraw(const float* x, int64_t n, const RowParams& p);

// The token of the chunked inverse-CDF draw of a top-p-alone row (kernels/common/inverse_cdf.h):
// z[0, n) the row's x / T, keep[j] != 0 for the kept set K (non-empty), z_max the row's max z
// (finite, in K). Never returns a token outside K. Cost: two exps per kept token of the row
// (level 0, then level 1), and one per token of the chosen chunk and segment again.
int32_t ChunkedInverseCdfDraw(const float* z, const uint8_t* keep, int64_t n, float z_max,
                              const RowParams& p);

}  // namespace samplerd::kernels

#endif  // SAMPLERD_KERNELS_CPU_INVERSE_CDF_DRAW_H_
