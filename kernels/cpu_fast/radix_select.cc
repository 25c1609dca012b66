// Phase 2 of FastCpuSampler: radix selection of the top-k / top-p thresholds (radix_select.h).
#include "kernels/cpu_fast/radix_select.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <mutex>
#include <vector>

#include "kernels/cpu_fast/bin_kernels.h"
#include "kernels/cpu_fast/chunked_draw.h"
#include "kernels/cpu_fast/cpu_features.h"
#include "kernels/cpu_fast/gumbel_draw.h"
#include "kernels/cpu_fast/order_keys.h"
#include "kernels/cpu_fast/quantised_mass.h"
#include "kernels/cpu_fast/row_chunks.h"

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
  // Top-p alone: the chunked inverse-CDF draw over the survivors (chunked_draw.h).
  if (r.top_p_alone) return DrawChunkedGathered(kept, r);
  DrawSorted(kept, r);
  r.plan = Plan::kDone;
  r.token = static_cast<int32_t>(r.best_id);
}

// The draw over every survivor, keys <= p_key (top-p) and the other thresholds: Gumbel-max, or
// the chunked inverse CDF when top-p is the row's only filter.
void PlanDraw(uint32_t p_key, RowState& r) {
  r.plan = r.top_p_alone ? Plan::kChunkedDraw : Plan::kDraw;
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
    if (GridBin(ValueOf(static_cast<uint32_t>(mid)), r.mx, r.grid_scale) >= b) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  return static_cast<uint32_t>(lo);
}

// A histogram pass over tokens [t0, t1) of a row: counts (and, for top-p, masses with the
// counts packed in, bin_kernels.h) per bin into r.
void HistogramPass(const SampleArgs& args, int64_t row, int64_t t0, int64_t t1, RowState& r) {
  ThreadScratch& t = Scratch();
  float* scratch = t.x.data();
  int64_t* counts = t.counts.data();
  Mass* mass = t.mass.data();
  BinSpec spec;
  spec.grid = r.grid;
  spec.mx = r.mx;
  spec.scale = r.grid_scale;
  spec.window_lo = r.window_lo;
  spec.window_hi = r.window_hi;
  spec.floor = ValueOf(r.hi);
  spec.lo = r.lo;
  spec.span = r.hi - r.lo;
  spec.shift = r.shift;
  const bool with_masses = r.Masses();
  const bool avx512 = UseAvx512();
  const bool windowed = avx512 && r.grid && (r.window_lo > 0 || r.window_hi < kGridBins);
  const bool avx2 = UseAvx2();
  if (t.histogram_dirty) {  // an abandoned task's partial sums
    std::fill(t.counts.begin(), t.counts.end(), 0);
    std::fill(t.mass.begin(), t.mass.end(), 0);
  }
  t.histogram_dirty = true;
  int32_t end = 0;  // 1 + the highest bin touched
  // The lowest bin touched is 0, or window_lo - 1 for MassChunkWindowedAvx512.
  const int32_t low_bin = windowed ? std::max(0, r.window_lo - 1) : 0;
  for (int64_t begin = t0; begin < t1; begin += kChunk) {
    const int64_t n = std::min(kChunk, t1 - begin);
    const float* z = ScaledChunk(args, row, begin, n, r.p.temperature, scratch);
    int32_t chunk_end = 0;
#if SAMPLERD_CPU_FAST_X86
    if (avx2) {
      chunk_end = !with_masses ? CountChunkAvx2(spec, z, n, t.bins.data(), counts)
                  : !avx512    ? MassChunkAvx2(spec, z, n, mass)
                  : windowed   ? MassChunkWindowedAvx512(spec, z, n, mass)
                               : MassChunkAvx512(spec, z, n, mass);
    }
#endif
    if (!avx2) {
      chunk_end = with_masses ? HistogramChunkScalar<true>(spec, z, 0, n, counts, mass)
                              : HistogramChunkScalar<false>(spec, z, 0, n, counts, mass);
    }
    end = std::max(end, chunk_end);
  }
  // Merge bins [low_bin, end) into r stripe by stripe (RowState::stripe_mu), starting at this
  // task's own stripe.
  constexpr int kStripes = RowState::kMergeStripes;
  const int32_t stripe_bins = (end - low_bin + kStripes - 1) / kStripes;
  const uint32_t first = r.merge_ticket.fetch_add(1, std::memory_order_relaxed);
  for (int k = 0; k < kStripes && stripe_bins > 0; ++k) {
    const int stripe = static_cast<int>((first + k) % kStripes);
    const int32_t b0 = low_bin + stripe * stripe_bins;
    const int32_t b1 = std::min(end, b0 + stripe_bins);
    if (b0 >= b1) continue;
    std::lock_guard<SpinMutex> lock(r.stripe_mu[stripe]);
    if (with_masses) {
      for (int32_t b = b0; b < b1; ++b) r.mass[b] += mass[b];
    } else {
      for (int32_t b = b0; b < b1; ++b) r.counts[b] += counts[b];
    }
  }
  if (with_masses) {
    std::fill(mass + low_bin, mass + std::max(low_bin, end), 0);
  } else {
    std::fill(counts, counts + end, 0);
  }
  t.histogram_dirty = false;
}

constexpr int kGroupBins = 64;
constexpr int kWindowGroups = (kGridBins + kGroupBins) / kGroupBins;

// The first grid bin whose cumulative weight from bin 0 reaches `target` (kGridBins if none),
// by a scan of the groups' sums, then of the bins of the group that reaches it.
int FirstBinReaching(const double* weight, const double* group, double target) {
  double cumulative = 0.0;
  int g = 0;
  for (; g < kWindowGroups && cumulative + group[g] < target; ++g) cumulative += group[g];
  if (g == kWindowGroups) return kGridBins;
  const int last = std::min(kGridBins, g * kGroupBins + kGroupBins - 1);
  for (int b = g * kGroupBins; b < last; ++b) {
    cumulative += weight[b];
    if (cumulative >= target) return b;
  }
  return last;
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
  r.SetGrid(top, bottom, GridScale(r.mx, floor));
}

bool WantsWindowSample(const RowParams& p, int64_t vocab) {
  return !(p.temperature < kGreedyTemperature) && p.top_p > 0.0f && p.top_p < 1.0f &&
         vocab / kWindowSample >= 16;
}

void SampleForWindow(const SampleArgs& args, int64_t row, int64_t begin, int64_t n, RowState& r) {
  const int64_t stride = args.vocab / kWindowSample;
  const int64_t half = stride / 2;
  // The first k with k * stride + half >= begin.
  int64_t k = begin <= half ? 0 : (begin - half + stride - 1) / stride;
  const unsigned char* fp32 = Fp32Chunk(args, row, 0);
  for (; k < kWindowSample && k * stride + half < begin + n; ++k) {
    const int64_t j = k * stride + half;
    float x;
    if (fp32 != nullptr) {
      std::memcpy(&x, fp32 + j * 4, 4);
    } else {
      LoadChunk(args, row, j, 1, &x);
    }
    r.window_sample[k] = x;
  }
}

void NarrowMassWindow(const SampleArgs& args, int64_t row, RowState& r) {
  if (r.stage != Stage::kTopP || r.pass != Pass::kHistogram || !r.grid) return;
  // The window (8 standard errors each side) holds ~15% of a flat row's tokens.
  constexpr int64_t kSample = kWindowSample;
  constexpr double kStandardErrors = 8.0;
  const int64_t stride = args.vocab / kSample;
  if (stride < 16) return;  // a short row: the whole pass costs little more than the sample
  const bool sampled = static_cast<int64_t>(r.window_sample.size()) == kSample;
  // The sample's masses per grid bin and per group of kGroupBins bins (a short scan below).
  std::vector<double>& weight = Scratch().window_weight;
  weight.assign(kGridBins + 1 + kWindowGroups, 0.0);
  double* group = weight.data() + kGridBins + 1;
  double sum = 0.0;
  double sum_squares = 0.0;
  const uint32_t span = r.hi - r.lo;
  const unsigned char* fp32 = Fp32Chunk(args, row, 0);
  for (int64_t k = 0; k < kSample; ++k) {
    const int64_t j = k * stride + stride / 2;
    float x;
    if (sampled) {
      x = r.window_sample[k];
    } else if (fp32 != nullptr) {
      std::memcpy(&x, fp32 + j * 4, 4);
    } else {
      LoadChunk(args, row, j, 1, &x);
    }
    const float z = x / r.p.temperature;
    if (KeyOf(z) - r.lo > span) continue;  // not in the stage
    const double w = static_cast<double>(QuantisedMass(z, r.mx)) / kMassScale;
    const int b = GridBin(z, r.mx, r.grid_scale);
    weight[b] += w;
    group[b / kGroupBins] += w;
    sum += w;
    sum_squares += w * w;
  }
  // The sample's effective size: (sum w)^2 / sum w^2, 1 when one token holds all its mass.
  if (!(sum > 0.0) || sum * sum < 0.5 * kSample * sum_squares) return;
  const double effective = sum * sum / sum_squares;
  const double p = r.p.top_p;
  const double margin = kStandardErrors * std::sqrt(std::max(p * (1.0 - p), 0.01) / effective);
  // The bins where the cumulative fraction reaches p - margin and p + margin, one more each side.
  r.window_lo = std::max(0, FirstBinReaching(weight.data(), group, (p - margin) * sum) - 1);
  r.window_hi = std::min(kGridBins, FirstBinReaching(weight.data(), group, (p + margin) * sum) + 1);
}

void Histogram(const SampleArgs& args, int64_t row, int64_t t0, int64_t t1, RowState& r) {
  HistogramPass(args, row, t0, t1, r);
}

void Gather(const SampleArgs& args, int64_t row, int64_t t0, int64_t t1, RowState& r) {
  ThreadScratch& t = Scratch();
  float* scratch = t.x.data();
  const uint32_t top = r.gather_lo;
  const uint32_t span = r.gather_hi - top;
  const bool avx2 = UseAvx2();
  t.candidates.clear();
  for (int64_t begin = t0; begin < t1; begin += kChunk) {
    const int64_t n = std::min(kChunk, t1 - begin);
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
  std::lock_guard<SpinMutex> lock(r.mu);
  r.candidates.insert(r.candidates.end(), t.candidates.begin(), t.candidates.end());
}

void Advance(int64_t gather_cap, RowState& r) {
  if (r.pass == Pass::kGather) {
    return r.boundary_only ? FinishBoundary(gather_cap, r) : FinishGathered(gather_cap, r);
  }
  const bool top_p = r.stage == Stage::kTopP;
  if (top_p) {  // unpack HistogramPass's counts (bin_kernels.h)
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
  // Sums below `short_of` convert to doubles below the limit (rounding is monotone, and
  // short_of <= limit * (1 - 2^-50) < limit's double), so only the last bins before the
  // boundary pay for the 128-bit conversion (a library call).
  const Mass short_of = static_cast<Mass>(limit * (1.0 - 0x1p-50));
  int64_t count = r.count_above;
  Mass cumulative = r.mass_above;
  uint32_t p_key = UINT32_MAX;  // top-p keeps keys <= this
  int b = 0;
  for (; b < r.bins; ++b) {
    const int64_t before_count = count;
    const Mass before_mass = cumulative;
    count += r.counts[b];
    cumulative += r.mass[b];
    const bool reached = top_p ? cumulative >= short_of && static_cast<double>(cumulative) >= limit
                               : count >= r.p.top_k;
    if (!reached) continue;
    if (r.grid && (b < r.window_lo || b > r.window_hi)) {
      // The window (NarrowMassWindow) missed the boundary: only its bins are exact, so the
      // grid pass again, every bin exact.
      r.total = 0;
      r.SetGrid(r.lo, r.hi, r.grid_scale);
      return;
    }
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
