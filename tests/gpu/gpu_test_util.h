// Shared helpers of the GPU tests: random batches in every dtype, and one call that runs a batch
// on the CPU reference and one that runs it on the GPU, with the same output layout.
#ifndef SAMPLERD_TESTS_GPU_GPU_TEST_UTIL_H_
#define SAMPLERD_TESTS_GPU_GPU_TEST_UTIL_H_

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/common/sampling_types.h"

namespace samplerd::kernels::testing {

// A batch in host memory, ready for either backend.
struct Batch {
  DType dtype = DType::kFp32;
  int64_t batch = 0;
  int64_t vocab = 0;
  int64_t row_stride = 0;
  std::vector<uint8_t> bytes;     // [batch, row_stride] elements of dtype
  std::vector<RowParams> params;  // 1 or batch entries
  int32_t top_logprobs = -1;
  LogprobSource source = LogprobSource::kRaw;
  // Logits processors (SampleArgs), empty when none: [batch, ceil(vocab / 32)] bitmask words,
  // and the adjusts with their batch + 1 row offsets.
  std::vector<uint32_t> bitmask;
  std::vector<uint32_t> adjust_offsets;
  std::vector<TokenAdjust> adjusts;
  // Pass SampleArgs::all_greedy as the server does (kernels/gpu/sample.h AllGreedy); false
  // sends an all-greedy batch through the general kernels instead of the one-launch path.
  bool greedy_hint = true;
};

// Outputs of one run, host memory.
struct Outputs {
  std::vector<int32_t> tokens;
  std::vector<RowStatus> status;
  std::vector<float> sampled_logprob;
  std::vector<int64_t> sampled_rank;
  std::vector<int32_t> top_ids;
  std::vector<float> top_values;
};

// Storage bits of `v` in `dtype` (round to nearest even for the 16-bit types).
void StoreValue(DType dtype, float v, uint8_t* out);
// fp32 value of element i of a row in `dtype` storage.
float LoadValue(DType dtype, const uint8_t* row, int64_t i);

// Fills `b` (shape and dtype already set) with logits drawn as `kind`:
// "randn3" (N(0,1) * 3), "peaked" (N(0,1) plus +12 on one random token per row), "zipf" (the
// token of rank q at -1.5 ln(1 + q) plus N(0, 0.1): most mass in a few hundred tokens, like a
// real model), "flat" (every logit equal) or "engine" (N(0, 0.6): a random-weight model's rows,
// which top-p 0.95 keeps ~85% of), rounded to the dtype so both backends read identical values.
void FillLogits(Batch& b, const std::string& kind, std::mt19937_64& rng);

// Runs the CPU reference over every row.
Outputs RunCpu(const Batch& b);
// Runs the GPU kernels (device 0) in a new zeroed workspace; fails the current test on a
// runtime error.
Outputs RunGpu(const Batch& b);

// As RunGpu, in a caller's device workspace of `workspace_bytes` (zeroed before its first use,
// as kernels/gpu/sample.h asks) that may have served other launches of any shape.
Outputs RunGpuIn(const Batch& b, void* workspace, size_t workspace_bytes);

// Row parameters with these filters (seed and position 0).
RowParams Params(float temperature, int32_t top_k, float top_p, float min_p,
                 TopPMode mode = TopPMode::kTopKFirst);
// One entry of `setting` per row of `b`, each with a random seed and position.
void SetParams(Batch& b, const RowParams& setting, std::mt19937_64& rng);

// Expects the GPU's logprob outputs to be the CPU's: ranks and ids equal, values within 2e-4
// (infinities equal).
void ExpectLogprobsMatch(const Outputs& gpu, const Outputs& cpu);

// True when a GPU is visible; *why says why not.
bool HaveGpu(std::string* why);

}  // namespace samplerd::kernels::testing

#endif  // SAMPLERD_TESTS_GPU_GPU_TEST_UTIL_H_
