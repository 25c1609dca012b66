// Pass 2 of GPU sampling: RowFinishKernel, one block per row, turns the chunk statistics into
// the row's token (and logprobs).
//
// Launch: grid (batch), kFinishThreads threads. Rows with a small top-k select and draw over the
// chunk candidates only (never touching the row again); rows with top-p alone get their plan
// for MassDrawKernel (mass_plan.h) unless it falls back; other rows (large k, min-p alone,
// logprobs, a top-p fallback) read their row again, from L2 when it is still there: one pass per
// radix round that is needed, plus the draw. Logprobs add passes of their own.
#ifndef SAMPLERD_KERNELS_GPU_ROW_FINISH_H_
#define SAMPLERD_KERNELS_GPU_ROW_FINISH_H_

#include <cstdint>

#include "kernels/gpu/candidate_finish.h"
#include "kernels/gpu/chunk_pass.h"
#include "kernels/gpu/device_common.h"
#include "kernels/gpu/inverse_cdf.h"
#include "kernels/gpu/mass_plan.h"
#include "kernels/gpu/rows_in.h"
#include "kernels/gpu/select.h"

namespace samplerd::kernels::gpu {

inline constexpr int kFinishThreads = 512;

struct RowFinishParams {
  RowsIn rows;
  const ChunkStats* stats;
  const uint32_t* candidate_key;
  const int32_t* candidate_index;
  int32_t top_logprobs;
  LogprobSource logprob_source;
  int32_t* token_ids;
  RowStatus* status;
  float* sampled_logprob;
  int64_t* sampled_rank;
  int32_t* top_ids;
  float* top_values;
  MassWorkspace mass;  // the top-p rows' plans and pass-2 state (mass_plan.h)
};

// The items of a row: every token with z = x / temperature > -inf (NaN never reaches here),
// x processed by `procs` (row_processors.h), or raw when it has none (the default).
template <DType kDType>
struct RowSource {
  const void* row;
  int64_t vocab;
  float temperature;  // 1 gives the raw logits exactly
  RowProcessors procs{};
  int64_t row_index = 0;  // the row's index in the batch, for `procs`
  // Loads kUnroll elements per thread before using any, so a block keeps enough reads in
  // flight (one dependent load at a time ran at ~2 GB/s per row; see NOTES.md v2).
  static constexpr int kUnroll = 16;
  template <class F>
  __device__ void ForEach(F&& f) const {
    for (int64_t base = 0; base < vocab; base += kFinishThreads * kUnroll) {
      float v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t j = base + u * kFinishThreads + threadIdx.x;
        v[u] = j < vocab ? LoadLogit<kDType>(row, j) : -kInfF;
      }
      if (procs.active()) {
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const int64_t j = base + u * kFinishThreads + threadIdx.x;
          if (j < vocab) v[u] = procs.Apply(row_index, j, v[u]);
        }
      }
      // z = x exactly when T = 1 (the common case): skip the IEEE divide, which dominated the
      // profile of these loops (FCHK / MUFU.RCP, NOTES.md v4).
      const bool unit = temperature == 1.0f;
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const float z = unit ? v[u] : v[u] / temperature;
        if (z > -kInfF) f(OrderedKey(z), base + u * kFinishThreads + threadIdx.x, z);
      }
    }
  }
  __device__ float Z(int64_t j) const {
    float x = LoadLogit<kDType>(row, j);
    if (procs.active()) x = procs.Apply(row_index, j, x);
    return temperature == 1.0f ? x : x / temperature;
  }
};

// The items of a row's chunk candidates (a superset of its top-k).
struct CandidateSource {
  const uint32_t* key;  // [chunks, kCandidateCap] of this row
  const int32_t* index;
  const ChunkStats* stats;  // [chunks] of this row
  int chunks;
  template <class F>
  __device__ void ForEach(F&& f) const {
    for (int c = 0; c < chunks; ++c) {
      const uint32_t n = stats[c].candidates;
      const int64_t base = static_cast<int64_t>(c) * kCandidateCap;
      for (uint32_t i = threadIdx.x; i < n; i += kFinishThreads) {
        const uint32_t k = key[base + i];
        f(k, static_cast<int64_t>(index[base + i]), KeyToFloat(k));
      }
    }
  }
};

// The row-level statistics, combined from the chunks in chunk order (deterministic).
struct RowSummary {
  float max_z;
  float sum_exp_z;  // relative to max_z
  float max_x;
  float sum_exp_x;  // relative to max_x
  int64_t argmax_x;
  uint32_t nan_count;
  uint32_t pos_inf_x;
  uint32_t pos_inf_z;
  uint32_t not_neg_inf_x;
  bool candidates_ok;
  ArgMaxPair drawn;  // top-k rows whose candidates all tied: the best z + G over all chunks
  bool tied;  // a flat row: TiedAtRowMax, set only for top-k rows whose candidates overflowed
};

// Thread 0 combines; `staged` holds the row's chunk stats, loaded in parallel by the block
// (one dependent global load per chunk cost ~20 µs per row, NOTES.md v2).
__device__ inline RowSummary CombineChunks(const ChunkStats* staged, int chunks) {
  RowSummary r{-kInfF, 0.0f, -kInfF, 0.0f, 0, 0, 0, 0, 0, true, ArgMaxPair{-kInfF, INT64_MAX},
               false};
  for (int c = 0; c < chunks; ++c) {
    r.max_z = fmaxf(r.max_z, staged[c].max_z);
    r.max_x = fmaxf(r.max_x, staged[c].max_x);
  }
  bool have_argmax = false;
  for (int c = 0; c < chunks; ++c) {
    const ChunkStats& s = staged[c];
    if (s.sum_exp_z > 0.0f) r.sum_exp_z += s.sum_exp_z * expf(s.max_z - r.max_z);
    if (s.sum_exp_x > 0.0f) r.sum_exp_x += s.sum_exp_x * expf(s.max_x - r.max_x);
    if (!have_argmax && s.not_neg_inf_x > 0 && s.max_x == r.max_x) {
      r.argmax_x = s.argmax_x;  // chunks in index order: the first holder has the lowest index
      have_argmax = true;
    }
    r.nan_count += s.nan_count;
    r.pos_inf_x += s.pos_inf_x;
    r.pos_inf_z += s.pos_inf_z;
    r.not_neg_inf_x += s.not_neg_inf_x;
    r.candidates_ok = r.candidates_ok && s.overflow == 0;
    const ArgMaxPair drawn{s.best_score, s.best_index};
    if (Better(drawn, r.drawn)) r.drawn = drawn;
  }
  return r;
}

// Whether every chunk with a finite z overflowed its candidates with all its finite z equal to
// the row max (pass 1 then drew the row: a flat row, v11).
__device__ inline bool TiedAtRowMax(const ChunkStats* staged, int chunks, float row_max) {
  for (int c = 0; c < chunks; ++c) {
    const ChunkStats& s = staged[c];
    if (s.max_z != -kInfF && !(s.overflow != 0 && s.min_z == row_max)) return false;
  }
  return true;
}

// The token of a greedy row, which pass 1 already decided, when the row is ordinary: no NaN and
// a token above -inf. The same choice as CombineChunks (the argmax of the first chunk holding
// the row's max x), made by the block's first wave with shuffles (thread 0 alone spent ~6,000
// cycles on CombineChunks at 19 chunks, NOTES.md v16). -1 for a row that is not ordinary: the
// general finish gives it its status. Every thread must call; one barrier.
__device__ inline int64_t GreedyToken(const ChunkStats* stats, int chunks, int64_t* slot) {
  if (threadIdx.x < static_cast<unsigned>(kWaveSize)) {
    const int lane = static_cast<int>(threadIdx.x);
    float max_x = -kInfF;
    uint32_t odd = 0, finite = 0;
    for (int k = lane; k < chunks; k += kWaveSize) {
      const ChunkStats& s = stats[k];
      max_x = fmaxf(max_x, s.max_x);
      odd |= s.nan_count;
      finite |= s.not_neg_inf_x;
    }
    max_x = WaveMax(max_x);
    const bool ordinary = WaveOr(odd) == 0 && WaveOr(finite) != 0;
    int first = chunks;
    for (int k = lane; k < chunks; k += kWaveSize) {
      if (stats[k].not_neg_inf_x > 0 && stats[k].max_x == max_x) {
        first = k;
        break;
      }
    }
    first = WaveMinInt(first);
    if (lane == 0) *slot = ordinary && first < chunks ? stats[first].argmax_x : -1;
  }
  __syncthreads();
  return *slot;
}

// kTopTies: max x / T is not finite, so the row is uniform over the tokens at the max x.
enum class DrawKind : uint8_t { kPointMass, kTopTies, kFiltered };

// Shared state of one row's block.

struct FinishShared {
  union {
    SelectStorage select;
    ChunkStats staged[kMaxStagedChunks];  // only until the row summary is made
    MassPlanScratch mass_plan;            // mass rows' plan (mass_plan.h)
    InverseCdfShared inverse_cdf;         // plain-temperature rows' draw (inverse_cdf.h)
    ChunkedDrawShared chunked;            // v47: top-p-alone rows' draw (chunked_draw.h)
  };
  uint32_t candidate_offset[kMaxStagedChunks + 1];
  BlockReduce<kFinishThreads>::Storage reduce;
  RowSummary summary;
  CandidateScratch candidates;  // top-k rows (candidate_finish.h)
  int64_t greedy_token;         // GreedyToken
};

// Gumbel-max over the items of `source` with key >= lo: argmax of z + G (or of G alone when
// `noise_only`), lowest index on ties. *mass gets the items' fixed-point mass, *count their
// number.
template <class Source>
__device__ int64_t GumbelDraw(const Source& source, uint32_t lo, bool noise_only, float row_max,
                              const RowParams& params, FinishShared& sh, uint64_t* mass,
                              uint64_t* count) {
  ArgMaxPair best{-kInfF, INT64_MAX};
  uint64_t my_mass = 0, my_count = 0;
  const PhiloxKey philox_key = WaveUniformKey(params.seed);
  const uint64_t position = WaveUniformU64(params.position);
  source.ForEach([&](uint32_t key, int64_t j, float z) {
    if (key < lo) return;
    const float noise = GumbelOf(philox_key, position, static_cast<uint64_t>(j));
    const ArgMaxPair candidate{noise_only ? noise : z + noise, j};
    if (Better(candidate, best)) best = candidate;
    if (!noise_only) my_mass += FixedMass(z, row_max);
    ++my_count;
  });
  using Reduce = BlockReduce<kFinishThreads>;
  *mass = Reduce::SumU64(sh.reduce, my_mass);
  *count = Reduce::SumU64(sh.reduce, my_count);
  return Reduce::ArgMax(sh.reduce, best).index;
}

// Calls emit(slot, j) for the first `want` indices j (in index order) with pred(j) true.
template <class Pred, class Emit>
__device__ void OrderedFirst(int64_t vocab, int want, Pred pred, Emit emit, FinishShared& sh) {
  int64_t got = 0;
  for (int64_t base = 0; got < want && base < vocab; base += kFinishThreads) {
    const int64_t j = base + threadIdx.x;
    const bool flag = j < vocab && pred(j);
    uint64_t total = 0;
    const uint64_t before = BlockReduce<kFinishThreads>::ExclusiveScan(sh.reduce, flag, &total);
    if (flag && got + static_cast<int64_t>(before) < want) emit(got + before, j);
    got += static_cast<int64_t>(total);
  }
}

}  // namespace samplerd::kernels::gpu

#endif  // SAMPLERD_KERNELS_GPU_ROW_FINISH_H_
