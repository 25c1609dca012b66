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

// Upper bounds of the Gumbel noise -logf(-logf(U)) over the Philox bits sharing their top 10
// bits (U grows with the bits): G at the bucket's largest U, computed in double, plus a margin
// far above logf's error.
struct NoiseBounds {
  float bound[1 << (32 - kNoiseBucketShift)];
  NoiseBounds() {
    constexpr uint32_t kBuckets = 1u << (32 - kNoiseBucketShift);
    for (uint32_t q = 0; q < kBuckets; ++q) {
      const uint32_t top_bits = (q << kNoiseBucketShift) | ((1u << kNoiseBucketShift) - 1);
      const double u = static_cast<double>(UniformFromBits(top_bits));
      bound[q] = static_cast<float>(-std::log(-std::log(u)) + 1e-3);
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

// DrawScalar, 8 tokens at a time, 256 at a time in two steps: a branch-free scan lists the
// blocks of 4 tokens holding a token that may still win (against the floor at the start of
// the step), then the list is drawn 8 blocks per Philox8 call, its tokens' noise bounds
// checked 8 at a time, and the tokens left offered (against the current floor). Returns where
// the scalar tail starts.
SAMPLERD_AVX2 int64_t DrawAvx2(const float* z, int64_t begin, int64_t n, uint32_t top,
                               uint32_t span, const RowParams& p, const PhiloxKey& key,
                               Best& best) {
  // Block indices must fit 32 bits (the counter's high word is 0 below token 2^34).
  if (static_cast<uint64_t>(begin + n) >= (uint64_t{1} << 34)) return 0;
  constexpr int64_t kStep = 256;
  const __m256i topv = _mm256_set1_epi32(static_cast<int32_t>(top));
  const __m256i spanv = _mm256_set1_epi32(static_cast<int32_t>(span));
  const __m256 above = _mm256_set1_ps(kGumbelAbove);
  const float* bound = Bounds().bound;
  alignas(32) uint32_t block[kStep / 4 + 8];  // + the padding of the last Philox8 call
  uint8_t mask[kStep / 4 + 8];
  alignas(32) uint32_t words[32];
  int64_t j0 = 0;
  while (j0 + 8 <= n) {
    const int64_t step_end = std::min(n & ~int64_t{7}, j0 + kStep);
    const __m256 floor = _mm256_set1_ps(best.floor);
    int count = 0;
    for (; j0 < step_end; j0 += 8) {
      const __m256 v = _mm256_loadu_ps(z + j0);
      const uint32_t reach = static_cast<uint32_t>(
          _mm256_movemask_ps(_mm256_cmp_ps(_mm256_add_ps(v, above), floor, _CMP_GE_OQ)));
      const uint32_t bits = KeysInRange8(v, topv, spanv) & reach;
      const uint32_t first = static_cast<uint32_t>((begin + j0) / 4);
      block[count] = first;
      mask[count] = static_cast<uint8_t>(bits & 15u);
      count += (bits & 15u) != 0;
      block[count] = first + 1;
      mask[count] = static_cast<uint8_t>(bits >> 4);
      count += (bits >> 4) != 0;
    }
    for (int q0 = 0; q0 < count; q0 += 8) {
      Philox8(block + q0, p.position, key, words);
      // Each word vector i holds token i of the 8 blocks: filter its tokens on the bound of
      // their noise in vector form, then offer the few left (in any order: Offer breaks ties).
      const __m256i lanes = _mm256_cmpgt_epi32(_mm256_set1_epi32(std::min(8, count - q0)),
                                               _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
      const __m256i masks = _mm256_and_si256(
          _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(mask + q0))),
          lanes);
      const __m256i first = _mm256_sub_epi32(
          _mm256_slli_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + q0)), 2),
          _mm256_set1_epi32(static_cast<int32_t>(begin)));
      const __m256 floor_now = _mm256_set1_ps(best.floor);
      for (int i = 0; i < 4; ++i) {
        const __m256i bit = _mm256_set1_epi32(1 << i);
        const __m256i in = _mm256_cmpeq_epi32(_mm256_and_si256(masks, bit), bit);
        if (_mm256_testz_si256(in, in)) continue;
        const __m256i w = _mm256_load_si256(reinterpret_cast<const __m256i*>(words + 8 * i));
        const __m256 v = _mm256_mask_i32gather_ps(_mm256_setzero_ps(), z,
                                                  _mm256_add_epi32(first, _mm256_set1_epi32(i)),
                                                  _mm256_castsi256_ps(in), 4);
        const __m256 g = _mm256_i32gather_ps(bound, _mm256_srli_epi32(w, kNoiseBucketShift), 4);
        const __m256 ok = _mm256_and_ps(_mm256_cmp_ps(_mm256_add_ps(v, g), floor_now, _CMP_GE_OQ),
                                        _mm256_castsi256_ps(in));
        for (uint32_t bits = static_cast<uint32_t>(_mm256_movemask_ps(ok)); bits != 0;
             bits &= bits - 1) {
          const int q = __builtin_ctz(bits);
          const int64_t token = static_cast<int64_t>(block[q0 + q]) * 4 + i;
          best.Offer(z[token - begin], words[8 * i + q], token, bound);
        }
      }
    }
  }
  return j0;
}
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
    if (avx2) j = DrawAvx2(z, begin, n, top, span, p, key, best);
#endif
    DrawScalar(z, begin, j, n, top, span, p, key, best);
  }
  if (best.id < 0) return;
  std::lock_guard<std::mutex> lock(r.mu);
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
