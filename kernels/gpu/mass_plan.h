// Top-p over a row's chunks, part 1 of 2 (the "mass" path of row_path.h; part 2: mass_draw.h).
//
// A row whose only filter is top-p used to be finished by one block reading the whole row two
// or three times (~270 µs at B = 1, V = 151,936; NOTES.md v8). Here every pass is spread over the
// row's chunks:
//
//   pass 1 (ChunkPassKernel): each chunk block also builds the mass histogram of its chunk:
//     kMassBins bins of 1 / kMassBinsPerLogit logit on an absolute grid (the bin of z is
//     floor(kMassBinsPerLogit * z)), counting each token's mass exp(z - chunk max) in fixed
//     point. Integer sums do not depend on the order of the atomics. RowFinishKernel then
//     combines the chunks' histograms in chunk order, each scaled by exp(chunk max - row max)
//     in double, and finds the boundary bin: the first bin, from the top, where the mass
//     reaches p * total. That is the row's MassPlan (PlanMassRow). Level 0 of the draw
//     (kernels/common/inverse_cdf.h) decides most rows here: the tail lies inside the boundary
//     bin, so when u0 x (mass above + the bin's mass) < the mass above, the head is drawn
//     whatever the cut keeps (kHeadDraw, v48): one block of MassDrawKernel draws from the bins
//     above the boundary bin (chunk weights from the histograms), and pass 2 does not run.
//   pass 2 (MassDrawKernel, mass_draw.h), on the other rows: each chunk block reads its chunk
//     again and appends the boundary bin's tokens to a per-row list (tokens above the bin are
//     kept for sure). The row's last block sorts that list, keeps the prefix whose mass above stays
//     below the target (a tie group whole), decides level 0 with the tail's exact weight, and draws
//     the token by the chunked inverse CDF (chunked_draw.h).
//
// The result is the rule of select.h (keep j iff the mass strictly above z_j is < p * total)
// with masses in units of the row max's mass, summed chunk by chunk in a fixed order: bitwise
// repeatable and batch invariant. Rows the plan cannot take (NaN, +inf, no finite z, |row max|
// >= kMassMaxRowAbs, a boundary bin of more than kBoundaryCap tokens unless level 0 takes the
// head) get kFallback and are finished by the one-block path of row_finish.h, exactly as before.
#ifndef SAMPLERD_KERNELS_GPU_MASS_PLAN_H_
#define SAMPLERD_KERNELS_GPU_MASS_PLAN_H_

#include <cstdint>

#include "kernels/common/inverse_cdf.h"
#include "kernels/common/sampling_types.h"
#include "kernels/gpu/chunk_stats.h"
#include "kernels/gpu/device_common.h"
#include "kernels/gpu/select.h"

namespace samplerd::kernels::gpu {

inline constexpr int kMassBins = 256;
inline constexpr float kMassBinsPerLogit = 8.0f;  // so the bins span 32 logits
// floor(8 z) is exact in fp32 below 2^21; chunks within 32 logits of a row max below 2^20 are.
inline constexpr float kMassMaxRowAbs = 1048576.0f;    // 2^20
inline constexpr float kMassMaxChunkAbs = 2097152.0f;  // 2^21

// Boundary tokens a row's list holds. Up to kSortCap are sorted at once (mass_finish.h), more are
// split into sub-bins first (CutAndAttribute, chunked_draw.h).
inline constexpr int kBoundaryCap = 16384;
// Sub-bins of a wide boundary bin (1/2,048 logit each): pass 2 weighs them (v30), so the row's
// last block reads 256 sums instead of weighing the whole list.
inline constexpr int kBoundarySubBins = 256;
// Every wide two-pass row sums them in pass 2 (v51). Until v48 every top-p row ran pass 2, and
// large launches left the sums to the row's last block on all but their last rows (v37: pass
// 2's share of the sums cost up to 8% at B = 256); since v48's head draw only a few percent of
// rows run pass 2, and such a row's last block weighing its list alone (~40 us on a wide row)
// is the launch's critical path (kernels/gpu/NOTES.md, v51).

// kHeadDraw (v48): level 0 of the draw (kernels/common/inverse_cdf.h) takes the head for certain
// (u0 x (mass above the boundary bin + the bin's mass) < the mass above), so pass 2 does not run:
// one MassDrawKernel block draws from the bins above the boundary bin (FinishHeadRow).
enum class MassPath : uint32_t { kFallback = 0, kTwoPass = 1, kHeadDraw = 2 };

// What pass 1 decides for a mass row (bins counted from the row max's bin, 0, downwards).
struct MassPlan {
  MassPath path;
  int32_t boundary_bin;
  uint32_t boundary_count;  // tokens in the boundary bin (<= kBoundaryCap on kTwoPass)
  float row_max;
  float row_top;         // floor(kMassBinsPerLogit * row max)
  double target;         // p * the row's mass
  double mass_above;     // mass of the bins above the boundary bin
  double boundary_mass;  // the boundary bin's mass: bounds the tail's (level 0)
  // The bins as thresholds on the processed x (v13): a token is above the boundary bin iff
  // x >= kept_from_x, in it iff boundary_from_x <= x < kept_from_x (-inf and NaN: neither).
  float kept_from_x;
  float boundary_from_x;
};

// The mass path's part of the workspace.
struct MassWorkspace {
  bool enabled;          // false: no row takes the mass path (logprobs were asked for)
  uint32_t* hist_count;  // [batch, chunks, kMassBins] tokens per bin
  uint32_t* hist_hi;     // sum of (mass >> 16)
  uint32_t* hist_lo;     // sum of (mass & 0xffff): 32-bit shared atomics, no carries
  double* chunk_scale;   // [batch, chunks] exp(chunk max - row max); 0: chunk out of range
  // [batch, chunks] the histogram's weight above the boundary bin, by pass 2 (the head's
  // level-1 weights)
  unsigned long long* chunk_kept;
  MassPlan* plan;           // [batch]
  uint32_t* pass2_ticket;   // [batch] zeroed by the plan
  uint32_t* boundary_fill;  // [batch] tokens appended to the boundary list; zeroed by the plan
  uint32_t* boundary_key;   // [batch, kBoundaryCap]
  int32_t* boundary_index;  // [batch, kBoundaryCap]
  // [batch, kBoundarySubBins], zeroed by the plan of a two-pass row, filled by its pass 2 when
  // the row is wide (more boundary tokens than a MassDrawKernel block has threads): tokens and
  // fixed-point weight, so that the row's last block reads 256 sums instead of weighing the
  // whole list (v30, every row since v51).
  uint32_t* sub_count;
  unsigned long long* sub_weight;
};

// A wide boundary bin's sub-bins: the bin [bin_top - 1/8, bin_top) of z split by the fraction of
// 8z (exact in fp32, as is the scaling). Each token weighs its mass relative to bin_top in units
// of 2^-24, in (2^-24 x 2^(24 - 1/8 log2 e), 2^24]: integer sums, the same in any order.
struct BoundarySubBins {
  float bin_top;  // z < bin_top for every token of the boundary bin

  __device__ explicit BoundarySubBins(const MassPlan& plan)
      : bin_top((plan.row_top - static_cast<float>(plan.boundary_bin) + 1.0f) / kMassBinsPerLogit) {
  }

  __device__ static int Of(float z) {
    const float t = z * kMassBinsPerLogit;
    return static_cast<int>((t - floorf(t)) * static_cast<float>(kBoundarySubBins));
  }
  __device__ uint32_t Weight(float z) const {
    constexpr float kLog2E = 1.4426950408889634f;
    return static_cast<uint32_t>(exp2f((z - bin_top) * kLog2E) * kUnit);
  }
  // One weight unit in the plan's mass units.
  __device__ double UnitMass(const MassPlan& plan) const {
    return exp(static_cast<double>(bin_top) - static_cast<double>(plan.row_max)) * kMassScale /
           kUnit;
  }

  static constexpr float kUnit = 16777216.0f;  // 2^24
};

// One token's mass relative to `ref` (z <= ref) in units of 2^-31 (<= 2^31: fits 32 bits).
// exp2f of a product: two instructions where expf costs about ten (pass 1 is instruction-
// bound). Pass 1's histogram and pass 2's boundary walk both use this, so the boundary list adds
// up to its bin exactly.
__device__ __forceinline__ uint32_t FixedMass32(float z, float ref) {
  constexpr float kLog2E = 1.4426950408889634f;
  return static_cast<uint32_t>(exp2f((z - ref) * kLog2E) * kMassScale);
}

// Shared memory of pass 1's mass histogram.
struct MassShared {
  uint32_t count[kMassBins];
  uint32_t hi[kMassBins];
  uint32_t lo[kMassBins];
};

// Shared memory of PlanMassRow.
struct MassPlanScratch {
  double scale[kMaxStagedChunks];
  int32_t offset[kMaxStagedChunks];  // row bin of the chunk's bin 0; INT32_MAX: none
  double above[kMassBins + 1];
  int32_t boundary;
  MassPath path;
};

template <int kThreads>
__device__ void ClearMassHistogram(MassShared& sh) {
  for (int b = threadIdx.x; b < kMassBins; b += kThreads) {
    sh.count[b] = 0;
    sh.hi[b] = 0;
    sh.lo[b] = 0;
  }
}

// Adds z (a finite z of a chunk whose max is chunk_max, top = floor(kMassBinsPerLogit *
// chunk_max)) to the shared histogram; z more than 32 logits below the top is left out (its
// mass is below 2^-46 of the top's and never kept).
__device__ __forceinline__ void AddToMassHistogram(MassShared& sh, float z, float chunk_max,
                                                   float top) {
  const float d = top - floorf(z * kMassBinsPerLogit);
  if (!(d < static_cast<float>(kMassBins))) return;
  const int b = static_cast<int>(d);
  const uint32_t m = FixedMass32(z, chunk_max);
  atomicAdd(&sh.count[b], 1u);
  atomicAdd(&sh.hi[b], m >> 16);
  atomicAdd(&sh.lo[b], m & 0xffffu);
}

// The histogram of a chunk whose finite z all lie in its top bin (flat rows): the block's sum
// of `packed` (count << 48 | mass, summed over the block) as bin 0. The same integers as adding
// each token with AddToMassHistogram (the plan reads only count and hi * 2^16 + lo), without
// 8,192 atomics on one address (v28: flat top-p's chunk pass took 200 us at B = 128 against 62
// on other rows with the same instructions; ncu). One thread calls.
__device__ __forceinline__ void SetOneBinMassHistogram(MassShared& sh, uint64_t packed) {
  const uint64_t mass = packed & ((uint64_t{1} << 48) - 1);  // <= 8,192 x 2^31 = 2^44
  sh.count[0] = static_cast<uint32_t>(packed >> 48);
  sh.hi[0] = static_cast<uint32_t>(mass >> 16);
  sh.lo[0] = static_cast<uint32_t>(mass & 0xffffu);
}

template <int kThreads>
__device__ void StoreMassHistogram(const MassShared& sh, const MassWorkspace& ws, int64_t slot) {
  const int64_t base = slot * kMassBins;
  for (int b = threadIdx.x; b < kMassBins; b += kThreads) {
    ws.hist_count[base + b] = sh.count[b];
    ws.hist_hi[base + b] = sh.hi[b];
    ws.hist_lo[base + b] = sh.lo[b];
  }
}

// The plan of a mass row, by one block of kThreads >= kMassBins threads of the kernel after
// pass 1: combines the row's chunk histograms in chunk order into the row's MassPlan (and chunk
// scales), and zeroes the row's pass-2 ticket, boundary fill and (two-pass rows) sub-bins. Returns
// the path (every thread gets it). Every thread of the block must call.
template <int kThreads>
__device__ MassPath PlanMassRow(const MassWorkspace& ws, const ChunkStats* stats, int64_t row,
                                int chunks, const RowParams& params, MassPlanScratch& sh,
                                typename BlockReduce<kThreads>::Storage& reduce) {
  const float top_p = params.top_p;
  const float temperature = params.temperature;
  static_assert(kThreads > kMassBins, "one bin per thread, and one more for the total");
  using Reduce = BlockReduce<kThreads>;
  float local_max = -kInfF, local_min = kInfF;
  uint64_t flags = 0;  // chunks with NaN | with +inf z (<< 20) | with a finite x (<< 40)
  for (int c = threadIdx.x; c < chunks; c += kThreads) {
    const ChunkStats& s = stats[c];
    local_max = fmaxf(local_max, s.max_z);
    local_min = fminf(local_min, s.min_z);
    flags += (s.nan_count > 0 ? 1ull : 0ull) | (s.pos_inf_z > 0 ? 1ull << 20 : 0ull) |
             (s.not_neg_inf_x > 0 ? 1ull << 40 : 0ull);
  }
  const float row_max = Reduce::Max(reduce, local_max);
  // Every finite z of the chunks that can hold kept tokens equals the max: one tie group.
  const bool tied = Reduce::Min(reduce, local_min) == row_max;
  flags = Reduce::SumU64(reduce, flags);
  const bool usable = (flags & 0xfffff) == 0 && ((flags >> 20) & 0xfffff) == 0 &&
                      (flags >> 40) > 0 && fabsf(row_max) < kMassMaxRowAbs;
  MassPlan* plan = ws.plan + row;
  if (threadIdx.x == 0) {
    ws.pass2_ticket[row] = 0;
    ws.boundary_fill[row] = 0;
  }
  if (!usable) {
    if (threadIdx.x == 0) plan->path = MassPath::kFallback;
    return MassPath::kFallback;
  }
  const float row_top = floorf(row_max * kMassBinsPerLogit);
  for (int c = threadIdx.x; c < chunks; c += kThreads) {
    const float chunk_max = stats[c].max_z;
    int32_t offset = INT32_MAX;
    double scale = 0.0;
    if (chunk_max >= row_max - 64.0f) {  // else every token is > 32 logits below the row max
      const float o = row_top - floorf(chunk_max * kMassBinsPerLogit);
      if (o < static_cast<float>(kMassBins)) {
        offset = static_cast<int32_t>(o);
        scale = exp(static_cast<double>(chunk_max) - static_cast<double>(row_max));
      }
    }
    sh.offset[c] = offset;
    sh.scale[c] = scale;
    ws.chunk_scale[row * chunks + c] = scale;
  }
  if (threadIdx.x == 0) {
    sh.boundary = INT32_MAX;
    sh.path = MassPath::kFallback;
  }
  __syncthreads();
  // Row bin k = this thread: its chunk bins, in chunk order (threads past the bins add 0).
  const int k = threadIdx.x;
  double mass = 0.0;
  uint32_t count = 0;
  if (k < kMassBins) {
    // kBatch chunks' loads in flight at once (one at a time, the L2 latency of ~19 dependent
    // loads was most of this kernel at B = 1); added in chunk order.
    constexpr int kBatch = 8;
    for (int c0 = 0; c0 < chunks; c0 += kBatch) {
      uint32_t n[kBatch], hi[kBatch], lo[kBatch];
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int c = c0 + u;
        const int i = c < chunks ? k - sh.offset[c] : -1;  // offset INT32_MAX: i < 0
        n[u] = hi[u] = lo[u] = 0;
        if (i >= 0 && i < kMassBins) {
          const int64_t at = (row * chunks + c) * static_cast<int64_t>(kMassBins) + i;
          n[u] = ws.hist_count[at];
          hi[u] = ws.hist_hi[at];
          lo[u] = ws.hist_lo[at];
        }
      }
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        if (n[u] == 0) continue;
        count += n[u];
        mass +=
            static_cast<double>((static_cast<uint64_t>(hi[u]) << 16) + lo[u]) * sh.scale[c0 + u];
      }
    }
  }
  double total = 0.0;
  const double above = Reduce::ExclusiveScanF64(reduce, mass, &total);
  // The next bin's `above` is this bin's running mass as the scan computed it, so the bins
  // where the running mass crosses the target are exactly those that see it; the first wins.
  if (k <= kMassBins) sh.above[k] = above;
  __syncthreads();
  const double target = static_cast<double>(top_p) * total;
  if (k < kMassBins && count > 0 && above < target && target <= sh.above[k + 1]) {
    atomicMin(&sh.boundary, k);
  }
  __syncthreads();
  if (k == sh.boundary) {
    MassPlan out;
    out.path =
        count <= static_cast<uint32_t>(kBoundaryCap) ? MassPath::kTwoPass : MassPath::kFallback;
    out.boundary_bin = k;
    out.boundary_count = count;
    out.boundary_mass = sh.above[k + 1] - above;
    // Level 0 (v48): the head for certain, whatever share of the bin the cut keeps.
    if (HeadIsDrawn(above, out.boundary_mass, RowPartUniform(params.seed, params.position))) {
      out.path = MassPath::kHeadDraw;
    }
    if (tied) {
      // A tie group is kept whole, and here it is every kept candidate: all of bin k is kept
      // (above a boundary bin k + 1 that is empty), however many tokens it holds. The tail is
      // empty, so every draw is the head's.
      out.path = MassPath::kHeadDraw;
      out.boundary_bin = k + 1;
      out.boundary_count = 0;
      out.boundary_mass = 0.0;
    }
    out.row_max = row_max;
    out.row_top = row_top;
    // bin_of(z) = row_top - floor(8 z) is below bin b iff 8 z >= row_top - b + 1: exact in fp32
    // (8 z is, and |row_top| < 2^23), so these thresholds decide exactly as the bins do.
    const float b = static_cast<float>(out.boundary_bin);
    out.kept_from_x = SmallestXReaching((row_top - b + 1.0f) / kMassBinsPerLogit, temperature);
    out.boundary_from_x = SmallestXReaching((row_top - b) / kMassBinsPerLogit, temperature);
    out.target = target;
    out.mass_above = above;
    *plan = out;
    sh.path = out.path;
  } else if (threadIdx.x == 0 && sh.boundary == INT32_MAX) {
    plan->path = MassPath::kFallback;
  }
  __syncthreads();
  const MassPath path = sh.path;
  if (path == MassPath::kTwoPass) {  // pass 2 adds to them (the rows of every other path skip it)
    for (int b = threadIdx.x; b < kBoundarySubBins; b += kThreads) {
      ws.sub_count[row * kBoundarySubBins + b] = 0;
      ws.sub_weight[row * kBoundarySubBins + b] = 0;
    }
  }
  __syncthreads();
  return path;
}

}  // namespace samplerd::kernels::gpu

#endif  // SAMPLERD_KERNELS_GPU_MASS_PLAN_H_
