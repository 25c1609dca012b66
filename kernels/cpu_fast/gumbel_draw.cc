// Phase 3 of FastCpuSampler: the Gumbel-max draw with exact skips (gumbel_draw.h).
#include "kernels/cpu_fast/gumbel_draw.h"

#include <algorithm>
#include <cmath>
#include <mutex>
#include <vector>

#include "kernels/common/philox.h"
#include "kernels/cpu_fast/order_keys.h"
#include "kernels/cpu_fast/row_chunks.h"

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

void DrawChunks(const SampleArgs& args, int64_t row, int64_t c0, int64_t c1, RowState& r) {
  float* z = Scratch().x.data();
  const RowParams& p = r.p;
  const PhiloxKey key = PhiloxKeyFromSeed(p.seed);
  const float* bound = Bounds().bound;
  int64_t best = -1;
  float best_score = 0.0f;
  // The row's maximum token always survives and scores at least mx - 2.82.
  float floor = r.mx - kGumbelBelow;
  const uint32_t top = KeyOf(r.mx);
  const uint32_t span = r.draw_key - top;
  for (int64_t c = c0; c < c1; ++c) {
    const int64_t begin = c * kChunk;
    const int64_t n = std::min(kChunk, args.vocab - begin);
    LoadChunk(args, row, begin, n, z);
    if (r.plan == Plan::kTopTiesDraw) {
      for (int64_t j = 0; j < n; ++j) {
        if (z[j] != r.top_x) continue;  // x: not scaled on this plan
        const float score = GumbelNoise(p.seed, p.position, static_cast<uint64_t>(begin + j));
        if (best < 0 || score > best_score) {
          best = begin + j;
          best_score = score;
        }
      }
      continue;
    }
    Scale(z, n, p.temperature);
    // Blocks of 4 tokens share one Philox call (begin is a multiple of 4).
    for (int64_t j0 = 0; j0 < n; j0 += 4) {
      const int64_t m = std::min<int64_t>(4, n - j0);
      bool any = false;
      for (int64_t i = 0; i < m; ++i) {
        const float v = z[j0 + i];
        any |= KeyOf(v) - top <= span && !(v + kGumbelAbove < floor);
      }
      if (!any) continue;
      const PhiloxCounter bits =
          Philox4x32x10(PhiloxCounterFor(p.position, static_cast<uint64_t>(begin + j0)), key);
      for (int64_t i = 0; i < m; ++i) {
        const float v = z[j0 + i];
        if (KeyOf(v) - top > span) continue;
        const uint32_t w = bits.word[i];
        if (v + bound[w >> kNoiseBucketShift] < floor) continue;
        const float score = v + GumbelFromUniform(UniformFromBits(w));
        if (best < 0 || score > best_score) {
          best = begin + j0 + i;
          best_score = score;
          floor = std::max(floor, score);
        }
      }
    }
  }
  if (best < 0) return;
  std::lock_guard<std::mutex> lock(r.mu);
  r.Offer(best_score, best);
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
