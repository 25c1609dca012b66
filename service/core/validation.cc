#include "service/core/validation.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "service/core/model/status_macros.h"
#include "service/core/processors.h"
#include "service/core/regions/ipc_handle.h"

namespace samplerd::core {
namespace {

absl::Status Invalid(absl::string_view what, absl::string_view got) {
  return absl::InvalidArgumentError(absl::StrCat("expected ", what, ", got ", got));
}

// The shortest text (6 to 9 significant digits) that reads back as `v`: a value just past a
// bound must not print as the bound ("expected top_p in (0, 1], got 1" for 1.0000001).
std::string FloatText(float v) {
  if (std::isnan(v)) return "NaN";
  char text[32];
  for (int digits = 6; digits <= 9; ++digits) {
    std::snprintf(text, sizeof(text), "%.*g", digits, static_cast<double>(v));
    if (std::strtof(text, nullptr) == v) break;
  }
  return text;
}

// Checks one parameter set; `where` names it in messages ("params[3]").
absl::Status ValidateParams(const ParamsSpec& p, const std::string& where) {
  if (p.temperature.has_value()) {
    const float t = *p.temperature;
    if (!(t >= 0.0f) || std::isinf(t)) {
      return Invalid(absl::StrCat(where, ".temperature finite and >= 0"), FloatText(t));
    }
  }
  if (p.top_k < -1) {
    return Invalid(absl::StrCat(where, ".top_k >= -1 (0 or -1 disables)"), absl::StrCat(p.top_k));
  }
  if (p.top_p.has_value()) {
    const float tp = *p.top_p;
    if (!(tp > 0.0f && tp <= 1.0f)) {
      return Invalid(absl::StrCat(where, ".top_p in (0, 1]"), FloatText(tp));
    }
  }
  if (!(p.min_p >= 0.0f && p.min_p <= 1.0f)) {
    return Invalid(absl::StrCat(where, ".min_p in [0, 1]"), FloatText(p.min_p));
  }
  if (p.repetition_penalty.has_value()) {
    const float r = *p.repetition_penalty;
    if (!(r > 0.0f) || std::isinf(r)) {
      return Invalid(absl::StrCat(where, ".repetition_penalty finite and > 0 (1 is off)"),
                     FloatText(r));
    }
  }
  if (!(p.presence_penalty >= -2.0f && p.presence_penalty <= 2.0f)) {
    return Invalid(absl::StrCat(where, ".presence_penalty in [-2, 2]"),
                   FloatText(p.presence_penalty));
  }
  if (!(p.frequency_penalty >= -2.0f && p.frequency_penalty <= 2.0f)) {
    return Invalid(absl::StrCat(where, ".frequency_penalty in [-2, 2]"),
                   FloatText(p.frequency_penalty));
  }
  return absl::OkStatus();
}

kernels::RowParams ApplyDefaults(const ParamsSpec& p, uint64_t seed) {
  kernels::RowParams row;
  row.temperature = p.temperature.value_or(1.0f);
  row.top_k = p.top_k;
  row.top_p = p.top_p.value_or(1.0f);
  row.min_p = p.min_p;
  row.top_p_mode = p.top_p_mode;
  row.seed = seed;
  row.position = p.position;
  return row;
}

absl::Status ValidateShape(const SampleRequest& request, const Limits& limits) {
  if (request.shape.size() != 2) {
    // At most the first few dimensions: a status message travels in a header, and a shape of
    // thousands of dimensions echoed whole passed the client's header limit, which then
    // reported RESOURCE_EXHAUSTED instead of this error.
    constexpr size_t kShown = 4;
    const size_t shown = std::min(request.shape.size(), kShown);
    return Invalid(
        "logits.shape [B, V] (2 dimensions)",
        absl::StrCat("[", absl::StrJoin(request.shape.begin(), request.shape.begin() + shown, ", "),
                     request.shape.size() > kShown ? ", ..." : "", "] (", request.shape.size(),
                     " dimensions)"));
  }
  const int64_t batch = request.shape[0];
  const int64_t vocab = request.shape[1];
  if (batch < 1) return Invalid("batch size B >= 1", absl::StrCat(batch));
  if (vocab < 1) return Invalid("vocabulary size V >= 1", absl::StrCat(vocab));
  if (batch > limits.max_batch) {
    return absl::ResourceExhaustedError(absl::StrCat("expected batch size B <= ", limits.max_batch,
                                                     " (server limit), got ", batch));
  }
  if (vocab > limits.max_vocab) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "expected vocabulary size V <= ", limits.max_vocab, " (server limit), got ", vocab));
  }
  if (request.row_stride != 0 && request.row_stride < vocab) {
    return Invalid(absl::StrCat("logits.row_stride 0 or >= V = ", vocab),
                   absl::StrCat(request.row_stride));
  }
  // Bound the stride so that byte counts cannot overflow int64 (V is already bounded).
  if (request.row_stride > limits.max_vocab * 16) {
    return Invalid(absl::StrCat("logits.row_stride <= ", limits.max_vocab * 16),
                   absl::StrCat(request.row_stride));
  }
  return absl::OkStatus();
}

// Checks where the logits come from and go to, and the event handles (the regions themselves
// are checked when leased).
absl::Status ValidateSources(const SampleRequest& request) {
  if (request.has_inline_data && request.logits_region.has_value()) {
    return Invalid("one logits source (inline_data or region)", "both");
  }
  if (!request.has_inline_data && !request.logits_region.has_value()) {
    return Invalid("logits.inline_data or logits.region", "no logits data");
  }
  if (!request.ready_event.empty()) {
    RETURN_IF_ERROR(ParseIpcEventHandle(request.ready_event, "ready_event").status());
  }
  if (!request.done_event.empty()) {
    RETURN_IF_ERROR(ParseIpcEventHandle(request.done_event, "done_event").status());
    if (!request.output.has_value()) {
      return Invalid("an output region with done_event (the engine reads the tokens there)",
                     "done_event without output");
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<int64_t> ExpectedInlineBytes(const SampleRequest& request, const Limits& limits) {
  if (!request.dtype.has_value()) {
    return Invalid("logits.dtype DTYPE_FP32, DTYPE_FP16 or DTYPE_BF16", "DTYPE_UNSPECIFIED");
  }
  RETURN_IF_ERROR(ValidateShape(request, limits));
  const int64_t vocab = request.shape[1];
  return InlineBytes(*request.dtype, request.shape[0], vocab,
                     request.row_stride == 0 ? vocab : request.row_stride);
}

absl::StatusOr<ValidatedBatch> ValidateSampleRequest(const SampleRequest& request,
                                                     const Limits& limits,
                                                     absl::FunctionRef<uint64_t()> next_seed) {
  if (request.request_id.size() > static_cast<size_t>(limits.max_request_id_bytes)) {
    return Invalid(absl::StrCat("request_id of at most ", limits.max_request_id_bytes, " bytes"),
                   absl::StrCat(request.request_id.size(), " bytes"));
  }
  RETURN_IF_ERROR(ExpectedInlineBytes(request, limits).status());

  ValidatedBatch out;
  out.dtype = *request.dtype;
  out.batch = request.shape[0];
  out.vocab = request.shape[1];
  out.row_stride = request.row_stride == 0 ? out.vocab : request.row_stride;

  RETURN_IF_ERROR(ValidateSources(request));
  const int64_t want = InlineBytes(out.dtype, out.batch, out.vocab, out.row_stride);
  const int64_t got = static_cast<int64_t>(request.inline_data.size());
  // Region slices are checked against the region when it is leased (same byte count).
  if (request.has_inline_data && got != want) {
    return Invalid(
        absl::StrCat(want, " bytes of logits.inline_data for shape [", out.batch, ", ", out.vocab,
                     "]",
                     out.row_stride != out.vocab ? absl::StrCat(" with row_stride ", out.row_stride)
                                                 : std::string(),
                     " and ", kernels::DTypeSize(out.dtype), "-byte elements"),
        absl::StrCat(got, " bytes"));
  }

  const size_t n_params = request.params.size();
  if (n_params != 0 && n_params != 1 && n_params != static_cast<size_t>(out.batch)) {
    return Invalid(absl::StrCat("params with 1 entry (all rows) or B = ", out.batch, " entries"),
                   absl::StrCat(n_params, " entries"));
  }
  for (size_t i = 0; i < n_params; ++i) {
    RETURN_IF_ERROR(ValidateParams(request.params[i], absl::StrCat("params[", i, "]")));
  }
  auto check_per_row = [&out](const char* name, const std::vector<uint64_t>& values) {
    if (values.empty() || values.size() == static_cast<size_t>(out.batch)) {
      return absl::OkStatus();
    }
    return Invalid(absl::StrCat(name, " with 0 entries or B = ", out.batch, " entries"),
                   absl::StrCat(values.size(), " entries"));
  };
  RETURN_IF_ERROR(check_per_row("row_seeds", request.row_seeds));
  RETURN_IF_ERROR(check_per_row("row_positions", request.row_positions));

  if (request.logprobs.has_value()) {
    const int64_t top_n = request.logprobs->top_n;
    if (top_n < 0 || top_n > limits.max_top_logprobs) {
      return Invalid(absl::StrCat("logprobs.top_n in [0, ", limits.max_top_logprobs, "]"),
                     absl::StrCat(top_n));
    }
    out.top_logprobs = static_cast<int32_t>(top_n);
    out.logprob_source = request.logprobs->source;
  }

  // Parameters: broadcast stays broadcast only when the seed is shared explicitly; otherwise
  // every row gets its own server seed so that identical rows draw independently.
  const ParamsSpec kDefaults;
  const bool broadcast = n_params <= 1;
  const ParamsSpec& first = n_params == 0 ? kDefaults : request.params[0];
  // row_seeds / row_positions override per row, so they always expand to B entries.
  const bool per_row = !request.row_seeds.empty() || !request.row_positions.empty();
  out.seeds.resize(out.batch);
  if (broadcast && first.seed.has_value() && !per_row) {
    out.params.push_back(ApplyDefaults(first, *first.seed));
    for (auto& s : out.seeds) s = *first.seed;
  } else {
    out.params.reserve(out.batch);
    for (int64_t r = 0; r < out.batch; ++r) {
      const ParamsSpec& p = broadcast ? first : request.params[r];
      const uint64_t seed = !request.row_seeds.empty() ? request.row_seeds[r]
                            : p.seed.has_value()       ? *p.seed
                                                       : next_seed();
      out.params.push_back(ApplyDefaults(p, seed));
      if (!request.row_positions.empty()) out.params.back().position = request.row_positions[r];
      out.seeds[r] = seed;
    }
  }
  RETURN_IF_ERROR(ValidateProcessors(request, &out));
  return out;
}

}  // namespace samplerd::core
