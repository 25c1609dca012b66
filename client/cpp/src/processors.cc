// The logits processors of a SampleRequest from plain C++ values (samplerd/processors.h).
#include "samplerd/processors.h"

#include <algorithm>
#include <cstring>
#include <utility>

namespace samplerd {
namespace {

// Inline words are little-endian; a memcpy of host int32s is right on little-endian hosts only.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "inline words need a little-endian host");

// Appends the bytes of `values` (4-byte host values, little-endian here) to `out`.
template <typename Field>
void Append(const Field& values, std::vector<uint8_t>* out) {
  if (values.empty()) return;
  const auto* bytes = reinterpret_cast<const uint8_t*>(values.data());
  out->insert(out->end(), bytes, bytes + values.size() * 4);
}

grpc::Status Invalid(const std::string& message) {
  return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, message);
}

// The batch B of `request` when its logits' shape is set (MakeFp32Request, MakeRegionRequest),
// else -1.
int64_t BatchOf(const v1::SampleRequest& request) {
  return request.has_logits() && request.logits().shape_size() > 0 ? request.logits().shape(0) : -1;
}

// OK when a logit bias of `rows` rows fits a request of `batch` rows (< 0: not known yet, any
// count >= 0), else INVALID_ARGUMENT: a bias for another number of rows is malformed.
grpc::Status CheckBiasRows(int64_t rows, int64_t batch) {
  if (rows >= 0 && (batch < 0 || rows == batch)) return grpc::Status::OK;
  return Invalid("expected logit bias for B " +
                 (batch >= 0 ? "= " + std::to_string(batch) : std::string(">= 0")) + " rows, got " +
                 std::to_string(rows));
}

// The number of rows of a token history of `prompt` and `output` into *rows: the size of the
// vectors given (either may be empty: no tokens of it in any row). INVALID_ARGUMENT when a
// non-empty vector has another number of rows than the other one, or than `batch` when known
// (>= 0): a shorter vector would silently read as rows without tokens, a longer one be cut.
grpc::Status HistoryRows(const std::vector<std::vector<int32_t>>& prompt,
                         const std::vector<std::vector<int32_t>>& output, int64_t batch,
                         size_t* rows) {
  if (batch >= 0) {
    for (const auto& [name, ids] : {std::pair{"prompt", &prompt}, std::pair{"output", &output}}) {
      if (!ids->empty() && ids->size() != static_cast<uint64_t>(batch)) {
        return Invalid(std::string("expected ") + name + " token ids for B = " +
                       std::to_string(batch) + " rows, got " + std::to_string(ids->size()));
      }
    }
  } else if (!prompt.empty() && !output.empty() && prompt.size() != output.size()) {
    return Invalid("expected prompt and output token ids for the same number of rows, got " +
                   std::to_string(prompt.size()) + " and " + std::to_string(output.size()));
  }
  *rows = std::max(prompt.size(), output.size());
  return grpc::Status::OK;
}

// Writes the lists of `rows` rows of history into *out (an empty vector: no tokens of it in any
// row): each row's distinct tokens in increasing order, with their output count and
// whether the prompt has them.
void FillTokenHistory(const std::vector<std::vector<int32_t>>& prompt,
                      const std::vector<std::vector<int32_t>>& output, size_t rows,
                      v1::TokenHistory* out) {
  out->Clear();
  out->add_row_offsets(0);
  struct Entry {
    uint32_t output_count = 0;
    bool in_prompt = false;
  };
  for (size_t r = 0; r < rows; ++r) {
    std::map<int32_t, Entry> entries;  // ordered: increasing token ids
    if (r < prompt.size()) {
      for (const int32_t t : prompt[r]) entries[t].in_prompt = true;
    }
    if (r < output.size()) {
      for (const int32_t t : output[r]) ++entries[t].output_count;
    }
    for (const auto& [token, entry] : entries) {
      out->add_token_ids(token);
      out->add_output_counts(entry.output_count);
      out->add_in_prompt(entry.in_prompt);
    }
    out->add_row_offsets(static_cast<uint32_t>(out->token_ids_size()));
  }
}

// Sets *out to the lists of `rows`: each row's tokens in increasing order (TokenBias is ordered).
void FillLogitBias(const std::vector<TokenBias>& rows, v1::LogitBias* out) {
  out->Clear();
  out->add_row_offsets(0);
  for (const TokenBias& row : rows) {
    for (const auto& [token, bias] : row) {
      out->add_token_ids(token);
      out->add_biases(bias);
    }
    out->add_row_offsets(static_cast<uint32_t>(out->token_ids_size()));
  }
}

}  // namespace

void SetTokenBitmask(const int32_t* words, int64_t batch, int64_t vocab,
                     v1::SampleRequest* request) {
  std::string* data = request->mutable_token_bitmask()->mutable_inline_words();
  const int64_t count = std::max<int64_t>(batch, 0) * BitmaskWords(std::max<int64_t>(vocab, 0));
  data->resize(static_cast<size_t>(count) * sizeof(int32_t));
  if (count > 0 && words != nullptr) std::memcpy(data->data(), words, data->size());
}

void SetTokenBitmaskRegion(const std::string& region, uint64_t offset, v1::SampleRequest* request) {
  v1::RegionSlice* slice = request->mutable_token_bitmask()->mutable_region();
  slice->set_region(region);
  slice->set_offset(offset);
}

grpc::Status SetLogitBias(const std::vector<TokenBias>& rows, v1::SampleRequest* request) {
  const grpc::Status status = CheckBiasRows(static_cast<int64_t>(rows.size()), BatchOf(*request));
  if (!status.ok()) return status;
  FillLogitBias(rows, request->mutable_logit_bias());
  return grpc::Status::OK;
}

grpc::Status SetLogitBias(const TokenBias& bias, int64_t batch, v1::SampleRequest* request) {
  const grpc::Status status = CheckBiasRows(batch, BatchOf(*request));
  if (!status.ok()) return status;
  FillLogitBias(std::vector<TokenBias>(static_cast<size_t>(batch), bias),
                request->mutable_logit_bias());
  return grpc::Status::OK;
}

grpc::Status SetTokenHistory(const std::vector<std::vector<int32_t>>& prompt,
                             const std::vector<std::vector<int32_t>>& output,
                             v1::SampleRequest* request) {
  size_t rows = 0;
  const grpc::Status status = HistoryRows(prompt, output, BatchOf(*request), &rows);
  if (!status.ok()) return status;
  FillTokenHistory(prompt, output, rows, request->mutable_token_history());
  return grpc::Status::OK;
}

void SetLogitBiasRegion(const std::string& region, uint64_t offset, v1::SampleRequest* request) {
  v1::LogitBias* bias = request->mutable_logit_bias();
  bias->Clear();
  bias->mutable_region()->set_region(region);
  bias->mutable_region()->set_offset(offset);
}

void SetTokenHistoryRegion(const std::string& region, uint64_t offset, v1::SampleRequest* request) {
  v1::TokenHistory* history = request->mutable_token_history();
  history->Clear();
  history->mutable_region()->set_region(region);
  history->mutable_region()->set_offset(offset);
}

std::vector<uint8_t> PackLists(const v1::LogitBias& bias) {
  static_assert(sizeof(float) == 4, "biases are float32");
  std::vector<uint8_t> out;
  out.reserve(
      static_cast<size_t>(bias.row_offsets_size() + bias.token_ids_size() + bias.biases_size()) *
      4);
  Append(bias.row_offsets(), &out);
  Append(bias.token_ids(), &out);
  Append(bias.biases(), &out);
  return out;
}

std::vector<uint8_t> PackLists(const v1::TokenHistory& history) {
  std::vector<uint8_t> out;
  out.reserve(static_cast<size_t>(history.row_offsets_size() + history.token_ids_size() +
                                  history.output_counts_size()) *
                  4 +
              static_cast<size_t>(history.in_prompt_size()));
  Append(history.row_offsets(), &out);
  Append(history.token_ids(), &out);
  Append(history.output_counts(), &out);
  for (const bool in_prompt : history.in_prompt()) out.push_back(in_prompt ? 1 : 0);
  return out;
}

std::vector<uint8_t> PackLogitBias(const std::vector<TokenBias>& rows) {
  v1::LogitBias bias;
  FillLogitBias(rows, &bias);
  return PackLists(bias);
}

grpc::Status PackTokenHistory(const std::vector<std::vector<int32_t>>& prompt,
                              const std::vector<std::vector<int32_t>>& output,
                              std::vector<uint8_t>* out) {
  size_t rows = 0;
  const grpc::Status status = HistoryRows(prompt, output, /*batch=*/-1, &rows);
  if (!status.ok()) return status;
  v1::TokenHistory history;
  FillTokenHistory(prompt, output, rows, &history);
  *out = PackLists(history);
  return grpc::Status::OK;
}

}  // namespace samplerd
