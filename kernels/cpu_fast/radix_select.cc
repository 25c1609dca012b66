// Phase 2 of FastCpuSampler: radix selection of the top-k / top-p thresholds (radix_select.h).
#include "kernels/cpu_fast/radix_select.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu_fast/cpu_features.h"
#include "kernels/cpu_fast/gumbel_draw.h"
#include "kernels/cpu_fast/order_keys.h"
#include "kernels/cpu_fast/quantised_mass.h"
#include "kernels/cpu_fast/row_chunks.h"

#if SAMPLERD_CPU_FAST_X86
#include <immintrin.h>
#endif

namespace samplerd::kernels::cpu_fast_internal {
namespace {

// The gathered tokens are every token of the stage with key <= gather_hi, which holds the
// stage's boundary: apply the stage exactly as the oracle does, then either start top-p (JOINT
// needs the whole row) or draw over the survivors, which are all gathered.
void FinishGathered(int64_t gather_cap, RowState& r) {
  std::vector<Candidate>& c = r.candidates;
  std::sort(c.begin(), c.end(), [](const Candidate& a, const Candidate& b) {
    return a.z > b.z || (a.z == b.z && a.id < b.id);
  });
  const int64_t n = static_cast<int64_t>(c.size());
  int64_t kept = n;  // survivors: c[0, kept)
  if (r.stage == Stage::kTopK) {
    // Fewer gathered than k happens only when the stage holds fewer tokens: then no cut.
    if (r.p.top_k <= n) {
      r.k_threshold = c[r.p.top_k - 1].z;
      while (kept > 0 && c[kept - 1].z < r.k_threshold) --kept;
    }
    if (r.need_p && r.joint) {
      r.stage = Stage::kTopP;
      r.stage_count = -1;
      return StartStage(gather_cap, r);
    }
  }
  if (r.need_p) {
    // Top-p over c[0, kept). From a histogram stage the total (and every mass) is quantised;
    // otherwise these are all the stage's tokens and the sums are the oracle's own.
    const bool quantised = r.total != 0;
    auto mass = [&](const Candidate& t) { return std::exp(static_cast<double>(t.z) - r.mx); };
    double total = 0.0;
    if (quantised) {
      total = static_cast<double>(r.total);
    } else {
      for (int64_t i = 0; i < kept; ++i) total += mass(c[i]);
    }
    const double limit = static_cast<double>(r.p.top_p) * total;
    double prefix = 0.0;
    Mass prefix_q = 0;
    int64_t i = 0;
    for (; i < kept; ++i) {
      if (i > 0 && c[i].z != c[i - 1].z) {
        const double above = quantised ? static_cast<double>(prefix_q) : prefix;
        if (!(above < limit)) break;
      }
      if (quantised) {
        prefix_q += QuantisedMass(c[i].z, r.mx);
      } else {
        prefix += mass(c[i]);
      }
    }
    kept = i;
  }
  DrawSorted(kept, r);
  r.plan = Plan::kDone;
  r.token = static_cast<int32_t>(r.best_id);
}

// The draw over every survivor, keys <= p_key (top-p) and the other thresholds.
void PlanDraw(uint32_t p_key, RowState& r) {
  r.plan = Plan::kDraw;
  r.draw_key = std::min({p_key, KeyOf(std::max(r.min_threshold, r.min_finite)),
                         KeyOf(std::max(r.k_threshold, r.min_finite))});
}

// Starts the top-p stage after a top-k stage whose survivors number `survivors`.
void StartTopP(int64_t gather_cap, int64_t survivors, RowState& r) {
  r.stage = Stage::kTopP;
  r.stage_count = r.joint ? -1 : survivors;  // JOINT: the stage is every finite z
  StartStage(gather_cap, r);
}

// The gathered tokens are exactly the boundary bin's, below count_above tokens of mass
// mass_above: find the stage's threshold among them, then start top-p or draw over the row.
void FinishBoundary(int64_t gather_cap, RowState& r) {
  std::vector<Candidate>& c = r.candidates;
  std::sort(c.begin(), c.end(), [](const Candidate& a, const Candidate& b) {
    return a.z > b.z || (a.z == b.z && a.id < b.id);
  });
  const int64_t n = static_cast<int64_t>(c.size());
  if (r.stage == Stage::kTopK) {
    // count_above < k <= count_above + n, so the k-th value is here.
    const int64_t need = r.p.top_k - r.count_above;
    r.k_threshold = c[need - 1].z;
    int64_t kept = need;
    while (kept < n && c[kept].z == r.k_threshold) ++kept;  // ties with the k-th value stay
    if (r.need_p) return StartTopP(gather_cap, r.count_above + kept, r);
    return PlanDraw(UINT32_MAX, r);
  }
  // Top-p: the mass strictly above the first token is mass_above < limit, so it stays; a later
  // tie group stays while the mass above it is < limit (Advance's rule, token by token).
  const double limit = static_cast<double>(r.p.top_p) * static_cast<double>(r.total);
  Mass above = r.mass_above;
  int64_t i = 0;
  for (; i < n; ++i) {
    if (i > 0 && c[i].z != c[i - 1].z && !(static_cast<double>(above) < limit)) break;
    above += QuantisedMass(c[i].z, r.mx);
  }
  PlanDraw(KeyOf(c[i - 1].z), r);
}

// The smallest key in [r.lo, r.hi + 1] whose grid bin is >= b (keys grow as z falls, and the
// bins with them).
uint32_t FirstKeyOfGridBin(int b, const RowState& r) {
  uint64_t lo = r.lo;
  uint64_t hi = static_cast<uint64_t>(r.hi) + 1;
  while (lo < hi) {
    const uint64_t mid = (lo + hi) / 2;
    if (GridBin(ValueOf(static_cast<uint32_t>(mid)), r.mx) >= b) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  return static_cast<uint32_t>(lo);
}

// Grid bins + 1 of z[0, n) into bins (0 for tokens below `floor`, outside the stage) and, with
// kMasses, their quantised masses into masses.
// Returns the largest of those bins + 1 (0 if none).
template <bool kMasses>
int32_t GridBinsScalar(const float* z, int64_t begin, int64_t n, float mx, float floor,
                       int32_t* bins, uint64_t* masses) {
  int32_t last = 0;
  for (int64_t j = begin; j < n; ++j) {
    const bool in = z[j] >= floor;
    bins[j] = in ? GridBin(z[j], mx) + 1 : 0;
    last = std::max(last, bins[j]);
    if (kMasses) masses[j] = in ? QuantisedMass(z[j], mx) : 0;
  }
  return last;
}

#if SAMPLERD_CPU_FAST_X86
template <bool kMasses>
SAMPLERD_AVX2 int32_t GridBinsAvx2(const float* z, int64_t n, float mx, float floor, int32_t* bins,
                                uint64_t* masses) {
  const __m256 mxv = _mm256_set1_ps(mx);
  const __m256 floorv = _mm256_set1_ps(floor);
  const __m256 grid_logits = _mm256_set1_ps(kGridLogits);
  const __m256 per_logit = _mm256_set1_ps(kGridBinsPerLogit);
  const __m256 below_grid = _mm256_castsi256_ps(_mm256_set1_epi32(kGridBins));
  const __m256i one = _mm256_set1_epi32(1);
  const __m256d mxd = _mm256_set1_pd(static_cast<double>(mx));
  __m256i last = _mm256_setzero_si256();
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m256 v = _mm256_loadu_ps(z + j);
    const __m256 in = _mm256_cmp_ps(v, floorv, _CMP_GE_OQ);
    const __m256 d = _mm256_sub_ps(mxv, v);
    const __m256 on_grid = _mm256_cmp_ps(d, grid_logits, _CMP_LT_OQ);
    const __m256 bin = _mm256_blendv_ps(
        below_grid, _mm256_castsi256_ps(_mm256_cvttps_epi32(_mm256_mul_ps(d, per_logit))),
        on_grid);
    const __m256i bin1 = _mm256_and_si256(_mm256_add_epi32(_mm256_castps_si256(bin), one),
                                          _mm256_castps_si256(in));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(bins + j), bin1);
    last = _mm256_max_epi32(last, bin1);
    if (kMasses) {
      const __m256i in64_lo = _mm256_cvtepi32_epi64(_mm256_castsi256_si128(_mm256_castps_si256(in)));
      const __m256i in64_hi =
          _mm256_cvtepi32_epi64(_mm256_extracti128_si256(_mm256_castps_si256(in), 1));
      const __m256i m0 = QuantisedMass4(_mm256_sub_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(v)), mxd));
      const __m256i m1 = QuantisedMass4(_mm256_sub_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)), mxd));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(masses + j), _mm256_and_si256(m0, in64_lo));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(masses + j + 4), _mm256_and_si256(m1, in64_hi));
    }
  }
  alignas(32) int32_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), last);
  int32_t top = GridBinsScalar<kMasses>(z, j, n, mx, floor, bins, masses);
  for (int32_t lane : lanes) top = std::max(top, lane);
  return top;
}
#endif

#if SAMPLERD_CPU_FAST_X86
// Appends the tokens of z[0, n) with KeyOf(z) - lo <= span to `out`, 8 at a time; returns how
// many tokens it looked at (the rest, < 8, are the caller's).
SAMPLERD_AVX2 int64_t GatherAvx2(const float* z, int64_t begin, int64_t n, uint32_t lo,
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

SAMPLERD_AVX512_WARNINGS_OFF
// GridBinsAvx2<true> with the masses 8 at a time (AVX-512 F + DQ).
SAMPLERD_AVX512 int32_t GridBinsAvx512(const float* z, int64_t n, float mx, float floor,
                                       int32_t* bins, uint64_t* masses) {
  const ExpTable512 table;
  const __m256 mxv = _mm256_set1_ps(mx);
  const __m256 floorv = _mm256_set1_ps(floor);
  const __m256 grid_logits = _mm256_set1_ps(kGridLogits);
  const __m256 per_logit = _mm256_set1_ps(kGridBinsPerLogit);
  const __m256 below_grid = _mm256_castsi256_ps(_mm256_set1_epi32(kGridBins));
  const __m256i one = _mm256_set1_epi32(1);
  const __m512d mxd = _mm512_set1_pd(static_cast<double>(mx));
  __m256i last = _mm256_setzero_si256();
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m256 v = _mm256_loadu_ps(z + j);
    const __m256 in = _mm256_cmp_ps(v, floorv, _CMP_GE_OQ);
    const __m256 d = _mm256_sub_ps(mxv, v);
    const __m256 on_grid = _mm256_cmp_ps(d, grid_logits, _CMP_LT_OQ);
    const __m256 bin = _mm256_blendv_ps(
        below_grid, _mm256_castsi256_ps(_mm256_cvttps_epi32(_mm256_mul_ps(d, per_logit))),
        on_grid);
    const __m256i bin1 = _mm256_and_si256(_mm256_add_epi32(_mm256_castps_si256(bin), one),
                                          _mm256_castps_si256(in));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(bins + j), bin1);
    last = _mm256_max_epi32(last, bin1);
    const __m512i m = QuantisedMass8(_mm512_sub_pd(_mm512_cvtps_pd(v), mxd), table);
    _mm512_storeu_si512(masses + j,
                        _mm512_maskz_mov_epi64(static_cast<__mmask8>(_mm256_movemask_ps(in)), m));
  }
  alignas(32) int32_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), last);
  int32_t top = GridBinsScalar<true>(z, j, n, mx, floor, bins, masses);
  for (int32_t lane : lanes) top = std::max(top, lane);
  return top;
}
SAMPLERD_AVX512_WARNINGS_ON
#endif

// The grid pass over chunks [c0, c1) of a row: counts (and masses) per grid bin into r. With
// masses, a bin's count rides in bits 96.. of its mass sum (one add per token: sums of < 2^32
// masses <= 2^62 stay below 2^96); Advance unpacks them.
void GridHistogram(const SampleArgs& args, int64_t row, int64_t c0, int64_t c1, RowState& r) {
  ThreadScratch& t = Scratch();
  float* scratch = t.x.data();
  int32_t* bins = t.bins.data();
  uint64_t* masses = t.masses.data();
  int64_t* counts = t.grid_counts.data();
  Mass* mass = t.grid_mass.data();
  const bool with_masses = r.Masses();
  const float floor = ValueOf(r.hi);
  const bool avx2 = UseAvx2();
  const bool avx512 = UseAvx512();
  int32_t last = 0;  // the highest bin + 1 used
  for (int64_t c = c0; c < c1; ++c) {
    const int64_t begin = c * kChunk;
    const int64_t n = std::min(kChunk, args.vocab - begin);
    const float* z = ScaledChunk(args, row, begin, n, r.p.temperature, scratch);
    int32_t top = 0;
#if SAMPLERD_CPU_FAST_X86
    if (avx2) {
      top = !with_masses ? GridBinsAvx2<false>(z, n, r.mx, floor, bins, masses)
            : avx512     ? GridBinsAvx512(z, n, r.mx, floor, bins, masses)
                         : GridBinsAvx2<true>(z, n, r.mx, floor, bins, masses);
    }
#endif
    if (!avx2) {
      top = with_masses ? GridBinsScalar<true>(z, 0, n, r.mx, floor, bins, masses)
                        : GridBinsScalar<false>(z, 0, n, r.mx, floor, bins, masses);
    }
    last = std::max(last, top);
    if (with_masses) {
      constexpr Mass kOne = static_cast<Mass>(1) << 96;
      for (int64_t j = 0; j < n; ++j) mass[bins[j]] += kOne + masses[j];
    } else {
      for (int64_t j = 0; j < n; ++j) ++counts[bins[j]];
    }
  }
  {
    std::lock_guard<std::mutex> lock(r.mu);
    if (with_masses) {
      for (int32_t b = 1; b <= last; ++b) r.mass[b - 1] += mass[b];
    } else {
      for (int32_t b = 1; b <= last; ++b) r.counts[b - 1] += counts[b];
    }
  }
  if (with_masses) {
    std::fill(mass, mass + last + 1, 0);
  } else {
    std::fill(counts, counts + last + 1, 0);
  }
}

}  // namespace

void StartStage(int64_t gather_cap, RowState& r) {
  float floor = r.min_finite;
  if (r.stage == Stage::kTopK || !r.joint) floor = std::max(floor, r.min_threshold);
  if (r.stage == Stage::kTopP && !r.joint) floor = std::max(floor, r.k_threshold);
  const uint32_t top = KeyOf(r.mx);
  const uint32_t bottom = KeyOf(floor);
  r.count_above = 0;
  r.mass_above = 0;
  r.total = 0;
  r.boundary_only = false;
  if (r.stage == Stage::kTopP && r.stage_count >= 0 && r.stage_count <= gather_cap) {
    r.pass = Pass::kGather;  // few tokens: gather them all, the total comes from them
    r.gather_lo = top;
    r.gather_hi = bottom;
    return;
  }
  r.stage_count = -1;
  r.SetGrid(top, bottom);
}

void Histogram(const SampleArgs& args, int64_t row, int64_t c0, int64_t c1, RowState& r) {
  if (r.grid) return GridHistogram(args, row, c0, c1, r);
  ThreadScratch& t = Scratch();
  float* scratch = t.x.data();
  const uint32_t lo = r.lo;
  const uint32_t span = r.hi - r.lo;
  const int shift = r.shift;
  const float mx = r.mx;
  const bool masses = r.Masses();
  std::fill(t.counts.begin(), t.counts.begin() + r.bins, 0);
  if (masses) std::fill(t.mass.begin(), t.mass.begin() + r.bins, 0);
  for (int64_t c = c0; c < c1; ++c) {
    const int64_t begin = c * kChunk;
    const int64_t n = std::min(kChunk, args.vocab - begin);
    const float* z = ScaledChunk(args, row, begin, n, r.p.temperature, scratch);
    for (int64_t j = 0; j < n; ++j) {
      const uint32_t offset = KeyOf(z[j]) - lo;
      if (offset > span) continue;
      const uint32_t bin = offset >> shift;
      ++t.counts[bin];
      if (masses) t.mass[bin] += QuantisedMass(z[j], mx);
    }
  }
  std::lock_guard<std::mutex> lock(r.mu);
  for (int b = 0; b < r.bins; ++b) r.counts[b] += t.counts[b];
  if (masses) {
    for (int b = 0; b < r.bins; ++b) r.mass[b] += t.mass[b];
  }
}

void Gather(const SampleArgs& args, int64_t row, int64_t c0, int64_t c1, RowState& r) {
  ThreadScratch& t = Scratch();
  float* scratch = t.x.data();
  const uint32_t top = r.gather_lo;
  const uint32_t span = r.gather_hi - top;
  const bool avx2 = UseAvx2();
  t.candidates.clear();
  for (int64_t c = c0; c < c1; ++c) {
    const int64_t begin = c * kChunk;
    const int64_t n = std::min(kChunk, args.vocab - begin);
    const float* z = ScaledChunk(args, row, begin, n, r.p.temperature, scratch);
    int64_t j = 0;
#if SAMPLERD_CPU_FAST_X86
    if (avx2) j = GatherAvx2(z, begin, n, top, span, t.candidates);
#endif
    for (; j < n; ++j) {
      if (KeyOf(z[j]) - top <= span) {
        t.candidates.push_back({z[j], static_cast<int32_t>(begin + j)});
      }
    }
  }
  std::lock_guard<std::mutex> lock(r.mu);
  r.candidates.insert(r.candidates.end(), t.candidates.begin(), t.candidates.end());
}

void Advance(int64_t gather_cap, RowState& r) {
  if (r.pass == Pass::kGather) {
    return r.boundary_only ? FinishBoundary(gather_cap, r) : FinishGathered(gather_cap, r);
  }
  const bool top_p = r.stage == Stage::kTopP;
  if (r.grid && top_p) {  // unpack GridHistogram's counts
    constexpr Mass kMassBits = (static_cast<Mass>(1) << 96) - 1;
    for (int b = 0; b < r.bins; ++b) {
      r.counts[b] = static_cast<int64_t>(r.mass[b] >> 96);
      r.mass[b] &= kMassBits;
    }
  }
  if (top_p && r.total == 0) {  // the first pass of a top-p stage: its total
    for (int b = 0; b < r.bins; ++b) r.total += r.mass[b];
  }
  const double limit = static_cast<double>(r.p.top_p) * static_cast<double>(r.total);
  int64_t count = r.count_above;
  Mass cumulative = r.mass_above;
  uint32_t p_key = UINT32_MAX;  // top-p keeps keys <= this
  int b = 0;
  for (; b < r.bins; ++b) {
    const int64_t before_count = count;
    const Mass before_mass = cumulative;
    count += r.counts[b];
    cumulative += r.mass[b];
    const bool reached = top_p ? static_cast<double>(cumulative) >= limit : count >= r.p.top_k;
    if (!reached) continue;
    uint32_t bin_lo, bin_hi;
    if (r.grid) {
      bin_lo = FirstKeyOfGridBin(b, r);
      bin_hi = b == kGridBins ? r.hi : FirstKeyOfGridBin(b + 1, r) - 1;
    } else {
      bin_lo = r.lo + (static_cast<uint32_t>(b) << r.shift);
      bin_hi = std::min(r.hi, bin_lo + ((1u << r.shift) - 1));
    }
    if (count <= gather_cap) {  // gather every token down to the bin
      r.pass = Pass::kGather;
      r.boundary_only = false;
      r.gather_lo = KeyOf(r.mx);
      r.gather_hi = bin_hi;
      r.candidates.clear();
      return;
    }
    if (bin_lo != bin_hi) {
      r.count_above = before_count;
      r.mass_above = before_mass;
      if (r.counts[b] <= gather_cap) {  // gather the bin alone
        r.pass = Pass::kGather;
        r.boundary_only = true;
        r.gather_lo = bin_lo;
        r.gather_hi = bin_hi;
        r.candidates.clear();
        return;
      }
      r.SetRange(bin_lo, bin_hi);
      return;
    }
    // One value: the boundary itself.
    if (top_p) {
      p_key = bin_lo;
    } else {
      r.k_threshold = ValueOf(bin_lo);
      r.stage_count = count;  // the tokens with z >= the k-th value
    }
    break;
  }
  if (b == r.bins && !top_p) {
    // Fewer survivors than k: top-k keeps them all. (A top-p stage that never reaches its
    // limit, which only rounding could cause, keeps all its tokens.)
    r.need_k = false;
    r.stage_count = count;
  }
  if (!top_p && r.need_p) return StartTopP(gather_cap, r.stage_count, r);
  PlanDraw(p_key, r);
}

}  // namespace samplerd::kernels::cpu_fast_internal
