// A device session's logits processors, one row at a time: the checks of
// proto/samplerd/v1/device_session.h ("processors") and the merge of a row's bias and history
// entries into the sorted TokenAdjust list the samplers take (SampleArgs::adjusts): the whole
// row sequentially (SessionRowValid, MergeSessionRow), or entry by entry for the GPU plane's
// parallel version (the header and entry checks, SessionLowerBound, SessionAdjust).
//
// Shared by the host plane (service/core/session/host_plane.cc, on the CPU) and the GPU plane
// (kernels/gpu/session_step.hip, a block per row), so that both planes accept the same rows
// and build bit-identical adjusts. The per-entry arithmetic is HistoryAdjust
// (logits_processors.h), the same as SampleRequest's merge (service/core/processors.cc).
//
// Included from host and device code: plain C++, no standard-library containers.
#ifndef SAMPLERD_KERNELS_COMMON_SESSION_PROCESSORS_H_
#define SAMPLERD_KERNELS_COMMON_SESSION_PROCESSORS_H_

#include <cstdint>

#include "kernels/common/host_device.h"
#include "kernels/common/logits_processors.h"
#include "kernels/common/sampling_types.h"
#include "proto/samplerd/v1/device_session.h"

namespace samplerd::kernels {

// The arrays of a processors buffer (device_session.h), resolved for (M, NB, NH).
struct SessionProcessors {
  const float* repetition = nullptr;          // [M]
  const float* presence = nullptr;            // [M]
  const float* frequency = nullptr;           // [M]
  const uint32_t* bias_offsets = nullptr;     // [M + 1]
  const int32_t* bias_tokens = nullptr;       // [NB]
  const float* biases = nullptr;              // [NB]
  const uint32_t* history_offsets = nullptr;  // [M + 1]
  const int32_t* history_tokens = nullptr;    // [NH]
  const uint32_t* output_counts = nullptr;    // [NH]
  const uint8_t* in_prompt = nullptr;         // [NH]
  uint32_t bias_capacity = 0;                 // NB
  uint32_t history_capacity = 0;              // NH
};

// The arrays of the processors buffer at `base` (host code: device_session.h's offset functions
// are host functions; the pointers may be device addresses).
inline SessionProcessors ResolveSessionProcessors(const uint8_t* base, uint32_t m, uint32_t nb,
                                                  uint32_t nh) {
  SessionProcessors p;
  p.repetition = reinterpret_cast<const float*>(base + samplerd_processors_repetition_offset(m));
  p.presence = reinterpret_cast<const float*>(base + samplerd_processors_presence_offset(m));
  p.frequency = reinterpret_cast<const float*>(base + samplerd_processors_frequency_offset(m));
  p.bias_offsets =
      reinterpret_cast<const uint32_t*>(base + samplerd_processors_bias_offsets_offset(m));
  p.bias_tokens =
      reinterpret_cast<const int32_t*>(base + samplerd_processors_bias_tokens_offset(m));
  p.biases = reinterpret_cast<const float*>(base + samplerd_processors_biases_offset(m, nb));
  p.history_offsets =
      reinterpret_cast<const uint32_t*>(base + samplerd_processors_history_offsets_offset(m, nb));
  p.history_tokens =
      reinterpret_cast<const int32_t*>(base + samplerd_processors_history_tokens_offset(m, nb));
  p.output_counts =
      reinterpret_cast<const uint32_t*>(base + samplerd_processors_output_counts_offset(m, nb, nh));
  p.in_prompt = base + samplerd_processors_in_prompt_offset(m, nb, nh);
  p.bias_capacity = nb;
  p.history_capacity = nh;
  return p;
}

// A row's header: its penalties and both lists' offsets, as read once. The GPU plane checks
// and then uses one copy (an engine that rewrites its buffer during a step must not make the
// step read entries other than those it checked the bounds of).
struct SessionRowHeader {
  float repetition, presence, frequency;
  uint32_t b0, b1, h0, h1;  // bias entries [b0, b1), history entries [h0, h1)
};

SAMPLERD_HOST_DEVICE inline SessionRowHeader ReadSessionRowHeader(const SessionProcessors& p,
                                                                  uint32_t row) {
  return SessionRowHeader{p.repetition[row],         p.presence[row],
                          p.frequency[row],          p.bias_offsets[row],
                          p.bias_offsets[row + 1],   p.history_offsets[row],
                          p.history_offsets[row + 1]};
}

// Whether a header's penalties are in range (repetition finite and > 0, presence and frequency
// in [-2, 2], as SamplingParams) and both lists' offsets are in order within the capacities.
// Written so that NaN fails every comparison.
SAMPLERD_HOST_DEVICE inline bool SessionRowHeaderValid(const SessionRowHeader& h,
                                                       const SessionProcessors& p) {
  if (!(h.repetition > 0.0f && h.repetition < __builtin_huge_valf())) return false;
  if (!(h.presence >= -2.0f && h.presence <= 2.0f && h.frequency >= -2.0f && h.frequency <= 2.0f)) {
    return false;
  }
  return h.b0 <= h.b1 && h.b1 <= p.bias_capacity && h.h0 <= h.h1 && h.h1 <= p.history_capacity;
}

// Whether `row`'s header is valid (above). Check it before reading any entry of the row.
SAMPLERD_HOST_DEVICE inline bool SessionRowHeaderValid(const SessionProcessors& p, uint32_t row) {
  return SessionRowHeaderValid(ReadSessionRowHeader(p, row), p);
}

// Whether bias entry i of a row whose entries start at `begin` has a token in [0, vocab) above
// the previous entry's and a bias that is not NaN (+-inf are fine).
SAMPLERD_HOST_DEVICE inline bool SessionBiasEntryValid(const SessionProcessors& p, uint32_t i,
                                                       uint32_t begin, int64_t vocab) {
  const int32_t t = p.bias_tokens[i];
  return t >= 0 && t < vocab && (i == begin || p.bias_tokens[i - 1] < t) &&
         p.biases[i] == p.biases[i];
}

// Whether history entry i of a row whose entries start at `begin` has a token in [0, vocab)
// above the previous entry's and an in_prompt of 0 or 1.
SAMPLERD_HOST_DEVICE inline bool SessionHistoryEntryValid(const SessionProcessors& p, uint32_t i,
                                                          uint32_t begin, int64_t vocab) {
  const int32_t t = p.history_tokens[i];
  return t >= 0 && t < vocab && (i == begin || p.history_tokens[i - 1] < t) && p.in_prompt[i] <= 1;
}

// Whether `row`'s processors follow every rule of device_session.h: the header, then each entry
// (the GPU plane checks the entries of a row in parallel with the same functions).
SAMPLERD_HOST_DEVICE inline bool SessionRowValid(const SessionProcessors& p, uint32_t row,
                                                 int64_t vocab) {
  if (!SessionRowHeaderValid(p, row)) return false;
  const uint32_t b0 = p.bias_offsets[row], b1 = p.bias_offsets[row + 1];
  for (uint32_t i = b0; i < b1; ++i) {
    if (!SessionBiasEntryValid(p, i, b0, vocab)) return false;
  }
  const uint32_t h0 = p.history_offsets[row], h1 = p.history_offsets[row + 1];
  for (uint32_t i = h0; i < h1; ++i) {
    if (!SessionHistoryEntryValid(p, i, h0, vocab)) return false;
  }
  return true;
}

// The index of the first token >= t in the sorted tokens[begin, end) (end when none).
SAMPLERD_HOST_DEVICE inline uint32_t SessionLowerBound(const int32_t* tokens, uint32_t begin,
                                                       uint32_t end, int32_t t) {
  while (begin < end) {
    const uint32_t mid = begin + (end - begin) / 2;
    if (tokens[mid] < t) {
      begin = mid + 1;
    } else {
      end = mid;
    }
  }
  return begin;
}

constexpr uint32_t kNoEntry = 0xffffffffu;

// The merged TokenAdjust of one token of a row whose penalties are `h`'s: bias entry `bias` and
// history entry `history` (either kNoEntry, not both), with Sample's arithmetic (HistoryAdjust).
SAMPLERD_HOST_DEVICE inline TokenAdjust SessionAdjust(const SessionProcessors& p,
                                                      const SessionRowHeader& h, uint32_t bias,
                                                      uint32_t history) {
  TokenAdjust a;
  if (bias != kNoEntry) {
    a.token = p.bias_tokens[bias];
    a.bias = p.biases[bias];
  }
  if (history != kNoEntry) {
    a.token = p.history_tokens[history];
    HistoryAdjust(p.output_counts[history], p.in_prompt[history] != 0, h.repetition, h.presence,
                  h.frequency, &a);
  }
  return a;
}

// As above, with `row`'s penalties read from the buffer.
SAMPLERD_HOST_DEVICE inline TokenAdjust SessionAdjust(const SessionProcessors& p, uint32_t row,
                                                      uint32_t bias, uint32_t history) {
  SessionRowHeader h{};
  h.repetition = p.repetition[row];
  h.presence = p.presence[row];
  h.frequency = p.frequency[row];
  return SessionAdjust(p, h, bias, history);
}

// Merges a valid row's bias and history entries (both sorted) into TokenAdjust entries sorted
// by token, one per token of the union. Entries that change nothing are kept (a bias of 0 and
// repetition 1 leave every logit as it is, -0 aside), so that a row's count is the size of the
// union, which the GPU plane computes in parallel. Writes them to `out` unless it is null;
// returns how many there are.
SAMPLERD_HOST_DEVICE inline uint32_t MergeSessionRow(const SessionProcessors& p, uint32_t row,
                                                     TokenAdjust* out) {
  uint32_t b = p.bias_offsets[row];
  const uint32_t b_end = p.bias_offsets[row + 1];
  uint32_t h = p.history_offsets[row];
  const uint32_t h_end = p.history_offsets[row + 1];
  uint32_t n = 0;
  while (b < b_end || h < h_end) {
    const int32_t bt = b < b_end ? p.bias_tokens[b] : INT32_MAX;
    const int32_t ht = h < h_end ? p.history_tokens[h] : INT32_MAX;
    const uint32_t bias = bt <= ht ? b++ : kNoEntry;
    const uint32_t history = ht <= bt ? h++ : kNoEntry;
    if (out != nullptr) out[n] = SessionAdjust(p, row, bias, history);
    ++n;
  }
  return n;
}

// Whether a valid row's `n` merged entries fit after the `before` entries of the valid rows
// above it: all rows' entries together may not exceed NB + NH. Rows' ranges overlap only where
// some row's offsets decrease (that row is invalid), so this rejects only rows next to such a
// row, and only when their entries would overrun the merged list's fixed size.
SAMPLERD_HOST_DEVICE inline bool SessionEntriesFit(uint64_t before, uint32_t n,
                                                   const SessionProcessors& p) {
  return before + n <= uint64_t{p.bias_capacity} + p.history_capacity;
}

}  // namespace samplerd::kernels

#endif  // SAMPLERD_KERNELS_COMMON_SESSION_PROCESSORS_H_
