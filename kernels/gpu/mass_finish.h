// Top-p over a row's chunks: the end of the draw, run by the row's last MassDrawKernel block
// (mass_draw.h). The tokens of the boundary bin are sorted on chip, cut by the top-p rule, and
// drawn against the best Gumbel score of the bins above it.
#ifndef SAMPLERD_KERNELS_GPU_MASS_FINISH_H_
#define SAMPLERD_KERNELS_GPU_MASS_FINISH_H_

#include <cstdint>

#include "kernels/gpu/chunk_stats.h"
#include "kernels/gpu/device_common.h"
#include "kernels/gpu/mass_plan.h"
#include "kernels/gpu/select.h"

namespace samplerd::kernels::gpu {

// Mass of a boundary token in the plan's units: its fixed-point mass relative to its chunk's
// max, scaled as that chunk's histogram was (so the list adds up to its bin exactly).
__device__ __forceinline__ double BoundaryWeight(uint32_t key, int32_t index,
                                                 const float* chunk_max, const double* row_scale) {
  const int c = index / kChunk;
  return static_cast<double>(FixedMass32(KeyToFloat(key), chunk_max[c])) * row_scale[c];
}

// The row's token from its n boundary tokens in s.sort (any order; n <= kSortCap) and
// `best_above`, the best score of the kept tokens above the boundary bin (the same in every
// thread). Every thread of the block must call; every thread gets the token.
template <int kThreads>
__device__ int64_t DrawBoundary(const MassPlan& plan, int n, const float* chunk_max,
                                const double* chunk_scale, const RowParams& params,
                                ArgMaxPair best_above, SelectStorage& s,
                                typename BlockReduce<kThreads>::Storage& reduce) {
  using Reduce = BlockReduce<kThreads>;
  const PhiloxKey key = WaveUniformKey(params.seed);
  const uint64_t position = WaveUniformU64(params.position);
  if (threadIdx.x == 0) s.cut = static_cast<uint32_t>(n);
  // Both wait for the block before they read. A list longer than one item a thread comes only
  // from a crossing sub-bin of DrawWideBoundary (rare: ties at 1/16,384 logit).
  if (n <= kThreads) {
    SortFewDescending<kThreads>(s, n);
  } else {
    SortDescending<kThreads>(s, n);
  }
  // Each thread owns `per` consecutive items: the mass strictly above a tie group's first item
  // decides whether the group is kept (select.h's rule, in double). As few as the list needs,
  // so that short lists weigh their items in parallel (v18: kSortCap / kThreads = 16 a thread
  // made one thread weigh a 9-item list alone, ~4,700 cycles).
  const int per = (n + kThreads - 1) / kThreads;
  const int first = static_cast<int>(threadIdx.x) * per;
  double mine = 0.0;
  for (int i = first; i < first + per && i < n; ++i) {
    mine += BoundaryWeight(s.sort.key[i], s.sort.index[i], chunk_max, chunk_scale);
  }
  double total = 0.0;
  double running = plan.mass_above + Reduce::ExclusiveScanF64(reduce, mine, &total);
  for (int i = first; i < first + per && i < n; ++i) {
    const bool group_start = i == 0 || s.sort.key[i] != s.sort.key[i - 1];
    if (group_start && !(running < plan.target)) {
      atomicMin(&s.cut, static_cast<uint32_t>(i));
      break;
    }
    running += BoundaryWeight(s.sort.key[i], s.sort.index[i], chunk_max, chunk_scale);
  }
  __syncthreads();
  const int cut = static_cast<int>(s.cut);
  // The best score above lets MayBeat skip most boundary tokens.
  ArgMaxPair best = best_above;
  for (int i = threadIdx.x; i < cut; i += kThreads) {
    const int64_t j = s.sort.index[i];
    const float z = KeyToFloat(s.sort.key[i]);
    const float u = UniformOf(key, position, static_cast<uint64_t>(j));
    if (!MayBeat(z, u, best_above.value)) continue;
    const ArgMaxPair scored{z + GumbelFromUniform(u), j};
    if (Better(scored, best)) best = scored;
  }
  return Reduce::ArgMax(reduce, best).index;
}

// The row's token when its boundary bin holds more tokens than the block sorts whole (more than
// one a thread: a randn x 3 row at p = 0.95 has ~1,000, a peaked row ~4,000 of N(0, 1) noise in
// one 1/8-logit bin, a random-weight model's row ~7,000; up to kBoundaryCap). The bin is split
// into kBoundarySubBins sub-bins (BoundarySubBins), weighed in fixed point relative to the bin's
// top (integer sums: the same in any order); the sub-bins above the one where the mass crosses
// the target are kept whole, and that one's tokens are collected, sorted and cut as DrawBoundary
// does. A crossing sub-bin of more than kSortCap tokens (1/2,048 logit wide: ties) is kept whole.
// On a row that presums (every row of a small launch, v30; the last rows of a large one, v37)
// pass 2 has summed the sub-bins and their bests; on the others this block weighs the list and
// draws the kept sub-bins' tokens itself. The same sums, the same kept set and the same token
// either way.
template <int kThreads>
__device__ int64_t DrawWideBoundary(const MassWorkspace& ws, const MassPlan& plan, int64_t row,
                                    int n, const volatile uint32_t* list_key,
                                    const volatile int32_t* list_index, const float* chunk_max,
                                    const double* chunk_scale, const RowParams& params,
                                    ArgMaxPair best_above, SelectStorage& s,
                                    typename BlockReduce<kThreads>::Storage& reduce) {
  static_assert(kBoundarySubBins % kScanSegments == 0, "FindCrossingBin's segments");
  const PhiloxKey key = WaveUniformKey(params.seed);
  const uint64_t position = WaveUniformU64(params.position);
  const bool summed = ws.Presums(row);
  const BoundarySubBins subs(plan);
  const double unit_mass = subs.UnitMass(plan);
  const volatile unsigned long long* sub_best = ws.sub_best + row * kBoundarySubBins;
  if (summed) {
    const volatile uint32_t* sub_count = ws.sub_count + row * kBoundarySubBins;
    const volatile unsigned long long* sub_weight = ws.sub_weight + row * kBoundarySubBins;
    for (int b = threadIdx.x; b < kBoundarySubBins; b += kThreads) {
      const unsigned long long w = sub_weight[b];
      s.hist.count[b] = sub_count[b];
      s.hist.weight_lo[b] = static_cast<uint32_t>(w);
      s.hist.weight_hi[b] = static_cast<uint32_t>(w >> 32);
    }
  } else {
    ClearHistogram<kThreads>(s, kBoundarySubBins);
    for (int i = threadIdx.x; i < n; i += kThreads) {
      const float z = KeyToFloat(list_key[i]);
      const int b = BoundarySubBins::Of(z);
      atomicAdd(&s.hist.count[b], 1u);
      AddBinWeight(s, b, subs.Weight(z));
    }
  }
  __syncthreads();
  FindCrossingBin<kThreads>(s, kBoundarySubBins, 0, (plan.target - plan.mass_above) / unit_mass,
                            true);
  const int crossing = s.found_bin;  // -1: the bin's weight stays below the target: keep it all
  const double above = plan.mass_above + static_cast<double>(s.found_above) * unit_mass;
  __syncthreads();
  // The kept sub-bins' tokens join the draw (their bests, when summed); the crossing sub-bin's
  // tokens are collected for the sort.
  if (threadIdx.x == 0) s.collected = 0;
  ArgMaxPair best = best_above;
  for (int b = crossing + 1 + static_cast<int>(threadIdx.x); summed && b < kBoundarySubBins;
       b += kThreads) {
    const unsigned long long key = sub_best[b];
    if (key == 0) continue;
    const ArgMaxPair scored{KeyToFloat(static_cast<uint32_t>(key >> 32)),
                            static_cast<int64_t>(~static_cast<uint32_t>(key))};
    if (Better(scored, best)) best = scored;
  }
  __syncthreads();  // s.collected is zero
  // Four list entries in flight a thread: the loads, not the compares, are this loop's time
  // when the sub-bins were summed.
  constexpr int kInFlight = 4;
  const bool walk = !summed || crossing >= 0;
  for (int i0 = static_cast<int>(threadIdx.x); walk && i0 < n; i0 += kThreads * kInFlight) {
    uint32_t keys[kInFlight];
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) {
      const int i = i0 + u * kThreads;
      keys[u] = i < n ? list_key[i] : kNegInfKey;
    }
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) {
      const int i = i0 + u * kThreads;
      if (i >= n) continue;
      const float z = KeyToFloat(keys[u]);
      const int b = BoundarySubBins::Of(z);
      if (b == crossing) {
        AppendCollected(s, keys[u], list_index[i]);
        continue;
      }
      if (summed || b < crossing) continue;
      const int64_t j = list_index[i];
      const float u_j = UniformOf(key, position, static_cast<uint64_t>(j));
      if (!MayBeat(z, u_j, best.value)) continue;
      const ArgMaxPair scored{z + GumbelFromUniform(u_j), j};
      if (Better(scored, best)) best = scored;
    }
  }
  best = BlockReduce<kThreads>::ArgMax(reduce, best);  // also: s.collected is final
  const int m = static_cast<int>(s.collected);
  if (m > kSortCap) {
    // Ties at this resolution: the crossing sub-bin is kept whole (the one place this path
    // keeps more than the rule would).
    __syncthreads();
    ArgMaxPair mine = best;
    for (int i = threadIdx.x; i < n; i += kThreads) {
      const float z = KeyToFloat(list_key[i]);
      if (BoundarySubBins::Of(z) != crossing) continue;
      const int64_t j = list_index[i];
      const ArgMaxPair scored{z + GumbelOf(key, position, static_cast<uint64_t>(j)), j};
      if (Better(scored, mine)) mine = scored;
    }
    return BlockReduce<kThreads>::ArgMax(reduce, mine).index;
  }
  MassPlan sub = plan;
  sub.mass_above = above;
  return DrawBoundary<kThreads>(sub, m, chunk_max, chunk_scale, params, best, s, reduce);
}

}  // namespace samplerd::kernels::gpu

#endif  // SAMPLERD_KERNELS_GPU_MASS_FINISH_H_
