// Validation of a request's logits processors (logit bias, token history, allowed-token
// bitmask; docs/DESIGN.md "Logits processors") and their merge into the per-row TokenAdjust
// entries the backends apply (kernels/common/logits_processors.h).
#ifndef SAMPLERD_SERVICE_CORE_PROCESSORS_H_
#define SAMPLERD_SERVICE_CORE_PROCESSORS_H_

#include "absl/status/status.h"
#include "service/core/model/request.h"
#include "service/core/model/validated_batch.h"

namespace samplerd::core {

// Checks request.logit_bias, token_history and token_bitmask against out->batch and out->vocab
// (set, like the rest of `out`, by ValidateSampleRequest; the penalties themselves are checked
// with the other parameters) and fills out->adjust_offsets, out->adjusts and out->bitmask_words.
//
// Per row and token, the bias (0 if the row's bias list lacks the token) and the row's
// penalties on its history entry become one kernels::TokenAdjust: repetition is the row's
// repetition_penalty for a token seen in the prompt or the output, else 1; penalty is
// frequency * float(count) + presence * (count > 0), in float32. Entries that change nothing
// (bias 0, repetition 1, penalty 0) are dropped; when no row has an entry, both vectors stay
// empty. Entries are sorted by token within a row.
//
// A bias list or history that names a region (LogitBias.region, TokenHistory.region) and has
// not been read yet is pending: only its source is checked (its repeated fields must be
// empty), every other list waits too, and nothing is merged. The core then reads the lists
// (ReadProcessorLists, regions/request_io.h) and calls this again, which checks them exactly
// as inline lists, naming them "<list>.region.<field>".
//
// Errors, all INVALID_ARGUMENT "<field>[i] (row r): expected X, got Y": a list with both a
// region and repeated fields; offsets that are not B + 1 non-decreasing values from 0 to the
// list's length; parallel lists of different lengths; token ids outside [0, V); a token twice
// within a row's bias list or history; a NaN bias; an in_prompt other than 0 or 1; a bitmask
// with no source or two, or inline words that are not B * ceil(V / 32) * 4 bytes (a region
// slice is checked when it is leased: BindSampleIo).
absl::Status ValidateProcessors(const SampleRequest& request, ValidatedBatch* out);

}  // namespace samplerd::core

#endif  // SAMPLERD_SERVICE_CORE_PROCESSORS_H_
