// The logits processors on the GPU (DESIGN.md, "Logits processors"): the one place where a
// loaded logit becomes the processed logit that every filter, draw and processed logprob sees.
//
// Every pass hands the logits it loads to RowProcessors here: the group passes (pass 1, the
// greedy pass, the top-p draw) load their groups' bits once (LoadBits) and apply them to each
// group of 4 tokens (ApplyBits); RowSource (row_finish.h) applies them one token at a time
// (Apply). Raw logprobs read the logits without them. A new per-token stage (say a DRY penalty)
// is a change to Apply / ApplyAdjusts (and LoadBits, if it needs per-token bits; a stage that
// disallows tokens folds its bits into GroupBits::allow, which the predicate loops read through
// Allowed) and the host code that fills the struct, and nothing else: no path choice depends on
// the processors.
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

// Which processors a launch has, for the kernels compiled per kind: launches without any run a
// copy with none of their code, and launches with a bitmask alone (the structured-output case) a
// copy without the bias and penalties' per-group mark tests (v27: those tests and the registers
// their code held cost a masked top-k pass ~8% at B = 128).
enum class ProcsKind : uint8_t { kNone, kMask, kAll };

struct RowProcessors {
  const uint32_t* allowed;     // [batch, words]: the allowed-token bitmask, or null
  uint32_t* marked;            // [batch, words]: bit set where the token has an adjust, or null
  uint32_t* first;             // [batch, words]: index of a marked word's first adjust
  const TokenAdjust* adjusts;  // sorted by token within each row
  const uint32_t* offsets;     // [batch + 1]: row r's adjusts are [offsets[r], offsets[r + 1])
  int64_t words;               // per row: ceil(vocab / 32)

  __host__ __device__ bool active() const { return allowed != nullptr || marked != nullptr; }
  __host__ __device__ ProcsKind kind() const {
    return marked != nullptr ? ProcsKind::kAll
                             : (allowed != nullptr ? ProcsKind::kMask : ProcsKind::kNone);
  }

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

  // The processors' bits of kGroups groups of 4 tokens, group g at j0 + off(g), with every
  // word load issued before any is used: bit 4g + e of GroupBits::allow / ::mark is token
  // j0 + off(g) + e's. A pass that keeps them applies the processors with ApplyBits and never
  // loads a word again (v12 loaded a group's word in every pass as it applied it: a dense mask
  // cost 30-60% at B = 128). Groups at or past `end` read the row's word 0 instead (always
  // there) and get allow 1111, mark 0000.
  //
  // The layout every caller has (a thread's groups 32-token-strided from a 4-aligned j0, or
  // 4 apart within one word): off(g) is a constant once unrolled, j0 % 4 == 0 and
  // (j0 % 32) + (off(g) % 32) <= 28 for every g, so group g's word is j0's word + off(g) / 32 and
  // its shift (j0 % 32) + off(g) % 32. A thread whose groups all start inside the row (all but
  // the row's last few) then loads its words at constant offsets from one address and shifts
  // them all by about the same amount: ~4 instructions a group, where the index arithmetic of
  // each group (64-bit, clamped) had cost ~15 (v21).
  struct GroupBits {
    uint32_t allow;
    uint32_t mark;
  };
  // The words of LoadBits, loaded (LoadWords) apart from their use (BitsOf): a pass may issue
  // these loads before the logits' and use them once the logits' are issued too, so that the
  // words' round trip overlaps the logits' instead of following it (v38: a masked pass 1 spent
  // 14.5% of its stall samples on the words' first use). LoadBits is BitsOf(LoadWords(...)).
  template <int kGroups>
  struct GroupWords {
    uint32_t allow[kGroups];
    uint32_t mark[kGroups];
  };
  // kMarks false: the launch has no marks (ProcsKind::kMask); GroupBits::mark is 0.
  template <int kGroups, bool kMarks = true, class Off>
  __device__ __forceinline__ GroupWords<kGroups> LoadWords(int64_t row, int64_t j0, Off off,
                                                           int64_t end) const {
    static_assert(kGroups <= 8, "4 bits a group in 32");
    GroupWords<kGroups> w{};  // zeros where a word is not loaded: BitsOf never reads them
    const int64_t row_word = row * words;
    if (j0 + off(kGroups - 1) < end) {
      // Each kind of bits under a uniform branch of its own: a launch with a mask alone ran the
      // marks' shifts on the null words too (~3 instructions a group, SASS v25).
      const int64_t w0 = row_word + (j0 >> 5);
      if (allowed != nullptr) {
#pragma unroll
        for (int g = 0; g < kGroups; ++g) w.allow[g] = allowed[w0 + (off(g) >> 5)];
      }
      if (kMarks && marked != nullptr) {
#pragma unroll
        for (int g = 0; g < kGroups; ++g) w.mark[g] = marked[w0 + (off(g) >> 5)];
      }
      return w;
    }
#pragma unroll
    for (int g = 0; g < kGroups; ++g) {
      const int64_t j = j0 + off(g);
      const int64_t at = row_word + (j < end ? j >> 5 : 0);
      w.allow[g] = allowed != nullptr ? allowed[at] : ~0u;
      w.mark[g] = kMarks && marked != nullptr ? marked[at] : 0u;
    }
    return w;
  }
  template <int kGroups, bool kMarks = true, class Off>
  __device__ __forceinline__ GroupBits BitsOf(const GroupWords<kGroups>& w, int64_t j0, Off off,
                                              int64_t end) const {
    const int shift0 = static_cast<int>(j0 & 31);
    GroupBits bits{0u, 0u};
    if (j0 + off(kGroups - 1) < end) {
      if (allowed == nullptr) {
        bits.allow = kGroups == 8 ? ~0u : (1u << (4 * kGroups)) - 1u;
      } else {
#pragma unroll
        for (int g = 0; g < kGroups; ++g) {
          bits.allow |= ((w.allow[g] >> (shift0 + (off(g) & 31))) & 0xfu) << (4 * g);
        }
      }
      if (kMarks && marked != nullptr) {
#pragma unroll
        for (int g = 0; g < kGroups; ++g) {
          bits.mark |= ((w.mark[g] >> (shift0 + (off(g) & 31))) & 0xfu) << (4 * g);
        }
      }
      return bits;
    }
#pragma unroll
    for (int g = 0; g < kGroups; ++g) {
      const int shift = shift0 + (off(g) & 31);
      const bool in = j0 + off(g) < end;
      bits.allow |= (in ? (w.allow[g] >> shift) & 0xfu : 0xfu) << (4 * g);
      bits.mark |= (in ? (w.mark[g] >> shift) & 0xfu : 0u) << (4 * g);
    }
    return bits;
  }
  template <int kGroups, bool kMarks = true, class Off>
  __device__ __forceinline__ GroupBits LoadBits(int64_t row, int64_t j0, Off off,
                                                int64_t end) const {
    return BitsOf<kGroups, kMarks>(LoadWords<kGroups, kMarks>(row, j0, off, end), j0, off, end);
  }

  // The processors on group g of LoadBits (the 4 tokens at j; those past the row's end hold
  // -inf and stay so). kMarks false: the bitmask alone (ProcsKind::kMask).
  template <bool kMarks = true>
  __device__ __forceinline__ void ApplyBits(int64_t row, int64_t j, const GroupBits& bits, int g,
                                            float* v) const {
    if constexpr (kMarks) ApplyAdjusts(row, j, bits, g, v);
    ApplyAllowed(bits, g, v);
  }

  // The bias and penalties alone on group g of LoadBits. An adjust loads its word's mark again
  // (rare: only groups holding a marked token).
  __device__ __forceinline__ void ApplyAdjusts(int64_t row, int64_t j, const GroupBits& bits, int g,
                                               float* v) const {
    const uint32_t mark = (bits.mark >> (4 * g)) & 0xfu;
    if (mark != 0u) {
      const int64_t w = row * words + (j >> 5);
      const uint32_t word = marked[w];
      const int shift = static_cast<int>(j & 31);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        if ((mark >> e) & 1u) v[e] = AdjustLogit(v[e], At(w, word, shift + e));
      }
    }
  }

  // The bitmask alone on group g of LoadBits: all of ApplyBits when bits.mark is 0.
  __device__ __forceinline__ void ApplyAllowed(const GroupBits& bits, int g, float* v) const {
    const uint32_t allow = bits.allow >> (4 * g);
#pragma unroll
    for (int e = 0; e < 4; ++e) v[e] = AnyBitSet(allow, 1u << e) ? v[e] : Disallowed(v[e]);
  }

  // Whether item i of LoadBits's groups (token e = i % 4 of group g = i / 4) is allowed.
  //
  // The mask as a predicate (v20): the processed logit is `allowed ? a : Disallowed(a)`, a the
  // logit after ApplyAdjusts, and Disallowed(a) is -inf or NaN. So a pass that only compares
  // tokens with a value above -inf (a running max, a threshold, `> -inf`) may test
  // `Allowed(bits, i) && a ...` on the adjusted logit instead of applying the mask first: the
  // same outcome for every token, a predicate AND instead of a select chain. NaN is the one
  // value the mask keeps, so NaN counts read `a` alone. Pass 1's cheapest loops
  // (chunk_pass.h, greedy_pass.h) do this: the mask's select had doubled their ~5 instructions
  // a token.
  // (A mask test, `allow & (1 << i)`, is one instruction that sets a predicate; `(allow >> i) & 1`
  // compiled to three.)
  __device__ __forceinline__ static bool Allowed(const GroupBits& bits, int i) {
    return AnyBitSet(bits.allow, 1u << i);
  }

  // The adjust of the marked token at bit `bit` of word w (whose value is `mark`): the word's
  // first adjust plus the marked tokens below it (entries are sorted and unique).
  __device__ const TokenAdjust& At(int64_t w, uint32_t mark, int bit) const {
    return adjusts[first[w] + __popc(mark & ((1u << bit) - 1u))];
  }
};

}  // namespace samplerd::kernels::gpu

#endif  // SAMPLERD_KERNELS_GPU_ROW_PROCESSORS_H_
