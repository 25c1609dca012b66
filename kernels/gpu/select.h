// Exact threshold selection for one row, by one block: radix histograms on order-preserving
// keys, then an on-chip sort of the boundary bin once it is small.
//
// Every filter of the semantics has the same shape: keep token j iff the weight of the eligible
// tokens strictly above it is below a target — top-k (weight 1, target k), top-p (weight
// exp(z - max) in fixed point, target p * mass), top-N logprobs (weight 1, target N). The kept
// set is then {key >= t} for one key t, which SelectThreshold finds exactly.
#ifndef SAMPLERD_KERNELS_GPU_SELECT_H_
#define SAMPLERD_KERNELS_GPU_SELECT_H_

#include <cstdint>

#include "kernels/gpu/device_common.h"

namespace samplerd::kernels::gpu {

inline constexpr int kHistBits = 11;  // digits: bits 31..21, 20..10, 9..0
inline constexpr int kHistBins = 1 << kHistBits;
inline constexpr int kSortCap = 4096;     // boundary bins up to this size are sorted on chip
inline constexpr int kScanSegments = 64;  // bins are searched in this many segments

// Shared memory of SelectThreshold; the histogram and the sort buffers are never live together.
struct SelectStorage {
  union {
    struct {
      uint32_t count[kHistBins];
      uint32_t weight_lo[kHistBins];  // weight = hi * 2^32 + lo, added with carries so that
      uint32_t weight_hi[kHistBins];  // only 32-bit shared atomics are needed
    } hist;
    struct {
      uint32_t key[kSortCap];
      int32_t index[kSortCap];
    } sort;
  };
  uint64_t segment[kScanSegments];
  uint32_t collected;
  int32_t found_bin;
  uint64_t found_above;
  uint32_t cut;
};

__device__ __forceinline__ uint64_t BinWeight(const SelectStorage& s, int b) {
  return (static_cast<uint64_t>(s.hist.weight_hi[b]) << 32) | s.hist.weight_lo[b];
}

__device__ __forceinline__ void AddBinWeight(SelectStorage& s, int b, uint32_t w) {
  const uint32_t old = atomicAdd(&s.hist.weight_lo[b], w);
  if (old + w < old) atomicAdd(&s.hist.weight_hi[b], 1u);  // carry
}

// Appends one item of the boundary bin to s.sort (s.collected counts every call). A slot past
// kSortCap is dropped: the histogram pass found at most kSortCap items in the bin, so more can
// only come from logits changed since that pass, within the kernel (an engine writing them
// during a device-session step); the row's result is then unspecified, but stays in bounds.
__device__ __forceinline__ void AppendCollected(SelectStorage& s, uint32_t key, int64_t index) {
  const uint32_t slot = atomicAdd(&s.collected, 1u);
  if (slot >= static_cast<uint32_t>(kSortCap)) return;
  s.sort.key[slot] = key;
  s.sort.index[slot] = static_cast<int32_t>(index);
}

// The items AppendCollected stored: s.collected, at most kSortCap.
__device__ __forceinline__ int CollectedCount(const SelectStorage& s) {
  return s.collected < static_cast<uint32_t>(kSortCap) ? static_cast<int>(s.collected) : kSortCap;
}

// Weight of a sorted item: its fixed-point mass, or 1 when counting.
__device__ __forceinline__ uint64_t ItemWeight(uint32_t key, bool by_mass, float row_max) {
  return by_mass ? FixedMass(KeyToFloat(key), row_max) : 1;
}

// Sorts s.sort[0, n) by key descending, index ascending, n <= kThreads, by rank: each thread
// counts the items that come before its own, then writes it there (indices are distinct, so the
// order is total). v18: a bitonic sort of 1,060 items took ~42,000 cycles in one block, of 9
// items ~3,600 (NOTES.md). Waits for the block before it reads and after it writes.
template <int kThreads>
__device__ void SortFewDescending(SelectStorage& s, int n) {
  __syncthreads();  // the items are in place
  const bool mine = static_cast<int>(threadIdx.x) < n;
  const uint32_t key = mine ? s.sort.key[threadIdx.x] : 0u;
  const int32_t index = mine ? s.sort.index[threadIdx.x] : 0;
  // (key, ~index) as one 64-bit number: larger comes first.
  const uint64_t me = (static_cast<uint64_t>(key) << 32) | ~static_cast<uint32_t>(index);
  int rank = 0;
  for (int j = 0; mine && j < n; ++j) {
    const uint64_t other =
        (static_cast<uint64_t>(s.sort.key[j]) << 32) | ~static_cast<uint32_t>(s.sort.index[j]);
    rank += other > me;
  }
  __syncthreads();  // every thread has read the items
  if (mine) {
    s.sort.key[rank] = key;
    s.sort.index[rank] = index;
  }
  __syncthreads();
}

// Sorts s.sort[0, n) by key descending, index ascending (bitonic; pads to a power of two).
template <int kThreads>
__device__ void SortDescending(SelectStorage& s, int n) {
  int size = 1;
  while (size < n) size <<= 1;
  for (int i = n + threadIdx.x; i < size; i += kThreads) {
    s.sort.key[i] = 0;  // below every real key (the smallest, -inf, is 0x007fffff)
    s.sort.index[i] = INT32_MAX;
  }
  __syncthreads();
  for (int k = 2; k <= size; k <<= 1) {
    for (int j = k >> 1; j > 0; j >>= 1) {
      // One thread per comparator (size / 2 of them): i is the lower index of pair t.
      for (int t = threadIdx.x; t < size / 2; t += kThreads) {
        const int i = 2 * t - (t & (j - 1));
        const int partner = i + j;
        const uint32_t ka = s.sort.key[i], kb = s.sort.key[partner];
        const int32_t ia = s.sort.index[i], ib = s.sort.index[partner];
        const bool a_first = ka > kb || (ka == kb && ia < ib);
        const bool ascending_block = (i & k) == 0;  // this block ends "first" items first
        if (a_first != ascending_block) {
          s.sort.key[i] = kb;
          s.sort.key[partner] = ka;
          s.sort.index[i] = ib;
          s.sort.index[partner] = ia;
        }
      }
      __syncthreads();
    }
  }
}

// Finds the bin of s.hist (bins [0, nbins)) in which the weight from the top first reaches
// `target`, given `above` weight already above every bin. Sets s.found_bin (-1 when the total
// stays below the target) and s.found_above (weight strictly above that bin).
template <int kThreads>
__device__ void FindCrossingBin(SelectStorage& s, int nbins, uint64_t above, double target,
                                bool by_mass) {
  const int per_segment = nbins / kScanSegments;
  const int t = threadIdx.x;
  auto bin_weight = [&](int b) -> uint64_t {
    return by_mass ? BinWeight(s, b) : static_cast<uint64_t>(s.hist.count[b]);
  };
  // Segment t covers bins [nbins - (t + 1) * per, nbins - t * per): segment 0 is the top.
  if (t < kScanSegments) {
    uint64_t sum = 0;
    const int hi = nbins - t * per_segment;
    for (int b = hi - 1; b >= hi - per_segment; --b) sum += bin_weight(b);
    s.segment[t] = sum;
  }
  if (t == 0) s.found_bin = -1;
  __syncthreads();
  // The weight above each segment, by wave 0: lane l holds segments [l k, l k + k), k =
  // kScanSegments / kWaveSize, and one wave scan adds the lanes' sums (integers: the same sums in
  // any order; one thread walking the 64 segments took ~1 us).
  if (t < kWaveSize) {
    constexpr int kPerLane = kScanSegments / kWaveSize > 0 ? kScanSegments / kWaveSize : 1;
    uint64_t w[kPerLane];
    uint64_t lane_sum = 0;
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) {
      const int i = t * kPerLane + k;
      w[k] = i < kScanSegments ? s.segment[i] : 0;
      lane_sum += w[k];
    }
    uint64_t inclusive = lane_sum;
    for (int o = 1; o < kWaveSize; o <<= 1) {
      const uint64_t up = static_cast<uint64_t>(
          __shfl_up(static_cast<unsigned long long>(inclusive), o, kWaveSize));
      if (t >= o) inclusive += up;
    }
    uint64_t running = above + (inclusive - lane_sum);
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) {
      const int i = t * kPerLane + k;
      if (i < kScanSegments) s.segment[i] = running;  // weight above segment i
      running += w[k];
    }
  }
  __syncthreads();
  if (t < kScanSegments) {
    uint64_t running = s.segment[t];
    const int hi = nbins - t * per_segment;
    for (int b = hi - 1; b >= hi - per_segment; --b) {
      const uint64_t w = bin_weight(b);
      if (static_cast<double>(running) < target && target <= static_cast<double>(running + w)) {
        s.found_bin = b;  // at most one bin crosses
        s.found_above = running;
      }
      running += w;
    }
  }
  __syncthreads();
}

// s.collected items of one boundary bin are in s.sort; `bin_above` is the weight of every
// eligible item above the bin. Sorts them and returns the smallest kept key.
// s.sort[0, n) is sorted (key descending) with weights; `above` weighs every eligible item
// before it. Returns the cut: the first tie-group start whose weight above reaches `target`
// (n when none does). Items before the cut are kept.
template <int kThreads>
__device__ uint32_t CutSorted(SelectStorage& s, int n, uint64_t above, double target, bool by_mass,
                              float row_max, typename BlockReduce<kThreads>::Storage& reduce) {
  // Exclusive prefix weights; each thread owns consecutive items.
  constexpr int kPer = kSortCap / kThreads;
  const int first = static_cast<int>(threadIdx.x) * kPer;
  uint64_t mine = 0;
  for (int i = first; i < first + kPer && i < n; ++i) {
    mine += ItemWeight(s.sort.key[i], by_mass, row_max);
  }
  if (threadIdx.x == 0) s.cut = static_cast<uint32_t>(n);
  uint64_t total = 0;
  uint64_t running = above + BlockReduce<kThreads>::ExclusiveScan(reduce, mine, &total);
  for (int i = first; i < first + kPer && i < n; ++i) {
    const bool group_start = i == 0 || s.sort.key[i] != s.sort.key[i - 1];
    if (group_start && !(static_cast<double>(running) < target)) {
      atomicMin(&s.cut, static_cast<uint32_t>(i));
      break;
    }
    running += ItemWeight(s.sort.key[i], by_mass, row_max);
  }
  __syncthreads();
  const uint32_t cut = s.cut;
  __syncthreads();
  return cut;
}

// s.collected items of one boundary bin are in s.sort; `bin_above` is the weight of every
// eligible item above the bin. Sorts them and returns the smallest kept key.
template <int kThreads>
__device__ uint32_t ResolveCollected(SelectStorage& s, uint64_t bin_above, double target,
                                     bool by_mass, float row_max,
                                     typename BlockReduce<kThreads>::Storage& reduce) {
  const int n = CollectedCount(s);
  SortDescending<kThreads>(s, n);
  const uint32_t cut = CutSorted<kThreads>(s, n, bin_above, target, by_mass, row_max, reduce);
  const uint32_t result = s.sort.key[cut == 0 ? 0 : cut - 1];
  __syncthreads();
  return result;
}

inline constexpr float kValueBinsPerLogit = 64.0f;

// Bin of z in a histogram of kHistBins bins of 1 / kValueBinsPerLogit logit below the row max,
// the top bin holding the max; -1 more than kHistBins / kValueBinsPerLogit (32) logits below.
// Value bins spread a row's tokens over many bins, so few shared atomics collide.
__device__ __forceinline__ int ValueBin(float row_max, float z) {
  const float d = (row_max - z) * kValueBinsPerLogit;
  return d < static_cast<float>(kHistBins) ? kHistBins - 1 - static_cast<int>(d) : -1;
}

// Zeroes bins [0, nbins) of s.hist, then waits for the block.
template <int kThreads>
__device__ void ClearHistogram(SelectStorage& s, int nbins) {
  for (int b = threadIdx.x; b < nbins; b += kThreads) {
    s.hist.count[b] = 0;
    s.hist.weight_lo[b] = 0;
    s.hist.weight_hi[b] = 0;
  }
  __syncthreads();
}

// Sum of s.hist.weight (every thread gets it).
template <int kThreads>
__device__ uint64_t HistogramTotal(SelectStorage& s) {
  if (threadIdx.x < kScanSegments) {
    uint64_t sum = 0;
    for (int b = threadIdx.x; b < kHistBins; b += kScanSegments) sum += BinWeight(s, b);
    s.segment[threadIdx.x] = sum;
  }
  __syncthreads();
  uint64_t total = 0;
  for (int i = 0; i < kScanSegments; ++i) total += s.segment[i];
  __syncthreads();
  return total;
}

// The exact threshold key t: an eligible item j (key_j >= lo_key) is kept iff the weight of the
// eligible items with a key strictly above key_j is < target; kept == {key >= t}. Returns lo_key
// when everything eligible is kept.
//
// `source.ForEach(f)` calls f(key, index, z) for the items this thread owns (every item of the
// row or list once per block). Weights: 1 per item, or FixedMass(z, row_max) when by_mass. The
// target is count_target, or (by_mass) p * joint_total when joint_total >= 0, else p * (the
// eligible mass). Costs one pass over the source per radix round (1-3) plus one to collect.
// Optional work fused into SelectThreshold's last pass (the top-p filter of a row read from
// memory): the Gumbel-max draw over the kept items, so the row is not read a third time
// (NOTES.md v7). `done` says whether it happened (only on the value-bin path).
struct FusedDraw {
  bool enabled = false;
  uint64_t seed = 0;
  uint64_t position = 0;
  bool done = false;
  ArgMaxPair best{-__builtin_huge_valf(), INT64_MAX};
  uint64_t mass = 0;   // fixed-point mass of the kept items
  uint64_t count = 0;  // their number
};

template <int kThreads, class Source>
__device__ uint32_t SelectThreshold(const Source& source, uint32_t lo_key, bool by_mass,
                                    float row_max, double p, double joint_total,
                                    double count_target, SelectStorage& s,
                                    typename BlockReduce<kThreads>::Storage& reduce,
                                    FusedDraw* draw = nullptr) {
  double target = count_target;
  if (by_mass) {
    // First try bins of 1/64 logit below the row max: they spread a row's tokens over many bins
    // (few atomics collide) and the boundary bin is usually small. Tokens more than 32 below
    // the max weigh 0 in fixed point and are skipped.
    auto value_bin = [&](float z) { return ValueBin(row_max, z); };
    ClearHistogram<kThreads>(s, kHistBins);
    source.ForEach([&](uint32_t key, int64_t, float z) {
      if (key < lo_key) return;
      const int b = value_bin(z);
      // Unsigned: also drops a z above row_max (bin >= kHistBins), which only logits changed
      // since pass 1 can hold (an engine writing them during a device-session step).
      if (static_cast<unsigned>(b) >= static_cast<unsigned>(kHistBins)) return;
      atomicAdd(&s.hist.count[b], 1u);
      AddBinWeight(s, b, static_cast<uint32_t>(FixedMass(z, row_max)));
    });
    __syncthreads();
    target =
        p * (joint_total >= 0.0 ? joint_total : static_cast<double>(HistogramTotal<kThreads>(s)));
    FindCrossingBin<kThreads>(s, kHistBins, 0, target, true);
    const int bin = s.found_bin;
    if (bin < 0) return lo_key;
    if (s.hist.count[bin] <= static_cast<uint32_t>(kSortCap)) {
      const uint64_t bin_above = s.found_above;
      const bool drawing = draw != nullptr && draw->enabled;
      uint64_t count_above = 0;  // items in bins above the boundary bin
      if (drawing) {
        uint64_t mine = 0;
        for (int b = bin + 1 + static_cast<int>(threadIdx.x); b < kHistBins; b += kThreads) {
          mine += s.hist.count[b];
        }
        count_above = BlockReduce<kThreads>::SumU64(reduce, mine);
      }
      __syncthreads();
      if (threadIdx.x == 0) s.collected = 0;
      __syncthreads();
      ArgMaxPair best{-kInfF, INT64_MAX};
      source.ForEach([&](uint32_t key, int64_t index, float z) {
        if (key < lo_key) return;
        const int b = value_bin(z);
        if (b > bin && drawing) {  // kept for sure: compete in the draw now
          const ArgMaxPair scored{
              z + GumbelNoise(draw->seed, draw->position, static_cast<uint64_t>(index)), index};
          if (Better(scored, best)) best = scored;
        }
        if (b != bin) return;
        AppendCollected(s, key, index);
      });
      __syncthreads();
      if (!drawing)
        return ResolveCollected<kThreads>(s, bin_above, target, by_mass, row_max, reduce);
      const int n = CollectedCount(s);
      SortDescending<kThreads>(s, n);
      const uint32_t cut = CutSorted<kThreads>(s, n, bin_above, target, by_mass, row_max, reduce);
      uint64_t kept_mass = 0;
      for (int i = threadIdx.x; i < static_cast<int>(cut); i += kThreads) {
        const int64_t index = s.sort.index[i];
        const float z = KeyToFloat(s.sort.key[i]);
        const ArgMaxPair scored{
            z + GumbelNoise(draw->seed, draw->position, static_cast<uint64_t>(index)), index};
        if (Better(scored, best)) best = scored;
        kept_mass += FixedMass(z, row_max);
      }
      const uint32_t result = s.sort.key[cut == 0 ? 0 : cut - 1];
      draw->best = BlockReduce<kThreads>::ArgMax(reduce, best);
      draw->mass = bin_above + BlockReduce<kThreads>::SumU64(reduce, kept_mass);
      draw->count = count_above + cut;
      draw->done = true;
      return result;
    }
    __syncthreads();  // a crowded bin (many equal values): exact radix rounds below
  }
  uint32_t prefix = 0;
  uint64_t above = 0;
  for (int round = 0; round < 3; ++round) {
    const int shift = round == 0 ? 21 : (round == 1 ? 10 : 0);
    const int bits = round == 2 ? 10 : 11;
    const int nbins = 1 << bits;
    ClearHistogram<kThreads>(s, nbins);
    source.ForEach([&](uint32_t key, int64_t, float z) {
      if (key < lo_key) return;
      if (round > 0 && (key >> (shift + bits)) != prefix) return;
      const int b = (key >> shift) & (nbins - 1);
      atomicAdd(&s.hist.count[b], 1u);
      if (by_mass) AddBinWeight(s, b, static_cast<uint32_t>(FixedMass(z, row_max)));
    });
    __syncthreads();
    if (round == 0 && by_mass) {
      target =
          p * (joint_total >= 0.0 ? joint_total : static_cast<double>(HistogramTotal<kThreads>(s)));
    }
    FindCrossingBin<kThreads>(s, nbins, above, target, by_mass);
    const int bin = s.found_bin;
    const uint64_t bin_above = s.found_above;
    const uint32_t bin_count = bin < 0 ? 0u : s.hist.count[bin];
    // Every thread reads the bin before any goes on: the next round clears the histogram and
    // resets found_bin. Without this barrier a late thread could read the next round's zeroes,
    // take another branch than its block and return a wrong threshold (racecheck, NOTES.md v23).
    __syncthreads();
    if (bin < 0) return round == 0 ? lo_key : (prefix << (shift + bits));
    const uint32_t bin_prefix = (round == 0 ? 0u : (prefix << bits)) | static_cast<uint32_t>(bin);
    if (round == 2) return bin_prefix;  // a single key value: all of it is kept
    if (bin_count <= static_cast<uint32_t>(kSortCap)) {
      // Collect the boundary bin and walk it in order.
      __syncthreads();
      if (threadIdx.x == 0) s.collected = 0;
      __syncthreads();
      source.ForEach([&](uint32_t key, int64_t index, float z) {
        if (key < lo_key || (key >> shift) != bin_prefix) return;
        AppendCollected(s, key, index);
      });
      __syncthreads();
      return ResolveCollected<kThreads>(s, bin_above, target, by_mass, row_max, reduce);
    }
    prefix = bin_prefix;
    above = bin_above;
  }
  return prefix;  // not reached
}

}  // namespace samplerd::kernels::gpu

#endif  // SAMPLERD_KERNELS_GPU_SELECT_H_
