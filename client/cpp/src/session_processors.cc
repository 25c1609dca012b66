// PackSessionProcessors (samplerd/device_session.h): a device session's processors buffer from
// per-row values, with the lists built by the unary helpers (SetLogitBias, SetTokenHistory: each
// row's tokens distinct and increasing, as device_session.h asks) and laid out at
// device_session.h's offsets.
#include <cstring>
#include <string>
#include <utility>

#include "samplerd/device_session.h"

namespace samplerd {
namespace {

grpc::Status Invalid(const std::string& message) {
  return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, message);
}

// `values` (B entries, or none: `fill`) into the float array at `offset` of `out`.
void PutRows(const std::vector<float>& values, float fill, uint32_t m, uint64_t offset,
             std::vector<uint8_t>* out) {
  for (uint32_t r = 0; r < m; ++r) {
    const float v = r < values.size() ? values[r] : fill;
    std::memcpy(out->data() + offset + 4ull * r, &v, 4);
  }
}

// Copies `count` elements of a repeated field to `offset` of `out`.
template <typename Field>
void PutField(const Field& field, uint64_t offset, size_t elem, std::vector<uint8_t>* out) {
  for (int i = 0; i < field.size(); ++i) {
    const auto v = field.Get(i);
    std::memcpy(out->data() + offset + elem * static_cast<uint64_t>(i), &v, elem);
  }
}

// Row offsets [M + 1] from a message's B + 1 (rows past B empty), checked against `capacity`.
grpc::Status PutOffsets(const google::protobuf::RepeatedField<uint32_t>& offsets, int batch,
                        uint32_t m, uint32_t capacity, const char* what, uint64_t at,
                        std::vector<uint8_t>* out) {
  const uint32_t n = offsets.empty() ? 0 : offsets.Get(offsets.size() - 1);
  if (n > capacity) {
    return Invalid(std::string("expected at most ") + std::to_string(capacity) + " " + what +
                   " entries over all rows (the session's capacity), got " + std::to_string(n));
  }
  for (uint32_t r = 0; r <= m; ++r) {
    const uint32_t v = static_cast<int>(r) <= batch && !offsets.empty() ? offsets.Get(r) : n;
    std::memcpy(out->data() + at + 4ull * r, &v, 4);
  }
  return grpc::Status::OK;
}

}  // namespace

grpc::Status PackSessionProcessors(const DeviceSessionOptions& options, int batch,
                                   const SessionProcessorRows& rows, std::vector<uint8_t>* out) {
  const uint32_t m = options.max_batch;
  if (!options.processors) return Invalid("expected options with processors, got none");
  if (batch < 0 || static_cast<uint32_t>(batch) > m) {
    return Invalid("expected a batch in [0, max_batch " + std::to_string(m) + "], got " +
                   std::to_string(batch));
  }
  // A vector shorter than the batch would otherwise be padded with rows of no processors.
  const std::pair<const char*, size_t> sizes[] = {
      {"logit_bias", rows.logit_bias.size()},
      {"prompt_token_ids", rows.prompt_token_ids.size()},
      {"output_token_ids", rows.output_token_ids.size()},
      {"repetition_penalty", rows.repetition_penalty.size()},
      {"presence_penalty", rows.presence_penalty.size()},
      {"frequency_penalty", rows.frequency_penalty.size()}};
  for (const auto& [name, size] : sizes) {
    if (size != 0 && size != static_cast<size_t>(batch)) {
      return Invalid(std::string("expected SessionProcessorRows.") + name + " empty or of B = " +
                     std::to_string(batch) + " rows, got " + std::to_string(size));
    }
  }
  const uint32_t nb = options.logit_bias_capacity, nh = options.token_history_capacity;
  out->assign(samplerd_processors_bytes(m, nb, nh), 0);
  PutRows(rows.repetition_penalty, 1.0f, m, samplerd_processors_repetition_offset(m), out);
  PutRows(rows.presence_penalty, 0.0f, m, samplerd_processors_presence_offset(m), out);
  PutRows(rows.frequency_penalty, 0.0f, m, samplerd_processors_frequency_offset(m), out);

  v1::SampleRequest lists;  // the unary helpers build the sorted per-row lists
  std::vector<TokenBias> bias = rows.logit_bias;
  bias.resize(static_cast<size_t>(batch));
  grpc::Status status = SetLogitBias(bias, &lists);  // `lists` has no logits shape: OK
  if (!status.ok()) return status;
  std::vector<std::vector<int32_t>> prompt = rows.prompt_token_ids, output = rows.output_token_ids;
  prompt.resize(static_cast<size_t>(batch));
  output.resize(static_cast<size_t>(batch));
  status = SetTokenHistory(prompt, output, &lists);  // batch rows each: OK
  if (!status.ok()) return status;

  const v1::LogitBias& b = lists.logit_bias();
  status = PutOffsets(b.row_offsets(), batch, m, nb, "logit_bias",
                      samplerd_processors_bias_offsets_offset(m), out);
  if (!status.ok()) return status;
  PutField(b.token_ids(), samplerd_processors_bias_tokens_offset(m), 4, out);
  PutField(b.biases(), samplerd_processors_biases_offset(m, nb), 4, out);

  const v1::TokenHistory& h = lists.token_history();
  status = PutOffsets(h.row_offsets(), batch, m, nh, "token_history",
                      samplerd_processors_history_offsets_offset(m, nb), out);
  if (!status.ok()) return status;
  PutField(h.token_ids(), samplerd_processors_history_tokens_offset(m, nb), 4, out);
  PutField(h.output_counts(), samplerd_processors_output_counts_offset(m, nb, nh), 4, out);
  PutField(h.in_prompt(), samplerd_processors_in_prompt_offset(m, nb, nh), 1, out);
  return grpc::Status::OK;
}

}  // namespace samplerd
