// The per-token loops of the selection passes (radix_select.h): each token's histogram bin and
// quantised mass, and the tokens of a key range, in scalar, AVX2 and AVX-512 forms that give
// identical results (cpu_features.h). Internal to kernels/cpu_fast.
#ifndef SAMPLERD_KERNELS_CPU_FAST_BIN_KERNELS_H_
#define SAMPLERD_KERNELS_CPU_FAST_BIN_KERNELS_H_

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels/cpu_fast/cpu_features.h"
#include "kernels/cpu_fast/order_keys.h"
#include "kernels/cpu_fast/quantised_mass.h"
#include "kernels/cpu_fast/row_state.h"

#if SAMPLERD_CPU_FAST_X86
#include <immintrin.h>
#endif

namespace samplerd::kernels::cpu_fast_internal {

// How a histogram pass bins a token.
struct BinSpec {
  bool grid = false;  // GridBin(z, mx, scale) for z >= floor; else (KeyOf(z) - lo) >> shift
  float mx = 0.0f;
  float scale = kGridBinsPerLogit;
  int32_t window_lo = 0;  // grid: MassChunkWindowedAvx512's exact bins (RowState::window_lo)
  int32_t window_hi = kGridBins;
  float floor = 0.0f;
  uint32_t lo = 0;  // radix: keys [lo, lo + span]
  uint32_t span = 0;
  int shift = 0;
};

// Top-p passes add a token's count to bits 96.. of its bin's mass sum (one add per token: sums
// of < 2^32 masses <= 2^62 stay below 2^96); Advance unpacks them.
inline constexpr Mass kCountOne = static_cast<Mass>(1) << 96;

// The bin of z, -1 when z is outside the pass.
inline int32_t BinOf(const BinSpec& s, float z) {
  if (s.grid) return z >= s.floor ? GridBin(z, s.mx, s.scale) : -1;
  const uint32_t offset = KeyOf(z) - s.lo;
  return offset <= s.span ? static_cast<int32_t>(offset >> s.shift) : -1;
}

// Adds the tokens z[begin, n) in the pass to a thread's histogram: counts[bin] += 1, or with
// kMasses mass[bin] += kCountOne + the token's quantised mass. Returns 1 + the highest bin
// touched (0 if none).
template <bool kMasses>
int32_t HistogramChunkScalar(const BinSpec& s, const float* z, int64_t begin, int64_t n,
                             int64_t* counts, Mass* mass) {
  int32_t end = 0;
  for (int64_t j = begin; j < n; ++j) {
    const int32_t b = BinOf(s, z[j]);
    if (b < 0) continue;
    end = std::max(end, b + 1);
    if (kMasses) {
      mass[b] += kCountOne + QuantisedMass(z[j], s.mx);
    } else {
      ++counts[b];
    }
  }
  return end;
}

#if SAMPLERD_CPU_FAST_X86
// BinOf of 8 tokens: their bins (garbage outside the pass) and the lanes in the pass.
class BinsOf8 {
 public:
  SAMPLERD_AVX2 explicit BinsOf8(const BinSpec& s)
      : grid_(s.grid),
        mx_(_mm256_set1_ps(s.mx)),
        scale_(_mm256_set1_ps(s.scale)),
        floor_(_mm256_set1_ps(s.floor)),
        lo_(_mm256_set1_epi32(static_cast<int32_t>(s.lo))),
        span_(_mm256_set1_epi32(static_cast<int32_t>(s.span))),
        shift_(_mm_cvtsi32_si128(s.shift)) {}

  SAMPLERD_AVX2 __m256i operator()(__m256 v, __m256i* in) const {
    if (grid_) {
      *in = _mm256_castps_si256(_mm256_cmp_ps(v, floor_, _CMP_GE_OQ));
      const __m256 f = _mm256_mul_ps(_mm256_sub_ps(mx_, v), scale_);
      const __m256 on_grid =
          _mm256_cmp_ps(f, _mm256_set1_ps(static_cast<float>(kGridBins)), _CMP_LT_OQ);
      return _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(_mm256_set1_epi32(kGridBins)),
                                                  _mm256_castsi256_ps(_mm256_cvttps_epi32(f)),
                                                  on_grid));
    }
    const __m256i offset = _mm256_sub_epi32(KeyOf8(v), lo_);
    *in = _mm256_cmpeq_epi32(_mm256_min_epu32(offset, span_), offset);
    return _mm256_srl_epi32(offset, shift_);
  }

 private:
  bool grid_;
  __m256 mx_, scale_, floor_;
  __m256i lo_, span_;
  __m128i shift_;
};

// 1 + the highest bin of the lanes in `in`, for the running maximum `end`.
SAMPLERD_AVX2 inline __m256i MaxEnd(__m256i end, __m256i bin, __m256i in) {
  return _mm256_max_epi32(end, _mm256_and_si256(_mm256_add_epi32(bin, _mm256_set1_epi32(1)), in));
}

SAMPLERD_AVX2 inline int32_t MaxLanes(__m256i v) {
  alignas(32) int32_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), v);
  return *std::max_element(lanes, lanes + 8);
}

// HistogramChunkScalar<false> over [0, n): bins 8 at a time into `bins` (a token outside the
// pass to the spare counter counts[kHistBins]), then one add per token.
SAMPLERD_AVX2 inline int32_t CountChunkAvx2(const BinSpec& s, const float* z, int64_t n,
                                            int32_t* bins, int64_t* counts) {
  const BinsOf8 bins_of(s);
  const __m256i spare = _mm256_set1_epi32(kHistBins);
  __m256i end = _mm256_setzero_si256();
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    __m256i in;
    const __m256i bin = bins_of(_mm256_loadu_ps(z + j), &in);
    end = MaxEnd(end, bin, in);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(bins + j), _mm256_blendv_epi8(spare, bin, in));
  }
  for (int64_t i = 0; i < j; ++i) ++counts[bins[i]];
  counts[kHistBins] = 0;
  return std::max(MaxLanes(end), HistogramChunkScalar<false>(s, z, j, n, counts, nullptr));
}

// HistogramChunkScalar<true> over [0, n): bins 8 at a time, masses 4 at a time, then the adds
// for the tokens in the pass only.
SAMPLERD_AVX2 inline int32_t MassChunkAvx2(const BinSpec& s, const float* z, int64_t n,
                                           Mass* mass) {
  const BinsOf8 bins_of(s);
  const __m256d mxd = _mm256_set1_pd(static_cast<double>(s.mx));
  __m256i end = _mm256_setzero_si256();
  alignas(32) int32_t bins[8];
  alignas(32) uint64_t masses[8];
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m256 v = _mm256_loadu_ps(z + j);
    __m256i in;
    const __m256i bin = bins_of(v, &in);
    uint32_t lanes = static_cast<uint32_t>(_mm256_movemask_ps(_mm256_castsi256_ps(in)));
    if (lanes == 0) continue;
    end = MaxEnd(end, bin, in);
    _mm256_store_si256(reinterpret_cast<__m256i*>(bins), bin);
    _mm256_store_si256(
        reinterpret_cast<__m256i*>(masses),
        QuantisedMass4(_mm256_sub_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(v)), mxd)));
    _mm256_store_si256(
        reinterpret_cast<__m256i*>(masses + 4),
        QuantisedMass4(_mm256_sub_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)), mxd)));
    for (; lanes != 0; lanes &= lanes - 1) {
      const int i = __builtin_ctz(lanes);
      mass[bins[i]] += kCountOne + masses[i];
    }
  }
  return std::max(MaxLanes(end), HistogramChunkScalar<true>(s, z, j, n, nullptr, mass));
}

SAMPLERD_AVX512_WARNINGS_OFF
// MassChunkAvx2 with the masses 8 at a time (AVX-512 F + DQ).
SAMPLERD_AVX512 inline int32_t MassChunkAvx512(const BinSpec& s, const float* z, int64_t n,
                                               Mass* mass) {
  const ExpTable512 table;
  const BinsOf8 bins_of(s);
  const __m512d mxd = _mm512_set1_pd(static_cast<double>(s.mx));
  __m256i end = _mm256_setzero_si256();
  alignas(32) int32_t bins[8];
  alignas(64) uint64_t masses[8];
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m256 v = _mm256_loadu_ps(z + j);
    __m256i in;
    const __m256i bin = bins_of(v, &in);
    uint32_t lanes = static_cast<uint32_t>(_mm256_movemask_ps(_mm256_castsi256_ps(in)));
    if (lanes == 0) continue;
    end = MaxEnd(end, bin, in);
    _mm256_store_si256(reinterpret_cast<__m256i*>(bins), bin);
    _mm512_store_si512(masses, QuantisedMass8(_mm512_sub_pd(_mm512_cvtps_pd(v), mxd), table));
    for (; lanes != 0; lanes &= lanes - 1) {
      const int i = __builtin_ctz(lanes);
      mass[bins[i]] += kCountOne + masses[i];
    }
  }
  return std::max(MaxLanes(end), HistogramChunkScalar<true>(s, z, j, n, nullptr, mass));
}

// MassChunkAvx512 for a grid pass whose exact bins are [s.window_lo, s.window_hi] only
// (RowState::window_lo): the masses and counts of the tokens above the window are summed in
// vector lanes and added to bin window_lo - 1 once, those below the window to bin
// window_hi + 1. Integer sums, so the cumulative masses and counts of the bins from
// window_lo - 1 to window_hi, and the total, are exactly MassChunkAvx512's. The scalar add per
// token, half of that pass on a near-flat row, is left to the window's tokens. Touches only bins
// [max(0, window_lo - 1), window_hi + 1].
SAMPLERD_AVX512 inline int32_t MassChunkWindowedAvx512(const BinSpec& s, const float* z, int64_t n,
                                                       Mass* mass) {
  const ExpTable512 table;
  const BinsOf8 bins_of(s);
  const __m512d mxd = _mm512_set1_pd(static_cast<double>(s.mx));
  const __m256i lo = _mm256_set1_epi32(s.window_lo);
  const __m256i hi = _mm256_set1_epi32(s.window_hi);
  const __m512i low_half = _mm512_set1_epi64(0xFFFFFFFFLL);
  // Per lane, the masses' high and low 32-bit halves: < 2^40 and 2^42 over a chunk.
  __m512i above_hi = _mm512_setzero_si512(), above_lo = above_hi;
  __m512i below_hi = above_hi, below_lo = above_hi;
  int64_t above_count = 0, below_count = 0;
  __m256i end = _mm256_setzero_si256();
  alignas(32) int32_t bins[8];
  alignas(64) uint64_t masses[8];
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m256 v = _mm256_loadu_ps(z + j);
    __m256i in;
    const __m256i bin = bins_of(v, &in);
    if (_mm256_testz_si256(in, in)) continue;
    const __m256i out_above = _mm256_and_si256(_mm256_cmpgt_epi32(lo, bin), in);
    const __m256i out_below = _mm256_and_si256(_mm256_cmpgt_epi32(bin, hi), in);
    const __m256i inside = _mm256_andnot_si256(_mm256_or_si256(out_above, out_below), in);
    const auto above = static_cast<__mmask8>(_mm256_movemask_ps(_mm256_castsi256_ps(out_above)));
    const auto below = static_cast<__mmask8>(_mm256_movemask_ps(_mm256_castsi256_ps(out_below)));
    const __m512i q = QuantisedMass8(_mm512_sub_pd(_mm512_cvtps_pd(v), mxd), table);
    const __m512i q_hi = _mm512_srli_epi64(q, 32);
    const __m512i q_lo = _mm512_and_si512(q, low_half);
    above_hi = _mm512_mask_add_epi64(above_hi, above, above_hi, q_hi);
    above_lo = _mm512_mask_add_epi64(above_lo, above, above_lo, q_lo);
    below_hi = _mm512_mask_add_epi64(below_hi, below, below_hi, q_hi);
    below_lo = _mm512_mask_add_epi64(below_lo, below, below_lo, q_lo);
    above_count += __builtin_popcount(above);
    below_count += __builtin_popcount(below);
    uint32_t lanes = static_cast<uint32_t>(_mm256_movemask_ps(_mm256_castsi256_ps(inside)));
    if (lanes == 0) continue;
    end = MaxEnd(end, bin, inside);
    _mm256_store_si256(reinterpret_cast<__m256i*>(bins), bin);
    _mm512_store_si512(masses, q);
    for (; lanes != 0; lanes &= lanes - 1) {
      const int i = __builtin_ctz(lanes);
      mass[bins[i]] += kCountOne + masses[i];
    }
  }
  // The tail (< 8 tokens) as the lanes above: every bin touched is in
  // [window_lo - 1, window_hi + 1].
  int32_t last = MaxLanes(end);
  for (; j < n; ++j) {
    const int32_t b = BinOf(s, z[j]);
    if (b < 0) continue;
    const int32_t kept = std::clamp(b, s.window_lo - 1, s.window_hi + 1);
    mass[kept] += kCountOne + QuantisedMass(z[j], s.mx);
    last = std::max(last, kept + 1);
  }
  if (above_count > 0) {
    mass[s.window_lo - 1] +=
        (static_cast<Mass>(above_count) << 96) +
        (static_cast<Mass>(static_cast<uint64_t>(_mm512_reduce_add_epi64(above_hi))) << 32) +
        static_cast<uint64_t>(_mm512_reduce_add_epi64(above_lo));
    last = std::max(last, s.window_lo);
  }
  if (below_count > 0) {
    mass[s.window_hi + 1] +=
        (static_cast<Mass>(below_count) << 96) +
        (static_cast<Mass>(static_cast<uint64_t>(_mm512_reduce_add_epi64(below_hi))) << 32) +
        static_cast<uint64_t>(_mm512_reduce_add_epi64(below_lo));
    last = std::max(last, s.window_hi + 2);
  }
  return last;
}
SAMPLERD_AVX512_WARNINGS_ON

// Appends the tokens of z[0, n) with KeyOf(z) - lo <= span to `out`, 8 at a time; returns how
// many tokens it looked at (the rest, < 8, are the caller's).
SAMPLERD_AVX2 inline int64_t GatherAvx2(const float* z, int64_t begin, int64_t n, uint32_t lo,
                                        uint32_t span, std::vector<Candidate>& out) {
  const __m256i lov = _mm256_set1_epi32(static_cast<int32_t>(lo));
  const __m256i spanv = _mm256_set1_epi32(static_cast<int32_t>(span));
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    uint32_t mask = KeysInRange8(_mm256_loadu_ps(z + j), lov, spanv);
    for (; mask != 0; mask &= mask - 1) {
      const int64_t i = j + __builtin_ctz(mask);
      out.push_back({z[i], static_cast<int32_t>(begin + i)});
    }
  }
  return j;
}
#endif

}  // namespace samplerd::kernels::cpu_fast_internal

#endif  // SAMPLERD_KERNELS_CPU_FAST_BIN_KERNELS_H_
