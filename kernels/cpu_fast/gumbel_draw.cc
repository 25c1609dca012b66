// Phase 3 of FastCpuSampler: the Gumbel-max draw with exact skips (gumbel_draw.h).
#include "kernels/cpu_fast/gumbel_draw.h"

#include <algorithm>
#include <cmath>
#include <mutex>
#include <vector>

#include "kernels/common/philox.h"
#include "kernels/cpu_fast/cpu_features.h"
#include "kernels/cpu_fast/order_keys.h"
#include "kernels/cpu_fast/row_chunks.h"

#if SAMPLERD_CPU_FAST_X86
#include <immintrin.h>
#endif

namespace samplerd::kernels::cpu_fast_internal {
namespace {

constexpr int kNoiseBucketShift = 22;  // G bound per top 10 bits of the 32 Philox bits

constexpr uint32_t kNoiseBuckets = 1u << (32 - kNoiseBucketShift);

// Upper bounds of the Gumbel noise -logf(-logf(U)) over the Philox bits sharing their top 10
// bits (U grows with the bits): G at the bucket's largest U, computed in double, plus a margin
// far above logf's error. Non-decreasing in the bucket (FirstReachingBucket relies on it).
struct NoiseBounds {
  float bound[kNoiseBuckets];
  NoiseBounds() {
    for (uint32_t q = 0; q < kNoiseBuckets; ++q) {
      const uint32_t top_bits = (q << kNoiseBucketShift) | ((1u << kNoiseBucketShift) - 1);
      const double u = static_cast<double>(UniformFromBits(top_bits));
      bound[q] = static_cast<float>(-std::log(-std::log(u)) + 1e-3);
      // Already so (U and G grow with the bits); a larger bound only skips less.
      if (q > 0) bound[q] = std::max(bound[q], bound[q - 1]);
    }
  }
};

const NoiseBounds& Bounds() {
  static const NoiseBounds bounds;
  return bounds;
}

}  // namespace

void WarmNoiseBounds() { Bounds(); }

namespace {

// The best (score, id) of one task's draw so far, and the score any new best must beat.
struct Best {
  int64_t id = -1;
  float score = 0.0f;
  float floor = 0.0f;  // <= the winning score: tokens that cannot reach it skip the noise

  // Token `id` (z = v) drew the 32 bits w: keep it if it beats the best (lowest id on equal
  // scores, so the order tokens arrive in does not matter).
  void Offer(float v, uint32_t w, int64_t token, const float* bound) {
    if (v + bound[w >> kNoiseBucketShift] < floor) return;
    const float score_now = v + GumbelFromUniform(UniformFromBits(w));
    if (id < 0 || score_now > score || (score_now == score && token < id)) {
      id = token;
      score = score_now;
      floor = std::max(floor, score_now);
    }
  }
};

// The draw over z[j_begin, n) of a chunk starting at token `begin` (j_begin % 4 == 0):
// survivors are KeyOf(z) - top <= span.
void DrawScalar(const float* z, int64_t begin, int64_t j_begin, int64_t n, uint32_t top,
                uint32_t span, const RowParams& p, const PhiloxKey& key, Best& best) {
  const float* bound = Bounds().bound;
  // Blocks of 4 tokens share one Philox call (begin is a multiple of 4).
  for (int64_t j0 = j_begin; j0 < n; j0 += 4) {
    const int64_t m = std::min<int64_t>(4, n - j0);
    bool any = false;
    for (int64_t i = 0; i < m; ++i) {
      const float v = z[j0 + i];
      any |= KeyOf(v) - top <= span && !(v + kGumbelAbove < best.floor);
    }
    if (!any) continue;
    const PhiloxCounter bits =
        Philox4x32x10(PhiloxCounterFor(p.position, static_cast<uint64_t>(begin + j0)), key);
    for (int64_t i = 0; i < m; ++i) {
      const float v = z[j0 + i];
      if (KeyOf(v) - top > span) continue;
      best.Offer(v, bits.word[i], begin + j0 + i, bound);
    }
  }
}

#if SAMPLERD_CPU_FAST_X86
// The 32-bit products hi and lo of a * m for 8 lanes.
SAMPLERD_AVX2 inline void MulHiLo8(__m256i a, __m256i m, __m256i& hi, __m256i& lo) {
  const __m256i even = _mm256_mul_epu32(a, m);
  const __m256i odd = _mm256_mul_epu32(_mm256_srli_epi64(a, 32), m);
  hi = _mm256_blend_epi32(_mm256_srli_epi64(even, 32), odd, 0xAA);
  lo = _mm256_blend_epi32(even, _mm256_slli_epi64(odd, 32), 0xAA);
}

// The smallest bucket q with v_max + bound[q] >= floor, kNoiseBuckets when there is none. A
// token with z <= v_max whose bits lie in a lower bucket has z + bound < floor (both sums are
// non-decreasing), so Best::Offer would skip it: the vector draws drop such bits with one
// unsigned compare, reading neither the token's z nor its bound.
uint32_t FirstReachingBucket(float v_max, float floor, const float* bound) {
  uint32_t lo = 0;
  uint32_t hi = kNoiseBuckets;
  while (lo < hi) {
    const uint32_t mid = (lo + hi) / 2;
    if (v_max + bound[mid] >= floor) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  return lo;
}

// One step of the vector draws: the blocks of 4 tokens of z[j0, step_end) (j0 % 8 == 0)
// holding a survivor whose z + kGumbelAbove reaches `floor`, each with the mask of those
// tokens, and the largest z of the step.
struct StepBlocks {
  static constexpr int64_t kStep = 256;  // tokens per step
  // + the padding the last Philox call of a step reads (its lanes are masked off).
  alignas(64) uint32_t block[kStep / 4 + 16] = {};
  alignas(64) uint8_t mask[kStep / 4 + 16] = {};
  int count = 0;
  float v_max = -kInf;
};

SAMPLERD_AVX2 inline float MaxLanes(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
  return _mm_cvtss_f32(m);
}

// Lists the step's blocks into `out` (branch-free) and returns where the step ended.
SAMPLERD_AVX2 inline int64_t ListBlocks(const float* z, int64_t begin, int64_t j0, int64_t step_end,
                                        uint32_t top, uint32_t span, float floor, StepBlocks& out) {
  const __m256i topv = _mm256_set1_epi32(static_cast<int32_t>(top));
  const __m256i spanv = _mm256_set1_epi32(static_cast<int32_t>(span));
  const __m256 above = _mm256_set1_ps(kGumbelAbove);
  const __m256 floorv = _mm256_set1_ps(floor);
  __m256 v_max = _mm256_set1_ps(-kInf);
  int count = 0;
  for (; j0 < step_end; j0 += 8) {
    const __m256 v = _mm256_loadu_ps(z + j0);
    v_max = _mm256_max_ps(v, v_max);
    const uint32_t reach = static_cast<uint32_t>(
        _mm256_movemask_ps(_mm256_cmp_ps(_mm256_add_ps(v, above), floorv, _CMP_GE_OQ)));
    const uint32_t bits = KeysInRange8(v, topv, spanv) & reach;
    const uint32_t first = static_cast<uint32_t>((begin + j0) / 4);
    out.block[count] = first;
    out.mask[count] = static_cast<uint8_t>(bits & 15u);
    count += (bits & 15u) != 0;
    out.block[count] = first + 1;
    out.mask[count] = static_cast<uint8_t>(bits >> 4);
    count += (bits >> 4) != 0;
  }
  out.count = count;
  out.v_max = MaxLanes(v_max);
  return j0;
}

// Philox4x32x10 of the 8 blocks block[0, 8) (counters {block, 0, position}) : word i of
// block b in out[i * 8 + b]. Integer ops only: the scalar function's bits.
SAMPLERD_AVX2 void Philox8(const uint32_t* block, uint64_t position, PhiloxKey key, uint32_t* out) {
  __m256i c0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block));
  __m256i c1 = _mm256_setzero_si256();
  __m256i c2 = _mm256_set1_epi32(static_cast<int32_t>(position));
  __m256i c3 = _mm256_set1_epi32(static_cast<int32_t>(position >> 32));
  const __m256i m0 = _mm256_set1_epi32(static_cast<int32_t>(kPhiloxM0));
  const __m256i m1 = _mm256_set1_epi32(static_cast<int32_t>(kPhiloxM1));
  for (int round = 0; round < kPhiloxRounds; ++round) {
    if (round > 0) {
      key.word[0] += kPhiloxW0;
      key.word[1] += kPhiloxW1;
    }
    __m256i hi0, lo0, hi1, lo1;
    MulHiLo8(c0, m0, hi0, lo0);
    MulHiLo8(c2, m1, hi1, lo1);
    c0 = _mm256_xor_si256(_mm256_xor_si256(hi1, c1),
                          _mm256_set1_epi32(static_cast<int32_t>(key.word[0])));
    c1 = lo1;
    c2 = _mm256_xor_si256(_mm256_xor_si256(hi0, c3),
                          _mm256_set1_epi32(static_cast<int32_t>(key.word[1])));
    c3 = lo0;
  }
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), c0);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 8), c1);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 16), c2);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 24), c3);
}

// The floor a step's Philox bits are filtered against, and its first reaching bucket
// (FirstReachingBucket), recomputed only when the floor has risen.
struct BucketFilter {
  float floor = kInf;
  uint32_t first = 0;

  // The bits a token of the step needs to be offered: w >= *w_min; false when none can be.
  bool Update(float v_max, const Best& best, const float* bound, uint32_t* w_min) {
    if (best.floor != floor) {
      floor = best.floor;
      first = FirstReachingBucket(v_max, floor, bound);
    }
    *w_min = first << kNoiseBucketShift;
    return first < kNoiseBuckets;
  }
};

// DrawScalar, 8 tokens at a time, 256 at a time in two steps: ListBlocks, then the list drawn
// 8 blocks per Philox8 call; a token is offered only if its bits reach the step's
// first reaching bucket (almost none, once the floor has risen: on a flat row the draw is then
// its Philox calls). Returns where the scalar tail starts.
SAMPLERD_AVX2 int64_t DrawAvx2(const float* z, int64_t begin, int64_t n, uint32_t top,
                               uint32_t span, const RowParams& p, const PhiloxKey& key,
                               Best& best) {
  // Block indices must fit 32 bits (the counter's high word is 0 below token 2^34).
  if (static_cast<uint64_t>(begin + n) >= (uint64_t{1} << 34)) return 0;
  const float* bound = Bounds().bound;
  StepBlocks s;
  alignas(32) uint32_t words[32];
  int64_t j0 = 0;
  while (j0 + 8 <= n) {
    const int64_t step_end = std::min(n & ~int64_t{7}, j0 + StepBlocks::kStep);
    j0 = ListBlocks(z, begin, j0, step_end, top, span, best.floor, s);
    BucketFilter filter;
    for (int q0 = 0; q0 < s.count; q0 += 8) {
      Philox8(s.block + q0, p.position, key, words);
      uint32_t w_min;
      if (!filter.Update(s.v_max, best, bound, &w_min)) continue;
      const __m256i lanes = _mm256_cmpgt_epi32(_mm256_set1_epi32(std::min(8, s.count - q0)),
                                               _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
      const __m256i masks = _mm256_and_si256(
          _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(s.mask + q0))),
          lanes);
      const __m256i w_minv = _mm256_set1_epi32(static_cast<int32_t>(w_min));
      for (int i = 0; i < 4; ++i) {
        const __m256i bit = _mm256_set1_epi32(1 << i);
        const __m256i w = _mm256_load_si256(reinterpret_cast<const __m256i*>(words + 8 * i));
        const __m256i in = _mm256_and_si256(_mm256_cmpeq_epi32(_mm256_and_si256(masks, bit), bit),
                                            _mm256_cmpeq_epi32(_mm256_max_epu32(w, w_minv), w));
        for (uint32_t bits = static_cast<uint32_t>(_mm256_movemask_ps(_mm256_castsi256_ps(in)));
             bits != 0; bits &= bits - 1) {
          const int q = __builtin_ctz(bits);
          const int64_t token = static_cast<int64_t>(s.block[q0 + q]) * 4 + i;
          best.Offer(z[token - begin], words[8 * i + q], token, bound);
        }
      }
    }
  }
  return j0;
}

SAMPLERD_AVX512_WARNINGS_OFF
// MulHiLo8 for 16 lanes.
SAMPLERD_AVX512 inline void MulHiLo16(__m512i a, __m512i m, __m512i& hi, __m512i& lo) {
  const __m512i even = _mm512_mul_epu32(a, m);
  const __m512i odd = _mm512_mul_epu32(_mm512_srli_epi64(a, 32), m);
  hi = _mm512_mask_blend_epi32(0xAAAA, _mm512_srli_epi64(even, 32), odd);
  lo = _mm512_mask_blend_epi32(0xAAAA, even, _mm512_slli_epi64(odd, 32));
}

// What Philox16 needs besides the blocks, for one (seed, position): the round keys, and the
// parts of the first two rounds that do not depend on the block. Counter words 1-3 are
// {0, position lo, position hi} for every block, so round 1's product of word 2 and round 2's
// product of word 0 are the same for all blocks.
struct Philox16Constants {
  __m512i key0[kPhiloxRounds];
  __m512i key1[kPhiloxRounds];
  __m512i round1_c0;      // round 1's new word 0: hi(M1 * position lo) ^ 0 ^ key0
  __m512i round1_c1;      // its new word 1: lo(M1 * position lo)
  __m512i round2_hi0;     // round 2's hi(M0 * word 0), ^ key1 (its new word 2 minus word 3)
  __m512i round2_c3;      // its new word 3: lo(M0 * word 0)
  __m512i round2_c1_key;  // round 1's word 1 ^ round 2's key0 (its new word 0 minus hi1)
  __m512i position_hi;    // counter word 3

  SAMPLERD_AVX512 Philox16Constants(uint64_t position, PhiloxKey key) {
    for (int round = 0; round < kPhiloxRounds; ++round) {
      if (round > 0) {
        key.word[0] += kPhiloxW0;
        key.word[1] += kPhiloxW1;
      }
      key0[round] = _mm512_set1_epi32(static_cast<int32_t>(key.word[0]));
      key1[round] = _mm512_set1_epi32(static_cast<int32_t>(key.word[1]));
    }
    const __m512i m0 = _mm512_set1_epi32(static_cast<int32_t>(kPhiloxM0));
    const __m512i m1 = _mm512_set1_epi32(static_cast<int32_t>(kPhiloxM1));
    position_hi = _mm512_set1_epi32(static_cast<int32_t>(position >> 32));
    __m512i hi, lo;
    MulHiLo16(_mm512_set1_epi32(static_cast<int32_t>(position)), m1, hi, lo);
    round1_c0 = _mm512_xor_si512(hi, key0[0]);
    round1_c1 = lo;
    MulHiLo16(round1_c0, m0, hi, lo);
    round2_hi0 = _mm512_xor_si512(hi, key1[1]);
    round2_c3 = lo;
    round2_c1_key = _mm512_xor_si512(round1_c1, key0[1]);
  }
};

// Philox8 for the 16 blocks block[0, 16): word i of block b in out[i * 16 + b]. Rounds 1 and 2
// take one product each (Philox16Constants has the other); the same bits.
SAMPLERD_AVX512 void Philox16(const uint32_t* block, const Philox16Constants& k, uint32_t* out) {
  const __m512i m0 = _mm512_set1_epi32(static_cast<int32_t>(kPhiloxM0));
  const __m512i m1 = _mm512_set1_epi32(static_cast<int32_t>(kPhiloxM1));
  __m512i hi0, lo0, hi1, lo1;
  // Round 1: words {block, 0, position lo, position hi}.
  MulHiLo16(_mm512_loadu_si512(block), m0, hi0, lo0);
  __m512i c0 = k.round1_c0;
  __m512i c1 = k.round1_c1;
  __m512i c2 = _mm512_xor_si512(_mm512_xor_si512(hi0, k.position_hi), k.key1[0]);
  __m512i c3 = lo0;
  // Round 2: word 0 is the same for every block.
  MulHiLo16(c2, m1, hi1, lo1);
  c0 = _mm512_xor_si512(hi1, k.round2_c1_key);
  c1 = lo1;
  c2 = _mm512_xor_si512(k.round2_hi0, c3);
  c3 = k.round2_c3;
  for (int round = 2; round < kPhiloxRounds; ++round) {
    MulHiLo16(c0, m0, hi0, lo0);
    MulHiLo16(c2, m1, hi1, lo1);
    c0 = _mm512_xor_si512(_mm512_xor_si512(hi1, c1), k.key0[round]);
    c1 = lo1;
    c2 = _mm512_xor_si512(_mm512_xor_si512(hi0, c3), k.key1[round]);
    c3 = lo0;
  }
  _mm512_storeu_si512(out, c0);
  _mm512_storeu_si512(out + 16, c1);
  _mm512_storeu_si512(out + 32, c2);
  _mm512_storeu_si512(out + 48, c3);
}

// For each 4-bit mask of live blocks, their positions packed to the front.
struct PackedBlocks {
  alignas(16) uint32_t position[16][4] = {};
  constexpr PackedBlocks() {
    for (int mask = 0; mask < 16; ++mask) {
      int k = 0;
      for (int b = 0; b < 4; ++b) {
        if ((mask >> b) & 1) position[mask][k++] = static_cast<uint32_t>(b);
      }
    }
  }
};
constexpr PackedBlocks kPackedBlocks;

// ListBlocks for DrawAvx512, 16 tokens at a time: lists the live blocks only, with no masks of
// their tokens (the few tokens whose bits pass the bucket filter are checked one by one).
SAMPLERD_AVX512 inline int64_t ListBlocks16(const float* z, int64_t begin, int64_t j0,
                                            int64_t step_end, uint32_t top, uint32_t span,
                                            float floor, StepBlocks& out) {
  const __m512i topv = _mm512_set1_epi32(static_cast<int32_t>(top));
  const __m512i spanv = _mm512_set1_epi32(static_cast<int32_t>(span));
  const __m512 above = _mm512_set1_ps(kGumbelAbove);
  const __m512 floorv = _mm512_set1_ps(floor);
  const __m512i magnitude = _mm512_set1_epi32(0x7FFFFFFF);
  __m512 v_max = _mm512_set1_ps(-kInf);
  int count = 0;
  for (; j0 < step_end; j0 += 16) {
    const __mmask16 load = step_end - j0 >= 16 ? 0xFFFF : 0x00FF;  // step_end - j0 % 8 == 0
    const __m512 v = _mm512_maskz_loadu_ps(load, z + j0);
    v_max = _mm512_mask_max_ps(v_max, load, v, v_max);
    const __mmask16 reach =
        _mm512_mask_cmp_ps_mask(load, _mm512_add_ps(v, above), floorv, _CMP_GE_OQ);
    // KeyOf of 16 values (order_keys.h), then KeyOf(v) - top <= span.
    const __m512i u = _mm512_castps_si512(_mm512_add_ps(v, _mm512_setzero_ps()));
    const __m512i key =
        _mm512_xor_si512(u, _mm512_andnot_si512(_mm512_srai_epi32(u, 31), magnitude));
    uint32_t t = _mm512_mask_cmple_epu32_mask(reach, _mm512_sub_epi32(key, topv), spanv);
    t |= t >> 1;
    t |= t >> 2;  // bit 4b: a token of block b is listed
    const uint32_t live = (t & 1) | ((t >> 3) & 2) | ((t >> 6) & 4) | ((t >> 9) & 8);
    const __m128i packed =
        _mm_load_si128(reinterpret_cast<const __m128i*>(kPackedBlocks.position[live]));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out.block + count),
                     _mm_add_epi32(packed, _mm_set1_epi32(static_cast<int32_t>((begin + j0) / 4))));
    count += __builtin_popcount(live);
  }
  out.count = count;
  out.v_max = _mm512_reduce_max_ps(v_max);
  return step_end;  // j0 passed it by 8 when the step ended on a half
}

// DrawAvx2 with 16 blocks per Philox call (AVX-512 F).
SAMPLERD_AVX512 int64_t DrawAvx512(const float* z, int64_t begin, int64_t n, uint32_t top,
                                   uint32_t span, const RowParams& p, const PhiloxKey& key,
                                   Best& best) {
  if (static_cast<uint64_t>(begin + n) >= (uint64_t{1} << 34)) return 0;
  const float* bound = Bounds().bound;
  const Philox16Constants constants(p.position, key);
  StepBlocks s;
  alignas(64) uint32_t words[64];
  int64_t j0 = 0;
  while (j0 + 8 <= n) {
    const int64_t step_end = std::min(n & ~int64_t{7}, j0 + StepBlocks::kStep);
    j0 = ListBlocks16(z, begin, j0, step_end, top, span, best.floor, s);
    BucketFilter filter;
    for (int q0 = 0; q0 < s.count; q0 += 16) {
      Philox16(s.block + q0, constants, words);
      uint32_t w_min;
      if (!filter.Update(s.v_max, best, bound, &w_min)) continue;
      const int valid = std::min(16, s.count - q0);
      const __mmask16 lanes = static_cast<__mmask16>((1u << valid) - 1);
      const __m512i w_minv = _mm512_set1_epi32(static_cast<int32_t>(w_min));
      for (int i = 0; i < 4; ++i) {
        const __m512i w = _mm512_load_si512(words + 16 * i);
        for (uint32_t bits = _mm512_mask_cmpge_epu32_mask(lanes, w, w_minv); bits != 0;
             bits &= bits - 1) {
          const int q = __builtin_ctz(bits);
          const int64_t token = static_cast<int64_t>(s.block[q0 + q]) * 4 + i;
          const float v = z[token - begin];
          if (KeyOf(v) - top > span) continue;  // a live block's token that does not survive
          best.Offer(v, words[16 * i + q], token, bound);
        }
      }
    }
  }
  return j0;
}
SAMPLERD_AVX512_WARNINGS_ON
#endif

}  // namespace

void DrawChunks(const SampleArgs& args, int64_t row, int64_t t0, int64_t t1, RowState& r) {
  float* scratch = Scratch().x.data();
  const RowParams& p = r.p;
  const PhiloxKey key = PhiloxKeyFromSeed(p.seed);
  Best best;
  // The row's maximum token always survives and scores at least mx - 2.82.
  best.floor = r.mx - kGumbelBelow;
  const uint32_t top = KeyOf(r.mx);
  const uint32_t span = r.draw_key - top;
  const bool avx2 = UseAvx2();
  const bool avx512 = UseAvx512();
  for (int64_t begin = t0; begin < t1; begin += kChunk) {
    const int64_t n = std::min(kChunk, t1 - begin);
    if (r.plan == Plan::kTopTiesDraw) {
      LoadChunk(args, row, begin, n, scratch);
      for (int64_t j = 0; j < n; ++j) {
        if (scratch[j] != r.top_x) continue;  // x: not scaled on this plan
        const float score = GumbelNoise(p.seed, p.position, static_cast<uint64_t>(begin + j));
        if (best.id < 0 || score > best.score) {
          best.id = begin + j;
          best.score = score;
        }
      }
      continue;
    }
    const float* z = ScaledChunk(args, row, begin, n, p.temperature, scratch);
    int64_t j = 0;
#if SAMPLERD_CPU_FAST_X86
    if (avx512) {
      j = DrawAvx512(z, begin, n, top, span, p, key, best);
    } else if (avx2) {
      j = DrawAvx2(z, begin, n, top, span, p, key, best);
    }
#endif
    DrawScalar(z, begin, j, n, top, span, p, key, best);
  }
  if (best.id < 0) return;
  std::lock_guard<SpinMutex> lock(r.mu);
  r.Offer(best.score, best.id);
}

void DrawSorted(int64_t kept, RowState& r) {
  const std::vector<Candidate>& c = r.candidates;
  const RowParams& p = r.p;
  for (int64_t i = 0; i < kept; ++i) {
    if (c[i].z < r.min_threshold || c[i].z < r.k_threshold) break;  // JOINT: not a survivor
    // Sorted by z descending: once z + max noise is below the best score, nothing later wins.
    if (r.best_id >= 0 && c[i].z + kGumbelAbove < r.best_score) break;
    r.Offer(c[i].z + GumbelNoise(p.seed, p.position, static_cast<uint64_t>(c[i].id)), c[i].id);
  }
}

}  // namespace samplerd::kernels::cpu_fast_internal
