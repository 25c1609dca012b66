// The chunked draw's level 1 and level 2 weights (chunked_draw.h): the float masses of
// float_mass.h summed over a piece or over each segment of a chunk, in scalar, AVX2 + FMA and
// AVX-512 forms (all within kFloatMassError per term; they need not give the same bits).
// Included by chunked_draw.cc only. Internal to kernels/cpu_fast.
#ifndef SAMPLERD_KERNELS_CPU_FAST_CHUNK_WEIGHTS_H_
#define SAMPLERD_KERNELS_CPU_FAST_CHUNK_WEIGHTS_H_

#include <algorithm>
#include <array>
#include <cstdint>

#include "kernels/common/inverse_cdf.h"
#include "kernels/cpu_fast/cpu_features.h"
#include "kernels/cpu_fast/float_mass.h"
#include "kernels/cpu_fast/row_state.h"

#if SAMPLERD_CPU_FAST_X86
#include <immintrin.h>
#endif

namespace samplerd::kernels::cpu_fast_internal {
namespace chunk_weights_detail {

// Level 1's and level 2's weights: the float masses (float_mass.h) of the kept tokens of a
// piece or segment, summed in double (the vector paths first add two tokens' masses in float:
// one more rounding, which kFloatMassError covers). Kept: z >= from = max(r.keep_from,
// r.skip_below); tokens of the set below skip_below are counted in `left_out` when kLeftOut
// (skip_below > keep_from; else there are none). Every kept z is in [r.mx - 36, r.mx], inside
// FloatKeptMass's domain. No branch on the data (a randn x 3 row keeps ~9% of its tokens,
// scattered: a branch per block mispredicts).
#if SAMPLERD_CPU_FAST_X86
// The masses of 16 tokens, two vectors of 8 added lane by lane, with AVX2 + FMA.
template <bool kLeftOut>
struct Avx2Masses {
  __m256 table_lo, table_hi, mx, from, keep;

  SAMPLERD_AVX2_FMA Avx2Masses(const RowState& r, float from_value)
      : table_lo(_mm256_loadu_ps(kExp2Sixteenths)),
        table_hi(_mm256_loadu_ps(kExp2Sixteenths + 8)),
        mx(_mm256_set1_ps(r.mx)),
        from(_mm256_set1_ps(from_value)),
        keep(_mm256_set1_ps(r.keep_from)) {}

  // The lanes of v kept (all bits set), left-out tokens counted.
  SAMPLERD_AVX2_FMA __m256 Kept(__m256 v, int64_t& left_out) const {
    const __m256 kept = _mm256_cmp_ps(v, from, _CMP_GE_OQ);
    if constexpr (kLeftOut) {
      const int in_set = _mm256_movemask_ps(_mm256_cmp_ps(v, keep, _CMP_GE_OQ));
      left_out += __builtin_popcount(static_cast<unsigned>(in_set & ~_mm256_movemask_ps(kept)));
    }
    return kept;
  }

  // The masses of v's lanes in kept_v and w's in kept_w, added lane by lane, in 4 double
  // lanes. Lanes not kept (-inf included) may compute anything: the masks zero them.
  SAMPLERD_AVX2_FMA __m256d Pair(__m256 v, __m256 kept_v, __m256 w, __m256 kept_w) const {
    const __m256 f =
        _mm256_add_ps(_mm256_and_ps(FloatKeptMass8(v, mx, table_lo, table_hi), kept_v),
                      _mm256_and_ps(FloatKeptMass8(w, mx, table_lo, table_hi), kept_w));
    return _mm256_add_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(f)),
                         _mm256_cvtps_pd(_mm256_extractf128_ps(f, 1)));
  }

  // z[0, 16) in 4 double lanes.
  SAMPLERD_AVX2_FMA __m256d Sixteen(const float* z, int64_t& left_out) const {
    const __m256 v = _mm256_loadu_ps(z);
    const __m256 w = _mm256_loadu_ps(z + 8);
    return Pair(v, Kept(v, left_out), w, Kept(w, left_out));
  }
};

SAMPLERD_AVX2_FMA inline double SumLanes(__m256d v) {
  alignas(32) double lanes[4];
  _mm256_store_pd(lanes, v);
  return (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
}

template <bool kLeftOut>
SAMPLERD_AVX2_FMA int64_t PieceAvx2(const float* z, int64_t n, const RowState& r, float from,
                                    double& sum, int64_t& left_out) {
  const Avx2Masses<kLeftOut> masses(r, from);
  __m256d acc = _mm256_setzero_pd();
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) acc = _mm256_add_pd(acc, masses.Sixteen(z + j, left_out));
  sum += SumLanes(acc);
  return j;
}

// For each 8-bit mask, the indices of its set bits in order, a byte each: the permute that
// packs those lanes first (AVX2 has no compress).
constexpr std::array<uint64_t, 256> MakePackIndices() {
  std::array<uint64_t, 256> indices{};
  for (int mask = 0; mask < 256; ++mask) {
    int count = 0;
    for (int lane = 0; lane < 8; ++lane) {
      if (mask & (1 << lane)) indices[mask] |= static_cast<uint64_t>(lane) << (8 * count++);
    }
  }
  return indices;
}
inline constexpr std::array<uint64_t, 256> kPackIndices = MakePackIndices();

// PackedPieceAvx512 (below) with AVX2 + FMA: the permute of kPackIndices for the compress.
template <bool kLeftOut>
SAMPLERD_AVX2_FMA int64_t PackedPieceAvx2(const float* z, int64_t n, const RowState& r, float from,
                                          float* packed, double& sum, int64_t& left_out) {
  const Avx2Masses<kLeftOut> masses(r, from);
  int64_t count = 0;
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m256 v = _mm256_loadu_ps(z + j);
    const auto kept = static_cast<unsigned>(_mm256_movemask_ps(masses.Kept(v, left_out)));
    const __m256i index = _mm256_cvtepu8_epi32(
        _mm_loadl_epi64(reinterpret_cast<const __m128i*>(&kPackIndices[kept])));
    _mm256_storeu_ps(packed + count, _mm256_permutevar8x32_ps(v, index));
    count += __builtin_popcount(kept);
  }
  const __m256 all = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
  __m256d acc = _mm256_setzero_pd();
  int64_t i = 0;
  for (; i + 16 <= count; i += 16) {
    acc = _mm256_add_pd(
        acc, masses.Pair(_mm256_loadu_ps(packed + i), all, _mm256_loadu_ps(packed + i + 8), all));
  }
  // [0, 16) lanes left: those below `rest` (beyond: stale floats).
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i rest = _mm256_set1_epi32(static_cast<int>(count - i));
  const __m256 kept_v = _mm256_castsi256_ps(_mm256_cmpgt_epi32(rest, lane));
  const __m256 kept_w =
      _mm256_castsi256_ps(_mm256_cmpgt_epi32(rest, _mm256_add_epi32(lane, _mm256_set1_epi32(8))));
  acc = _mm256_add_pd(acc, masses.Pair(_mm256_loadu_ps(packed + i), kept_v,
                                       _mm256_loadu_ps(packed + i + 8), kept_w));
  sum += SumLanes(acc);
  return j;
}

template <bool kLeftOut>
SAMPLERD_AVX2_FMA int64_t SegmentsAvx2(const float* z, int64_t n, const RowState& r, float from,
                                       double* weight, int64_t& left_out) {
  static_assert(kDrawSegment == 32, "two steps of 16 a segment");
  const Avx2Masses<kLeftOut> masses(r, from);
  int64_t j = 0;
  for (; j + 32 <= n; j += 32) {
    weight[j / 32] = SumLanes(
        _mm256_add_pd(masses.Sixteen(z + j, left_out), masses.Sixteen(z + j + 16, left_out)));
  }
  return j;
}

SAMPLERD_AVX512_WARNINGS_OFF

// The masses of 32 tokens, two vectors of 16 added lane by lane, with AVX-512 F + DQ.
template <bool kLeftOut>
struct Avx512Masses {
  __m512 table, mx, from, keep;

  SAMPLERD_AVX512 Avx512Masses(const RowState& r, float from_value)
      : table(_mm512_loadu_ps(kExp2Sixteenths)),
        mx(_mm512_set1_ps(r.mx)),
        from(_mm512_set1_ps(from_value)),
        keep(_mm512_set1_ps(r.keep_from)) {}

  SAMPLERD_AVX512 __mmask16 Kept(__m512 v, int64_t& left_out) const {
    const __mmask16 kept = _mm512_cmp_ps_mask(v, from, _CMP_GE_OQ);
    if constexpr (kLeftOut) {
      const __mmask16 in_set = _mm512_cmp_ps_mask(v, keep, _CMP_GE_OQ);
      left_out += __builtin_popcount(static_cast<unsigned>(in_set & ~kept) & 0xffffu);
    }
    return kept;
  }

  // The masses of v's lanes in kept_v and w's in kept_w, added lane by lane, in 8 double
  // lanes. Lanes not kept (-inf included) may compute anything: the masks leave them out.
  SAMPLERD_AVX512 __m512d Pair(__m512 v, __mmask16 kept_v, __m512 w, __mmask16 kept_w) const {
    const __m512 m = _mm512_maskz_mov_ps(kept_v, FloatKeptMass16(v, mx, table));
    const __m512 f = _mm512_mask_add_ps(m, kept_w, m, FloatKeptMass16(w, mx, table));
    return _mm512_add_pd(_mm512_cvtps_pd(_mm512_castps512_ps256(f)),
                         _mm512_cvtps_pd(_mm512_extractf32x8_ps(f, 1)));
  }

  // z[0, 32) in 8 double lanes.
  SAMPLERD_AVX512 __m512d ThirtyTwo(const float* z, int64_t& left_out) const {
    const __m512 v = _mm512_loadu_ps(z);
    const __m512 w = _mm512_loadu_ps(z + 16);
    return Pair(v, Kept(v, left_out), w, Kept(w, left_out));
  }
};

SAMPLERD_AVX512 inline double SumLanes(__m512d v) {
  alignas(64) double lanes[8];
  _mm512_store_pd(lanes, v);
  return ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) +
         ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
}

template <bool kLeftOut>
SAMPLERD_AVX512 int64_t PieceAvx512(const float* z, int64_t n, const RowState& r, float from,
                                    double& sum, int64_t& left_out) {
  const Avx512Masses<kLeftOut> masses(r, from);
  __m512d acc = _mm512_setzero_pd();
  int64_t j = 0;
  for (; j + 32 <= n; j += 32) acc = _mm512_add_pd(acc, masses.ThirtyTwo(z + j, left_out));
  sum += SumLanes(acc);
  return j;
}

// PieceAvx512 for a piece that keeps few of its tokens: the kept z packed into `packed` first
// (n + 32 floats; a register compress and a full store a step), then their masses 32 at a time,
// so that no exp is spent on a lane that is not kept. A randn x 3 row at top-p 0.95 keeps ~9% of
// its tokens: level 1 took 19 µs instead of 37 (a microbenchmark at V = 151,936); packing a
// flat row (95% kept) cost 49. The break-even is near half kept (PackThePiece).
template <bool kLeftOut>
SAMPLERD_AVX512 int64_t PackedPieceAvx512(const float* z, int64_t n, const RowState& r, float from,
                                          float* packed, double& sum, int64_t& left_out) {
  const Avx512Masses<kLeftOut> masses(r, from);
  int64_t count = 0;
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) {
    const __m512 v = _mm512_loadu_ps(z + j);
    const __mmask16 kept = masses.Kept(v, left_out);
    _mm512_storeu_ps(packed + count, _mm512_maskz_compress_ps(kept, v));
    count += __builtin_popcount(static_cast<unsigned>(kept));
  }
  __m512d acc = _mm512_setzero_pd();
  int64_t i = 0;
  for (; i + 32 <= count; i += 32) {
    acc = _mm512_add_pd(acc, masses.Pair(_mm512_loadu_ps(packed + i), 0xFFFF,
                                         _mm512_loadu_ps(packed + i + 16), 0xFFFF));
  }
  const int64_t rest = count - i;  // [0, 32): the lanes below it (beyond: stale floats)
  const auto kept_v = static_cast<__mmask16>(rest >= 16 ? 0xFFFF : (1u << rest) - 1);
  const auto kept_w = static_cast<__mmask16>(rest > 16 ? (1u << (rest - 16)) - 1 : 0);
  acc = _mm512_add_pd(acc, masses.Pair(_mm512_loadu_ps(packed + i), kept_v,
                                       _mm512_loadu_ps(packed + i + 16), kept_w));
  sum += SumLanes(acc);
  return j;
}

template <bool kLeftOut>
SAMPLERD_AVX512 int64_t SegmentsAvx512(const float* z, int64_t n, const RowState& r, float from,
                                       double* weight, int64_t& left_out) {
  static_assert(kDrawSegment == 32, "one step of 32 a segment");
  const Avx512Masses<kLeftOut> masses(r, from);
  int64_t j = 0;
  for (; j + 32 <= n; j += 32) weight[j / 32] = SumLanes(masses.ThirtyTwo(z + j, left_out));
  return j;
}

SAMPLERD_AVX512_WARNINGS_ON
#endif

// The float mass sum of the kept tokens of z[0, n), in double.
template <bool kLeftOut>
double ScalarMasses(const float* z, int64_t n, const RowState& r, float from, int64_t& left_out) {
  double sum = 0.0;
  for (int64_t j = 0; j < n; ++j) {
    if (z[j] >= from) {
      sum += FloatKeptMass(z[j], r.mx);
    } else if (kLeftOut && z[j] >= r.keep_from) {
      ++left_out;
    }
  }
  return sum;
}

// True when fewer than half of 64 tokens spread over z[0, n) are >= from: PackedPieceAvx512
// then costs less than PieceAvx512. (Either gives a sum within the same bound.)
inline bool PackThePiece(const float* z, int64_t n, float from) {
  constexpr int kSample = 64;
  if (n < 4 * kSample) return false;
  int kept = 0;
  for (int k = 0; k < kSample; ++k) kept += z[k * n / kSample] >= from ? 1 : 0;
  return kept < kSample / 2;
}

template <bool kLeftOut>
double FloatPieceMassOf(const float* z, int64_t n, const RowState& r, float from,
                        int64_t& left_out) {
  double sum = 0.0;
  int64_t j = 0;
#if SAMPLERD_CPU_FAST_X86
  const bool pack = PackThePiece(z, n, from);
  if (UseAvx512() && pack) {
    j = PackedPieceAvx512<kLeftOut>(z, n, r, from, Scratch().packed.data(), sum, left_out);
  } else if (UseAvx512()) {
    j = PieceAvx512<kLeftOut>(z, n, r, from, sum, left_out);
  } else if (UseAvx2Fma() && pack) {
    j = PackedPieceAvx2<kLeftOut>(z, n, r, from, Scratch().packed.data(), sum, left_out);
  } else if (UseAvx2Fma()) {
    j = PieceAvx2<kLeftOut>(z, n, r, from, sum, left_out);
  }
#endif
  return sum + ScalarMasses<kLeftOut>(z + j, n - j, r, from, left_out);
}

template <bool kLeftOut>
void FloatSegmentMassesOf(const float* z, int64_t n, const RowState& r, float from, double* weight,
                          int64_t& left_out) {
  int64_t j = 0;
#if SAMPLERD_CPU_FAST_X86
  if (UseAvx512()) {
    j = SegmentsAvx512<kLeftOut>(z, n, r, from, weight, left_out);
  } else if (UseAvx2Fma()) {
    j = SegmentsAvx2<kLeftOut>(z, n, r, from, weight, left_out);
  }
#endif
  for (; j < n; j += kDrawSegment) {
    weight[j / kDrawSegment] =
        ScalarMasses<kLeftOut>(z + j, std::min(kDrawSegment, n - j), r, from, left_out);
  }
}

}  // namespace chunk_weights_detail

// Level 1: the float mass sum of the kept tokens (z >= r.keep_from) of z[0, n), n <= kChunk;
// those below r.skip_below are left out and counted in `left_out`. Uses the thread's scratch
// (Scratch().packed).
inline double FloatPieceMass(const float* z, int64_t n, const RowState& r, int64_t& left_out) {
  if (r.skip_below > r.keep_from) {
    return chunk_weights_detail::FloatPieceMassOf<true>(z, n, r, r.skip_below, left_out);
  }
  return chunk_weights_detail::FloatPieceMassOf<false>(z, n, r, r.keep_from, left_out);
}

// Level 2: weight[s] = FloatPieceMass of segment s (kDrawSegment tokens) of z[0, n).
inline void FloatSegmentMasses(const float* z, int64_t n, const RowState& r, double* weight,
                               int64_t& left_out) {
  if (r.skip_below > r.keep_from) {
    return chunk_weights_detail::FloatSegmentMassesOf<true>(z, n, r, r.skip_below, weight,
                                                            left_out);
  }
  chunk_weights_detail::FloatSegmentMassesOf<false>(z, n, r, r.keep_from, weight, left_out);
}

}  // namespace samplerd::kernels::cpu_fast_internal

#endif  // SAMPLERD_KERNELS_CPU_FAST_CHUNK_WEIGHTS_H_
