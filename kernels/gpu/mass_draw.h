// Top-p over a row's chunks, part 2 of 2 (part 1 and the design: mass_plan.h).
//
// Pass 2 for a row whose MassPlan is kTwoPass: block (chunk c, row r) of MassDrawKernel reads
// its chunk again. Tokens above the boundary bin compete in the Gumbel-max draw at once (queued,
// then drawn with every lane busy); the boundary bin's tokens are appended to the row's boundary
// list (in a small launch, a wide bin's tokens are also weighed by sub-bin here, and scored
// where they might win: BlockSubBins). The last block of the row sorts the list (split into
// sub-bins first when it holds more than one token a thread), keeps its prefix by the top-p
// rule, draws among it and compares with every chunk's best (mass_finish.h): the row's token.
#ifndef SAMPLERD_KERNELS_GPU_MASS_DRAW_H_
#define SAMPLERD_KERNELS_GPU_MASS_DRAW_H_

#include <cstdint>

#include "kernels/gpu/chunk_pass.h"
#include "kernels/gpu/chunk_stats.h"
#include "kernels/gpu/deferred_scores.h"
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
// Gumbel-max draw and the boundary list's sort are the same in any order of work, and a boundary
// token's mass refers to its pass-1 chunk (index / kChunk), whichever block lists it.
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

// The last block of a mass row: loads the boundary list and the chunks' best scores and returns
// the row's token (every thread gets it). Every thread of the block must call.
template <int kThreads>
__device__ int64_t FinishMassRow(const MassWorkspace& ws, const MassPlan& plan,
                                 const float* chunk_max, const double* chunk_scale, int64_t row,
                                 int parts, const RowParams& params, SelectStorage& s,
                                 typename BlockReduce<kThreads>::Storage& reduce) {
  // The entries pass 2 appended: the plan's count (<= kBoundaryCap on kTwoPass), unless the
  // logits changed between the launches (an engine writing them during a device-session step);
  // entries past those appended are another call's, of tokens maybe outside this row.
  const uint32_t fill = *static_cast<const volatile uint32_t*>(ws.boundary_fill + row);
  const int n = static_cast<int>(fill < plan.boundary_count ? fill : plan.boundary_count);
  const volatile uint32_t* list_key = ws.boundary_key + row * kBoundaryCap;
  const volatile int32_t* list_index = ws.boundary_index + row * kBoundaryCap;
  // Lists of up to one token a thread are sorted whole (by rank: cheap); longer ones are split
  // into sub-bins first, so that only the crossing sub-bin's few tokens are sorted (v18: the
  // bitonic sort of ~1,060 boundary tokens of a randn x 3 row took 21 us of top-p's 60 at B = 1).
  const bool sort_whole = n <= kThreads;
  for (int i = threadIdx.x; i < n && sort_whole; i += kThreads) {
    s.sort.key[i] = list_key[i];
    s.sort.index[i] = list_index[i];
  }
  ArgMaxPair best{-kInfF, INT64_MAX};
  const volatile ChunkBest* bests = ws.chunk_best + row * parts;  // one a MassDrawKernel block
  for (int c = threadIdx.x; c < parts; c += kThreads) {
    const int32_t j = bests[c].index;
    const ArgMaxPair scored{bests[c].score, j < 0 ? INT64_MAX : static_cast<int64_t>(j)};
    if (j >= 0 && Better(scored, best)) best = scored;
  }
  best = BlockReduce<kThreads>::ArgMax(reduce, best);  // also: the list is in s.sort
  if (!sort_whole) {
    return DrawWideBoundary<kThreads>(ws, plan, row, n, list_key, list_index, chunk_max,
                                      chunk_scale, params, best, s, reduce);
  }
  return DrawBoundary<kThreads>(plan, n, chunk_max, chunk_scale, params, best, s, reduce);
}

// A wide row's boundary tokens of one MassDrawKernel block, by sub-bin: their count and weight,
// and the best score of those that might still win (BoundaryBestKey). Added to the row's sums
// (MassWorkspace::sub_*) at the end of the block; the row's last block reads those (v30).
struct BlockSubBins {
  uint32_t count[kBoundarySubBins];
  unsigned long long weight[kBoundarySubBins];
  unsigned long long best[kBoundarySubBins];

  template <int kThreads>
  __device__ void Clear() {
    for (int b = threadIdx.x; b < kBoundarySubBins; b += kThreads) {
      count[b] = 0;
      weight[b] = 0;
      best[b] = 0;
    }
  }

  // Boundary token j (z, uniform u). `u_floor`: MayBeatThreshold at the bin's top against
  // `floor`, a score some kept token reaches: below it, the token cannot win.
  __device__ __forceinline__ void Add(const BoundarySubBins& subs, float z, float u, int32_t j,
                                      float u_floor, float floor) {
    const int b = BoundarySubBins::Of(z);
    atomicAdd(&count[b], 1u);
    atomicAdd(&weight[b], static_cast<unsigned long long>(subs.Weight(z)));
    if (u >= u_floor && MayBeat(z, u, floor)) {
      atomicMax(&best[b], BoundaryBestKey(z + GumbelFromUniform(u), j));
    }
  }

  template <int kThreads>
  __device__ void AddToRow(const MassWorkspace& ws, int64_t row) const {
    for (int b = threadIdx.x; b < kBoundarySubBins; b += kThreads) {
      const int64_t at = row * kBoundarySubBins + b;
      if (count[b] == 0) continue;
      atomicAdd(ws.sub_count + at, count[b]);
      atomicAdd(ws.sub_weight + at, weight[b]);
      if (best[b] != 0) atomicMax(ws.sub_best + at, best[b]);
    }
  }
};

// Shared memory of MassDrawKernel: the block's span of kSpan tokens (widened to fp32), then, in
// the row's last block, the sort of the boundary list.
inline constexpr int kKeptQueue = 4096;  // kept tokens drawn per round

template <int kSpan>
struct MassDrawShared {
  union {
    alignas(16) float chunk[kSpan];  // read as float4
    SelectStorage select;
  };
  union {
    uint16_t kept[kKeptQueue];  // chunk offsets of the kept tokens of this round (sparse chunks)
    DeferredScores<kMassDrawThreads>::Storage scores;  // the offers of a dense chunk's draw
    BlockSubBins sub;  // then a wide row's boundary tokens of this block, by sub-bin
    struct {           // the last block's copy of the row's chunk references
      float max[kMaxStagedChunks];
      double scale[kMaxStagedChunks];
    } ref;
  };
  uint32_t fill;  // boundary tokens of this block
  uint32_t base;  // their first slot in the row's list
  uint32_t ticket;
  uint32_t floor_key;  // a dense draw's best score so far, shared by its waves (OrderedKey)
};

// Pass 2 of a kTwoPass mass row: block (chunk, row). Writes the row's token and status when it
// is the row's last block. Every thread of the block must call.
//
// The chunk's loads are issued at once and staged in shared memory; the per-token work then runs
// as a loop that is not unrolled. At small batches a kernel's time is mostly instruction fetch
// from a cold cache (ncu: 64% of pass 1's stall samples at B = 1 were "no instruction"), so
// compact code matters more there than unrolled arithmetic (NOTES.md v8).
// The kept tokens of a dense chunk (a random-weight model's rows keep ~85% of their tokens at
// p = 0.95, flat rows all of them), drawn by their own threads: every lane is busy without
// MassDrawChunk's queue, and one Philox block serves a group of 4 (the queue computes a whole
// block for each token: 4x the Philox work where groups are full; v28). The same scores and
// MayBeat skips as the queue, so the same token; the exact scores wait for a full wave (v29).
// Not inlined: inlined (v28a), B = 1 rows got 2-5% slower.
template <int kThreads, int kSpan>
__device__ __noinline__ ArgMaxPair
DrawDenseGroups(typename DeferredScores<kThreads>::Storage& storage, const float* chunk,
                uint32_t kept_groups, int64_t begin, float kept_from, const RowParams& params,
                float top_z, float floor_score, uint32_t* block_floor) {
  constexpr int kGroups = kSpan / 4 / kThreads;
  DeferredScores<kThreads> scores(storage, chunk, begin, params.temperature, top_z, floor_score,
                                  block_floor);
  const PhiloxKey key = WaveUniformKey(params.seed);
  const uint64_t position = WaveUniformU64(params.position);
#pragma unroll 1
  for (int g = 0; g < kGroups; ++g) {  // every lane the same trips: Collect is wave-wide
    const int first = (g * kThreads + static_cast<int>(threadIdx.x)) * 4;
    uint32_t offers = 0;
    int at[4];
    uint32_t bits[4];
    if ((kept_groups >> g) & 1u) {
      const float4 x4 = *reinterpret_cast<const float4*>(&chunk[first]);
      const float x[4] = {x4.x, x4.y, x4.z, x4.w};
      // first is a multiple of 4: the group is one Philox block.
      const PhiloxCounter block = Philox4x32x10(PhiloxCounterFor(position, begin + first), key);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        at[e] = first + e;
        bits[e] = block.word[e];
        // The wave scores each offer with MayBeat first: testing it here would run its two exps
        // in every wave where any lane passes BitsFloor, which is most of them.
        if (bits[e] >= scores.BitsFloor() && x[e] >= kept_from) offers |= 1u << e;
      }
    }
    scores.Collect(offers, at, bits);
    if (g == 0) scores.Flush();  // the floor rises early: most tokens then fail BitsFloor alone
  }
  return scores.Finish();
}

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
  const int chunk = part / kSpansPerChunk;  // the pass-1 chunk holding the span
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
  // The row's Philox key and position where the compiler knows they are uniform (every thread
  // is here): the key schedule is then made once, not in every Philox block.
  const PhiloxKey key = WaveUniformKey(params.seed);
  const uint64_t position = WaveUniformU64(params.position);
  // The chunk's loads at once; the kept and boundary tokens are counted from the registers
  // while the chunk is staged in shared memory for the draw.
  uint32_t kept_tokens = 0;
  uint32_t kept_groups = 0;      // bit g: group g holds a kept token
  uint32_t boundary_groups = 0;  // bit g: group g holds a boundary token
  uint32_t boundary_tokens = 0;
  {
    float v[kGroups * 4];
#pragma unroll
    for (int g = 0; g < kGroups; ++g)
      LoadGroup<kDType>(row_ptr, begin + local_at(g), end, &v[g * 4]);
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
      uint32_t kept = 0;
      uint32_t boundary = 0;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float x = v[g * 4 + e];
        const bool plain = !AnyBitSet(mark, 1u << (4 * g + e));  // true without marks
        kept += plain && x >= kept_from;
        boundary += plain && x >= boundary_from && x < kept_from;
      }
      kept_tokens += kept;
      boundary_tokens += boundary;
      if (kept > 0) kept_groups |= 1u << g;
      if (boundary > 0) boundary_groups |= 1u << g;
    }
    for (uint32_t m = mark; m != 0u; m &= m - 1u) {  // the marked tokens, processed (v42)
      const int i = __ffs(static_cast<int>(m)) - 1;
      const int local = local_at(i >> 2) + (i & 3);
      const int64_t j = begin + local;
      const float x = procs.Apply(row, j, LoadLogit<kDType>(row_ptr, j));
      sh.chunk[local] = x;
      const bool kept = x >= kept_from;
      const bool boundary = x >= boundary_from && x < kept_from;
      kept_tokens += kept;
      boundary_tokens += boundary;
      if (kept) kept_groups |= 1u << (i >> 2);
      if (boundary) boundary_groups |= 1u << (i >> 2);
    }
  }
  if (threadIdx.x == 0) {
    sh.fill = 0;
    sh.floor_key = kNegInfKey;  // before the scan's barriers: every wave reads it after them
  }
  // The kept tokens compete in the Gumbel-max draw. They are sparse (9% of randn x 3 at p =
  // 0.95), so drawing in place would run the Philox and log code for whole waves where one lane
  // needs it (142 lane-instructions a token measured): they are queued first, then drawn with
  // every lane busy, the exact Gumbel only where MayBeat says it could win.
  uint64_t total_kept = 0;
  const uint32_t first_kept =
      static_cast<uint32_t>(BlockReduce<kThreads>::ExclusiveScan(reduce, kept_tokens, &total_kept));
  // A floor for MayBeat from the start: the score of the chunk's largest logit, if it is kept
  // (it is drawn again; the floor only lets others be skipped).
  float floor_score = -kInfF;
  float top_z = kInfF;  // the chunk's largest z (+inf: not known, no token skipped on u alone)
  {
    const int64_t top = row_stats[chunk].argmax_x;
    if (top >= begin && top < end) {
      const float x = sh.chunk[top - begin];
      top_z = z_of(x);
      if (x >= kept_from) {
        floor_score = top_z + GumbelNoise(params.seed, params.position, static_cast<uint64_t>(top));
      }
    }
  }
  // A dense chunk (a random-weight model's rows keep ~85% of their tokens at p = 0.95, flat rows
  // all of them) has every lane busy without the queue: each thread draws its own groups, one
  // Philox block a group of 4 (the queue computes a whole block for each token, 4x the Philox
  // work where groups are full; v28). The same scores and the same MayBeat skips, so the same
  // token.
  const bool dense = total_kept >= static_cast<uint64_t>(kSpan / 2);
  ArgMaxPair best{-kInfF, INT64_MAX};
  if (dense) {
    best = DrawDenseGroups<kThreads, kSpan>(sh.scores, sh.chunk, kept_groups, begin, kept_from,
                                            params, top_z, floor_score, &sh.floor_key);
  }
  for (uint32_t round = 0; !dense && round < total_kept; round += kKeptQueue) {
    uint32_t at = first_kept;
    if (at < round + kKeptQueue && at + kept_tokens > round) {
#pragma unroll 1
      for (uint32_t groups = kept_groups; groups != 0; groups &= groups - 1) {
        const int first = local_at(__ffs(groups) - 1);
        const float4 x4 = *reinterpret_cast<const float4*>(&sh.chunk[first]);
        const float x[4] = {x4.x, x4.y, x4.z, x4.w};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          if (!(x[e] >= kept_from)) continue;
          if (at >= round && at < round + kKeptQueue) sh.kept[at - round] = first + e;
          ++at;
        }
      }
    }
    __syncthreads();
    const int queued =
        static_cast<int>(total_kept - round < kKeptQueue ? total_kept - round : kKeptQueue);
    for (int q = threadIdx.x; q < queued; q += kThreads) {
      const int local = sh.kept[q];
      const float z = z_of(sh.chunk[local]);
      const int64_t j = begin + local;
      const float u = UniformOf(key, position, static_cast<uint64_t>(j));
      if (!MayBeat(z, u, fmaxf(floor_score, best.value))) continue;
      const ArgMaxPair scored{z + GumbelFromUniform(u), j};
      if (Better(scored, best)) best = scored;
    }
    __syncthreads();
  }
  // A wide row (more boundary tokens than the block has threads) of a small launch weighs its
  // boundary tokens here, by sub-bin, and scores those that might still win: the row's last
  // block then reads 256 sums and bests instead of drawing the whole list alone (v30).
  const bool wide = ws.Presums(row) && plan.boundary_count > static_cast<uint32_t>(kThreads);
  if (wide) {
    best = BlockReduce<kThreads>::ArgMax(reduce, best);  // also: the draw's shared memory is free
    sh.sub.template Clear<kThreads>();
  }
  // The boundary tokens: one shared atomic per thread and one global atomic per block (one
  // global atomic per token serialised the blocks of a row on one address).
  __syncthreads();  // sh.fill and the sub-bins are zero
  const uint32_t mine = boundary_tokens > 0 ? atomicAdd(&sh.fill, boundary_tokens) : 0;
  __syncthreads();
  if (threadIdx.x == 0 && sh.fill > 0) sh.base = atomicAdd(ws.boundary_fill + row, sh.fill);
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
    // A boundary token whose u is below this cannot beat the chunk's best, a kept token's
    // score: MayBeat's threshold at the bin's top holds for every z of the bin.
    const float u_floor = MayBeatThreshold(subs.bin_top, best.value);
#pragma unroll 1
    for (uint32_t groups = boundary_groups; groups != 0; groups &= groups - 1) {
      const int first = local_at(__ffs(groups) - 1);
      const PhiloxCounter bits = Philox4x32x10(PhiloxCounterFor(position, begin + first), key);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float x = sh.chunk[first + e];
        if (!(x >= boundary_from && x < kept_from)) continue;
        const float z = z_of(x);
        append(first, e, z);
        sh.sub.Add(subs, z, UniformFromBits(bits.word[e]), static_cast<int32_t>(begin + first + e),
                   u_floor, best.value);
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
    best = BlockReduce<kThreads>::ArgMax(reduce, best);  // also: every thread is done with sh.chunk
  }
  if (threadIdx.x == 0) {
    ws.chunk_best[row * parts + part] =
        ChunkBest{best.value, best.index == INT64_MAX ? -1 : static_cast<int32_t>(best.index)};
  }
  if (!LastToArrive(ws.pass2_ticket + row, static_cast<uint32_t>(parts), &sh.ticket)) return;
  for (int c = threadIdx.x; c < chunks; c += kThreads) {
    sh.ref.max[c] = row_stats[c].max_z;
    sh.ref.scale[c] = ws.chunk_scale[row * chunks + c];
  }
  const int64_t token = FinishMassRow<kThreads>(ws, plan, sh.ref.max, sh.ref.scale, row, parts,
                                                params, sh.select, reduce);
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
  if (plan.path != MassPath::kTwoPass) return;
  const void* row_ptr = p.rows.Row<kDType>(row);
  MassDrawChunk<kDType, kMassDrawThreads, kSpan, kKind>(
      p.mass, plan, row_ptr, p.rows.procs, p.rows.vocab, p.stats + row * p.rows.chunks, row,
      static_cast<int>(blockIdx.x), p.rows.chunks, params, sh, reduce, p.token_ids, p.status);
}

}  // namespace samplerd::kernels::gpu

#endif  // SAMPLERD_KERNELS_GPU_MASS_DRAW_H_
