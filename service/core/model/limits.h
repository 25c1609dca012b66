// The limits a request is checked against, with their defaults (--max_batch, --max_vocab, ...).
// Transport limits (message and stream step sizes) belong to the transport: service/grpc.
#ifndef SAMPLERD_SERVICE_CORE_MODEL_LIMITS_H_
#define SAMPLERD_SERVICE_CORE_MODEL_LIMITS_H_

#include <cstdint>
#include <limits>

namespace samplerd::core {

// The largest --max_batch and --max_vocab a server takes: token ids are int32, and every byte
// count of a request within them (B x row stride x 4, the stride <= 16 V) fits int64.
inline constexpr int64_t kMaxBatchLimit = int64_t{1} << 24;
inline constexpr int64_t kMaxVocabLimit = std::numeric_limits<int32_t>::max();

// The largest requests the server accepts.
struct Limits {
  int64_t max_batch = 4096;       // rows per request
  int64_t max_vocab = 1 << 22;    // 4,194,304 columns
  int32_t max_top_logprobs = 64;  // LogprobOptions.top_n
  int64_t max_request_id_bytes = 256;
  // Sampling requests and stream steps admitted and not yet answered; one more is refused at
  // once with RESOURCE_EXHAUSTED. 0: no limit.
  int64_t max_inflight = 256;
  // Inline logits bytes of the admitted requests and stream steps, plus the bytes reserved by
  // chunked stream steps being assembled (SamplerCore::ReserveInflightBytes); one that would
  // pass it is refused at once with RESOURCE_EXHAUSTED. 0: no limit.
  int64_t max_inflight_bytes = 0;
  // The packed bytes of one logit-bias list or token history read from a region
  // (LogitBias.region, TokenHistory.region): the server copies such a list into its memory, as
  // it receives a message, so the list is bounded like an inline one (main.cc sets it to
  // --max_message_bytes). A list past it is refused with RESOURCE_EXHAUSTED before anything is
  // allocated. Without it a sparse shm object announcing N = 4e9 entries made one request
  // allocate 36 GB (std::bad_alloc aborted the server).
  int64_t max_region_list_bytes = int64_t{256} << 20;
};

}  // namespace samplerd::core

#endif  // SAMPLERD_SERVICE_CORE_MODEL_LIMITS_H_
