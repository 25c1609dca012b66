// The limits a request is checked against, with their defaults (--max_batch, --max_vocab, ...).
#ifndef SAMPLERD_SERVICE_CORE_MODEL_LIMITS_H_
#define SAMPLERD_SERVICE_CORE_MODEL_LIMITS_H_

#include <cstdint>

namespace samplerd::core {

// The largest requests the server accepts.
struct Limits {
  int64_t max_batch = 4096;               // rows per request
  int64_t max_vocab = 1 << 22;            // 4,194,304 columns
  int64_t max_message_bytes = 256 << 20;  // 256 MiB per gRPC message
  int32_t max_top_logprobs = 64;          // LogprobOptions.top_n
  int64_t max_request_id_bytes = 256;
  int64_t max_stream_step_bytes = int64_t{1} << 30;  // a chunked SampleStream step, reassembled
  // Sampling requests and stream steps admitted and not yet answered; one more is refused at
  // once with RESOURCE_EXHAUSTED. 0: no limit.
  int64_t max_inflight = 256;
};

}  // namespace samplerd::core

#endif  // SAMPLERD_SERVICE_CORE_MODEL_LIMITS_H_
