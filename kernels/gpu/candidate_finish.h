// The finish of a top-k row (k <= kMaxCandidateK) from its chunk candidates, by one block: the
// row summary it needs, then the exact min-p / top-k / top-p over the candidates and the draw.
//
// Written for latency (v14): a phase trace of v13's finish at B = 1 (NOTES.md) spent 39,000
// cycles a row, most of them in serial work with the block waiting at a barrier: thread 0
// combining the chunk stats (6,200), a 64-segment scan of a 2,048-bin histogram (10,500), a
// bitonic sort of 64 items (6,200). Here one wave combines the chunks with shuffles, each thread
// owns 4 consecutive bins of the histogram (one block scan finds the k-th value's bin), and the
// few items left (usually about k) are sorted by rank, in one step.
#ifndef SAMPLERD_KERNELS_GPU_CANDIDATE_FINISH_H_
#define SAMPLERD_KERNELS_GPU_CANDIDATE_FINISH_H_

#include <cstdint>

#include "kernels/gpu/chunk_stats.h"
#include "kernels/gpu/device_common.h"
#include "kernels/gpu/select.h"

namespace samplerd::kernels::gpu {

inline constexpr int kRankSortCap = 256;  // collected items sorted by rank; more: bitonic

// How a top-k row ends, from its chunk stats (CandidateRowSummary).
enum class CandidatePath : uint32_t {
  kList,     // from the candidate lists (CandidatesDraw)
  kTied,     // a flat row: every chunk overflowed with its finite z all at the row max, and
             // pass 1 drew the row (v11); its token is the best z + G over the chunks
  kGeneral,  // anything else (NaN, z = +inf, nothing finite, an overflow that is not a tie,
             // more than kSortCap candidates): the general finish, which handles each case
};

// Shared memory of the candidate finish (beside SelectStorage, whose histogram and sort arrays
// it uses).
struct CandidateScratch {
  uint32_t rank_key[kRankSortCap];  // the collected items, before they are sorted by rank
  int32_t rank_index[kRankSortCap];
  float max_z;      // the row summary (CandidateRowSummary)
  float sum_exp_z;  // relative to max_z; JOINT top-p rows only
  uint32_t total;   // candidates of the row
  CandidatePath path;
  int64_t drawn;       // kTied: the token
  uint32_t floor_bin;  // the top-k's last bin (TopBin)
  uint32_t collected;  // items in bins <= floor_bin
  uint32_t cut;        // the collect counter, then the top-k cut
  uint32_t top_p_cut;
};

// Bin of z in 1/64 logit below the row max, the max in bin 0; everything more than 2,047 / 64
// logits below lands in the last bin. Monotone: a larger z never gets a larger bin.
__device__ __forceinline__ int TopBin(float row_max, float z) {
  const float d = (row_max - z) * kValueBinsPerLogit;
  return d < static_cast<float>(kHistBins - 1) ? static_cast<int>(d) : kHistBins - 1;
}

// The summary a top-k row needs, by the block's first wave with shuffles (thread 0 alone cost
// ~6,000 cycles at 19 chunks): the max z, for JOINT top-p the sum of exp(z - max), each chunk's
// first candidate (offset[c], offset[chunks] = the total), and the row's CandidatePath. Every
// thread must call; one barrier.
__device__ inline void CandidateRowSummary(const ChunkStats* stats, int chunks, bool joint,
                                           uint32_t* offset, CandidateScratch& c) {
  if (threadIdx.x < static_cast<unsigned>(kWaveSize)) {
    const int lane = static_cast<int>(threadIdx.x);
    float max_z = -kInfF;
    uint32_t odd = 0, overflow = 0, finite = 0, carry = 0;
    for (int base = 0; base < chunks; base += kWaveSize) {
      const int k = base + lane;
      uint32_t n = 0;
      if (k < chunks) {
        const ChunkStats& s = stats[k];
        max_z = fmaxf(max_z, s.max_z);
        odd |= s.nan_count | s.pos_inf_z;
        overflow |= s.overflow;
        finite |= s.not_neg_inf_x;
        n = s.candidates;
      }
      uint32_t inclusive = n;
      for (int o = 1; o < kWaveSize; o <<= 1) {
        const uint32_t up = __shfl_up(inclusive, o, kWaveSize);
        if (lane >= o) inclusive += up;
      }
      if (k < chunks) offset[k] = carry + inclusive - n;
      carry += __shfl(inclusive, kWaveSize - 1, kWaveSize);
    }
    max_z = WaveMax(max_z);
    odd = WaveOr(odd);
    overflow = WaveOr(overflow);
    finite = WaveOr(finite);
    const bool plain = odd == 0 && finite != 0 && max_z > -kInfF;
    // JOINT top-p: the row's sum of exp(z - max) by one lane in chunk order, the additions of
    // CombineChunks (row_finish.h) exactly, so that the kept set never depends on which finish
    // ran (a row that asks for logprobs takes the general one).
    float sum = 0.0f;
    if (joint && plain && lane == 0) {
      for (int k = 0; k < chunks; ++k) {
        const ChunkStats& s = stats[k];
        if (s.sum_exp_z > 0.0f) sum += s.sum_exp_z * expf(s.max_z - max_z);
      }
    }
    // A flat row (TiedAtRowMax of the general finish): every chunk with a finite z overflowed,
    // its least finite z at the row max.
    uint32_t tied = 1;
    ArgMaxPair drawn{-kInfF, INT64_MAX};
    if (plain && overflow != 0) {
      for (int k = lane; k < chunks; k += kWaveSize) {
        const ChunkStats& s = stats[k];
        tied &= s.max_z == -kInfF || (s.overflow != 0 && s.min_z == max_z);
        const ArgMaxPair chunk_best{s.best_score, s.best_index};
        if (Better(chunk_best, drawn)) drawn = chunk_best;
      }
      tied = WaveAnd(tied);
      drawn = WaveArgMax(drawn);
    }
    if (lane == 0) {
      offset[chunks] = carry;
      c.max_z = max_z;
      c.sum_exp_z = sum;
      c.total = carry;
      c.drawn = drawn.index;
      if (plain && overflow == 0 && carry <= static_cast<uint32_t>(kSortCap)) {
        c.path = CandidatePath::kList;
      } else if (plain && overflow != 0 && tied != 0) {
        c.path = CandidatePath::kTied;
      } else {
        c.path = CandidatePath::kGeneral;
      }
    }
  }
  __syncthreads();
}

// The top-p cut of s.sort[0, n) (sorted, key descending): the first tie-group start whose
// weight above reaches p * (the joint mass when joint_mass >= 0, else the mass of all n);
// n when none does. Each thread owns consecutive items; one block scan.
template <int kThreads>
__device__ int CutTopP(SelectStorage& s, int n, float p, double joint_mass, float row_max,
                       uint32_t* cut_slot, typename BlockReduce<kThreads>::Storage& reduce) {
  const int per = (n + kThreads - 1) / kThreads;
  const int first = static_cast<int>(threadIdx.x) * per;
  const int last = min(first + per, n);
  uint64_t mine = 0;
  for (int i = first; i < last; ++i) mine += FixedMass(KeyToFloat(s.sort.key[i]), row_max);
  if (threadIdx.x == 0) *cut_slot = static_cast<uint32_t>(n);
  uint64_t total = 0;
  uint64_t running = BlockReduce<kThreads>::ExclusiveScan(reduce, mine, &total);
  const double target =
      static_cast<double>(p) * (joint_mass >= 0.0 ? joint_mass : static_cast<double>(total));
  for (int i = first; i < last; ++i) {
    const bool group_start = i == 0 || s.sort.key[i] != s.sort.key[i - 1];
    if (group_start && !(static_cast<double>(running) < target)) {
      atomicMin(cut_slot, static_cast<uint32_t>(i));
      break;
    }
    running += FixedMass(KeyToFloat(s.sort.key[i]), row_max);
  }
  __syncthreads();
  const int cut = static_cast<int>(*cut_slot);
  __syncthreads();
  return cut;
}

// min-p, top-k and top-p over the row's candidates (total <= kSortCap), then the Gumbel-max
// draw over the kept ones; returns the token. `key` / `index` are the row's [chunks, kCandidateCap]
// lists, offset[c] chunk c's first candidate; row_max the max z, sum_exp_z (JOINT top-p) the sum of
// exp(z - row_max) over the row.
//
//   1. Each thread loads up to kSortCap / kThreads candidates at once into registers.
//   2. A 2,048-bin histogram (TopBin) of the ones min-p keeps; one block scan over threads that
//      own 4 consecutive bins finds the bin of the k-th largest (every bin above it is kept
//      whole, every bin below it dropped).
//   3. The items in or above that bin (usually k and a few) are collected and sorted: by rank
//      (each item counts the items before it) when at most kRankSortCap, else bitonic.
//   4. top-k keeps the sorted prefix up to the last tie of the k-th key; top-p cuts it by mass.
template <int kThreads>
__device__ int64_t CandidatesDraw(const uint32_t* key, const int32_t* index, const uint32_t* offset,
                                  int chunks, int total, float row_max, float sum_exp_z,
                                  const RowParams& params, CandidateScratch& c, SelectStorage& s,
                                  typename BlockReduce<kThreads>::Storage& reduce) {
  constexpr int kPer = kSortCap / kThreads;
  const uint32_t min_p_key = params.min_p > 0.0f ? OrderedKey(row_max + logf(params.min_p)) : 0u;
  // 1. Candidate i lives in the last chunk whose offset is <= i; all loads are independent.
  uint32_t my_key[kPer];
  int32_t my_index[kPer];
#pragma unroll
  for (int u = 0; u < kPer; ++u) {
    const int i = static_cast<int>(threadIdx.x) + u * kThreads;
    my_key[u] = 0;  // below every real key: never eligible
    my_index[u] = 0;
    if (i < total) {
      int lo = 0, hi = chunks - 1;
      while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (offset[mid] <= static_cast<uint32_t>(i))
          lo = mid;
        else
          hi = mid - 1;
      }
      const int64_t slot =
          static_cast<int64_t>(lo) * kCandidateCap + (i - static_cast<int>(offset[lo]));
      my_key[u] = key[slot];
      my_index[u] = index[slot];
    }
  }
  // 2. Thread t owns bins [4t, 4t + 4): the scan over threads is a scan over bins, top first.
  constexpr int kBinsPerThread = kHistBins / kThreads;
  static_assert(kBinsPerThread * kThreads == kHistBins, "bins split evenly over the threads");
#pragma unroll
  for (int b = 0; b < kBinsPerThread; ++b) s.hist.count[threadIdx.x * kBinsPerThread + b] = 0;
  __syncthreads();
#pragma unroll
  for (int u = 0; u < kPer; ++u) {
    if (my_key[u] >= min_p_key && my_key[u] != 0) {
      atomicAdd(&s.hist.count[TopBin(row_max, KeyToFloat(my_key[u]))], 1u);
    }
  }
  __syncthreads();
  uint32_t bins[kBinsPerThread];
  uint64_t mine = 0;
#pragma unroll
  for (int b = 0; b < kBinsPerThread; ++b) {
    bins[b] = s.hist.count[threadIdx.x * kBinsPerThread + b];
    mine += bins[b];
  }
  uint64_t eligible = 0;
  uint64_t above = BlockReduce<kThreads>::ExclusiveScan(reduce, mine, &eligible);
  const uint64_t k = static_cast<uint64_t>(params.top_k);
  if (threadIdx.x == 0 && eligible < k) {  // top-k keeps every eligible candidate
    c.floor_bin = kHistBins - 1;
    c.collected = static_cast<uint32_t>(eligible);
  }
  if (above < k && k <= above + mine) {  // this thread's bins hold the k-th largest
#pragma unroll
    for (int b = 0; b < kBinsPerThread; ++b) {
      if (above < k && k <= above + bins[b]) {
        c.floor_bin = threadIdx.x * kBinsPerThread + b;
        c.collected = static_cast<uint32_t>(above + bins[b]);
      }
      above += bins[b];
    }
  }
  if (threadIdx.x == 0) c.cut = 0;  // the collect counter
  __syncthreads();
  // 3. Collect the items in or above the floor bin, then sort them.
  const int n = static_cast<int>(c.collected);
  const int floor_bin = static_cast<int>(c.floor_bin);
  const bool by_rank = n <= kRankSortCap;
#pragma unroll
  for (int u = 0; u < kPer; ++u) {
    if (my_key[u] >= min_p_key && my_key[u] != 0 &&
        TopBin(row_max, KeyToFloat(my_key[u])) <= floor_bin) {
      const uint32_t slot = atomicAdd(&c.cut, 1u);
      if (by_rank) {
        c.rank_key[slot] = my_key[u];
        c.rank_index[slot] = my_index[u];
      } else {
        s.sort.key[slot] = my_key[u];
        s.sort.index[slot] = my_index[u];
      }
    }
  }
  __syncthreads();
  if (by_rank) {
    // Order: key descending, then index ascending; (key, ~index) as one 64-bit number.
    if (static_cast<int>(threadIdx.x) < n) {
      const uint32_t my = c.rank_key[threadIdx.x];
      const int32_t at = c.rank_index[threadIdx.x];
      const uint64_t me = (static_cast<uint64_t>(my) << 32) | (~static_cast<uint32_t>(at));
      int rank = 0;
      for (int j = 0; j < n; ++j) {
        const uint64_t other = (static_cast<uint64_t>(c.rank_key[j]) << 32) |
                               (~static_cast<uint32_t>(c.rank_index[j]));
        rank += other > me;
      }
      s.sort.key[rank] = my;
      s.sort.index[rank] = at;
    }
    __syncthreads();
  } else {
    SortDescending<kThreads>(s, n);
  }
  // 4. top-k: the prefix up to the last tie of the k-th key (min-p is already applied).
  int kept = n;
  if (static_cast<uint64_t>(n) > k) {
    const uint32_t kth = s.sort.key[k - 1];
    if (threadIdx.x == 0) c.cut = static_cast<uint32_t>(n);
    __syncthreads();
    for (int i = static_cast<int>(k) + static_cast<int>(threadIdx.x); i < n; i += kThreads) {
      if (s.sort.key[i] < kth && s.sort.key[i - 1] >= kth) c.cut = static_cast<uint32_t>(i);
    }
    __syncthreads();
    kept = static_cast<int>(c.cut);
  }
  if (params.top_p > 0.0f && params.top_p < 1.0f) {
    const double joint =
        params.top_p_mode == TopPMode::kJoint ? static_cast<double>(sum_exp_z) * kMassScale : -1.0;
    kept = CutTopP<kThreads>(s, kept, params.top_p, joint, row_max, &c.top_p_cut, reduce);
  }
  ArgMaxPair best{-kInfF, INT64_MAX};
  for (int i = threadIdx.x; i < kept; i += kThreads) {
    const int64_t j = s.sort.index[i];
    const float z = KeyToFloat(s.sort.key[i]);
    const ArgMaxPair scored{z + GumbelNoise(params.seed, params.position, static_cast<uint64_t>(j)),
                            j};
    if (Better(scored, best)) best = scored;
  }
  return BlockReduce<kThreads>::ArgMax(reduce, best).index;
}

}  // namespace samplerd::kernels::gpu

#endif  // SAMPLERD_KERNELS_GPU_CANDIDATE_FINISH_H_
