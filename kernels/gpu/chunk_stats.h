// The chunk geometry shared by every pass, and ChunkStats: what pass 1 (ChunkPassKernel) learns
// about one chunk of one row, read by the passes after it.
#ifndef SAMPLERD_KERNELS_GPU_CHUNK_STATS_H_
#define SAMPLERD_KERNELS_GPU_CHUNK_STATS_H_

#include <cstdint>

namespace samplerd::kernels::gpu {

// A row is read in chunks of kChunk tokens, one block of kChunkThreads threads each in pass 1.
// The chunk size never depends on the batch: a row's arithmetic is the same in any batch.
inline constexpr int kChunkThreads = 256;
inline constexpr int kItemsPerThread = 32;
inline constexpr int kChunk = kChunkThreads * kItemsPerThread;  // 8192 tokens
inline constexpr int kMaxStagedChunks = 512;  // chunks a row may have: V <= 4,194,304
inline constexpr int kCandidateCap = 1024;    // top-k candidates a chunk may list

// What pass 1 learns about one chunk of one row.
struct ChunkStats {
  float max_z;       // max of z = x / T over the chunk (-inf when every z is -inf)
  float min_z;       // min of the finite z, for rows with a mass histogram only (else +inf)
  float sum_exp_z;   // sum of exp(z - max_z) over finite z, for JOINT top-p rows only
  float max_x;       // max of x (NaN excluded)
  float sum_exp_x;   // sum of exp(x - max_x) over finite x, when raw logprobs are asked for
  int64_t argmax_x;  // lowest index holding max_x
  uint32_t nan_count;
  uint32_t pos_inf_x;      // x == +inf
  uint32_t pos_inf_z;      // z == +inf
  uint32_t not_neg_inf_x;  // x > -inf
  uint32_t candidates;     // candidates written
  uint32_t overflow;       // 1: the chunk had more than kCandidateCap candidates
  float best_score;        // top-k rows whose candidates overflowed: max of z + G
  int64_t best_index;      // its lowest index
  double mass_x;           // plain-temperature rows: sum of InverseCdfMass(x, max_x, 1 / T), else 0
};

}  // namespace samplerd::kernels::gpu

#endif  // SAMPLERD_KERNELS_GPU_CHUNK_STATS_H_
