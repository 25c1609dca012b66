// The logits processors of a SampleRequest from plain C++ values (samplerd/processors.h).
#include "samplerd/processors.h"

#include <algorithm>
#include <cstring>

namespace samplerd {
namespace {

// Inline words are little-endian; a memcpy of host int32s is right on little-endian hosts only.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "inline words need a little-endian host");

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

}  // namespace samplerd
