// The chunked inverse-CDF draw of a top-p-alone row (the definition: kernels/common/inverse_cdf.h;
// v47, level 0 v48). On the kHeadDraw plan (level 0 decided by the plan) one MassDrawKernel block
// draws from the head (HeadDrawToken); otherwise the row's last MassDrawKernel block finishes it
// once pass 2 has listed the boundary bin's tokens (mass_draw.h, ChunkedDrawToken):
//   0. the cut keeps a prefix of the boundary list: those tokens are the tail, attributed to
//      their chunks while the list is cut (CutAndAttribute); the head's chunk weights are the
//      bins of pass 1's histogram above the boundary bin (ChunkBinWeightAbove, by pass 2);
//      u0 against the two totals picks the part (ChoosePart);
//   1. the part's chunk weights, in the histogram's fixed point scaled by the chunk's scale,
//      scanned in chunk order by one wave against u1 (ChooseChunk);
//   2. the chosen chunk read again, 32 consecutive tokens a thread (thread t: segment t), float
//      masses summed in double, a block scan, the segment where u2 x the chunk's total falls;
//   3. that segment's 32 masses exactly (KeptMass, as the oracle), a token a lane, against u3.
// Levels 0-2 use approximate weights (~1e-6 and ~2e-7 relative): the token differs from the
// oracle's only when a target lies that close to a boundary between two units.
#ifndef SAMPLERD_KERNELS_GPU_CHUNKED_DRAW_H_
#define SAMPLERD_KERNELS_GPU_CHUNKED_DRAW_H_

#include <climits>
#include <cstdint>

#include "kernels/common/inverse_cdf.h"
#include "kernels/gpu/chunk_stats.h"
#include "kernels/gpu/device_common.h"
#include "kernels/gpu/mass_finish.h"
#include "kernels/gpu/mass_plan.h"
#include "kernels/gpu/row_processors.h"

namespace samplerd::kernels::gpu {

struct ChunkedDrawShared {
  union {
    unsigned long long weight[kMaxStagedChunks];  // a chunk's kept mass, fixed point
    double share[kMaxStagedChunks];               // the same, exact (the one-block draw)
  };
  int chunk;         // the chosen chunk
  bool head;         // level 0: the head is drawn
  uint32_t segment;  // the chosen segment (atomicMin)
  int last_segment;  // the last segment with weight (atomicMax)
  int64_t token;
  uint32_t min_key;           // the lowest key of the boundary tokens above the crossing sub-bin
  uint32_t min_crossing_key;  // ... and of the crossing sub-bin's
};

// Level 2's mass sum of one thread's segment, tokens [begin, begin + kDrawSegment) clipped to
// `end` (LoadGroup reads -inf past it, which no keeps() holds): group by group in a loop that is
// not unrolled, the next group's load in flight (v47e: unrolled, this was ~7 KB of code the
// row's last block fetched cold at B = 1). kProcs: the processors apply (a copy of the loop, so
// that the common one holds no call of theirs: v47i). Each mass is a select, not a branch.
template <DType kDType, bool kProcs, class Keeps>
__device__ __forceinline__ double SegmentMass(const void* row_ptr, const RowProcessors& procs,
                                              int64_t row, int64_t begin, int64_t end, float z_max,
                                              float temperature, const Keeps& keeps) {
  constexpr int kSegment = static_cast<int>(kDrawSegment);
  constexpr float kLog2E = 1.4426950408889634f;
  const bool unit_temperature = temperature == 1.0f;
  double mine = 0.0;
  float next[4];
  LoadGroup<kDType>(row_ptr, begin, end, next);
#pragma unroll 1
  for (int g = 0; g < kSegment / 4; ++g) {
    const float x[4] = {next[0], next[1], next[2], next[3]};
    if (g + 1 < kSegment / 4) LoadGroup<kDType>(row_ptr, begin + (g + 1) * 4, end, next);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float xj = x[e];
      if constexpr (kProcs) {
        const int64_t j = begin + g * 4 + e;
        if (j < end) xj = procs.Apply(row, j, xj);
      }
      const float z = unit_temperature ? xj : xj / temperature;
      const float m = exp2f((z - z_max) * kLog2E);
      mine += keeps(xj, z) ? m : 0.0f;
    }
  }
  return mine;
}

// Levels 2 and 3 of the chunked draw in chunk `chunk` of the row: keeps(x, z) is the kept
// set's predicate on a token's processed x and its z. Every thread must call; every thread gets
// the token.
template <DType kDType, int kThreads, class Keeps, class Fallback>
__device__ int64_t DrawInChunk(const void* row_ptr, const RowProcessors& procs, int64_t row,
                               int64_t vocab, int chunk, float z_max, float temperature,
                               const Keeps& keeps, const ChunkedUniforms& u,
                               const Fallback& fallback, ChunkedDrawShared& sh,
                               typename BlockReduce<kThreads>::Storage& reduce) {
  constexpr int kSegment = static_cast<int>(kDrawSegment);
  // Thread t reads segment t; threads past the chunk's segments read nothing (begin >= end).
  static_assert(kThreads * kSegment >= kChunk, "a segment a thread");
  static_assert(kSegment <= kMinWaveSize, "level 3: a token a lane of one wave");
  if (threadIdx.x == 0) {
    sh.segment = UINT32_MAX;
    sh.last_segment = -1;
  }
  // The chunk's segments: float masses, summed in double.
  const int64_t chunk_begin = static_cast<int64_t>(chunk) * kChunk;
  const int64_t end = chunk_begin + kChunk < vocab ? chunk_begin + kChunk : vocab;
  const int64_t begin = chunk_begin + static_cast<int64_t>(threadIdx.x) * kSegment;
  const double mine =
      procs.active()
          ? SegmentMass<kDType, true>(row_ptr, procs, row, begin, end, z_max, temperature, keeps)
          : SegmentMass<kDType, false>(row_ptr, procs, row, begin, end, z_max, temperature, keeps);
  double chunk_total = 0.0;
  const double before = BlockReduce<kThreads>::ExclusiveScanF64(reduce, mine, &chunk_total);
  const double target = u.u2 * chunk_total;
  if (mine > 0.0) {
    if (before + mine > target) atomicMin(&sh.segment, threadIdx.x);
    atomicMax(&sh.last_segment, static_cast<int>(threadIdx.x));
  }
  __syncthreads();
  const int segment = sh.segment != UINT32_MAX ? static_cast<int>(sh.segment) : sh.last_segment;
  if (segment < 0) return fallback();
  // Level 3: the chosen segment's tokens exactly (KeptMass, as the oracle), a token a lane of
  // wave 0. Lane k's running sum adds the masses of tokens 0..k in index order, one shuffle a
  // token (v47i: the same additions, so the same bits, as one thread walking them; that walk and
  // its barrier cost ~1.5-2.5 us), and the token is the lowest lane whose running sum passes
  // u3 x the total.
  const int64_t segment_begin = chunk_begin + static_cast<int64_t>(segment) * kSegment;
  if (threadIdx.x < static_cast<unsigned>(kWaveSize)) {
    const int lane = static_cast<int>(threadIdx.x);
    const int64_t j = segment_begin + lane;
    double m = 0.0;
    if (lane < kSegment && j < end) {
      float xj = LoadLogit<kDType>(row_ptr, j);
      if (procs.active()) xj = procs.Apply(row, j, xj);
      const float z = temperature == 1.0f ? xj : xj / temperature;
      if (keeps(xj, z)) m = KeptMass(z, static_cast<double>(z_max));
    }
    double running = 0.0;
#pragma unroll 1
    for (int k = 0; k < kSegment; ++k) {
      const double v = __shfl(m, k, kWaveSize);
      if (k <= lane) running += v;
    }
    const double goal = u.u3 * __shfl(running, kSegment - 1, kWaveSize);
    const int chosen = WaveMinInt(m > 0.0 && running > goal ? lane : INT_MAX);
    const int last = -WaveMinInt(m > 0.0 ? -lane : 1);
    if (lane == 0) {
      sh.token = chosen != INT_MAX ? segment_begin + chosen
                                   : (last >= 0 ? segment_begin + last : int64_t{-1});
    }
  }
  __syncthreads();
  return sh.token >= 0 ? sh.token : fallback();
}

// The chunked draw of a row finished by one block (logprobs, or a row the mass path cannot
// take): every level from the row itself, levels 0 and 1 with exact double masses (a fixed block
// reduction a chunk and part). `keeps(x, z)`: the kept set. Every thread must call.
template <DType kDType, int kThreads, class Keeps, class Fallback>
__device__ int64_t OneBlockChunkedDraw(const void* row_ptr, const RowProcessors& procs, int64_t row,
                                       int64_t vocab, float z_max, float temperature,
                                       const Keeps& keeps, const RowParams& params,
                                       const Fallback& fallback, ChunkedDrawShared& sh,
                                       typename BlockReduce<kThreads>::Storage& reduce) {
  constexpr int kSegment = static_cast<int>(kDrawSegment);
  constexpr int kHalf = kMaxStagedChunks / 2;
  const bool unit_temperature = temperature == 1.0f;
  const double reference = z_max;
  const ChunkedUniforms u = RowChunkedUniforms(params.seed, params.position);
  const int chunks = static_cast<int>((vocab + kChunk - 1) / kChunk);
  auto processed = [&](int64_t j) {
    const float x = LoadLogit<kDType>(row_ptr, j);
    return procs.active() ? procs.Apply(row, j, x) : x;
  };
  // Level 0 (v48): the bin of the kept set's lowest z splits it into a head above that bin and
  // a tail.
  float low = kInfF;
  for (int64_t j = threadIdx.x; j < vocab; j += kThreads) {
    const float x = processed(j);
    const float z = unit_temperature ? x : x / temperature;
    if (keeps(x, z)) low = fminf(low, z);
  }
  const float low_bin = DrawBin(BlockReduce<kThreads>::Min(reduce, low));
  // Each chunk's head share to sh.share[head_at + c], its tail share to sh.share[tail_at + c]
  // (a negative offset: not stored).
  auto shares = [&](int head_at, int tail_at) {
    for (int c = 0; c < chunks; ++c) {
      const int64_t chunk_begin = static_cast<int64_t>(c) * kChunk;
      const int64_t end = chunk_begin + kChunk < vocab ? chunk_begin + kChunk : vocab;
      const int64_t begin = chunk_begin + static_cast<int64_t>(threadIdx.x) * kSegment;
      double head = 0.0, tail = 0.0;
      for (int k = 0; k < kSegment && begin + k < end; ++k) {
        const float x = processed(begin + k);
        const float z = unit_temperature ? x : x / temperature;
        if (!keeps(x, z)) continue;
        (DrawBin(z) > low_bin ? head : tail) += KeptMass(z, reference);
      }
      double total = 0.0;
      if (head_at >= 0) {
        BlockReduce<kThreads>::ExclusiveScanF64(reduce, head, &total);
        if (threadIdx.x == 0) sh.share[head_at + c] = total;
      }
      if (tail_at >= 0) {
        BlockReduce<kThreads>::ExclusiveScanF64(reduce, tail, &total);
        if (threadIdx.x == 0) sh.share[tail_at + c] = total;
      }
    }
    __syncthreads();
  };
  auto sum = [&](int at) {
    double total = 0.0;
    for (int c = 0; c < chunks; ++c) total += sh.share[at + c];
    return total;
  };
  int at = 0;  // where the chosen part's shares are
  if (chunks <= kHalf) {
    shares(0, kHalf);
    if (threadIdx.x == 0) sh.head = HeadIsDrawn(sum(0), sum(kHalf), u.u0);
    __syncthreads();
    at = sh.head ? 0 : kHalf;
  } else {  // both do not fit: one part at a time
    shares(0, -1);
    double w_head = 0.0;
    if (threadIdx.x == 0) w_head = sum(0);
    __syncthreads();
    shares(-1, 0);
    if (threadIdx.x == 0) sh.head = HeadIsDrawn(w_head, sum(0), u.u0);
    __syncthreads();
    if (sh.head) shares(0, -1);
  }
  const bool head_drawn = sh.head;
  if (threadIdx.x == 0) {
    const double total = sum(at);
    const double target = u.u1 * total;
    double running = 0.0;
    int chosen = -1, last = -1;
#pragma unroll 1
    for (int c = 0; c < chunks; ++c) {
      const double w = sh.share[at + c];
      if (!(w > 0.0)) continue;
      running += w;
      last = c;
      if (running > target) {
        chosen = c;
        break;
      }
    }
    sh.chunk = chosen >= 0 ? chosen : last;
  }
  __syncthreads();
  const int chunk = sh.chunk;
  if (chunk < 0) return fallback();
  auto keeps_part = [&](float x, float z) {
    return keeps(x, z) && (DrawBin(z) > low_bin) == head_drawn;
  };
  return DrawInChunk<kDType, kThreads>(row_ptr, procs, row, vocab, chunk, z_max, temperature,
                                       keeps_part, u, fallback, sh, reduce);
}

// The head's level-1 weight of chunk `chunk` (its bins of pass 1's histogram above the boundary
// bin, in the histogram's fixed point): this caller's share, bins first, first + stride, ...
// (the sum over the callers that cover every bin is the chunk's weight).
__device__ __forceinline__ uint64_t ChunkBinWeightAbove(const MassWorkspace& ws,
                                                        const MassPlan& plan, int64_t row,
                                                        int chunks, int chunk,
                                                        const ChunkStats* row_stats, int first,
                                                        int stride) {
  // The row bin of the chunk's bin 0, as PlanMassRow offsets the chunk's histogram.
  const float shift = plan.row_top - floorf(row_stats[chunk].max_z * kMassBinsPerLogit);
  const int64_t base = (row * chunks + chunk) * static_cast<int64_t>(kMassBins);
  uint64_t mine = 0;
  for (int i = first; i < kMassBins; i += stride) {
    if (!(shift + static_cast<float>(i) < static_cast<float>(plan.boundary_bin))) continue;
    mine += (static_cast<uint64_t>(ws.hist_hi[base + i]) << 16) + ws.hist_lo[base + i];
  }
  return mine;
}

// Adds a kept boundary token's fixed-point mass to its chunk's weight, a contiguous stretch of
// the list at a time (each pass-2 block appended its tokens as one run, so a stretch rarely
// crosses a chunk): one shared atomic per change of chunk (v47f).
struct ChunkAttribution {
  ChunkedDrawShared& sh;
  const float* chunk_max;
  int current = -1;
  unsigned long long run = 0;

  __device__ void Add(float z, int32_t index) {
    const int c = index / kChunk;
    if (c != current) {
      Flush();
      current = c;
    }
    run += FixedMass32(z, chunk_max[c]);
  }
  __device__ void Flush() {
    if (current >= 0 && run != 0) atomicAdd(&sh.weight[current], run);
    run = 0;
  }
};

// Calls f(key, index) for each entry of the thread's contiguous stretch of the list's n
// entries, kBatch entries in flight.
template <int kThreads, class F>
__device__ void ForEachListStretch(const volatile uint32_t* list_key,
                                   const volatile int32_t* list_index, int n, const F& f) {
  constexpr int kBatch = 4;
  const int per = (n + kThreads - 1) / kThreads;
  const int first = static_cast<int>(threadIdx.x) * per;
  const int last = first + per < n ? first + per : n;
#pragma unroll 1
  for (int i0 = first; i0 < last; i0 += kBatch) {
    uint32_t key[kBatch];
    int32_t index[kBatch];
#pragma unroll
    for (int r = 0; r < kBatch; ++r) {
      key[r] = i0 + r < last ? list_key[i0 + r] : 0u;
      index[r] = i0 + r < last ? list_index[i0 + r] : -1;
    }
#pragma unroll
    for (int r = 0; r < kBatch; ++r) {
      if (index[r] >= 0) f(key[r], index[r]);
    }
  }
}

// The boundary cut of a two-pass row, and level 1's weights, part 2: each kept boundary token's
// mass added to its chunk's sh.weight (ChunkHistogramWeights first). Returns the key of the
// lowest kept boundary token (2^32: none kept). The kept set is an upper set in z (a tie group
// is kept whole), so a boundary token is kept iff OrderedKey(z) >= that key.
// Narrow lists (<= one token a thread) are sorted whole and cut (CutBoundary). Wide ones are
// weighed by sub-bin (summed in pass 2), and one walk of the list then
// collects the crossing sub-bin's tokens and attributes those above it (v47i: the cut's collect
// walk and the attribution's walk were two). Every thread must call; every thread gets the key.
template <int kThreads>
__device__ uint64_t CutAndAttribute(const MassWorkspace& ws, const MassPlan& plan, int64_t row,
                                    int n, const volatile uint32_t* list_key,
                                    const volatile int32_t* list_index, const float* chunk_max,
                                    const double* chunk_scale, SelectStorage& s,
                                    ChunkedDrawShared& sh,
                                    typename BlockReduce<kThreads>::Storage& reduce) {
  constexpr uint64_t kNone = uint64_t{1} << 32;
  // The sorted tokens s.sort[0, m) with key >= key_from are kept: attributed here.
  auto attribute_sorted = [&](int m, uint64_t key_from) {
    for (int i = threadIdx.x; i < m; i += kThreads) {
      const uint32_t key = s.sort.key[i];
      if (key < key_from) continue;
      const int32_t j = s.sort.index[i];
      atomicAdd(&sh.weight[j / kChunk], static_cast<unsigned long long>(
                                            FixedMass32(KeyToFloat(key), chunk_max[j / kChunk])));
    }
    __syncthreads();
  };
  if (n <= kThreads) {
    for (int i = threadIdx.x; i < n; i += kThreads) {
      s.sort.key[i] = list_key[i];
      s.sort.index[i] = list_index[i];
    }
    __syncthreads();
    const uint64_t key_from = CutBoundary<kThreads>(plan, n, chunk_max, chunk_scale, s, reduce);
    attribute_sorted(n, key_from);
    return key_from;
  }
  // The sub-bins' sums, by pass 2 (a wide row: more boundary tokens than a block has threads).
  const BoundarySubBins subs(plan);
  const double unit_mass = subs.UnitMass(plan);
  const volatile uint32_t* sub_count = ws.sub_count + row * kBoundarySubBins;
  const volatile unsigned long long* sub_weight = ws.sub_weight + row * kBoundarySubBins;
  for (int b = threadIdx.x; b < kBoundarySubBins; b += kThreads) {
    const unsigned long long w = sub_weight[b];
    s.hist.count[b] = sub_count[b];
    s.hist.weight_lo[b] = static_cast<uint32_t>(w);
    s.hist.weight_hi[b] = static_cast<uint32_t>(w >> 32);
  }
  __syncthreads();
  FindCrossingBin<kThreads>(s, kBoundarySubBins, 0, (plan.target - plan.mass_above) / unit_mass,
                            true);
  const int crossing = s.found_bin;  // -1: the bin's weight stays below the target: keep it all
  const double above = plan.mass_above + static_cast<double>(s.found_above) * unit_mass;
  __syncthreads();
  if (threadIdx.x == 0) {
    s.collected = 0;
    sh.min_crossing_key = UINT32_MAX;
  }
  __syncthreads();
  // One walk: the crossing sub-bin's tokens collected, those above it attributed.
  uint32_t min_above = UINT32_MAX, min_crossing = UINT32_MAX;
  {
    ChunkAttribution attribution{sh, chunk_max};
    ForEachListStretch<kThreads>(list_key, list_index, n, [&](uint32_t key, int32_t j) {
      const float z = KeyToFloat(key);
      const int b = BoundarySubBins::Of(z);
      if (b == crossing) {
        AppendCollected(s, key, j);
        min_crossing = key < min_crossing ? key : min_crossing;
      } else if (b > crossing) {
        attribution.Add(z, j);
        min_above = key < min_above ? key : min_above;
      }
    });
    attribution.Flush();
  }
  if (min_above != UINT32_MAX) atomicMin(&sh.min_key, min_above);
  if (min_crossing != UINT32_MAX) atomicMin(&sh.min_crossing_key, min_crossing);
  __syncthreads();
  const int m = static_cast<int>(s.collected);
  const uint64_t lowest_above = sh.min_key != UINT32_MAX ? sh.min_key : kNone;
  if (crossing < 0) return lowest_above;  // the whole bin is kept: every token was attributed
  if (m > kSortCap) {
    // Ties at this resolution: the crossing sub-bin is kept whole (the one place this path
    // keeps more than the rule would); its tokens are attributed by one more walk.
    ChunkAttribution attribution{sh, chunk_max};
    ForEachListStretch<kThreads>(list_key, list_index, n, [&](uint32_t key, int32_t j) {
      const float z = KeyToFloat(key);
      if (BoundarySubBins::Of(z) == crossing) attribution.Add(z, j);
    });
    attribution.Flush();
    __syncthreads();
    return sh.min_crossing_key;
  }
  MassPlan sub = plan;
  sub.mass_above = above;
  const uint64_t key_from = CutBoundary<kThreads>(sub, m, chunk_max, chunk_scale, s, reduce);
  attribute_sorted(m, key_from);
  return key_from != kNone ? key_from : lowest_above;
}

// A chunk's level-1 weight in the plan's mass units.
__device__ __forceinline__ double ChunkWeight(unsigned long long fixed, double scale) {
  return static_cast<double>(fixed) * scale;
}

// Level 0 of a two-pass row (v48), once the cut has put the tail's weights in sh.weight: the
// head's weights are the histogram's (`head`, by pass 2's first blocks). The part is the head iff
// u0 x (W_H + W_T) < W_H (HeadIsDrawn); sh.weight then gets the head's weights. Every thread must
// call; every thread gets the part.
template <int kThreads>
__device__ bool ChoosePart(int chunks, const double* chunk_scale,
                           const volatile unsigned long long* head, double u0,
                           ChunkedDrawShared& sh) {
  __syncthreads();  // the cut's attribution is done
  if (threadIdx.x < static_cast<unsigned>(kWaveSize)) {
    double w_head = 0.0, w_tail = 0.0;
    for (int c = threadIdx.x; c < chunks; c += kWaveSize) {
      w_head += ChunkWeight(head[c], chunk_scale[c]);
      w_tail += ChunkWeight(sh.weight[c], chunk_scale[c]);
    }
    w_head = WaveSumF64(w_head);
    w_tail = WaveSumF64(w_tail);
    if (threadIdx.x == 0) sh.head = HeadIsDrawn(w_head, w_tail, u0);
  }
  __syncthreads();
  const bool head_drawn = sh.head;
  if (head_drawn) {
    for (int c = threadIdx.x; c < chunks; c += kThreads) sh.weight[c] = head[c];
  }
  __syncthreads();
  return head_drawn;
}

// Level 1 by wave 0: a chunk a lane, the running weights by a wave scan (a fixed tree: the same
// bits on every run), chunk groups of kWaveSize in order; the chosen chunk is the lowest whose
// running weight passes u1 x the total, else the last of weight > 0 (v47i: thread 0 walked the
// chunks twice, ~1 us). Every thread must call; every thread gets the chunk (-1: no weight).
template <int kThreads>
__device__ int ChooseChunk(int chunks, const double* chunk_scale, double u1,
                           ChunkedDrawShared& sh) {
  if (threadIdx.x < static_cast<unsigned>(kWaveSize)) {
    const int lane = static_cast<int>(threadIdx.x);
    auto inclusive = [&](int c0, double* w) {
      const int c = c0 + lane;
      *w = c < chunks ? ChunkWeight(sh.weight[c], chunk_scale[c]) : 0.0;
      double v = *w;
      for (int o = 1; o < kWaveSize; o <<= 1) {
        const double up = __shfl_up(v, o, kWaveSize);
        if (lane >= o) v += up;
      }
      return v;
    };
    double total = 0.0, w = 0.0;
    for (int c0 = 0; c0 < chunks; c0 += kWaveSize) {
      total += __shfl(inclusive(c0, &w), kWaveSize - 1, kWaveSize);
    }
    const double target = u1 * total;
    double carry = 0.0;
    int chosen = INT_MAX, last = -1;
    for (int c0 = 0; c0 < chunks && chosen == INT_MAX; c0 += kWaveSize) {
      const double running = carry + inclusive(c0, &w);
      chosen = WaveMinInt(w > 0.0 && running > target ? c0 + lane : INT_MAX);
      const int last_here = -WaveMinInt(w > 0.0 ? -(c0 + lane) : 1);
      if (last_here >= 0) last = last_here;
      carry = __shfl(running, kWaveSize - 1, kWaveSize);
    }
    if (lane == 0) sh.chunk = chosen != INT_MAX ? chosen : last;
  }
  __syncthreads();
  return sh.chunk;
}

// The token of a top-p-alone row on the two-pass plan. `chunk_max` / `chunk_scale`: the row's
// chunk max z and scales (staged); the list of n boundary tokens. Every thread of the
// kThreads-thread block must call; every thread gets the token.
template <DType kDType, int kThreads, class Fallback>
__device__ int64_t ChunkedDrawToken(
    const MassWorkspace& ws, const MassPlan& plan, int64_t row, int chunks, const void* row_ptr,
    const RowProcessors& procs, int64_t vocab, const float* chunk_max, const double* chunk_scale,
    int n, const volatile uint32_t* list_key, const volatile int32_t* list_index,
    const volatile unsigned long long* head_weight, const RowParams& params,
    const Fallback& fallback, SelectStorage& s, ChunkedDrawShared& sh,
    typename BlockReduce<kThreads>::Storage& reduce) {
  static_assert(kChunk == kDrawChunk, "the GPU's chunks are the definition's");
  // Each thread's uniforms first: their Philox blocks overlap the loads below.
  const ChunkedUniforms u = RowChunkedUniforms(params.seed, params.position);
  const uint64_t key_from = CutAndAttribute<kThreads>(ws, plan, row, n, list_key, list_index,
                                                      chunk_max, chunk_scale, s, sh, reduce);
  const bool head = ChoosePart<kThreads>(chunks, chunk_scale, head_weight, u.u0, sh);
  const int chunk = ChooseChunk<kThreads>(chunks, chunk_scale, u.u1, sh);
  if (chunk < 0) return fallback();  // no kept mass: cannot happen on a two-pass plan
  // The head: above the boundary bin. The tail: a boundary token at or above the cut (only
  // boundary tokens reach key_from: it is one of theirs).
  const float kept_from_x = plan.kept_from_x;
  auto keeps = [head, kept_from_x, key_from](float x, float z) {
    return head ? x >= kept_from_x
                : x < kept_from_x && static_cast<uint64_t>(OrderedKey(z)) >= key_from;
  };
  return DrawInChunk<kDType, kThreads>(row_ptr, procs, row, vocab, chunk, plan.row_max,
                                       params.temperature, keeps, u, fallback, sh, reduce);
}

// The token of a top-p-alone row on the kHeadDraw plan (v48: level 0 took the head before pass
// 2): levels 1-3 over the tokens above the boundary bin, the chunks' weights from pass 1's
// histograms, a chunk a wave. `chunk_max` / `chunk_scale`: staged. Every thread of the block
// must call; every thread gets the token.
template <DType kDType, int kThreads, class Fallback>
__device__ int64_t HeadDrawToken(const MassWorkspace& ws, const MassPlan& plan, int64_t row,
                                 int chunks, const void* row_ptr, const RowProcessors& procs,
                                 int64_t vocab, const ChunkStats* row_stats,
                                 const double* chunk_scale, const RowParams& params,
                                 const Fallback& fallback, ChunkedDrawShared& sh,
                                 typename BlockReduce<kThreads>::Storage& reduce) {
  const ChunkedUniforms u = RowChunkedUniforms(params.seed, params.position);
  const int wave = static_cast<int>(threadIdx.x) / kWaveSize;
  const int lane = static_cast<int>(threadIdx.x) % kWaveSize;
  const int waves = kThreads / kWaveSize;
  for (int c = wave; c < chunks; c += waves) {
    const uint64_t w =
        WaveSumU64(ChunkBinWeightAbove(ws, plan, row, chunks, c, row_stats, lane, kWaveSize));
    if (lane == 0) sh.weight[c] = w;
  }
  __syncthreads();
  const int chunk = ChooseChunk<kThreads>(chunks, chunk_scale, u.u1, sh);
  if (chunk < 0) return fallback();  // no head mass: cannot happen on a kHeadDraw plan
  const float kept_from_x = plan.kept_from_x;
  auto keeps = [kept_from_x](float x, float) { return x >= kept_from_x; };
  return DrawInChunk<kDType, kThreads>(row_ptr, procs, row, vocab, chunk, plan.row_max,
                                       params.temperature, keeps, u, fallback, sh, reduce);
}

}  // namespace samplerd::kernels::gpu

#endif  // SAMPLERD_KERNELS_GPU_CHUNKED_DRAW_H_
