// The request model of the core: what a transport hands to SamplerCore, and what it gets back.
//
// Transports (service/grpc) convert their wire types into these; nothing here knows gRPC.
#ifndef SAMPLERD_SERVICE_CORE_MODEL_REQUEST_H_
#define SAMPLERD_SERVICE_CORE_MODEL_REQUEST_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "kernels/common/sampling_types.h"

namespace samplerd::core {

// A slice of a registered region: bytes from `offset` on (how many follows from the tensor).
struct RegionRef {
  std::string region;
  uint64_t offset = 0;
};

// Sampling parameters as the client sent them (unset fields keep their defaults).
struct ParamsSpec {
  std::optional<float> temperature;  // default 1
  int32_t top_k = 0;
  std::optional<float> top_p;  // default 1
  float min_p = 0.0f;
  kernels::TopPMode top_p_mode = kernels::TopPMode::kTopKFirst;
  std::optional<uint64_t> seed;  // default: chosen by the server
  uint64_t position = 0;
  // Penalties on the row's token history (DESIGN.md, "Logits processors").
  std::optional<float> repetition_penalty;  // default 1 (off)
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
};

// The logits processors of a request, as the client sent them (SampleRequest.logit_bias,
// token_history, token_bitmask in proto/samplerd/v1/processors.proto). Sparse lists are packed
// per batch: row i's entries are [row_offsets[i], row_offsets[i + 1]) of each list. The lists
// come inline or packed in a region slice (`region`): ReadProcessorLists (regions/request_io.h)
// then fills them from the slice and sets `region_read`.
struct LogitBiasSpec {
  std::vector<uint32_t> row_offsets;
  std::vector<int32_t> token_ids;
  std::vector<float> biases;
  std::optional<RegionRef> region;
  bool region_read = false;
};
struct TokenHistorySpec {
  std::vector<uint32_t> row_offsets;
  std::vector<int32_t> token_ids;
  std::vector<uint32_t> output_counts;
  std::vector<uint8_t> in_prompt;  // 0 or 1
  std::optional<RegionRef> region;
  bool region_read = false;
};
// int32 words [B, ceil(V / 32)], inline (a view, kept alive like inline_data) or in a region.
struct TokenBitmaskSpec {
  std::string_view inline_words;
  bool has_inline_words = false;
  std::optional<RegionRef> region;
};

// Logprobs asked for by the client.
struct LogprobSpec {
  int64_t top_n = 0;
  kernels::LogprobSource source = kernels::LogprobSource::kRaw;
};

// One sampling request. `inline_data` is a view: the transport keeps the bytes alive until the
// request's completion callback has run. The logits come from `inline_data` or `logits_region`.
struct SampleRequest {
  std::string request_id;
  std::optional<kernels::DType> dtype;  // nullopt: the client did not say
  std::vector<int64_t> shape;
  int64_t row_stride = 0;  // 0: dense
  std::string_view inline_data;
  bool has_inline_data = false;  // false: no inline data (see logits_region)
  std::optional<RegionRef> logits_region;
  // Optional: where the B int32 token ids are also written.
  std::optional<RegionRef> output;
  // Optional raw IPC event handles (64 bytes each when set; empty: none): one the producer
  // recorded after writing the logits, one the server records after writing `output`.
  std::string ready_event;
  std::string done_event;
  std::vector<ParamsSpec> params;
  // Empty, or B values overriding each row's seed / position (SampleRequest.row_seeds, ...).
  std::vector<uint64_t> row_seeds;
  std::vector<uint64_t> row_positions;
  std::string device;
  std::optional<LogprobSpec> logprobs;
  // Optional logits processors.
  std::optional<LogitBiasSpec> logit_bias;
  std::optional<TokenHistorySpec> token_history;
  std::optional<TokenBitmaskSpec> token_bitmask;

  absl::Time arrival = absl::Now();
  // The client's deadline: a request still queued when it passes is answered DEADLINE_EXCEEDED
  // without being computed.
  absl::Time deadline = absl::InfiniteFuture();
  // Returns true once the client has gone away (deadline passed or cancelled); checked before
  // the request is computed. May be empty.
  std::function<bool()> is_cancelled;
};

// Logprobs of one row (see SampleArgs for their meaning).
struct RowLogprobs {
  float sampled_logprob = 0.0f;
  int64_t sampled_rank = 0;
  std::vector<int32_t> top_ids;
  std::vector<float> top_values;
};

// Server-side durations of one request.
struct Timings {
  absl::Duration queue;
  absl::Duration compute;
  absl::Duration total;
};

// The outcome of a successful request: one entry per row. With a done event, token_ids and
// row_status are empty (the tokens are in the output region once the event completes).
struct SampleResult {
  std::string request_id;
  std::vector<int32_t> token_ids;
  std::vector<kernels::RowStatus> row_status;
  std::vector<uint64_t> seeds;
  std::vector<RowLogprobs> logprobs;  // empty unless asked for
  Timings timings;
};

}  // namespace samplerd::core

#endif  // SAMPLERD_SERVICE_CORE_MODEL_REQUEST_H_
