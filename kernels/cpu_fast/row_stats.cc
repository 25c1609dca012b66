// Phase 1 of FastCpuSampler: row statistics and the per-row decision.
#include "kernels/cpu_fast/row_stats.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/common/inverse_cdf.h"
#include "kernels/cpu_fast/cpu_features.h"
#include "kernels/cpu_fast/order_keys.h"
#include "kernels/cpu_fast/row_chunks.h"

#if SAMPLERD_CPU_FAST_X86
#include <immintrin.h>
#endif

namespace samplerd::kernels::cpu_fast_internal {

namespace {

// Raw statistics of one chunk: of x, and of z = x / T unless the row is greedy.
struct Scan {
  float max_x = -kInf;  // NaNs ignored
  bool nan_x = false;
  float max_z = -kInf;
  float min_finite_z = kInf;
  bool nan_z = false;
  bool pos_inf_z = false;
};

inline float At(const unsigned char* x, int64_t j) {
  float v;
  std::memcpy(&v, x + j * 4, 4);
  return v;
}

void ScanScalar(const unsigned char* x, int64_t begin, int64_t n, bool greedy, float t, Scan& s) {
  for (int64_t j = begin; j < n; ++j) {
    const float v = At(x, j);
    s.nan_x |= v != v;
    s.max_x = v > s.max_x ? v : s.max_x;
    if (greedy) continue;
    const float z = v / t;
    s.nan_z |= z != z;
    s.pos_inf_z |= z == kInf;
    s.max_z = z > s.max_z ? z : s.max_z;
    s.min_finite_z = z != -kInf && z < s.min_finite_z ? z : s.min_finite_z;
  }
}

// First j in [0, n) with x[j] == m, else 0.
int64_t FirstEqualScalar(const unsigned char* x, int64_t begin, int64_t n, float m) {
  for (int64_t j = begin; j < n; ++j) {
    if (At(x, j) == m) return j;
  }
  return 0;
}

#if SAMPLERD_CPU_FAST_X86
SAMPLERD_AVX2 inline float MaxLanes(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
  return _mm_cvtss_f32(m);
}

SAMPLERD_AVX2 inline float MinLanes(__m256 v) {
  __m128 m = _mm_min_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_min_ps(m, _mm_movehl_ps(m, m));
  m = _mm_min_ss(m, _mm_shuffle_ps(m, m, 1));
  return _mm_cvtss_f32(m);
}

// ScanScalar, 8 tokens at a time. _mm256_max_ps(v, m) returns m when v is NaN, as the scalar
// `v > m ? v : m` does; the sign a zero maximum gets does not matter to any later step. With
// kUnitTemperature (t == 1: x / 1 == x for every x) z is x, and the division, which bounds
// this loop's speed, is skipped.
template <bool kUnitTemperature>
SAMPLERD_AVX2 void ScanAvx2(const unsigned char* x, int64_t n, bool greedy, float t, Scan& s) {
  const __m256 neg_inf = _mm256_set1_ps(-kInf);
  const __m256 pos_inf = _mm256_set1_ps(kInf);
  int64_t j = 0;
  if (greedy) {
    __m256 m0 = neg_inf, m1 = neg_inf, nan = _mm256_setzero_ps();
    for (; j + 16 <= n; j += 16) {
      const __m256 v0 = _mm256_loadu_ps(reinterpret_cast<const float*>(x + j * 4));
      const __m256 v1 = _mm256_loadu_ps(reinterpret_cast<const float*>(x + j * 4 + 32));
      nan = _mm256_or_ps(nan, _mm256_cmp_ps(v0, v1, _CMP_UNORD_Q));
      m0 = _mm256_max_ps(v0, m0);
      m1 = _mm256_max_ps(v1, m1);
    }
    s.max_x = MaxLanes(_mm256_max_ps(m0, m1));
    s.nan_x = _mm256_movemask_ps(nan) != 0;
  } else {
    const __m256 tv = _mm256_set1_ps(t);
    __m256 mx = neg_inf, mz = neg_inf, lo = pos_inf, nan_x = _mm256_setzero_ps();
    __m256 nan_z = nan_x, inf_z = nan_x;
    for (; j + 8 <= n; j += 8) {
      const __m256 v = _mm256_loadu_ps(reinterpret_cast<const float*>(x + j * 4));
      const __m256 z = kUnitTemperature ? v : _mm256_div_ps(v, tv);
      nan_x = _mm256_or_ps(nan_x, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
      mx = _mm256_max_ps(v, mx);
      nan_z = _mm256_or_ps(nan_z, _mm256_cmp_ps(z, z, _CMP_UNORD_Q));
      inf_z = _mm256_or_ps(inf_z, _mm256_cmp_ps(z, pos_inf, _CMP_EQ_OQ));
      mz = _mm256_max_ps(z, mz);
      lo = _mm256_min_ps(_mm256_blendv_ps(z, pos_inf, _mm256_cmp_ps(z, neg_inf, _CMP_EQ_OQ)), lo);
    }
    s.max_x = MaxLanes(mx);
    s.nan_x = _mm256_movemask_ps(nan_x) != 0;
    s.max_z = MaxLanes(mz);
    s.min_finite_z = MinLanes(lo);
    s.nan_z = _mm256_movemask_ps(nan_z) != 0;
    s.pos_inf_z = _mm256_movemask_ps(inf_z) != 0;
  }
  ScanScalar(x, j, n, greedy, t, s);
}

SAMPLERD_AVX2 int64_t FirstEqualAvx2(const unsigned char* x, int64_t n, float m) {
  const __m256 mv = _mm256_set1_ps(m);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m256 v = _mm256_loadu_ps(reinterpret_cast<const float*>(x + j * 4));
    const int mask = _mm256_movemask_ps(_mm256_cmp_ps(v, mv, _CMP_EQ_OQ));
    if (mask != 0) return j + __builtin_ctz(static_cast<unsigned>(mask));
  }
  return FirstEqualScalar(x, j, n, m);
}
#endif

}  // namespace

ChunkStats ComputeChunkStats(const SampleArgs& args, int64_t row, int64_t begin, int64_t n,
                             const RowParams& p) {
  const unsigned char* x = Fp32Chunk(args, row, begin);
  if (x == nullptr) {  // fp16 / bf16: widen into the scratch first
    float* scratch = Scratch().x.data();
    LoadChunk(args, row, begin, n, scratch);
    x = reinterpret_cast<const unsigned char*>(scratch);
  }
  const bool greedy = p.temperature < kGreedyTemperature;
  const bool avx2 = UseAvx2();
  Scan scan;
#if SAMPLERD_CPU_FAST_X86
  if (avx2 && p.temperature == 1.0f) ScanAvx2<true>(x, n, greedy, p.temperature, scan);
  if (avx2 && p.temperature != 1.0f) ScanAvx2<false>(x, n, greedy, p.temperature, scan);
#endif
  if (!avx2) ScanScalar(x, 0, n, greedy, p.temperature, scan);
  ChunkStats s;
  s.nan_x = scan.nan_x;
  s.max_x = scan.max_x;
  s.any_above_neg_inf = scan.nan_x || scan.max_x != -kInf;
  if (greedy) {
    // The first index of the maximum (the oracle's ArgMax keeps the lowest index on ties).
    s.max_value = scan.max_x;
    int64_t arg = 0;
#if SAMPLERD_CPU_FAST_X86
    if (avx2) arg = FirstEqualAvx2(x, n, scan.max_x);
#endif
    if (!avx2) arg = FirstEqualScalar(x, 0, n, scan.max_x);
    s.arg = begin + arg;
  } else {
    s.max_value = scan.max_z;
    s.min_finite = scan.min_finite_z;
    s.nan_z = scan.nan_z;
    s.pos_inf_z = scan.pos_inf_z;
  }
  return s;
}

void Decide(const SampleArgs& args, const ChunkStats* stats, int64_t chunks, RowState& r) {
  const ChunkStats* s = stats;
  bool nan_x = false, above = false, nan_z = false, pos_inf = false;
  int64_t best_chunk = 0;
  float lowest = kInf;
  float top_x = -kInf;
  for (int64_t c = 0; c < chunks; ++c) {
    top_x = std::max(top_x, s[c].max_x);
    nan_x |= s[c].nan_x;
    above |= s[c].any_above_neg_inf;
    nan_z |= s[c].nan_z;
    pos_inf |= s[c].pos_inf_z;
    lowest = std::min(lowest, s[c].min_finite);
    if (s[c].max_value > s[best_chunk].max_value) best_chunk = c;
  }
  r.plan = Plan::kDone;
  r.token = -1;
  r.best_id = -1;
  if (nan_x) {
    r.status = RowStatus::kNan;
    return;
  }
  if (!above) {
    r.status = RowStatus::kNoFinite;
    return;
  }
  r.status = RowStatus::kOk;
  const RowParams& p = r.p;
  if (p.temperature < kGreedyTemperature) {
    r.token = static_cast<int32_t>(s[best_chunk].arg);
    return;
  }
  if (nan_z) {
    r.status = RowStatus::kNan;
    return;
  }
  r.mx = s[best_chunk].max_value;
  if (pos_inf || r.mx == -kInf) {
    // max x / T is not finite: uniform over the tokens at the max x (the oracle's DrawRow).
    r.plan = Plan::kTopTiesDraw;
    r.top_x = top_x;
    return;
  }
  if (IsPlainTemperature(p, args.vocab)) {  // the inverse-CDF draw (inverse_cdf_pass.h)
    r.plan = Plan::kInverseCdf;
    r.top_x = top_x;
    return;
  }
  r.min_finite = lowest;
  r.min_threshold = p.min_p > 0.0f ? r.mx + logf(p.min_p) : -kInf;
  r.k_threshold = -kInf;
  r.joint = p.top_p_mode == TopPMode::kJoint;
  r.top_p_alone = IsTopPAlone(p, args.vocab);
  r.need_k = p.top_k > 0 && p.top_k < args.vocab;
  r.need_p = p.top_p > 0.0f && p.top_p < 1.0f;
  r.candidates.clear();
  r.stage_count = -1;
  if (!r.need_k && !r.need_p) {
    r.plan = Plan::kDraw;
    r.draw_key = KeyOf(std::max(r.min_threshold, r.min_finite));
    return;
  }
  r.plan = Plan::kSelect;
  r.stage = r.need_k ? Stage::kTopK : Stage::kTopP;
}

}  // namespace samplerd::kernels::cpu_fast_internal
