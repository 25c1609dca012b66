// The logits processors on the GPU (DESIGN.md, "Logits processors"): the one place where a
// loaded logit becomes the processed logit that every filter, draw and processed logprob sees.
//
// Every pass loads a row's logits through RowsIn::LoadGroup (4 tokens) or RowSource
// (row_finish.h) and hands them to RowProcessors here; raw logprobs read the logits without it. A
// new per-token stage (say a DRY penalty) is a change to Apply / ApplyGroup and the host code that
// fills the struct, and nothing else: no path choice depends on the processors.
//
// The sparse entries (bias, penalties) are found through a bit per token, `marked`, and the
// index of each marked word's first entry, `first`, both set by MarkAdjustsKernel (sample.hip)
// before pass 1: a token with no entry (almost all of them) costs one bit test (4 tokens of a
// group share one word), a marked one two loads (its word's `first`, its entry), no search.
// (v1 binary-searched the row's list per marked token: 2,000 entries a row cost 2.9x at
// B = 128, NOTES.md v9.)
#ifndef SAMPLERD_KERNELS_GPU_ROW_PROCESSORS_H_
#define SAMPLERD_KERNELS_GPU_ROW_PROCESSORS_H_

#include <cstdint>

#include "kernels/common/logits_processors.h"
#include "kernels/common/sampling_types.h"
#include "kernels/gpu/platform.h"

namespace samplerd::kernels::gpu {

struct RowProcessors {
  const uint32_t* allowed;     // [batch, words]: the allowed-token bitmask, or null
  uint32_t* marked;            // [batch, words]: bit set where the token has an adjust, or null
  uint32_t* first;             // [batch, words]: index of a marked word's first adjust
  const TokenAdjust* adjusts;  // sorted by token within each row
  const uint32_t* offsets;     // [batch + 1]: row r's adjusts are [offsets[r], offsets[r + 1])
  int64_t words;               // per row: ceil(vocab / 32)

  __host__ __device__ bool active() const { return allowed != nullptr || marked != nullptr; }

  // Token j of `row`: x after the processors.
  __device__ float Apply(int64_t row, int64_t j, float x) const {
    const int64_t w = row * words + (j >> 5);
    const int bit = static_cast<int>(j & 31);
    if (marked != nullptr) {
      const uint32_t mark = marked[w];
      if ((mark >> bit) & 1u) x = AdjustLogit(x, At(w, mark, bit));
    }
    if (allowed != nullptr && ((allowed[w] >> bit) & 1u) == 0) x = Disallowed(x);
    return x;
  }

  // The 4 tokens of a group at j (4-aligned, so in one word). Tokens at or past `end` hold
  // -inf, which both steps leave as it is. The bitmask is a select per token; an adjust costs
  // two more loads, only for the (rare) marked tokens.
  __device__ __forceinline__ void ApplyGroup(int64_t row, int64_t j, int64_t end, float* v) const {
    if (j >= end) return;
    const int64_t w = row * words + (j >> 5);
    const int shift = static_cast<int>(j & 31);
    if (marked != nullptr) {
      const uint32_t mark = marked[w];
      if ((mark >> shift) & 0xfu) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          if ((mark >> (shift + e)) & 1u) v[e] = AdjustLogit(v[e], At(w, mark, shift + e));
        }
      }
    }
    if (allowed != nullptr) {
      const uint32_t allow = allowed[w] >> shift;
#pragma unroll
      for (int e = 0; e < 4; ++e) v[e] = (allow >> e) & 1u ? v[e] : Disallowed(v[e]);
    }
  }

  // The adjust of the marked token at bit `bit` of word w (whose value is `mark`): the word's
  // first adjust plus the marked tokens below it (entries are sorted and unique).
  __device__ const TokenAdjust& At(int64_t w, uint32_t mark, int bit) const {
    return adjusts[first[w] + __popc(mark & ((1u << bit) - 1u))];
  }
};

}  // namespace samplerd::kernels::gpu

#endif  // SAMPLERD_KERNELS_GPU_ROW_PROCESSORS_H_
