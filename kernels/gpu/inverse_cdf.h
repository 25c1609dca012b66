// The inverse-CDF draw of a plain-temperature row, finished by one block from pass 1's chunk
// masses (kernels/common/inverse_cdf.h has the definition every backend follows).
//
// Pass 1 (chunk_pass.h) leaves, per chunk c, its max x m_c and S_c = sum of
// exp((x - m_c) / T) in double. The finish:
//   1. X = max m_c; each chunk's share S_c * exp((m_c - X) / T), one lane per chunk; thread 0
//      adds the shares in chunk order (so the total has the same bits on every run and in any
//      batch), draws the row's uniform u and finds the chunk whose running total crosses
//      u * total;
//   2. the block reads that one chunk again (8,192 tokens, 16 consecutive ones a thread),
//      masses exp((x - X) / T) exactly as the oracle writes them, an exclusive scan in double in
//      thread order (= index order), and takes the lowest token whose prefix is above what is
//      left of the target.
// The oracle sums the same masses in index order; here they are summed per chunk and per thread,
// so the prefixes differ by a few double ulps of the total, and the tokens differ only when the
// target lies that close to a token boundary (~V x 1e-16 of rows).
#ifndef SAMPLERD_KERNELS_GPU_INVERSE_CDF_H_
#define SAMPLERD_KERNELS_GPU_INVERSE_CDF_H_

#include <cstdint>

#include "kernels/common/inverse_cdf.h"
#include "kernels/gpu/chunk_stats.h"
#include "kernels/gpu/device_common.h"
#include "kernels/gpu/rows_in.h"

namespace samplerd::kernels::gpu {

// The block's shared state for one row's draw.
struct InverseCdfShared {
  double share[kMaxStagedChunks];  // chunk c's mass relative to the row's max x
  double reference;                // the row's max x
  double left;                     // what is left of the target in the chosen chunk
  bool ordinary;                   // false: the row takes the general finish
  int chunk;                       // the chosen chunk
  int first;                       // the first chunk holding the row's max x
  int64_t argmax;                  // the row's first max x, if the chunk yields nothing
};

// The token of a plain-temperature row, or -1 when the row is not ordinary (a NaN, nothing
// above -inf, or a max z that is not finite): the general finish then gives it its status or
// its top-ties draw. Every thread of the kThreads-thread block must call; four barriers.
template <int kThreads, DType kDType>
__device__ int64_t InverseCdfToken(const RowsIn& rows, int64_t row, const RowParams& params,
                                   const ChunkStats* stats, InverseCdfShared& sh,
                                   typename BlockReduce<kThreads>::Storage& reduce) {
  static_assert(kChunk % kThreads == 0, "a chunk splits evenly over the block");
  constexpr int kPerThread = kChunk / kThreads;
  static_assert(kPerThread % 4 == 0, "whole groups of 4 a thread");
  using Reduce = BlockReduce<kThreads>;
  const int chunks = rows.chunks;
  const double inv_t = InverseTemperature(params.temperature);

  // 1. The shares, one lane per chunk (the first wave), then the chunk walk by thread 0.
  if (threadIdx.x < static_cast<unsigned>(kWaveSize)) {
    const int lane = static_cast<int>(threadIdx.x);
    float max_x = -kInfF, max_z = -kInfF;
    uint32_t odd = 0, finite = 0;
    for (int c = lane; c < chunks; c += kWaveSize) {
      max_x = fmaxf(max_x, stats[c].max_x);
      max_z = fmaxf(max_z, stats[c].max_z);
      odd |= stats[c].nan_count | stats[c].pos_inf_z;
      finite |= stats[c].not_neg_inf_x;
    }
    max_x = WaveMax(max_x);
    max_z = WaveMax(max_z);
    const bool ordinary =
        WaveOr(odd) == 0 && WaveOr(finite) != 0 && max_z > -kInfF && max_z < kInfF && max_x < kInfF;
    const double reference = static_cast<double>(max_x);
    int first = chunks;
    for (int c = lane; c < chunks; c += kWaveSize) {
      const ChunkStats& s = stats[c];
      sh.share[c] = ordinary && s.mass_x > 0.0
                        ? s.mass_x * exp((static_cast<double>(s.max_x) - reference) * inv_t)
                        : 0.0;
      if (first == chunks && s.not_neg_inf_x > 0 && s.max_x == max_x) first = c;
    }
    first = WaveMinInt(first);
    if (lane == 0) {
      sh.ordinary = ordinary && first < chunks;
      sh.first = first;
      sh.reference = reference;
    }
  }
  __syncthreads();
  if (!sh.ordinary) return -1;
  if (threadIdx.x == 0) {
    sh.argmax = stats[sh.first].argmax_x;
    double total = 0.0;
    for (int c = 0; c < chunks; ++c) total += sh.share[c];
    const double target = RowUniform(params.seed, params.position) * total;
    double before = 0.0;
    int chosen = -1, last = sh.first;  // last: the last chunk with mass
    for (int c = 0; c < chunks; ++c) {
      if (!(sh.share[c] > 0.0)) continue;
      last = c;
      if (before + sh.share[c] > target) {
        chosen = c;
        break;
      }
      before += sh.share[c];
    }
    // Rounding may leave the target at the total: then the last token with mass.
    sh.chunk = chosen >= 0 ? chosen : last;
    sh.left = chosen >= 0 ? target - before : __builtin_huge_val();
  }
  __syncthreads();

  // 2. The chosen chunk, read again: kPerThread consecutive tokens a thread, in index order.
  const int chunk = sh.chunk;
  const double left = sh.left;
  const double reference = sh.reference;
  const void* row_ptr = rows.Row<kDType>(row);
  const int64_t chunk_begin = static_cast<int64_t>(chunk) * kChunk;
  const int64_t end = chunk_begin + kChunk < rows.vocab ? chunk_begin + kChunk : rows.vocab;
  const int64_t begin = chunk_begin + static_cast<int64_t>(threadIdx.x) * kPerThread;
  float x[kPerThread];
#pragma unroll
  for (int g = 0; g < kPerThread / 4; ++g)
    LoadGroup<kDType>(row_ptr, begin + g * 4, end, &x[g * 4]);
  if (rows.procs.active()) {
#pragma unroll
    for (int k = 0; k < kPerThread; ++k) {
      if (begin + k < end) x[k] = rows.procs.Apply(row, begin + k, x[k]);
    }
  }
  // The masses are computed twice (sum, then scan) rather than kept: 32 registers fewer in a
  // kernel that already spills (RowFinishKernel, ptxas: NOTES.md v23).
  double mine = 0.0;
#pragma unroll
  for (int k = 0; k < kPerThread; ++k) {
    mine += InverseCdfMass(x[k], reference, inv_t);  // 0 for -inf (also past the end)
  }
  double chunk_total = 0.0;
  double prefix = Reduce::ExclusiveScanF64(reduce, mine, &chunk_total);
  int crossing = -1, last_with_mass = -1;
#pragma unroll
  for (int k = 0; k < kPerThread; ++k) {
    const double mass = InverseCdfMass(x[k], reference, inv_t);
    prefix += mass;
    if (mass > 0.0) {
      last_with_mass = k;
      if (crossing < 0 && prefix > left) crossing = k;
    }
  }
  const ArgMaxPair lowest = Reduce::ArgMax(
      reduce, crossing >= 0 ? ArgMaxPair{0.0f, begin + crossing} : ArgMaxPair{-kInfF, INT64_MAX});
  if (lowest.value == 0.0f) return lowest.index;
  // No prefix crossed (the chunk's own sum came out below the target, by rounding): the
  // chunk's last token with mass, else the row's first max x.
  const ArgMaxPair latest = Reduce::ArgMax(
      reduce, last_with_mass >= 0
                  ? ArgMaxPair{static_cast<float>(begin + last_with_mass - chunk_begin), 0}
                  : ArgMaxPair{-kInfF, INT64_MAX});
  return latest.value >= 0.0f ? chunk_begin + static_cast<int64_t>(latest.value) : sh.argmax;
}

}  // namespace samplerd::kernels::gpu

#endif  // SAMPLERD_KERNELS_GPU_INVERSE_CDF_H_
