// Top-p over a row's chunks, part 2 of 2 (part 1 and the design: mass_plan.h).
//
// Pass 2 for a row whose MassPlan is kTwoPass: block (chunk c, row r) of MassDrawKernel reads
// its chunk again and appends the boundary bin's tokens to the row's boundary list (a wide
// bin's tokens are also weighed by sub-bin here: BlockSubBins). It draws nothing:
// the row's last block cuts the list by the top-p rule and draws the token by the chunked
// inverse CDF (chunked_draw.h): no random number per kept token. A row on the kHeadDraw plan
// (v48) skips pass 2: its chunk-0 block draws from the head alone (FinishHeadRow).
#ifndef SAMPLERD_KERNELS_GPU_MASS_DRAW_H_
#define SAMPLERD_KERNELS_GPU_MASS_DRAW_H_

#include <cstdint>

#include "kernels/gpu/chunk_pass.h"
#include "kernels/gpu/chunk_stats.h"
#include "kernels/gpu/chunked_draw.h"
#include "kernels/gpu/device_common.h"
#include "kernels/gpu/mass_finish.h"
#include "kernels/gpu/mass_plan.h"
#include "kernels/gpu/rows_in.h"
#include "kernels/gpu/select.h"

namespace samplerd::kernels::gpu {

inline constexpr int kMassDrawThreads = 256;
// A small launch splits each chunk over this many MassDrawKernel blocks (v34): at B = 1 a row's
// pass 2 is one wave of 19 blocks (4 at V = 32,000), each a serial walk of 8,192 tokens. Which
// block reads which tokens does not change the token: the kept set comes from the plan, the
// boundary list's cut and integer sums are the same in any order of work, and a boundary token's
// mass refers to its pass-1 chunk (index / kChunk), whichever block lists it.
inline constexpr int kMassDrawSplit = 4;
// Launches of at most this many chunk blocks (batch x chunks) split them. Measured on an H100
// (132 SMs, session 26; the same library forced either way): the split gains 4-17% up to 152
// chunk blocks (V = 151,936 at B = 8: 0.91-0.96x; V = 32,000 at B = 32: 0.87-0.96x) and loses
// from 256 (V = 32,000 at B = 64: 0.99-1.10x; V = 151,936 at B = 16: 1.00-1.12x).
inline constexpr int64_t kMassDrawSplitMaxChunks = 160;

struct MassDrawParams {
  RowsIn rows;
  const ChunkStats* stats;  // [batch, chunks]
  int32_t* token_ids;
  RowStatus* status;
  MassWorkspace mass;
};

// A wide row's boundary tokens of one MassDrawKernel block, by sub-bin: their count and weight,
// added to the row's sums (MassWorkspace::sub_*) at the end of the block; the row's last block
// reads those instead of weighing its whole list (v30).
struct BlockSubBins {
  uint32_t count[kBoundarySubBins];
  unsigned long long weight[kBoundarySubBins];

  template <int kThreads>
  __device__ void Clear() {
    for (int b = threadIdx.x; b < kBoundarySubBins; b += kThreads) {
      count[b] = 0;
      weight[b] = 0;
    }
  }

  __device__ __forceinline__ void Add(const BoundarySubBins& subs, float z) {
    const int b = BoundarySubBins::Of(z);
    atomicAdd(&count[b], 1u);
    atomicAdd(&weight[b], static_cast<unsigned long long>(subs.Weight(z)));
  }

  template <int kThreads>
  __device__ void AddToRow(const MassWorkspace& ws, int64_t row) const {
    for (int b = threadIdx.x; b < kBoundarySubBins; b += kThreads) {
      const int64_t at = row * kBoundarySubBins + b;
      if (count[b] == 0) continue;
      atomicAdd(ws.sub_count + at, count[b]);
      atomicAdd(ws.sub_weight + at, weight[b]);
    }
  }
};

// Shared memory of MassDrawKernel: the block's span of kSpan tokens (widened to fp32), then, in
// the row's last block, the sort of the boundary list.

template <int kSpan>
struct MassDrawShared {
  union {
    alignas(16) float chunk[kSpan];  // read as float4
    SelectStorage select;
  };
  union {
    BlockSubBins sub;  // then a wide row's boundary tokens of this block, by sub-bin
    struct {           // the last block's copy of the row's chunk references
      float max[kMaxStagedChunks];
      double scale[kMaxStagedChunks];
      ChunkedDrawShared draw;  // v47
    } ref;
  };
  unsigned long long kept_weight;  // v47j: the chunk's histogram weight above the boundary bin
  uint32_t fill;                   // boundary tokens of this block
  uint32_t base;                   // their first slot in the row's list
  uint32_t ticket;
};

// The token of a row whose argmax is wanted when no kept mass is found (cannot happen on the
// mass path's plans): looked up only then (v47c: a serial walk of the chunk stats on every row's
// critical path).
__device__ __forceinline__ int64_t RowArgmax(const MassPlan& plan, int chunks,
                                             const ChunkStats* row_stats) {
  for (int c = 0; c < chunks; ++c) {
    if (row_stats[c].max_z == plan.row_max) return static_cast<int64_t>(row_stats[c].argmax_x);
  }
  return 0;
}

// v47: the last block of a mass row: the boundary cut, then the chunked inverse-CDF draw
// (chunked_draw.h). Every thread of the block must call; every thread gets the token.
template <DType kDType, int kThreads, int kSpan>
__device__ int64_t FinishChunkedRow(const MassWorkspace& ws, const MassPlan& plan, int64_t row,
                                    int chunks, const void* row_ptr, const RowProcessors& procs,
                                    int64_t vocab, const ChunkStats* row_stats,
                                    const RowParams& params, MassDrawShared<kSpan>& sh,
                                    typename BlockReduce<kThreads>::Storage& reduce) {
  const uint32_t fill = *static_cast<const volatile uint32_t*>(ws.boundary_fill + row);
  const int n = static_cast<int>(fill < plan.boundary_count ? fill : plan.boundary_count);
  const volatile uint32_t* list_key = ws.boundary_key + row * kBoundaryCap;
  const volatile int32_t* list_index = ws.boundary_index + row * kBoundaryCap;
  // The token when no kept mass is found (cannot happen on a two-pass plan): the row's argmax.
  const auto fallback = [&] { return RowArgmax(plan, chunks, row_stats); };
  return ChunkedDrawToken<kDType, kThreads>(
      ws, plan, row, chunks, row_ptr, procs, vocab, sh.ref.max, sh.ref.scale, n, list_key,
      list_index, ws.chunk_kept + row * chunks, params, fallback, sh.select, sh.ref.draw, reduce);
}

// v48: a row on the kHeadDraw plan, by one block (its chunk-0 block of MassDrawKernel): the
// draw over the tokens above the boundary bin (HeadDrawToken); pass 2 does not run. Every thread
// of the block must call.
template <DType kDType, int kThreads, int kSpan>
__device__ void FinishHeadRow(const MassWorkspace& ws, const MassPlan& plan, int64_t row,
                              int chunks, const void* row_ptr, const RowProcessors& procs,
                              int64_t vocab, const ChunkStats* row_stats, const RowParams& params,
                              MassDrawShared<kSpan>& sh,
                              typename BlockReduce<kThreads>::Storage& reduce, int32_t* token_ids,
                              RowStatus* status) {
  for (int c = threadIdx.x; c < chunks; c += kThreads) {
    sh.ref.scale[c] = ws.chunk_scale[row * chunks + c];
  }
  const auto fallback = [&] { return RowArgmax(plan, chunks, row_stats); };
  const int64_t token =
      HeadDrawToken<kDType, kThreads>(ws, plan, row, chunks, row_ptr, procs, vocab, row_stats,
                                      sh.ref.scale, params, fallback, sh.ref.draw, reduce);
  if (threadIdx.x == 0) WriteRowToken(token_ids, status, row, token, vocab);
}

// Pass 2 of a kTwoPass mass row: block (chunk, row). Writes the row's token and status when it
// is the row's last block. Every thread of the block must call.
//
// The chunk's loads are issued at once and staged in shared memory; the per-token work then runs
// as a loop that is not unrolled. At small batches a kernel's time is mostly instruction fetch
// from a cold cache (ncu: 64% of pass 1's stall samples at B = 1 were "no instruction"), so
// compact code matters more there than unrolled arithmetic (NOTES.md v8).
//
// The block reads span `part` of the row: kSpan tokens, kChunk / kSpan spans a pass-1 chunk.
template <DType kDType, int kThreads, int kSpan, ProcsKind kKind>
__device__ void MassDrawChunk(const MassWorkspace& ws, const MassPlan& plan, const void* row_ptr,
                              const RowProcessors& procs, int64_t vocab,
                              const ChunkStats* row_stats, int64_t row, int part, int chunks,
                              const RowParams& params, MassDrawShared<kSpan>& sh,
                              typename BlockReduce<kThreads>::Storage& reduce, int32_t* token_ids,
                              RowStatus* status) {
  constexpr int kGroups = kSpan / 4 / kThreads;  // groups of 4 tokens per thread
  static_assert(kGroups >= 1 && kGroups * 4 * kThreads == kSpan, "a span splits evenly");
  static_assert(kChunk % kSpan == 0, "spans tile a chunk");
  static_assert(kGroups <= 32, "one bit per group in a 32-bit mask");
  constexpr int kSpansPerChunk = kChunk / kSpan;
  const int parts = chunks * kSpansPerChunk;
  const int64_t begin = static_cast<int64_t>(part) * kSpan;
  const int64_t end = begin + kSpan < vocab ? begin + kSpan : vocab;  // < begin: no tokens
  // Group g of this thread: tokens [begin + at, begin + at + 4), at = (g * kThreads + tid) * 4.
  auto local_at = [&](int g) { return (g * kThreads + static_cast<int>(threadIdx.x)) * 4; };
  const bool unit_temperature = params.temperature == 1.0f;
  auto z_of = [&](float x) { return unit_temperature ? x : x / params.temperature; };
  // The bins as thresholds on x (the plan's, v13): one comparison per token, no bin arithmetic
  // and no divide.
  const float kept_from = plan.kept_from_x;
  const float boundary_from = plan.boundary_from_x;
  // The chunk's loads at once; the boundary tokens are counted from the registers while the
  // chunk is staged in shared memory for their append.
  // The chunk's first block also weighs its chunk for level 1 of the draw (the histogram's bins
  // above the boundary bin, its loads in flight with the chunk's), so that the row's last block
  // reads one number a chunk instead of its 256 bins (v47j).
  const int chunk = part / kSpansPerChunk;
  const bool weighs_chunk = part % kSpansPerChunk == 0;
  uint64_t hist_weight = 0;
  uint32_t boundary_groups = 0;  // bit g: group g holds a boundary token
  uint32_t boundary_tokens = 0;
  {
    float v[kGroups * 4];
#pragma unroll
    for (int g = 0; g < kGroups; ++g)
      LoadGroup<kDType>(row_ptr, begin + local_at(g), end, &v[g * 4]);
    if (weighs_chunk) {
      hist_weight = ChunkBinWeightAbove(ws, plan, row, chunks, chunk, row_stats,
                                        static_cast<int>(threadIdx.x), kThreads);
    }
    // The processors, once every load is in flight: the mask here, group by group; the tokens
    // with a bias or penalty (bit 4g + e of `mark`) one at a time below (v42: applied group by
    // group, each group's branch ran in most waves with a lane or two busy).
    uint32_t mark = 0;
    if constexpr (kKind != ProcsKind::kNone) {
      constexpr bool kMarks = kKind == ProcsKind::kAll;
      const RowProcessors::GroupBits bits = procs.LoadBits<kGroups, kMarks>(
          row, begin + local_at(0), [](int g) { return g * kThreads * 4; }, end);
#pragma unroll
      for (int g = 0; g < kGroups; ++g) procs.ApplyAllowed(bits, g, &v[g * 4]);
      mark = bits.mark;
    }
#pragma unroll
    for (int g = 0; g < kGroups; ++g) {
      *reinterpret_cast<float4*>(&sh.chunk[local_at(g)]) =
          make_float4(v[g * 4], v[g * 4 + 1], v[g * 4 + 2], v[g * 4 + 3]);
      uint32_t boundary = 0;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float x = v[g * 4 + e];
        const bool plain = !AnyBitSet(mark, 1u << (4 * g + e));  // true without marks
        boundary += plain && x >= boundary_from && x < kept_from;
      }
      boundary_tokens += boundary;
      if (boundary > 0) boundary_groups |= 1u << g;
    }
    for (uint32_t m = mark; m != 0u; m &= m - 1u) {  // the marked tokens, processed (v42)
      const int i = __ffs(static_cast<int>(m)) - 1;
      const int local = local_at(i >> 2) + (i & 3);
      const int64_t j = begin + local;
      const float x = procs.Apply(row, j, LoadLogit<kDType>(row_ptr, j));
      sh.chunk[local] = x;
      const bool boundary = x >= boundary_from && x < kept_from;
      boundary_tokens += boundary;
      if (boundary) boundary_groups |= 1u << (i >> 2);
    }
  }
  if (threadIdx.x == 0) {
    sh.fill = 0;
    sh.kept_weight = 0;
  }
  // A wide row (more boundary tokens than the block has threads) weighs its boundary tokens
  // here, by sub-bin: the row's last block then reads 256 sums instead of weighing the whole
  // list alone (v30; every wide row since v51).
  const bool wide = plan.boundary_count > static_cast<uint32_t>(kThreads);
  if (wide) sh.sub.template Clear<kThreads>();
  // The boundary tokens: one shared atomic per thread and one global atomic per block (one
  // global atomic per token serialised the blocks of a row on one address).
  __syncthreads();  // sh.fill and the sub-bins are zero
  const uint32_t mine = boundary_tokens > 0 ? atomicAdd(&sh.fill, boundary_tokens) : 0;
  if (weighs_chunk) {
    hist_weight = WaveSumU64(hist_weight);
    if (threadIdx.x % kWaveSize == 0 && hist_weight != 0) atomicAdd(&sh.kept_weight, hist_weight);
  }
  __syncthreads();
  if (threadIdx.x == 0 && sh.fill > 0) sh.base = atomicAdd(ws.boundary_fill + row, sh.fill);
  if (threadIdx.x == 0 && weighs_chunk) ws.chunk_kept[row * chunks + chunk] = sh.kept_weight;
  __syncthreads();
  uint32_t slot = sh.base + mine;
  auto append = [&](int first, int e, float z) {
    if (slot < static_cast<uint32_t>(kBoundaryCap)) {
      ws.boundary_key[row * kBoundaryCap + slot] = OrderedKey(z);
      ws.boundary_index[row * kBoundaryCap + slot] = static_cast<int32_t>(begin + first + e);
    }
    ++slot;
  };
  if (wide) {
    const BoundarySubBins subs(plan);
#pragma unroll 1
    for (uint32_t groups = boundary_groups; groups != 0; groups &= groups - 1) {
      const int first = local_at(__ffs(groups) - 1);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float x = sh.chunk[first + e];
        if (!(x >= boundary_from && x < kept_from)) continue;
        const float z = z_of(x);
        append(first, e, z);
        sh.sub.Add(subs, z);
      }
    }
    __syncthreads();  // every Add is done
    sh.sub.template AddToRow<kThreads>(ws, row);
  } else {
    for (uint32_t groups = boundary_groups; groups != 0; groups &= groups - 1) {
      const int first = local_at(__ffs(groups) - 1);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float x = sh.chunk[first + e];
        if (!(x >= boundary_from && x < kept_from)) continue;
        append(first, e, z_of(x));
      }
    }
    __syncthreads();  // every thread is done with sh.chunk
  }
  if (!LastToArrive(ws.pass2_ticket + row, static_cast<uint32_t>(parts), &sh.ticket)) return;
  for (int c = threadIdx.x; c < chunks; c += kThreads) {
    sh.ref.max[c] = row_stats[c].max_z;
    sh.ref.scale[c] = ws.chunk_scale[row * chunks + c];
    sh.ref.draw.weight[c] = 0;  // the tail's level-1 weights, added by the cut
  }
  if (threadIdx.x == 0) sh.ref.draw.min_key = UINT32_MAX;
  __syncthreads();
  const int64_t token = FinishChunkedRow<kDType, kThreads>(ws, plan, row, chunks, row_ptr, procs,
                                                           vocab, row_stats, params, sh, reduce);
  if (threadIdx.x == 0) WriteRowToken(token_ids, status, row, token, vocab);
}

// Launch: grid (chunks x kSplit, batch), kMassDrawThreads threads, after RowFinishKernel made
// the plans; kSplit is 1 or kMassDrawSplit (a small launch). Blocks of rows that are not on a
// two-pass plan leave at once.
template <DType kDType, ProcsKind kKind, int kSplit>
__global__ void __launch_bounds__(kMassDrawThreads, 4) MassDrawKernel(MassDrawParams p) {
  constexpr int kSpan = kChunk / kSplit;
  __shared__ MassDrawShared<kSpan> sh;
  __shared__ typename BlockReduce<kMassDrawThreads>::Storage reduce;
  const int64_t row = blockIdx.y;
  // A plain launch after RowFinishKernel, which writes the plans: launched dependent on it, its
  // waiting blocks cost top-p ~10% at B = 8, V = 262,144 and gained nothing elsewhere (v16).
  if (p.rows.Skipped(row)) return;  // device sessions: a row past the step's batch
  const RowParams params = p.rows.Params(row);
  if (!IsMassRow(params, p.rows.vocab, p.mass.enabled)) return;
  const MassPlan plan = p.mass.plan[row];
  const void* row_ptr = p.rows.Row<kDType>(row);
  if (plan.path == MassPath::kHeadDraw) {  // v48: no pass 2; the row's first block draws
    if (blockIdx.x == 0) {
      FinishHeadRow<kDType, kMassDrawThreads>(
          p.mass, plan, row, p.rows.chunks, row_ptr, p.rows.procs, p.rows.vocab,
          p.stats + row * p.rows.chunks, params, sh, reduce, p.token_ids, p.status);
    }
    return;
  }
  if (plan.path != MassPath::kTwoPass) return;
  MassDrawChunk<kDType, kMassDrawThreads, kSpan, kKind>(
      p.mass, plan, row_ptr, p.rows.procs, p.rows.vocab, p.stats + row * p.rows.chunks, row,
      static_cast<int>(blockIdx.x), p.rows.chunks, params, sh, reduce, p.token_ids, p.status);
}

}  // namespace samplerd::kernels::gpu

#endif  // SAMPLERD_KERNELS_GPU_MASS_DRAW_H_
