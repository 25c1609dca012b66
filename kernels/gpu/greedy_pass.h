// The greedy launch: one kernel for a launch whose rows are all greedy and that asks for no
// logprobs (SampleArgs::all_greedy), instead of the chunk pass and the finish.
//
// GreedyKernel: grid (spans per row, batch), kGreedyThreads threads. Block (s, r) reads span s of
// row r, kVecs 16-byte vectors a thread with every load in flight at once, and finds the span's
// argmax of x (the lowest index of the max; NaN never wins) and whether the span holds a NaN, an
// x above -inf. The row's last block to finish (an atomic ticket, LastToArrive) combines the
// row's spans, writes the token and status exactly as RowFinishKernel does for a greedy row (with
// logits processors, a row with nothing allowed reads its raw row again to tell kNoAllowed from
// kNoFinite), and zeroes the ticket for the next launch.
//
// An argmax is exact in any order, so the span may depend on the dtype and the batch without
// changing a token (batch invariance holds), unlike the sampling passes' fixed chunk.
// Why one launch, and what it measured: NOTES.md v12.
#ifndef SAMPLERD_KERNELS_GPU_GREEDY_PASS_H_
#define SAMPLERD_KERNELS_GPU_GREEDY_PASS_H_

#include <cstdint>

#include "kernels/common/sampling_types.h"
#include "kernels/gpu/device_common.h"
#include "kernels/gpu/platform.h"
#include "kernels/gpu/rows_in.h"

namespace samplerd::kernels::gpu {

inline constexpr int kGreedyThreads = 256;

// Tokens in one 16-byte vector.
template <DType kDType>
inline constexpr int kVecTokens = kDType == DType::kFp32 ? 4 : 8;

// Tokens a block reads with kVecs vectors a thread.
template <DType kDType, int kVecs>
inline constexpr int kGreedySpan = kGreedyThreads* kVecs* kVecTokens<kDType>;

// What a span tells its row.
inline constexpr uint32_t kSpanNan = 1;        // a NaN (after the processors)
inline constexpr uint32_t kSpanFinite = 2;     // an x above -inf (after the processors)
inline constexpr uint32_t kSpanRawFinite = 4;  // a raw x above -inf (found by the last block)

struct GreedySpan {
  float value;     // the span's max x (-inf when no x is above -inf)
  int32_t index;   // the lowest index holding it; -1 when value is -inf
  uint32_t flags;  // kSpan*
};

struct GreedyParams {
  RowsIn rows;         // rows.chunks: spans per row
  GreedySpan* spans;   // [batch, spans]
  uint32_t* tickets;   // [batch]: zero before the launch, and zero again after it
  int32_t* token_ids;  // [batch]
  RowStatus* status;   // [batch]
};

// The kVecTokens<kDType> logits (16 bytes) at `p`, which is 16-byte aligned, as floats.
template <DType kDType>
__device__ __forceinline__ void LoadAlignedVec(const void* p, float* out) {
  if constexpr (kDType == DType::kFp32) {
    LoadAlignedGroup<kDType>(p, out);
  } else {
    const uint4 v = *static_cast<const uint4*>(p);
    const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const auto h = static_cast<uint16_t>(words[e / 2] >> (16 * (e % 2)));
      out[e] =
          kDType == DType::kBf16 ? __uint_as_float(static_cast<uint32_t>(h) << 16) : HalfToFloat(h);
    }
  }
}

// The kVecTokens<kDType> logits at j (a multiple of it) of a row, as floats; -inf past `end`.
template <DType kDType>
__device__ __forceinline__ void LoadVec(const void* row, int64_t j, int64_t end, float* out) {
  if constexpr (kDType != DType::kFp32) {
    const uint16_t* p = static_cast<const uint16_t*>(row) + j;
    if (j + 7 < end && (reinterpret_cast<uintptr_t>(p) & 15) == 0) {
      LoadAlignedVec<kDType>(p, out);
      return;
    }
    LoadGroup<kDType>(row, j + 4, end, out + 4);
  }
  LoadGroup<kDType>(row, j, end, out);
}

// Reduces each wave's (argmax, flags) and leaves the block's in *out (thread 0 only; the other
// threads' *out is unspecified). Every thread must call.
__device__ __forceinline__ void CombineGreedy(ArgMaxPair best, uint32_t flags,
                                              GreedySpan (&waves)[kGreedyThreads / kMinWaveSize],
                                              GreedySpan* out) {
  best = WaveArgMax(best);
  for (int o = kWaveSize / 2; o > 0; o >>= 1) flags |= __shfl_xor(flags, o, kWaveSize);
  const int wave = static_cast<int>(threadIdx.x) / kWaveSize;
  if (threadIdx.x % kWaveSize == 0) {
    waves[wave] = GreedySpan{
        best.value, best.index == INT64_MAX ? -1 : static_cast<int32_t>(best.index), flags};
  }
  __syncthreads();
  if (threadIdx.x != 0) return;
  GreedySpan r = waves[0];
  for (int w = 1; w < kGreedyThreads / kWaveSize; ++w) {
    const GreedySpan s = waves[w];
    const ArgMaxPair a{s.value, s.index < 0 ? INT64_MAX : s.index};
    const ArgMaxPair b{r.value, r.index < 0 ? INT64_MAX : r.index};
    if (Better(a, b)) {
      r.value = s.value;
      r.index = s.index;
    }
    r.flags |= s.flags;
  }
  *out = r;
}

template <DType kDType, int kVecs, bool kProcs>
__global__ void __launch_bounds__(kGreedyThreads) GreedyKernel(GreedyParams p) {
  constexpr int kTokens = kVecTokens<kDType>;
  __shared__ GreedySpan waves[kGreedyThreads / kMinWaveSize];
  __shared__ uint32_t ticket;

  const int64_t row = blockIdx.y;
  if (p.rows.Skipped(row)) {
    // A launch with marks runs dependent on MarkAdjustsKernel (v43): every block waits for it,
    // so that this kernel never ends before it (RowFinishKernel's note in sample.hip).
    if constexpr (kProcs) GridWaitPrerequisites();
    return;
  }
  const int spans = p.rows.chunks;
  const void* row_ptr = p.rows.Row<kDType>(row);
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * kGreedySpan<kDType, kVecs>;
  const int64_t end = begin + kGreedySpan<kDType, kVecs> < p.rows.vocab
                          ? begin + kGreedySpan<kDType, kVecs>
                          : p.rows.vocab;
  // Vector v of a thread starts at begin + (v * threads + tid) * kTokens: each wave reads
  // contiguous memory, and a thread's tokens run in index order (so `>` keeps the lowest).
  auto vec_index = [&](int v) {
    return begin + (static_cast<int64_t>(v) * kGreedyThreads + threadIdx.x) * kTokens;
  };
  float x[kVecs * kTokens];
  // A whole span of a 16-byte aligned row (all but the row's last span, on the rows engines
  // hand over): one vector load a vector at a constant offset, no bounds or alignment test
  // (those were ~13 instructions a vector, SASS v25).
  if (end - begin == kGreedySpan<kDType, kVecs> &&
      (reinterpret_cast<uintptr_t>(row_ptr) & 15) == 0) {
    const char* const mine = static_cast<const char*>(row_ptr) + vec_index(0) * (16 / kTokens);
#pragma unroll
    for (int v = 0; v < kVecs; ++v)
      LoadAlignedVec<kDType>(mine + v * kGreedyThreads * 16, &x[v * kTokens]);
  } else {
#pragma unroll
    for (int v = 0; v < kVecs; ++v) LoadVec<kDType>(row_ptr, vec_index(v), end, &x[v * kTokens]);
  }

  uint32_t flags = 0;
  float best = -kInfF;
  int64_t best_j = INT64_MAX;
  // Tokens in index order: `>` keeps the lowest. `allowed`: the bitmask's bit, as a predicate
  // on the adjusted logit (RowProcessors::Allowed; the mask keeps NaN).
  auto consider = [&](float value, int64_t j, bool allowed) {
    if (value != value) flags |= kSpanNan;
    if (allowed && value > best) {
      best = value;
      best_j = j;
    }
  };
  // Group i: tokens [i * 4, i * 4 + 4) of x.
  constexpr int kGroups = kVecs * kTokens / 4;
  auto group_at = [&](int i) { return vec_index(i / (kTokens / 4)) + (i % (kTokens / 4)) * 4; };
  RowProcessors::GroupBits bits{~0u, 0u};
  if constexpr (kProcs) {
    // The words are loaded before anything waits for x[]: behind the loop below, their loads
    // would only start once the logits had arrived, a second memory round trip. A launch with
    // marks waits here for MarkAdjustsKernel, with its logits' loads in flight (v43; a no-op
    // in a launch that is not dependent).
    GridWaitPrerequisites();
    bits = p.rows.procs.LoadBits<kGroups>(
        row, vec_index(0),
        [](int i) {
          return (i / (kTokens / 4)) * kGreedyThreads * kTokens + (i % (kTokens / 4)) * 4;
        },
        end);
  }
  // Tokens with a bias or penalty (bits.mark) are left out of the unrolled loop, which still
  // flags their NaNs (the adjusts keep a NaN a NaN and make no other value NaN), and are then
  // taken one at a time (v40). v12-v39 sent a thread holding any of them through a second,
  // rolled loop over all its groups that applied every processor: with 2,000 entries a row
  // nearly every wave had such a thread, so the whole wave ran that loop with 1-6 lanes busy
  // (ncu, session 31: 34.2 M instructions against 12.0 M without processors, B = 128).
  const RowProcessors::GroupBits unmarked{bits.allow & ~bits.mark, 0u};
#pragma unroll
  for (int v = 0; v < kVecs; ++v) {
#pragma unroll
    for (int e = 0; e < kTokens; ++e) {
      const int i = v * kTokens + e;  // bit i of bits.allow (group i / 4, token i % 4)
      consider(x[i], vec_index(v) + e, !kProcs || RowProcessors::Allowed(unmarked, i));
    }
  }
  if constexpr (kProcs) {
    // The marked tokens, out of index order: ties go to the lower index explicitly. Apply gives
    // the processed logit (the adjust, then the mask as -inf).
    for (uint32_t m = bits.mark; m != 0u; m &= m - 1u) {
      const int i = __ffs(static_cast<int>(m)) - 1;
      const int64_t j = group_at(i / 4) + i % 4;
      const float value = p.rows.procs.Apply(row, j, LoadLogit<kDType>(row_ptr, j));
      if (value > -kInfF && (value > best || (value == best && j < best_j))) {
        best = value;
        best_j = j;
      }
    }
  }
  if (best > -kInfF) flags |= kSpanFinite;

  CombineGreedy(ArgMaxPair{best, best_j}, flags, waves, &waves[0]);
  if (threadIdx.x == 0) p.spans[row * spans + blockIdx.x] = waves[0];
  if (!LastToArrive(p.tickets + row, static_cast<uint32_t>(spans), &ticket)) return;

  // The row's last block: every span of the row, in any order (the argmax is exact).
  const volatile GreedySpan* row_spans = p.spans + row * spans;
  ArgMaxPair row_best{-kInfF, INT64_MAX};
  uint32_t row_flags = 0;
  for (int s = threadIdx.x; s < spans; s += kGreedyThreads) {
    const int32_t index = row_spans[s].index;
    const ArgMaxPair a{row_spans[s].value, index < 0 ? INT64_MAX : index};
    if (Better(a, row_best)) row_best = a;
    row_flags |= row_spans[s].flags;
  }
  GreedySpan r;
  CombineGreedy(row_best, row_flags, waves, &r);
  if constexpr (kProcs) {
    // Nothing allowed above -inf: was there a raw x above -inf (kNoAllowed) or not (kNoFinite)?
    // The block reads the raw row once to tell, on this error path only, rather than every
    // span testing each token for it.
    if (threadIdx.x == 0) ticket = r.flags;
    __syncthreads();
    if (!(ticket & (kSpanNan | kSpanFinite))) {
      bool raw_finite = false;
      for (int64_t j = static_cast<int64_t>(threadIdx.x) * 4; j < p.rows.vocab;
           j += 4 * kGreedyThreads) {
        float v[4];
        LoadGroup<kDType>(row_ptr, j, p.rows.vocab, v);
        raw_finite |= v[0] > -kInfF || v[1] > -kInfF || v[2] > -kInfF || v[3] > -kInfF;
      }
      if (__syncthreads_or(raw_finite)) r.flags |= kSpanRawFinite;
    }
  }
  if (threadIdx.x != 0) return;
  p.tickets[row] = 0;  // every block of the row has counted: ready for the next launch
  RowStatus status = RowStatus::kOk;
  if (r.flags & kSpanNan) {
    status = RowStatus::kNan;
  } else if (!(r.flags & kSpanFinite)) {
    status = kProcs && (r.flags & kSpanRawFinite) ? RowStatus::kNoAllowed : RowStatus::kNoFinite;
  }
  p.token_ids[row] = status == RowStatus::kOk ? r.index : -1;
  p.status[row] = status;
}

}  // namespace samplerd::kernels::gpu

#endif  // SAMPLERD_KERNELS_GPU_GREEDY_PASS_H_
