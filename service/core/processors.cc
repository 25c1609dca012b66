// ValidateProcessors (processors.h): structure checks first (offsets, list lengths), then each
// entry in list order (token range, NaN biases), then duplicates per row, then the merge.
#include "service/core/processors.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/common/logits_processors.h"
#include "service/core/model/status_macros.h"

namespace samplerd::core {
namespace {

absl::Status Invalid(absl::string_view field, absl::string_view what, absl::string_view got) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": expected ", what, ", got ", got));
}

// row_offsets of a packed list of `size` entries over `batch` rows: B + 1 non-decreasing values
// from 0 to `size`.
absl::Status CheckOffsets(absl::string_view list, const std::vector<uint32_t>& offsets,
                          int64_t batch, size_t size) {
  const std::string field = absl::StrCat(list, ".row_offsets");
  if (offsets.size() != static_cast<size_t>(batch) + 1) {
    return Invalid(field, absl::StrCat("B + 1 = ", batch + 1, " entries"),
                   absl::StrCat(offsets.size(), " entries"));
  }
  if (offsets[0] != 0) return Invalid(absl::StrCat(field, "[0]"), "0", absl::StrCat(offsets[0]));
  for (int64_t r = 1; r <= batch; ++r) {
    if (offsets[r] < offsets[r - 1]) {
      return Invalid(
          absl::StrCat(field, "[", r, "]"),
          absl::StrCat("non-decreasing offsets, >= row_offsets[", r - 1, "] = ", offsets[r - 1]),
          absl::StrCat(offsets[r]));
    }
  }
  if (offsets[batch] != size) {
    return Invalid(absl::StrCat(field, "[", batch, "]"),
                   absl::StrCat("the length of ", list, ".token_ids, ", size),
                   absl::StrCat(offsets[batch]));
  }
  return absl::OkStatus();
}

absl::Status CheckLength(absl::string_view list, absl::string_view name, size_t size, size_t want) {
  if (size == want) return absl::OkStatus();
  return Invalid(absl::StrCat(list, ".", name),
                 absl::StrCat("one entry per token id, ", want, " entries"),
                 absl::StrCat(size, " entries"));
}

// The row of entry i, given valid offsets (rows may be empty).
int64_t RowOf(const std::vector<uint32_t>& offsets, size_t i) {
  return std::upper_bound(offsets.begin(), offsets.end(), static_cast<uint32_t>(i)) -
         offsets.begin() - 1;
}

// Token ids in [0, vocab), each entry of a row at most once. Fills `sorted` with each row's
// entry indices sorted by (token, index).
absl::Status CheckTokens(absl::string_view list, const std::vector<uint32_t>& offsets,
                         const std::vector<int32_t>& tokens, int64_t vocab,
                         std::vector<uint32_t>* sorted) {
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= vocab) {
      return Invalid(absl::StrCat(list, ".token_ids[", i, "] (row ", RowOf(offsets, i), ")"),
                     absl::StrCat("a token id in [0, ", vocab, ")"), absl::StrCat(tokens[i]));
    }
  }
  sorted->resize(tokens.size());
  std::iota(sorted->begin(), sorted->end(), 0u);
  for (size_t r = 0; r + 1 < offsets.size(); ++r) {
    const auto begin = sorted->begin() + offsets[r];
    const auto end = sorted->begin() + offsets[r + 1];
    std::sort(begin, end, [&tokens](uint32_t a, uint32_t b) {
      return tokens[a] < tokens[b] || (tokens[a] == tokens[b] && a < b);
    });
    // Report the repeat that comes first in the list, with its token's first index.
    uint32_t repeat = UINT32_MAX;
    uint32_t first = 0;
    for (auto it = begin; it != end && it + 1 != end; ++it) {
      if (tokens[*it] == tokens[*(it + 1)] && *(it + 1) < repeat) {
        repeat = *(it + 1);
        auto group = it;
        while (group != begin && tokens[*(group - 1)] == tokens[*it]) --group;
        first = *group;
      }
    }
    if (repeat != UINT32_MAX) {
      return Invalid(
          absl::StrCat(list, ".token_ids[", repeat, "] (row ", r, ")"),
          "each token at most once within a row (duplicates are rejected, not summed)",
          absl::StrCat("token ", tokens[repeat], " again (first at token_ids[", first, "])"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckBitmask(const TokenBitmaskSpec& mask, const ValidatedBatch& batch) {
  if (mask.has_inline_words && mask.region.has_value()) {
    return Invalid("token_bitmask", "one source (inline_words or region)", "both");
  }
  if (!mask.has_inline_words && !mask.region.has_value()) {
    return Invalid("token_bitmask", "inline_words or region", "neither");
  }
  if (mask.has_inline_words) {
    const int64_t want = batch.batch * batch.bitmask_words * 4;
    if (static_cast<int64_t>(mask.inline_words.size()) != want) {
      return Invalid("token_bitmask.inline_words",
                     absl::StrCat("B * ceil(V / 32) * 4 = ", want, " bytes for shape [",
                                  batch.batch, ", ", batch.vocab, "]"),
                     absl::StrCat(mask.inline_words.size(), " bytes"));
    }
  }
  return absl::OkStatus();
}

// The penalties of row r.
struct RowPenalties {
  float repetition = 1.0f;
  float presence = 0.0f;
  float frequency = 0.0f;
};

RowPenalties PenaltiesOf(const SampleRequest& request, int64_t r) {
  if (request.params.empty()) return {};
  const ParamsSpec& p = request.params[request.params.size() == 1 ? 0 : r];
  return {p.repetition_penalty.value_or(1.0f), p.presence_penalty, p.frequency_penalty};
}

// Merges the rows' bias entries (`bias_order`: indices sorted by token per row) and history
// entries into out->adjusts / adjust_offsets.
void Merge(const SampleRequest& request, const std::vector<uint32_t>& bias_order,
           const std::vector<uint32_t>& history_order, ValidatedBatch* out) {
  const LogitBiasSpec* bias = request.logit_bias ? &*request.logit_bias : nullptr;
  const TokenHistorySpec* history = request.token_history ? &*request.token_history : nullptr;
  std::vector<uint32_t> offsets(out->batch + 1, 0);
  std::vector<kernels::TokenAdjust> adjusts;
  for (int64_t r = 0; r < out->batch; ++r) {
    const RowPenalties pen = PenaltiesOf(request, r);
    size_t b = bias ? bias->row_offsets[r] : 0;
    const size_t b_end = bias ? bias->row_offsets[r + 1] : 0;
    size_t h = history ? history->row_offsets[r] : 0;
    const size_t h_end = history ? history->row_offsets[r + 1] : 0;
    while (b < b_end || h < h_end) {
      const int32_t bt = b < b_end ? bias->token_ids[bias_order[b]] : INT32_MAX;
      const int32_t ht = h < h_end ? history->token_ids[history_order[h]] : INT32_MAX;
      kernels::TokenAdjust a;
      a.token = std::min(bt, ht);
      if (bt == a.token) a.bias = bias->biases[bias_order[b++]];
      if (ht == a.token) {
        const uint32_t i = history_order[h++];
        // float32 exactly as written (DESIGN.md): the kernels read this value, never recompute.
        kernels::HistoryAdjust(history->output_counts[i], history->in_prompt[i] != 0,
                               pen.repetition, pen.presence, pen.frequency, &a);
      }
      if (!kernels::IsNoOpAdjust(a)) adjusts.push_back(a);
    }
    offsets[r + 1] = static_cast<uint32_t>(adjusts.size());
  }
  if (adjusts.empty()) return;
  out->adjust_offsets = std::move(offsets);
  out->adjusts = std::move(adjusts);
}

// A list that names a region must leave its repeated fields empty; until ReadProcessorLists
// has read it, it is pending.
template <typename Spec>
absl::Status CheckListSource(absl::string_view list, const std::optional<Spec>& spec,
                             bool has_fields, bool* pending) {
  if (!spec.has_value() || !spec->region.has_value() || spec->region_read) return absl::OkStatus();
  if (has_fields) {
    return Invalid(list, "one source (the repeated fields or region)", "both");
  }
  *pending = true;
  return absl::OkStatus();
}

// "logit_bias" or "logit_bias.region" for a list read from a region.
template <typename Spec>
std::string ListName(absl::string_view list, const Spec& spec) {
  return spec.region.has_value() ? absl::StrCat(list, ".region") : std::string(list);
}

}  // namespace

absl::Status ValidateProcessors(const SampleRequest& request, ValidatedBatch* out) {
  bool pending = false;
  if (request.logit_bias.has_value()) {
    const LogitBiasSpec& b = *request.logit_bias;
    RETURN_IF_ERROR(CheckListSource(
        "logit_bias", request.logit_bias,
        !b.row_offsets.empty() || !b.token_ids.empty() || !b.biases.empty(), &pending));
  }
  if (request.token_history.has_value()) {
    const TokenHistorySpec& h = *request.token_history;
    RETURN_IF_ERROR(CheckListSource("token_history", request.token_history,
                                    !h.row_offsets.empty() || !h.token_ids.empty() ||
                                        !h.output_counts.empty() || !h.in_prompt.empty(),
                                    &pending));
  }
  std::vector<uint32_t> bias_order;
  std::vector<uint32_t> history_order;
  if (request.logit_bias.has_value() && !pending) {
    const LogitBiasSpec& bias = *request.logit_bias;
    const std::string list = ListName("logit_bias", bias);
    RETURN_IF_ERROR(CheckOffsets(list, bias.row_offsets, out->batch, bias.token_ids.size()));
    RETURN_IF_ERROR(CheckLength(list, "biases", bias.biases.size(), bias.token_ids.size()));
    RETURN_IF_ERROR(CheckTokens(list, bias.row_offsets, bias.token_ids, out->vocab, &bias_order));
    for (size_t i = 0; i < bias.biases.size(); ++i) {
      if (std::isnan(bias.biases[i])) {
        return Invalid(
            absl::StrCat(list, ".biases[", i, "] (row ", RowOf(bias.row_offsets, i), ")"),
            "a bias that is not NaN (+-inf allowed)", "NaN");
      }
    }
  }
  if (request.token_history.has_value() && !pending) {
    const TokenHistorySpec& history = *request.token_history;
    const std::string list = ListName("token_history", history);
    const size_t n = history.token_ids.size();
    RETURN_IF_ERROR(CheckOffsets(list, history.row_offsets, out->batch, n));
    RETURN_IF_ERROR(CheckLength(list, "output_counts", history.output_counts.size(), n));
    RETURN_IF_ERROR(CheckLength(list, "in_prompt", history.in_prompt.size(), n));
    RETURN_IF_ERROR(
        CheckTokens(list, history.row_offsets, history.token_ids, out->vocab, &history_order));
    for (size_t i = 0; i < n; ++i) {
      if (history.in_prompt[i] > 1) {  // a region's uint8; inline bools are 0 or 1
        return Invalid(
            absl::StrCat(list, ".in_prompt[", i, "] (row ", RowOf(history.row_offsets, i), ")"),
            "0 or 1", absl::StrCat(history.in_prompt[i]));
      }
    }
  }
  if (request.token_bitmask.has_value()) {
    out->bitmask_words = (out->vocab + 31) / 32;
    RETURN_IF_ERROR(CheckBitmask(*request.token_bitmask, *out));
  }
  // Lists in regions are checked, and everything merged, once they are read.
  if (pending) return absl::OkStatus();
  Merge(request, bias_order, history_order, out);
  return absl::OkStatus();
}

}  // namespace samplerd::core
