// Pass 1 of GPU sampling: ChunkPassKernel reads each row once, in fixed-size chunks.
//
// Launch: grid (chunks_per_row, batch), kChunkThreads threads; chunk c of row r covers tokens
// [c * kChunk, min(V, (c + 1) * kChunk)). The chunk size never depends on the batch size, so a
// row's arithmetic (and so its token) is the same alone or in any batch (batch invariance).
// Per chunk it writes ChunkStats and, for rows with a small top-k, the chunk's candidates: every
// token whose key is >= a threshold at or below the chunk's k-th largest z. Their union holds
// every token of the row's top-k, so RowFinishKernel never has to read the row again for them.
#ifndef SAMPLERD_KERNELS_GPU_CHUNK_PASS_H_
#define SAMPLERD_KERNELS_GPU_CHUNK_PASS_H_

#include <cstdint>

#include "kernels/common/inverse_cdf.h"
#include "kernels/gpu/chunk_stats.h"
#include "kernels/gpu/device_common.h"
#include "kernels/gpu/mass_plan.h"
#include "kernels/gpu/row_path.h"
#include "kernels/gpu/rows_in.h"

namespace samplerd::kernels::gpu {

// Where pass 1 writes (device memory, from the workspace).
struct ChunkPassParams {
  RowsIn rows;
  bool raw_logprobs;         // compute sum_exp_x
  ChunkStats* stats;         // [batch, chunks]
  uint32_t* candidate_key;   // [batch, chunks, kCandidateCap]
  int32_t* candidate_index;  // [batch, chunks, kCandidateCap]
  MassWorkspace mass;        // the top-p rows' histograms (mass_plan.h)
};

// Item i of this thread: groups of 4 consecutive tokens, group g at (g * threads + tid) * 4, so
// each wave reads contiguous memory and one Philox block serves a group.
__device__ __forceinline__ int64_t ItemIndex(int64_t begin, int i) {
  return begin + (static_cast<int64_t>(i >> 2) * kChunkThreads + threadIdx.x) * 4 + (i & 3);
}

// Pass 1 is budgeted at ~10-20 instructions per token: at 4.4 TB/s the SMs issue ~30 per
// fp32 token, and v2 (70+) was compute-bound at 4x the floor (NOTES.md).
// kKind: the launch's logits processors (row_processors.h). Launches without them run a copy with
// none of their code (it cost up to 29% at B = 1 as a runtime branch: NOTES.md v9), launches with
// a bitmask alone one without the bias and penalties (v27).
template <DType kDType, ProcsKind kKind>
__global__ void __launch_bounds__(kChunkThreads, 3) ChunkPassKernel(ChunkPassParams p) {
  constexpr bool kProcs = kKind != ProcsKind::kNone;
  constexpr bool kMarks = kKind == ProcsKind::kAll;  // bias or penalties
  GridLaunchDependents();  // RowFinishKernel may start its prologue (and fetch its code) now
  using Reduce = BlockReduce<kChunkThreads>;
  __shared__ typename Reduce::Storage reduce;
  __shared__ uint32_t thread_max[kChunkThreads / kLogicalWarp];
  __shared__ uint32_t candidate_count;
  __shared__ float candidate_from;
  __shared__ MassShared mass_sh;

  const int64_t row = blockIdx.y;
  if (p.rows.Skipped(row)) {  // device sessions: a row past the step's batch
    // A launch with marks runs dependent on MarkAdjustsKernel (v43): every block waits for it,
    // so that this kernel never ends before it (RowFinishKernel's note).
    if constexpr (kMarks) GridWaitPrerequisites();
    return;
  }
  const int chunk = blockIdx.x;
  const void* row_ptr = p.rows.Row<kDType>(row);
  const int64_t begin = static_cast<int64_t>(chunk) * kChunk;
  const int64_t end = begin + kChunk < p.rows.vocab ? begin + kChunk : p.rows.vocab;

  // Pass 1 holds the chunk in registers (every load in flight at once); later passes re-read
  // it from L1 group by group, so that x[] does not live across them (kept live, it was
  // demoted to local memory and serialised the loads: NOTES.md v3).
  //
  // A whole chunk of a row aligned for vector loads (every chunk but a row's last, on the rows
  // engines hand over) loads each of the thread's groups with one vector load at a constant
  // offset from `mine`, with no bounds or alignment test: LoadGroup's tests were ~13
  // instructions a group in every loop over the chunk (SASS, v25).
  const bool whole = end - begin == kChunk && GroupsAligned<kDType>(row_ptr);
  const char* const mine =
      static_cast<const char*>(row_ptr) + ItemIndex(begin, 0) * (kGroupBytes<kDType> / 4);
  constexpr int kGroupStride = kChunkThreads * kGroupBytes<kDType>;  // bytes between groups
  auto load_raw = [&](int g, float* v) {
    if (whole) {
      LoadAlignedGroup<kDType>(mine + g * kGroupStride, v);
    } else {
      LoadGroup<kDType>(row_ptr, ItemIndex(begin, g * 4), end, v);
    }
  };
  // Group g of this thread, from ItemIndex(begin, 0).
  constexpr auto group_off = [](int g) { return g * kChunkThreads * 4; };
  // A launch with a bitmask alone issues its words' loads before the logits' (v38): behind
  // them, their first use was 14.5% of the masked pass's stall samples (ncu, session 30).
  [[maybe_unused]] RowProcessors::GroupWords<kItemsPerThread / 4> mask_words;
  if constexpr (kKind == ProcsKind::kMask) {
    mask_words = p.rows.procs.LoadWords<kItemsPerThread / 4, false>(row, ItemIndex(begin, 0),
                                                                    group_off, end);
  }
  float x[kItemsPerThread];
  if (whole) {
#pragma unroll
    for (int g = 0; g < kItemsPerThread / 4; ++g) {
      LoadAlignedGroup<kDType>(mine + g * kGroupStride, &x[g * 4]);
    }
  } else {
#pragma unroll
    for (int g = 0; g < kItemsPerThread / 4; ++g) {
      LoadGroup<kDType>(row_ptr, ItemIndex(begin, g * 4), end, &x[g * 4]);
    }
  }
  // The row's parameters are read after the chunk's loads are issued, so that their latency
  // overlaps (ncu v5: blocks stalled on this load before their first logits load), and before
  // the mask's words are first used: behind that use they were a round trip of their own (v44:
  // 4% of a masked top-k pass's stall samples at B = 128).
  const RowParams params = p.rows.Params(row);
  // The logits processors' bits, once every load is in flight (row_processors.h). They stay
  // in two registers for the passes below, which re-read the chunk group by group. x[] stays
  // raw: the mask is a predicate in the loops over it (v20, v24), and the tokens with a bias or
  // penalty (marked) are left out of those loops and taken one at a time (v42).
  RowProcessors::GroupBits proc_bits{~0u, 0u};
  if constexpr (kKind == ProcsKind::kMask) {
    proc_bits = p.rows.procs.BitsOf<kItemsPerThread / 4, false>(mask_words, ItemIndex(begin, 0),
                                                                group_off, end);
  } else if constexpr (kProcs) {
    // The marks are MarkAdjustsKernel's: the launch waits for it here, with its logits' loads in
    // flight (v43; at B = 1 that kernel took ~4.6 us of a ~35 us top-k launch before).
    GridWaitPrerequisites();
    proc_bits = p.rows.procs.LoadBits<kItemsPerThread / 4, kMarks>(row, ItemIndex(begin, 0),
                                                                   group_off, end);
  }
  // Bit i: item i is allowed and has no bias or penalty, so its processed logit is its raw one.
  // Until v42 pass 1 applied the adjusts to x[] group by group (`ApplyAdjusts`, unrolled): with
  // 2,000 entries a row each group's branch ran in ~80% of the waves with ~2 lanes busy, 9.9 M
  // of the top-k pass's 45.7 M instructions at B = 128 (per-line ncu, session 32).
  const uint32_t plain_items = kMarks ? proc_bits.allow & ~proc_bits.mark : proc_bits.allow;
  auto allowed = [&](int i) { return !kProcs || AnyBitSet(plain_items, 1u << i); };
  // Group g's 4 plain bits (bit e: token e of the group), for the loops over groups that are
  // not unrolled: one shift a group, where allowed(g * 4 + e) took ~3 instructions a token
  // (a variable shift; SASS, v25).
  auto group_allow = [&](int g) { return kProcs ? plain_items >> (4 * g) : 0xfu; };
  auto allowed_in = [](uint32_t allow, int e) { return AnyBitSet(allow, 1u << e); };
  // Group g of this thread again (from L1), processed.
  auto load_group = [&](int g, float* v) {
    load_raw(g, v);
    if constexpr (kProcs) {
      p.rows.procs.ApplyBits<kMarks>(row, ItemIndex(begin, g * 4), proc_bits, g, v);
    }
  };
  // Loops over groups that test group_allow(g) read the raw logits of the tokens without a bias
  // or penalty and take the marked ones one at a time after (for_marked, v41). Until v40 they
  // re-applied each group's adjusts (ApplyAdjusts), whose entries' loads ran in nearly every
  // wave with a few lanes busy when a row has thousands of entries (the greedy pass's v40
  // measured that pattern at 57% of its instructions).
  //
  // f(i, j, v) for each marked item i of this thread (bit i of proc_bits.mark; token j), v its
  // processed logit: the bias and penalties, then the mask as -inf (or a NaN kept). Items in
  // index order.
  [[maybe_unused]] auto for_marked = [&](auto&& f) {
    if constexpr (kMarks) {
      for (uint32_t m = proc_bits.mark; m != 0u; m &= m - 1u) {
        const int i = __ffs(static_cast<int>(m)) - 1;
        const int64_t j = ItemIndex(begin, (i >> 2) * 4) + (i & 3);
        f(i, j, p.rows.procs.Apply(row, j, LoadLogit<kDType>(row_ptr, j)));
      }
    }
  };
  const bool greedy = IsGreedy(params);
  const bool mass = IsMassRow(params, p.rows.vocab, p.mass.enabled);
  if (mass) ClearMassHistogram<kChunkThreads>(mass_sh);      // the reductions below wait for it
  const bool unit_temperature = params.temperature == 1.0f;  // z = x exactly: skip the divide
  auto temper = [&](float v) { return unit_temperature ? v : v / params.temperature; };
  auto for_items = [&](auto&& f) {
    for (int g = 0; g < kItemsPerThread / 4; ++g) {
      float v[4];
      const int64_t group = ItemIndex(begin, g * 4);
      load_group(g, v);
#pragma unroll
      for (int e = 0; e < 4; ++e) f(group + e, v[e]);
    }
  };

  uint32_t nan = 0, pinf_x = 0, pinf_z = 0, finite_x = 0;
  float best_x = -kInfF;
  int32_t best_i = -1;  // item of best_x; items run in index order, so `>` keeps the lowest
  ArgMaxPair draw{-kInfF, INT64_MAX};
  const bool plain = IsPlainTemperature(params, p.rows.vocab);
  const PhiloxKey key = WaveUniformKey(params.seed);
  const uint64_t position = WaveUniformU64(params.position);
  float max_z = -kInfF;
  static_assert(kItemsPerThread == 32, "one bit an item in the allow word");
  const uint32_t allow_items = kProcs ? plain_items : ~0u;  // bit i: allowed(i)
  // The rare paths below test a token's value into bit i of a word and count it under the
  // allow bits once (a popcount), instead of testing allowed(i) per token: sharing those tests
  // with the loop that every thread runs, the compiler kept 32 predicates as bits of a register
  // in that loop, ~6 instructions a token more than the one test it needs (SASS, v25).
  // The allowed tokens whose z = x / T overflows to +inf (rows whose z is not x; rare).
  auto classify_inf_z = [&]() {
    uint32_t inf_z = 0;
#pragma unroll
    for (int i = 0; i < kItemsPerThread; ++i) {
      inf_z |= static_cast<uint32_t>(temper(x[i]) == kInfF) << i;
    }
    pinf_z = __popc(inf_z & allow_items);
    for_marked([&](int, int64_t, float v) { pinf_z += temper(v) == kInfF; });
  };
  // The statistics of x, for every row: the argmax and one
  // predicate a token for "NaN or +-inf"; the counts from a second look at the registers only
  // in the threads that saw one (v13: ~11 -> ~5 instructions a token). The mask is a predicate
  // here: an allowed finite token is finite after it, so a thread with no special value counts
  // its allowed bits. The marked tokens are counted by the walk after, except their NaNs: an
  // adjust keeps a NaN a NaN and makes no other value NaN, so NaNs are counted on x[].
  auto classify_x = [&]() {
    bool special = false;
#pragma unroll
    for (int i = 0; i < kItemsPerThread; ++i) {
      const float v = x[i];
      special |= !(fabsf(v) < kInfF);
      if (allowed(i) && v > best_x) {
        best_x = v;
        best_i = i;
      }
    }
    if (!special) {
      // every item finite (items past the row's end read -inf)
      finite_x = __popc(allow_items);
      return;
    }
    uint32_t inf_bits = 0, finite_bits = 0;
#pragma unroll  // (a loop over x[] that is not unrolled would move x[] to local memory)
    for (int i = 0; i < kItemsPerThread; ++i) {
      const float v = x[i];
      nan += v != v;  // the mask keeps NaN
      inf_bits |= static_cast<uint32_t>(v == kInfF) << i;
      finite_bits |= static_cast<uint32_t>(v > -kInfF) << i;
    }
    pinf_x = __popc(inf_bits & allow_items);
    finite_x = __popc(finite_bits & allow_items);
  };
  classify_x();  // every row; the statistics of z follow from those of x
  // Top-p rows: the smallest allowed x above -inf, to spot a chunk whose tokens share one bin.
  // Its bits are an opaque copy: sharing classify_x's tests, they cost every masked row 2
  // instructions a token there (v44: a top-k pass with a bitmask, ~1.2 M of 28.9 M at B = 128).
  float low_x = kInfF;
  if (mass) {
    const uint32_t low_allow = OpaqueWord(allow_items);
#pragma unroll
    for (int i = 0; i < kItemsPerThread; ++i) {
      if ((!kProcs || AnyBitSet(low_allow, 1u << i)) && x[i] > -kInfF) low_x = fminf(low_x, x[i]);
    }
  }
  // The marked tokens, processed, one at a time (v42); out of index order, so a tie with the
  // best so far keeps the lower item.
  for_marked([&](int i, int64_t, float v) {
    pinf_x += v == kInfF;
    finite_x += v > -kInfF;
    if (v > best_x || (v == best_x && v > -kInfF && i < best_i)) {
      best_x = v;
      best_i = i;
    }
    if (v > -kInfF) low_x = fminf(low_x, v);
  });
  if (unit_temperature) {  // z = x (v13)
    pinf_z = pinf_x;
    max_z = best_x;
  } else if (!greedy) {
    // z = x / T (fp32) is monotone in x for T > 0, so the thread's max z is its best x's, and
    // only a thread whose max z overflowed to +inf has any z = +inf to count (v24: the divide
    // a token was ~8 M of temperature 0.8's 67 M instructions at B = 128, ncu).
    max_z = temper(best_x);
    if (max_z == kInfF) classify_inf_z();
  }
  const float thread_max_z = max_z;
  // Top-p rows: also the chunk's smallest z above -inf (z = x / T is monotone in x), unless it
  // underflowed to -inf, to spot a chunk whose tokens share one bin.
  float low_z = mass ? temper(low_x) : kInfF;
  if (mass) {
    Reduce::MaxAndMin(reduce, &max_z, &low_z);
  } else if (!greedy) {
    max_z = Reduce::Max(reduce, max_z);
  }
  // Top-p rows on the mass path: the chunk's mass histogram (mass_plan.h), re-read from L1 in
  // a loop that is not unrolled (kept in registers across the reduction above, x[] spilled).
  // A chunk whose max is out of the histogram's range makes none; the plan never reads it (or
  // falls back).
  const bool histogram = mass && fabsf(max_z) < kMassMaxChunkAbs;
  float min_z = kInfF;  // of the finite z: the plan spots rows whose tokens are all tied
  if (histogram) {
    const float top = floorf(max_z * kMassBinsPerLogit);
    // f(z) for each allowed token whose z is above -inf, re-read from L1 in a loop that is not
    // unrolled.
    auto for_each_z = [&](auto&& f) {
#pragma unroll 1
      for (int g = 0; g < kItemsPerThread / 4; ++g) {
        float v[4];
        load_raw(g, v);
        const uint32_t allow = group_allow(g);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float z = temper(v[e]);
          if (allowed_in(allow, e) && z > -kInfF) f(z);
        }
      }
      // The marked tokens (v41); f's sums and minimum are order-free.
      for_marked([&](int, int64_t, float v) {
        const float z = temper(v);
        if (z > -kInfF) f(z);
      });
    };
    if (low_z > -kInfF && floorf(low_z * kMassBinsPerLogit) == top) {
      // Every token in the top bin (flat rows): summed over the block, no atomics (v29).
      uint64_t packed = 0;  // count << 48 | mass
      for_each_z([&](float z) { packed += (uint64_t{1} << 48) | FixedMass32(z, max_z); });
      packed = Reduce::SumU64(reduce, packed);
      if (threadIdx.x == 0) SetOneBinMassHistogram(mass_sh, packed);
      min_z = low_z;
    } else {
      for_each_z([&](float z) {
        min_z = fminf(min_z, z);
        AddToMassHistogram(mass_sh, z, max_z, top);
      });
      min_z = Reduce::Min(reduce, min_z);
    }
  }
  // Counts are at most 8192 each: pack them 16 bits apart for one reduction.
  const uint64_t counts = Reduce::SumU64(
      reduce, static_cast<uint64_t>(nan) | (static_cast<uint64_t>(pinf_x) << 16) |
                  (static_cast<uint64_t>(pinf_z) << 32) | (static_cast<uint64_t>(finite_x) << 48));
  const ArgMaxPair best =
      Reduce::ArgMax(reduce, ArgMaxPair{best_x, best_i < 0 ? INT64_MAX : ItemIndex(begin, best_i)});
  const int64_t stats_slot = row * p.rows.chunks + chunk;
  // The reductions above waited for every thread's histogram atomics.
  if (histogram) StoreMassHistogram<kChunkThreads>(mass_sh, p.mass, stats_slot);

  // Pass 2, only where the full row's mass is needed: JOINT top-p.
  float sum_z = 0.0f;
  if (!greedy && params.top_p_mode == TopPMode::kJoint && params.top_p < 1.0f && max_z > -kInfF &&
      max_z < kInfF) {
    for_items([&](int64_t, float v) {
      const float z = temper(v);
      if (z > -kInfF && z < kInfF) sum_z += expf(z - max_z);
    });
    sum_z = Reduce::Sum(reduce, sum_z);
  }
  // Plain-temperature rows: the chunk's mass relative to its max x, in double, for the
  // inverse-CDF draw of the finish (inverse_cdf.h; kernels/common/inverse_cdf.h). A chunk
  // with a +-inf max, or a NaN, leaves it 0: the finish then takes another path.
  double mass_x = 0.0;
  if (plain && best.value > -kInfF && best.value < kInfF && (counts & 0xffff) == 0) {
    const double reference = static_cast<double>(best.value);
    const double inv_t = InverseTemperature(params.temperature);
    for_items([&](int64_t, float v) {
      if (v > -kInfF) mass_x += InverseCdfMass(v, reference, inv_t);
    });
    mass_x = Reduce::SumF64(reduce, mass_x);
  }
  float sum_x = 0.0f;
  if (p.raw_logprobs && best.value > -kInfF && best.value < kInfF) {
    for_items([&](int64_t, float v) {
      if (v > -kInfF && v < kInfF) sum_x += expf(v - best.value);
    });
    sum_x = Reduce::Sum(reduce, sum_x);
  }

  // Candidates for a small top-k. Each group of 32 threads sorts its thread maxima (a bitonic
  // sort in registers, logical width 32 on any wave size); the threshold is the smallest of the
  // groups' m-th largest, m = ceil(k / groups). Every group then has m threads whose maximum
  // is >= the threshold, so at least k tokens are >= it, and on random logits not many more.
  // (The exact k-th of all 256 maxima cost ~40 instructions a token: NOTES.md v5.) The tokens
  // >= it are appended in any order; RowFinishKernel sorts them.
  uint32_t total = 0;
  uint32_t overflow = 0;
  const bool collect = UsesCandidates(params, p.rows.vocab) && (counts & 0xffff) == 0;
  if (collect) {
    constexpr int kGroup = kLogicalWarp;
    constexpr int kGroups = kChunkThreads / kGroup;
    const uint32_t k = static_cast<uint32_t>(params.top_k);  // <= kMaxCandidateK
    const uint32_t m = (k + kGroups - 1) / kGroups;          // <= kGroup
    const int lane = static_cast<int>(threadIdx.x) % kGroup;
    uint32_t v = thread_max_z > -kInfF ? OrderedKey(thread_max_z) : 0u;
    for (int size = 2; size <= kGroup; size <<= 1) {
      for (int stride = size >> 1; stride > 0; stride >>= 1) {
        const uint32_t other = __shfl_xor(v, stride, kGroup);
        const bool descending_block = (lane & size) == 0;
        const bool lower = (lane & stride) == 0;
        v = (lower == descending_block) ? max(v, other) : min(v, other);
      }
    }
    if (lane == static_cast<int>(m) - 1) thread_max[threadIdx.x / kGroup] = v;
    if (threadIdx.x == 0) candidate_count = 0;
    __syncthreads();
    uint32_t threshold = thread_max[0];
    for (int g = 1; g < kGroups; ++g) threshold = min(threshold, thread_max[g]);
    if (threshold == 0) threshold = kNegInfKey + 1;  // a group with fewer than m finite maxima
    const int64_t slot_base = (row * p.rows.chunks + chunk) * static_cast<int64_t>(kCandidateCap);
    // key(z) >= threshold <=> z >= KeyToFloat(threshold) for every z that is not NaN
    // (OrderedKey is monotone; the threshold is the key of a float above -inf, so -inf is never
    // a candidate) <=> x >= from (SmallestXReaching, one search by one thread). One comparison
    // a token, and one shared atomic per thread that has candidates: a divide and a
    // wave-aggregated atomic per token cost ~23 instructions a token (ncu SASS, NOTES.md v13).
    if (threadIdx.x == 0) {
      candidate_from = SmallestXReaching(KeyToFloat(threshold), params.temperature);
    }
    __syncthreads();
    const float from = candidate_from;  // x >= from <=> z >= the threshold: no divide a token
    uint32_t candidates_here = 0;       // this thread's
    uint32_t groups = 0;                // bit g: group g holds a candidate
    // The marked tokens are left out of both loops and taken one at a time after each (v41).
#pragma unroll 1
    for (int g = 0; g < kItemsPerThread / 4; ++g) {
      float v[4];
      load_raw(g, v);
      const uint32_t allow = group_allow(g);
      uint32_t here = 0;
#pragma unroll
      for (int e = 0; e < 4; ++e) here += allowed_in(allow, e) && v[e] >= from;
      candidates_here += here;
      if (here > 0) groups |= 1u << g;
    }
    for_marked([&](int, int64_t, float v) { candidates_here += v >= from; });
    uint32_t slot = candidates_here > 0 ? atomicAdd(&candidate_count, candidates_here) : 0;
    auto append = [&](float v, int64_t j) {
      if (slot < static_cast<uint32_t>(kCandidateCap)) {
        p.candidate_key[slot_base + slot] = OrderedKey(temper(v));
        p.candidate_index[slot_base + slot] = static_cast<int32_t>(j);
      }
      ++slot;
    };
#pragma unroll 1
    for (; groups != 0; groups &= groups - 1) {
      const int g = __ffs(groups) - 1;
      const int64_t group = ItemIndex(begin, g * 4);
      float v[4];
      load_raw(g, v);
      const uint32_t allow = group_allow(g);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        if (allowed_in(allow, e) && v[e] >= from) append(v[e], group + e);
      }
    }
    for_marked([&](int, int64_t j, float v) {
      if (v >= from) append(v, j);
    });
    __syncthreads();
    total = candidate_count;
    overflow = total > static_cast<uint32_t>(kCandidateCap);
    if (overflow) total = 0;
    // A chunk whose finite z all tie (a flat row) makes every token a candidate and overflows.
    // Every filter keeps a row whose finite z all tie, and its token is then the Gumbel-max over
    // the row, as for plain temperature: so an overflowing chunk also gives its min finite z and
    // its best z + G, and RowFinishKernel takes the row's best when every chunk ties at the row
    // max (v11; it re-read the row several times before: NOTES.md item 6). Rare, so not unrolled.
    if (overflow) {
      float lowest = kInfF;
      ArgMaxPair best{-kInfF, INT64_MAX};
#pragma unroll 1
      for (int g = 0; g < kItemsPerThread / 4; ++g) {
        const int64_t group = ItemIndex(begin, g * 4);
        if (group >= end) break;  // groups run in index order
        float v[4];
        load_group(g, v);
        const PhiloxCounter bits = Philox4x32x10(PhiloxCounterFor(position, group), key);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float z = temper(v[e]);
          if (!(z > -kInfF)) continue;
          lowest = fminf(lowest, z);
          const ArgMaxPair scored{z + GumbelFromUniform(UniformFromBits(bits.word[e])), group + e};
          if (Better(scored, best)) best = scored;
        }
      }
      min_z = Reduce::Min(reduce, lowest);
      draw = Reduce::ArgMax(reduce, best);
    }
  }

  if (threadIdx.x == 0) {
    ChunkStats s;
    s.max_z = max_z;
    s.min_z = min_z;
    s.sum_exp_z = sum_z;
    s.max_x = best.value;
    s.sum_exp_x = sum_x;
    s.argmax_x = best.index;
    s.nan_count = static_cast<uint32_t>(counts & 0xffff);
    s.pos_inf_x = static_cast<uint32_t>((counts >> 16) & 0xffff);
    s.pos_inf_z = static_cast<uint32_t>((counts >> 32) & 0xffff);
    s.not_neg_inf_x = static_cast<uint32_t>(counts >> 48);
    s.candidates = total;
    s.overflow = overflow;
    s.best_score = draw.value;
    s.best_index = draw.index;
    s.mass_x = mass_x;
    p.stats[stats_slot] = s;
  }
}

}  // namespace samplerd::kernels::gpu

#endif  // SAMPLERD_KERNELS_GPU_CHUNK_PASS_H_
