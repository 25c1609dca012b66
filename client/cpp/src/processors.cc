// The logits processors of a SampleRequest from plain C++ values (samplerd/processors.h).
#include "samplerd/processors.h"

#include <algorithm>
#include <cstring>

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

void SetLogitBias(const std::vector<TokenBias>& rows, v1::SampleRequest* request) {
  v1::LogitBias* out = request->mutable_logit_bias();
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

void SetLogitBias(const TokenBias& bias, int64_t batch, v1::SampleRequest* request) {
  SetLogitBias(std::vector<TokenBias>(static_cast<size_t>(std::max<int64_t>(batch, 0)), bias),
               request);
}

void SetTokenHistory(const std::vector<std::vector<int32_t>>& prompt,
                     const std::vector<std::vector<int32_t>>& output, v1::SampleRequest* request) {
  v1::TokenHistory* out = request->mutable_token_history();
  out->Clear();
  out->add_row_offsets(0);
  const size_t rows = std::max(prompt.size(), output.size());
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
  v1::SampleRequest request;
  SetLogitBias(rows, &request);
  return PackLists(request.logit_bias());
}

std::vector<uint8_t> PackTokenHistory(const std::vector<std::vector<int32_t>>& prompt,
                                      const std::vector<std::vector<int32_t>>& output) {
  v1::SampleRequest request;
  SetTokenHistory(prompt, output, &request);
  return PackLists(request.token_history());
}

}  // namespace samplerd
