// The chunked draw's level 0, 1 and 2 weights (chunked_draw.h): the float masses of
// float_mass.h summed over a piece or over each segment of a chunk, the head's tokens (z >=
// r.head_from) and the tail's (below it) apart, in scalar, AVX2 + FMA and AVX-512 forms (all
// within kFloatMassError per term, a piece's tail sum within kTailMassError; they need not give
// the same bits). Included by
// chunked_draw.cc only. Internal to kernels/cpu_fast.
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

// The float mass sums of a piece's or a segment's kept tokens, level 0's two parts apart.
struct PartMasses {
  double head = 0.0;  // z >= r.head_from
  double tail = 0.0;  // r.keep_from <= z < r.head_from
};

// The dense vector pieces (PieceAvx512, PieceAvx2) add the tail's float masses lane by lane in
// float for kTailFlushSteps steps, two masses a lane a step, before widening them to double:
// that saves the tail the head's pair sum and two widenings a step (with them, level 1 took
// 1.35x the time of the sums over all of K on dense rows; with this, 1.15x: a microbenchmark,
// HOST_PLANE_RESULTS "Run 13"). A lane's float sum of 16 masses or fewer is their sum
// with each mass through at most 16 float additions, so each times a factor within gamma_16 <
// 16.1 u of 1 (u = 2^-24; Higham, section 4.2), each mass within 2.3 u of exp (float_mass.h):
// a term of a piece's tail sum is within (1 + 2.3 u)(1 + 16.1 u) - 1 < 18.5 u of the oracle's
// mass (its 5e-15 included); kTailMassError = 32 u covers it (and the head's 3.3 u, and the
// tail sums of the packed, segment and scalar paths, which add in double as the head's do).
inline constexpr int kTailFlushSteps = 8;
inline constexpr double kTailMassError = 0x1.0p-19;

namespace chunk_weights_detail {

// Level 0's, level 1's and level 2's weights: the float masses (float_mass.h) of the kept
// tokens of a piece or segment, summed in double, the head's and the tail's apart (the vector
// paths first add two tokens' masses of the same part in float: one more rounding, which
// kFloatMassError covers; the dense pieces' tails add 16 in float, kTailMassError). Kept: z >= from
// = max(r.keep_from, r.skip_below); tokens of the set below skip_below are counted in `left_out`
// when kLeftOut (skip_below > keep_from; else there are none), whichever part they are in. A kept
// token is the head's when z >= r.head_from (the same compare as the oracle's DrawBin(z) >
// DrawBin(z_c): chunked_draw.cc, HeadFrom). Every kept z is in [r.mx - 36, r.mx], inside
// FloatKeptMass's domain. No branch on the data (a randn x 3 row keeps ~9% of its tokens,
// scattered; the tail's tokens are scattered too: a branch per block mispredicts).
#if SAMPLERD_CPU_FAST_X86
// The masses of 16 tokens, two vectors of 8 added lane by lane, with AVX2 + FMA.
template <bool kLeftOut>
struct Avx2Masses {
  __m256 table_lo, table_hi, mx, from, keep, head_from;

  SAMPLERD_AVX2_FMA Avx2Masses(const RowState& r, float from_value)
      : table_lo(_mm256_loadu_ps(kExp2Sixteenths)),
        table_hi(_mm256_loadu_ps(kExp2Sixteenths + 8)),
        mx(_mm256_set1_ps(r.mx)),
        from(_mm256_set1_ps(from_value)),
        keep(_mm256_set1_ps(r.keep_from)),
        head_from(_mm256_set1_ps(r.head_from)) {}

  // The lanes of v kept (all bits set), left-out tokens counted.
  SAMPLERD_AVX2_FMA __m256 Kept(__m256 v, int64_t& left_out) const {
    const __m256 kept = _mm256_cmp_ps(v, from, _CMP_GE_OQ);
    if constexpr (kLeftOut) {
      const int in_set = _mm256_movemask_ps(_mm256_cmp_ps(v, keep, _CMP_GE_OQ));
      left_out += __builtin_popcount(static_cast<unsigned>(in_set & ~_mm256_movemask_ps(kept)));
    }
    return kept;
  }

  // The masses of v's lanes in kept_v and w's in kept_w, the head's added lane by lane into
  // `head` and the tail's into `tail` (4 double lanes each). Lanes not kept (-inf included) may
  // compute anything: the masks zero them.
  SAMPLERD_AVX2_FMA void Pair(__m256 v, __m256 kept_v, __m256 w, __m256 kept_w, __m256d& head,
                              __m256d& tail) const {
    const __m256 mv = FloatKeptMass8(v, mx, table_lo, table_hi);
    const __m256 mw = FloatKeptMass8(w, mx, table_lo, table_hi);
    const __m256 head_v = _mm256_cmp_ps(v, head_from, _CMP_GE_OQ);
    const __m256 head_w = _mm256_cmp_ps(w, head_from, _CMP_GE_OQ);
    const __m256 h = _mm256_add_ps(_mm256_and_ps(mv, _mm256_and_ps(kept_v, head_v)),
                                   _mm256_and_ps(mw, _mm256_and_ps(kept_w, head_w)));
    const __m256 t = _mm256_add_ps(_mm256_and_ps(mv, _mm256_andnot_ps(head_v, kept_v)),
                                   _mm256_and_ps(mw, _mm256_andnot_ps(head_w, kept_w)));
    head = _mm256_add_pd(head, _mm256_add_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(h)),
                                             _mm256_cvtps_pd(_mm256_extractf128_ps(h, 1))));
    tail = _mm256_add_pd(tail, _mm256_add_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(t)),
                                             _mm256_cvtps_pd(_mm256_extractf128_ps(t, 1))));
  }

  // Pair for the dense pieces: the tail's masses added in float, lane by lane, into
  // `tail_lanes` (two additions a lane a call; flushed to double by the caller).
  SAMPLERD_AVX2_FMA void DensePair(__m256 v, __m256 kept_v, __m256 w, __m256 kept_w, __m256d& head,
                                   __m256& tail_lanes) const {
    const __m256 mv = FloatKeptMass8(v, mx, table_lo, table_hi);
    const __m256 mw = FloatKeptMass8(w, mx, table_lo, table_hi);
    const __m256 head_v = _mm256_cmp_ps(v, head_from, _CMP_GE_OQ);
    const __m256 head_w = _mm256_cmp_ps(w, head_from, _CMP_GE_OQ);
    const __m256 h = _mm256_add_ps(_mm256_and_ps(mv, _mm256_and_ps(kept_v, head_v)),
                                   _mm256_and_ps(mw, _mm256_and_ps(kept_w, head_w)));
    head = _mm256_add_pd(head, _mm256_add_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(h)),
                                             _mm256_cvtps_pd(_mm256_extractf128_ps(h, 1))));
    tail_lanes = _mm256_add_ps(tail_lanes, _mm256_and_ps(mv, _mm256_andnot_ps(head_v, kept_v)));
    tail_lanes = _mm256_add_ps(tail_lanes, _mm256_and_ps(mw, _mm256_andnot_ps(head_w, kept_w)));
  }

  // z[0, 16) into `head` and `tail`.
  SAMPLERD_AVX2_FMA void Sixteen(const float* z, int64_t& left_out, __m256d& head,
                                 __m256d& tail) const {
    const __m256 v = _mm256_loadu_ps(z);
    const __m256 w = _mm256_loadu_ps(z + 8);
    Pair(v, Kept(v, left_out), w, Kept(w, left_out), head, tail);
  }
};

SAMPLERD_AVX2_FMA inline double SumLanes(__m256d v) {
  alignas(32) double lanes[4];
  _mm256_store_pd(lanes, v);
  return (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
}

// The float tail lanes in 4 double lanes.
SAMPLERD_AVX2_FMA inline __m256d Widen(__m256 f) {
  return _mm256_add_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(f)),
                       _mm256_cvtps_pd(_mm256_extractf128_ps(f, 1)));
}

template <bool kLeftOut>
SAMPLERD_AVX2_FMA int64_t PieceAvx2(const float* z, int64_t n, const RowState& r, float from,
                                    PartMasses& sums, int64_t& left_out) {
  const Avx2Masses<kLeftOut> masses(r, from);
  __m256d head = _mm256_setzero_pd();
  __m256d tail = _mm256_setzero_pd();
  int64_t j = 0;
  while (j + 16 <= n) {
    __m256 tail_lanes = _mm256_setzero_ps();
    for (int step = 0; step < kTailFlushSteps && j + 16 <= n; ++step, j += 16) {
      const __m256 v = _mm256_loadu_ps(z + j);
      const __m256 w = _mm256_loadu_ps(z + j + 8);
      masses.DensePair(v, masses.Kept(v, left_out), w, masses.Kept(w, left_out), head, tail_lanes);
    }
    tail = _mm256_add_pd(tail, Widen(tail_lanes));
  }
  sums.head += SumLanes(head);
  sums.tail += SumLanes(tail);
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
                                          float* packed, PartMasses& sums, int64_t& left_out) {
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
  __m256d head = _mm256_setzero_pd();
  __m256d tail = _mm256_setzero_pd();
  int64_t i = 0;
  for (; i + 16 <= count; i += 16) {
    masses.Pair(_mm256_loadu_ps(packed + i), all, _mm256_loadu_ps(packed + i + 8), all, head, tail);
  }
  // [0, 16) lanes left: those below `rest` (beyond: stale floats).
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i rest = _mm256_set1_epi32(static_cast<int>(count - i));
  const __m256 kept_v = _mm256_castsi256_ps(_mm256_cmpgt_epi32(rest, lane));
  const __m256 kept_w =
      _mm256_castsi256_ps(_mm256_cmpgt_epi32(rest, _mm256_add_epi32(lane, _mm256_set1_epi32(8))));
  masses.Pair(_mm256_loadu_ps(packed + i), kept_v, _mm256_loadu_ps(packed + i + 8), kept_w, head,
              tail);
  sums.head += SumLanes(head);
  sums.tail += SumLanes(tail);
  return j;
}

template <bool kLeftOut>
SAMPLERD_AVX2_FMA int64_t SegmentsAvx2(const float* z, int64_t n, const RowState& r, float from,
                                       bool of_head, double* weight, int64_t& left_out) {
  static_assert(kDrawSegment == 32, "two steps of 16 a segment");
  const Avx2Masses<kLeftOut> masses(r, from);
  int64_t j = 0;
  for (; j + 32 <= n; j += 32) {
    __m256d head = _mm256_setzero_pd();
    __m256d tail = _mm256_setzero_pd();
    masses.Sixteen(z + j, left_out, head, tail);
    masses.Sixteen(z + j + 16, left_out, head, tail);
    weight[j / 32] = SumLanes(of_head ? head : tail);
  }
  return j;
}

SAMPLERD_AVX512_WARNINGS_OFF

// The masses of 32 tokens, two vectors of 16 added lane by lane, with AVX-512 F + DQ.
template <bool kLeftOut>
struct Avx512Masses {
  __m512 table, mx, from, keep, head_from;

  SAMPLERD_AVX512 Avx512Masses(const RowState& r, float from_value)
      : table(_mm512_loadu_ps(kExp2Sixteenths)),
        mx(_mm512_set1_ps(r.mx)),
        from(_mm512_set1_ps(from_value)),
        keep(_mm512_set1_ps(r.keep_from)),
        head_from(_mm512_set1_ps(r.head_from)) {}

  SAMPLERD_AVX512 __mmask16 Kept(__m512 v, int64_t& left_out) const {
    const __mmask16 kept = _mm512_cmp_ps_mask(v, from, _CMP_GE_OQ);
    if constexpr (kLeftOut) {
      const __mmask16 in_set = _mm512_cmp_ps_mask(v, keep, _CMP_GE_OQ);
      left_out += __builtin_popcount(static_cast<unsigned>(in_set & ~kept) & 0xffffu);
    }
    return kept;
  }

  // The masses of v's lanes in kept_v and w's in kept_w, the head's added lane by lane into
  // `head` and the tail's into `tail` (8 double lanes each). Lanes not kept (-inf included) may
  // compute anything: the masks leave them out.
  SAMPLERD_AVX512 void Pair(__m512 v, __mmask16 kept_v, __m512 w, __mmask16 kept_w, __m512d& head,
                            __m512d& tail) const {
    const __m512 mv = FloatKeptMass16(v, mx, table);
    const __m512 mw = FloatKeptMass16(w, mx, table);
    const __mmask16 head_v = _mm512_mask_cmp_ps_mask(kept_v, v, head_from, _CMP_GE_OQ);
    const __mmask16 head_w = _mm512_mask_cmp_ps_mask(kept_w, w, head_from, _CMP_GE_OQ);
    const auto tail_v = static_cast<__mmask16>(kept_v & ~head_v);
    const auto tail_w = static_cast<__mmask16>(kept_w & ~head_w);
    const __m512 hm = _mm512_maskz_mov_ps(head_v, mv);
    const __m512 h = _mm512_mask_add_ps(hm, head_w, hm, mw);
    const __m512 tm = _mm512_maskz_mov_ps(tail_v, mv);
    const __m512 t = _mm512_mask_add_ps(tm, tail_w, tm, mw);
    head = _mm512_add_pd(head, _mm512_add_pd(_mm512_cvtps_pd(_mm512_castps512_ps256(h)),
                                             _mm512_cvtps_pd(_mm512_extractf32x8_ps(h, 1))));
    tail = _mm512_add_pd(tail, _mm512_add_pd(_mm512_cvtps_pd(_mm512_castps512_ps256(t)),
                                             _mm512_cvtps_pd(_mm512_extractf32x8_ps(t, 1))));
  }

  // Pair for the dense pieces: the tail's masses added in float, lane by lane, into
  // `tail_lanes` (two additions a lane a call; flushed to double by the caller).
  SAMPLERD_AVX512 void DensePair(__m512 v, __mmask16 kept_v, __m512 w, __mmask16 kept_w,
                                 __m512d& head, __m512& tail_lanes) const {
    const __m512 mv = FloatKeptMass16(v, mx, table);
    const __m512 mw = FloatKeptMass16(w, mx, table);
    const __mmask16 head_v = _mm512_mask_cmp_ps_mask(kept_v, v, head_from, _CMP_GE_OQ);
    const __mmask16 head_w = _mm512_mask_cmp_ps_mask(kept_w, w, head_from, _CMP_GE_OQ);
    const __m512 hm = _mm512_maskz_mov_ps(head_v, mv);
    const __m512 h = _mm512_mask_add_ps(hm, head_w, hm, mw);
    head = _mm512_add_pd(head, _mm512_add_pd(_mm512_cvtps_pd(_mm512_castps512_ps256(h)),
                                             _mm512_cvtps_pd(_mm512_extractf32x8_ps(h, 1))));
    tail_lanes = _mm512_mask_add_ps(
        tail_lanes, _mm512_mask_cmp_ps_mask(kept_v, v, head_from, _CMP_LT_OQ), tail_lanes, mv);
    tail_lanes = _mm512_mask_add_ps(
        tail_lanes, _mm512_mask_cmp_ps_mask(kept_w, w, head_from, _CMP_LT_OQ), tail_lanes, mw);
  }

  // z[0, 32) into `head` and `tail`.
  SAMPLERD_AVX512 void ThirtyTwo(const float* z, int64_t& left_out, __m512d& head,
                                 __m512d& tail) const {
    const __m512 v = _mm512_loadu_ps(z);
    const __m512 w = _mm512_loadu_ps(z + 16);
    Pair(v, Kept(v, left_out), w, Kept(w, left_out), head, tail);
  }
};

SAMPLERD_AVX512 inline double SumLanes(__m512d v) {
  alignas(64) double lanes[8];
  _mm512_store_pd(lanes, v);
  return ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) +
         ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
}

// The float tail lanes in 8 double lanes.
SAMPLERD_AVX512 inline __m512d Widen(__m512 f) {
  return _mm512_add_pd(_mm512_cvtps_pd(_mm512_castps512_ps256(f)),
                       _mm512_cvtps_pd(_mm512_extractf32x8_ps(f, 1)));
}

template <bool kLeftOut>
SAMPLERD_AVX512 int64_t PieceAvx512(const float* z, int64_t n, const RowState& r, float from,
                                    PartMasses& sums, int64_t& left_out) {
  const Avx512Masses<kLeftOut> masses(r, from);
  __m512d head = _mm512_setzero_pd();
  __m512d tail = _mm512_setzero_pd();
  int64_t j = 0;
  while (j + 32 <= n) {
    __m512 tail_lanes = _mm512_setzero_ps();
    for (int step = 0; step < kTailFlushSteps && j + 32 <= n; ++step, j += 32) {
      const __m512 v = _mm512_loadu_ps(z + j);
      const __m512 w = _mm512_loadu_ps(z + j + 16);
      masses.DensePair(v, masses.Kept(v, left_out), w, masses.Kept(w, left_out), head, tail_lanes);
    }
    tail = _mm512_add_pd(tail, Widen(tail_lanes));
  }
  sums.head += SumLanes(head);
  sums.tail += SumLanes(tail);
  return j;
}

// PieceAvx512 for a piece that keeps few of its tokens: the kept z packed into `packed` first
// (n + 32 floats; a register compress and a full store a step), then their masses 32 at a time,
// so that no exp is spent on a lane that is not kept. A randn x 3 row at top-p 0.95 keeps ~9% of
// its tokens: level 1 took 19 µs instead of 37 (a microbenchmark at V = 151,936); packing a
// flat row (95% kept) cost 49. The break-even is near half kept (PackThePiece).
template <bool kLeftOut>
SAMPLERD_AVX512 int64_t PackedPieceAvx512(const float* z, int64_t n, const RowState& r, float from,
                                          float* packed, PartMasses& sums, int64_t& left_out) {
  const Avx512Masses<kLeftOut> masses(r, from);
  int64_t count = 0;
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) {
    const __m512 v = _mm512_loadu_ps(z + j);
    const __mmask16 kept = masses.Kept(v, left_out);
    _mm512_storeu_ps(packed + count, _mm512_maskz_compress_ps(kept, v));
    count += __builtin_popcount(static_cast<unsigned>(kept));
  }
  __m512d head = _mm512_setzero_pd();
  __m512d tail = _mm512_setzero_pd();
  int64_t i = 0;
  for (; i + 32 <= count; i += 32) {
    masses.Pair(_mm512_loadu_ps(packed + i), 0xFFFF, _mm512_loadu_ps(packed + i + 16), 0xFFFF, head,
                tail);
  }
  const int64_t rest = count - i;  // [0, 32): the lanes below it (beyond: stale floats)
  const auto kept_v = static_cast<__mmask16>(rest >= 16 ? 0xFFFF : (1u << rest) - 1);
  const auto kept_w = static_cast<__mmask16>(rest > 16 ? (1u << (rest - 16)) - 1 : 0);
  masses.Pair(_mm512_loadu_ps(packed + i), kept_v, _mm512_loadu_ps(packed + i + 16), kept_w, head,
              tail);
  sums.head += SumLanes(head);
  sums.tail += SumLanes(tail);
  return j;
}

template <bool kLeftOut>
SAMPLERD_AVX512 int64_t SegmentsAvx512(const float* z, int64_t n, const RowState& r, float from,
                                       bool of_head, double* weight, int64_t& left_out) {
  static_assert(kDrawSegment == 32, "one step of 32 a segment");
  const Avx512Masses<kLeftOut> masses(r, from);
  int64_t j = 0;
  for (; j + 32 <= n; j += 32) {
    __m512d head = _mm512_setzero_pd();
    __m512d tail = _mm512_setzero_pd();
    masses.ThirtyTwo(z + j, left_out, head, tail);
    weight[j / 32] = SumLanes(of_head ? head : tail);
  }
  return j;
}

SAMPLERD_AVX512_WARNINGS_ON
#endif

// The float mass sums of the kept tokens of z[0, n), in double, added to `sums`.
template <bool kLeftOut>
void ScalarMasses(const float* z, int64_t n, const RowState& r, float from, PartMasses& sums,
                  int64_t& left_out) {
  for (int64_t j = 0; j < n; ++j) {
    if (z[j] >= from) {
      (z[j] >= r.head_from ? sums.head : sums.tail) += FloatKeptMass(z[j], r.mx);
    } else if (kLeftOut && z[j] >= r.keep_from) {
      ++left_out;
    }
  }
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
PartMasses FloatPieceMassesOf(const float* z, int64_t n, const RowState& r, float from,
                              int64_t& left_out) {
  PartMasses sums;
  int64_t j = 0;
#if SAMPLERD_CPU_FAST_X86
  const bool pack = PackThePiece(z, n, from);
  if (UseAvx512() && pack) {
    j = PackedPieceAvx512<kLeftOut>(z, n, r, from, Scratch().packed.data(), sums, left_out);
  } else if (UseAvx512()) {
    j = PieceAvx512<kLeftOut>(z, n, r, from, sums, left_out);
  } else if (UseAvx2Fma() && pack) {
    j = PackedPieceAvx2<kLeftOut>(z, n, r, from, Scratch().packed.data(), sums, left_out);
  } else if (UseAvx2Fma()) {
    j = PieceAvx2<kLeftOut>(z, n, r, from, sums, left_out);
  }
#endif
  ScalarMasses<kLeftOut>(z + j, n - j, r, from, sums, left_out);
  return sums;
}

template <bool kLeftOut>
void FloatSegmentMassesOf(const float* z, int64_t n, const RowState& r, float from, bool of_head,
                          double* weight, int64_t& left_out) {
  int64_t j = 0;
#if SAMPLERD_CPU_FAST_X86
  if (UseAvx512()) {
    j = SegmentsAvx512<kLeftOut>(z, n, r, from, of_head, weight, left_out);
  } else if (UseAvx2Fma()) {
    j = SegmentsAvx2<kLeftOut>(z, n, r, from, of_head, weight, left_out);
  }
#endif
  for (; j < n; j += kDrawSegment) {
    PartMasses sums;
    ScalarMasses<kLeftOut>(z + j, std::min(kDrawSegment, n - j), r, from, sums, left_out);
    weight[j / kDrawSegment] = of_head ? sums.head : sums.tail;
  }
}

}  // namespace chunk_weights_detail

// Level 0's and level 1's weights: the float mass sums of the head's and the tail's kept
// tokens (z >= r.keep_from) of z[0, n), n <= kChunk (the head's terms within kFloatMassError,
// the tail's within kTailMassError); those below r.skip_below are left out and counted in
// `left_out`. Uses the thread's scratch (Scratch().packed).
inline PartMasses FloatPieceMasses(const float* z, int64_t n, const RowState& r,
                                   int64_t& left_out) {
  if (r.skip_below > r.keep_from) {
    return chunk_weights_detail::FloatPieceMassesOf<true>(z, n, r, r.skip_below, left_out);
  }
  return chunk_weights_detail::FloatPieceMassesOf<false>(z, n, r, r.keep_from, left_out);
}

// Level 2: weight[s] = the head's (of_head) or the tail's float mass sum of segment s
// (kDrawSegment tokens) of z[0, n), its terms within kFloatMassError, left-out tokens of either
// part counted.
inline void FloatSegmentMasses(const float* z, int64_t n, const RowState& r, bool of_head,
                               double* weight, int64_t& left_out) {
  if (r.skip_below > r.keep_from) {
    return chunk_weights_detail::FloatSegmentMassesOf<true>(z, n, r, r.skip_below, of_head, weight,
                                                            left_out);
  }
  chunk_weights_detail::FloatSegmentMassesOf<false>(z, n, r, r.keep_from, of_head, weight,
                                                    left_out);
}

}  // namespace samplerd::kernels::cpu_fast_internal

#endif  // SAMPLERD_KERNELS_CPU_FAST_CHUNK_WEIGHTS_H_
