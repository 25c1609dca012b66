// Phase 2 of FastCpuSampler: radix selection of the top-k / top-p thresholds (radix_select.h).
#include "kernels/cpu_fast/radix_select.h"

#include <algorithm>
#include <cmath>
#include <vector>

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
  DrawSorted(kept, r);
  r.plan = Plan::kDone;
  r.token = static_cast<int32_t>(r.best_id);
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
  if (r.stage == Stage::kTopP && r.stage_count >= 0 && r.stage_count <= gather_cap) {
    r.pass = Pass::kGather;  // few tokens: gather them all, the total comes from them
    r.gather_hi = bottom;
    return;
  }
  r.stage_count = -1;
  r.SetRange(top, bottom);
}

void Histogram(const SampleArgs& args, int64_t row, int64_t c0, int64_t c1, RowState& r) {
  ThreadScratch& t = Scratch();
  float* z = t.x.data();
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
    LoadChunk(args, row, begin, n, z);
    Scale(z, n, r.p.temperature);
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
  float* z = t.x.data();
  const uint32_t top = KeyOf(r.mx);
  const uint32_t span = r.gather_hi - top;
  t.candidates.clear();
  for (int64_t c = c0; c < c1; ++c) {
    const int64_t begin = c * kChunk;
    const int64_t n = std::min(kChunk, args.vocab - begin);
    LoadChunk(args, row, begin, n, z);
    Scale(z, n, r.p.temperature);
    for (int64_t j = 0; j < n; ++j) {
      if (KeyOf(z[j]) - top <= span) {
        t.candidates.push_back({z[j], static_cast<int32_t>(begin + j)});
      }
    }
  }
  std::lock_guard<std::mutex> lock(r.mu);
  r.candidates.insert(r.candidates.end(), t.candidates.begin(), t.candidates.end());
}

void Advance(int64_t gather_cap, RowState& r) {
  if (r.pass == Pass::kGather) return FinishGathered(gather_cap, r);
  const bool top_p = r.stage == Stage::kTopP;
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
    const uint32_t bin_lo = r.lo + (static_cast<uint32_t>(b) << r.shift);
    const uint32_t bin_hi = std::min(r.hi, bin_lo + ((1u << r.shift) - 1));
    if (count <= gather_cap) {
      r.pass = Pass::kGather;
      r.gather_hi = bin_hi;
      r.candidates.clear();
      return;
    }
    if (bin_lo != bin_hi) {
      r.count_above = before_count;
      r.mass_above = before_mass;
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
  if (!top_p && r.need_p) {
    r.stage = Stage::kTopP;
    return StartStage(gather_cap, r);
  }
  r.plan = Plan::kDraw;
  r.draw_key = std::min({p_key, KeyOf(std::max(r.min_threshold, r.min_finite)),
                         KeyOf(std::max(r.k_threshold, r.min_finite))});
}

}  // namespace samplerd::kernels::cpu_fast_internal
