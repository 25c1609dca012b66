// The logprob outputs of a row (sampled token's logprob and rank, the top-N list), written by
// RowFinishKernel's block once the row's token is known.
#ifndef SAMPLERD_KERNELS_GPU_ROW_LOGPROBS_H_
#define SAMPLERD_KERNELS_GPU_ROW_LOGPROBS_H_

#include <cstdint>

#include "kernels/gpu/device_common.h"
#include "kernels/gpu/row_finish.h"
#include "kernels/gpu/select.h"

namespace samplerd::kernels::gpu {

// Which tokens have a finite logprob (the "eligible" ones) and what it is.
struct LogprobView {
  bool point_mass = false;   // only `token`, logprob 0
  float temperature = 1.0f;  // eligible: z = x / temperature > -inf and key(z) >= lo
  bool processed = false;    // x after the logits processors (else raw)
  uint32_t lo = 0;
  bool constant = false;  // every eligible token has logprob `value_constant`
  double value_constant = 0.0;
  double row_max = 0.0;  // else logprob = (z - row_max) - log_sum
  double log_sum = 0.0;
  uint64_t eligible = 0;
};

template <DType kDType, class Source>
__device__ void WriteLogprobs(const RowFinishParams& p, int64_t row, const void* row_ptr,
                              const Source& source, const LogprobView& view, int64_t token,
                              FinishShared& sh) {
  using Reduce = BlockReduce<kFinishThreads>;
  const RowSource<kDType> row_source{row_ptr, p.rows.vocab, view.temperature,
                                     view.processed ? p.rows.procs : RowProcessors{}, row};
  auto eligible = [&](int64_t j) {
    if (view.point_mass) return j == token;
    const float z = row_source.Z(j);
    return z > -kInfF && OrderedKey(z) >= view.lo;
  };
  auto value = [&](float z) -> float {
    if (view.point_mass) return 0.0f;
    if (view.constant) return static_cast<float>(view.value_constant);
    return static_cast<float>((static_cast<double>(z) - view.row_max) - view.log_sum);
  };

  // The sampled token's logprob and rank (1 + the eligible tokens strictly above it).
  const float token_z = row_source.Z(token);
  uint64_t above = 0;
  // The rank costs a pass over the row; device sessions return the logprob alone.
  if (!view.point_mass && p.sampled_rank != nullptr) {
    const uint32_t token_key = OrderedKey(token_z);
    uint64_t mine = 0;
    source.ForEach(
        [&](uint32_t key, int64_t, float) { mine += key >= view.lo && key > token_key; });
    above = Reduce::SumU64(sh.reduce, mine);
  }
  if (threadIdx.x == 0) {
    if (p.sampled_logprob != nullptr) p.sampled_logprob[row] = value(token_z);
    if (p.sampled_rank != nullptr) p.sampled_rank[row] = 1 + static_cast<int64_t>(above);
  }
  const int32_t n = p.top_logprobs;
  if (n <= 0) return;
  int32_t* out_ids = p.top_ids + row * n;
  float* out_values = p.top_values + row * n;

  // The top `listed` eligible tokens, by key descending then index ascending.
  const int listed = static_cast<int>(view.eligible < static_cast<uint64_t>(n) ? view.eligible : n);
  SelectStorage& s = sh.select;
  if (view.point_mass) {
    if (threadIdx.x == 0) {
      out_ids[0] = static_cast<int32_t>(token);
      out_values[0] = 0.0f;
    }
  } else if (listed > 0) {
    const uint32_t t = SelectThreshold<kFinishThreads>(source, view.lo, false, 0.0f, 0.0, -1.0,
                                                       static_cast<double>(listed), s, sh.reduce);
    if (threadIdx.x == 0) s.collected = 0;
    __syncthreads();
    source.ForEach([&](uint32_t key, int64_t j, float) {
      if (key < t) return;
      AppendCollected(s, key, j);
    });
    __syncthreads();
    int collected = static_cast<int>(s.collected);
    __syncthreads();
    if (collected > kSortCap) {
      // Many tokens tie at t: take those above it, then the lowest indices of the tie.
      if (threadIdx.x == 0) s.collected = 0;
      __syncthreads();
      source.ForEach([&](uint32_t key, int64_t j, float) {
        if (key <= t) return;
        AppendCollected(s, key, j);
      });
      __syncthreads();
      // Fewer than `listed` unless the logits changed since the threshold pass (then the list
      // is unspecified, but stays in bounds).
      const int strictly_above = min(CollectedCount(s), listed);
      OrderedFirst(
          p.rows.vocab, listed - strictly_above,
          [&](int64_t j) { return eligible(j) && OrderedKey(row_source.Z(j)) == t; },
          [&](int64_t slot, int64_t j) {
            s.sort.key[strictly_above + slot] = t;
            s.sort.index[strictly_above + slot] = static_cast<int32_t>(j);
          },
          sh);
      __syncthreads();
      collected = listed;
    }
    SortDescending<kFinishThreads>(s, collected);
    for (int i = threadIdx.x; i < listed; i += kFinishThreads) {
      out_ids[i] = s.sort.index[i];
      out_values[i] = value(KeyToFloat(s.sort.key[i]));
    }
    __syncthreads();
  }
  // Then tokens with logprob -inf, lowest index first, then -1 past the vocabulary.
  const int filled = view.point_mass ? 1 : listed;
  if (filled < n) {
    OrderedFirst(
        p.rows.vocab, n - filled, [&](int64_t j) { return !eligible(j); },
        [&](int64_t slot, int64_t j) {
          out_ids[filled + slot] = static_cast<int32_t>(j);
          out_values[filled + slot] = -kInfF;
        },
        sh);
    const int64_t ineligible =
        p.rows.vocab - static_cast<int64_t>(view.point_mass ? 1 : view.eligible);
    const int64_t real = filled + (ineligible < n - filled ? ineligible : n - filled);
    for (int64_t i = real + threadIdx.x; i < n; i += kFinishThreads) {
      out_ids[i] = -1;
      out_values[i] = -kInfF;
    }
  }
}

}  // namespace samplerd::kernels::gpu

#endif  // SAMPLERD_KERNELS_GPU_ROW_LOGPROBS_H_
