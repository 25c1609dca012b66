// Top-p over a row's chunks: the boundary bin's cut, run by the row's last MassDrawKernel block
// (mass_draw.h, chunked_draw.h). The tokens of the boundary bin are sorted on chip and cut by the
// top-p rule.
#ifndef SAMPLERD_KERNELS_GPU_MASS_FINISH_H_
#define SAMPLERD_KERNELS_GPU_MASS_FINISH_H_

#include <cstdint>

#include "kernels/gpu/chunk_stats.h"
#include "kernels/gpu/device_common.h"
#include "kernels/gpu/mass_plan.h"
#include "kernels/gpu/select.h"

namespace samplerd::kernels::gpu {

// Mass of a boundary token in the plan's units: its fixed-point mass relative to its chunk's
// max, scaled as that chunk's histogram was (so the list adds up to its bin exactly).
__device__ __forceinline__ double BoundaryWeight(uint32_t key, int32_t index,
                                                 const float* chunk_max, const double* row_scale) {
  const int c = index / kChunk;
  return static_cast<double>(FixedMass32(KeyToFloat(key), chunk_max[c])) * row_scale[c];
}

// The cut of the n boundary tokens in s.sort (any order): sorted, each thread weighs a stretch,
// and the first tie group whose mass above reaches the plan's target is cut off. Returns the key
// of the last kept token (2^32: none). Every thread of the block must call; every thread gets it.
template <int kThreads>
__device__ uint64_t CutBoundary(const MassPlan& plan, int n, const float* chunk_max,
                                const double* chunk_scale, SelectStorage& s,
                                typename BlockReduce<kThreads>::Storage& reduce) {
  using Reduce = BlockReduce<kThreads>;
  if (threadIdx.x == 0) s.cut = static_cast<uint32_t>(n);
  if (n <= kThreads) {
    SortFewDescending<kThreads>(s, n);
  } else {
    SortDescending<kThreads>(s, n);
  }
  const int per = (n + kThreads - 1) / kThreads;
  const int first = static_cast<int>(threadIdx.x) * per;
  double mine = 0.0;
  for (int i = first; i < first + per && i < n; ++i) {
    mine += BoundaryWeight(s.sort.key[i], s.sort.index[i], chunk_max, chunk_scale);
  }
  double total = 0.0;
  double running = plan.mass_above + Reduce::ExclusiveScanF64(reduce, mine, &total);
  for (int i = first; i < first + per && i < n; ++i) {
    const bool group_start = i == 0 || s.sort.key[i] != s.sort.key[i - 1];
    if (group_start && !(running < plan.target)) {
      atomicMin(&s.cut, static_cast<uint32_t>(i));
      break;
    }
    running += BoundaryWeight(s.sort.key[i], s.sort.index[i], chunk_max, chunk_scale);
  }
  __syncthreads();
  const int cut = static_cast<int>(s.cut);
  const uint64_t key_from = cut > 0 ? s.sort.key[cut - 1] : uint64_t{1} << 32;
  __syncthreads();  // every thread has read s.cut and the key before s is reused
  return key_from;
}

}  // namespace samplerd::kernels::gpu

#endif  // SAMPLERD_KERNELS_GPU_MASS_FINISH_H_
