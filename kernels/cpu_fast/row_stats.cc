// Phase 1 of FastCpuSampler: row statistics and the per-row decision.
#include "kernels/cpu_fast/row_stats.h"

#include <algorithm>
#include <cmath>

#include "kernels/cpu_fast/order_keys.h"
#include "kernels/cpu_fast/row_chunks.h"

namespace samplerd::kernels::cpu_fast_internal {

ChunkStats ComputeChunkStats(const SampleArgs& args, int64_t row, int64_t chunk,
                             const RowParams& p) {
  const int64_t begin = chunk * kChunk;
  const int64_t n = std::min(kChunk, args.vocab - begin);
  float* x = Scratch().x.data();
  LoadChunk(args, row, begin, n, x);
  ChunkStats s;
  bool nan_x = false;
  bool above = false;
  float max_x = -kInf;
  for (int64_t j = 0; j < n; ++j) {
    nan_x |= x[j] != x[j];
    above |= x[j] != -kInf;
    max_x = x[j] > max_x ? x[j] : max_x;
  }
  s.nan_x = nan_x;
  s.max_x = max_x;
  s.any_above_neg_inf = above;
  if (p.temperature < kGreedyTemperature) {
    float m = -kInf;
    for (int64_t j = 0; j < n; ++j) m = x[j] > m ? x[j] : m;
    int64_t arg = 0;
    while (arg < n && !(x[arg] == m)) ++arg;
    s.max_value = m;
    s.arg = begin + (arg < n ? arg : 0);
  } else {
    Scale(x, n, p.temperature);
    float m = -kInf;
    float lowest = kInf;
    bool nan_z = false;
    bool pos_inf = false;
    for (int64_t j = 0; j < n; ++j) {
      nan_z |= x[j] != x[j];
      pos_inf |= x[j] == kInf;
      m = x[j] > m ? x[j] : m;
      lowest = x[j] != -kInf && x[j] < lowest ? x[j] : lowest;
    }
    s.max_value = m;
    s.min_finite = lowest;
    s.nan_z = nan_z;
    s.pos_inf_z = pos_inf;
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
  r.min_finite = lowest;
  r.min_threshold = p.min_p > 0.0f ? r.mx + logf(p.min_p) : -kInf;
  r.k_threshold = -kInf;
  r.joint = p.top_p_mode == TopPMode::kJoint;
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
