// Plain types shared by every sampler backend (CPU reference, HIP/CUDA kernels).
//
// This header is included from host and device code: no standard-library containers, no
// gRPC, protobuf or Abseil. Semantics are those of docs/DESIGN.md ("Sampling semantics").
#ifndef SAMPLERD_KERNELS_COMMON_SAMPLING_TYPES_H_
#define SAMPLERD_KERNELS_COMMON_SAMPLING_TYPES_H_

#include <cstdint>

namespace samplerd::kernels {

// Element type of a logits tensor. Values are computed in fp32 whatever the storage type.
enum class DType : uint8_t { kFp32 = 0, kFp16 = 1, kBf16 = 2 };

// Bytes per element of `dtype`.
inline constexpr int64_t DTypeSize(DType dtype) { return dtype == DType::kFp32 ? 4 : 2; }

// "fp32", "fp16" or "bf16", for messages.
inline constexpr const char* DTypeName(DType dtype) {
  return dtype == DType::kFp32 ? "fp32" : dtype == DType::kFp16 ? "fp16" : "bf16";
}

// Which mass the top-p threshold is compared with (DESIGN.md step 5).
enum class TopPMode : uint8_t {
  kTopKFirst = 0,  // over the survivors of min-p and top-k, renormalised (vLLM)
  kJoint = 1,      // against the full row's un-renormalised mass (aiter, SGLang, FlashInfer)
};

// Which distribution logprobs come from.
enum class LogprobSource : uint8_t {
  kRaw = 0,        // log_softmax(x) of the raw logits
  kProcessed = 1,  // after temperature and filters, renormalised; point mass for greedy rows
};

// Outcome of one row.
enum class RowStatus : uint8_t {
  kOk = 0,
  kNan = 1,            // the row holds a NaN; token -1
  kNoFinite = 2,       // every logit is -inf; token -1
  kInvalidParams = 3,  // the row's parameters failed validation (device sessions); token -1
  kNoAllowed = 4,      // some logit is above -inf, none is after the logits processors; token -1
};

// Temperatures below this (and >= 0) mean greedy sampling.
inline constexpr float kGreedyTemperature = 1e-5f;

// Parameters of one row, already validated and with defaults applied.
struct RowParams {
  float temperature = 1.0f;  // >= 0; < kGreedyTemperature means greedy
  int32_t top_k = 0;         // <= 0 or >= V disables
  float top_p = 1.0f;        // (0, 1]; 1 disables
  float min_p = 0.0f;        // [0, 1]; 0 disables
  TopPMode top_p_mode = TopPMode::kTopKFirst;
  uint64_t seed = 0;      // Philox key
  uint64_t position = 0;  // Philox counter (high half); the token index is the low half
};

// One token's logits processors, merged on the host from the request's logit bias, token
// history and the row's penalties (DESIGN.md, "Logits processors"); applied by AdjustLogit
// (kernels/common/logits_processors.h). A token with no bias has bias 0; one the penalties do
// not touch has repetition 1 and penalty 0.
struct TokenAdjust {
  int32_t token = 0;        // in [0, vocab)
  float bias = 0.0f;        // added first; +-inf sets the logit to that infinity
  float repetition = 1.0f;  // > 0; x > 0 ? x / repetition : x * repetition (1: off)
  float penalty = 0.0f;     // subtracted last: frequency * count + presence * (count > 0)
};

// One batch to sample: inputs and output buffers, all in the backend's memory space.
//
// Shapes: logits [batch, row_stride] (only the first `vocab` elements of each row are read),
// params [params_count] with params_count == 1 (broadcast) or == batch.
// Outputs: token_ids [batch], status [batch]; when top_logprobs >= 0 also sampled_logprob
// [batch], sampled_rank [batch], top_ids [batch, top_logprobs], top_values [batch, top_logprobs].
struct SampleArgs {
  const void* logits = nullptr;
  DType dtype = DType::kFp32;
  int64_t batch = 0;
  int64_t vocab = 0;
  int64_t row_stride = 0;  // elements; >= vocab
  const RowParams* params = nullptr;
  int64_t params_count = 0;

  // Logprobs: -1 = none; N >= 0 = the sampled token's logprob and rank plus the top N.
  int32_t top_logprobs = -1;
  LogprobSource logprob_source = LogprobSource::kRaw;

  int32_t* token_ids = nullptr;
  RowStatus* status = nullptr;
  float* sampled_logprob = nullptr;
  int64_t* sampled_rank = nullptr;
  int32_t* top_ids = nullptr;
  float* top_values = nullptr;

  // Logits processors, all optional (nullptr: none), in the backend's memory space:
  // - allowed_bitmask: [batch, bitmask_words] words, bitmask_words = ceil(vocab / 32); bit
  //   t % 32 of word t / 32 of a row is set when token t is allowed (others become -inf);
  // - adjusts: row r's TokenAdjust entries are adjusts[adjust_offsets[r] ..
  //   adjust_offsets[r + 1]), sorted by token, no token twice; adjust_offsets has batch + 1.
  const uint32_t* allowed_bitmask = nullptr;
  int64_t bitmask_words = 0;
  const TokenAdjust* adjusts = nullptr;
  const uint32_t* adjust_offsets = nullptr;

  // GPU only (device sessions): when set, a device word holding the number of rows that run.
  // The kernels are launched for `batch` rows (the session's max_batch); blocks of rows >=
  // *device_batch exit at once and write nothing. Rows below it are sampled as usual.
  const uint32_t* device_batch = nullptr;

  // GPU only: false when the caller knows that no row has top-p as its only filter (say from
  // the host copy of params: kernels/gpu/sample.h HasTopPRows). Such rows then take the
  // one-block path, and the launch of the two-pass top-p kernel is skipped. true is always
  // correct (device sessions, whose params the engine writes on the device).
  bool top_p_rows = true;

  // GPU only: true when the caller knows that every row is greedy (kernels/gpu/sample.h
  // AllGreedy). Without logprobs, the launch is then one kernel instead of two. false is always
  // correct.
  bool all_greedy = false;
};

}  // namespace samplerd::kernels

#endif  // SAMPLERD_KERNELS_COMMON_SAMPLING_TYPES_H_
