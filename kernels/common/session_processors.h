// A device session's logits processors, one row at a time: the checks of
// proto/samplerd/v1/device_session.h ("processors") and the merge of a row's bias and history
// entries into the sorted TokenAdjust list the samplers take (SampleArgs::adjusts).
//
// Shared by the host plane (service/core/session/host_plane.cc, on the CPU) and the GPU plane
// (kernels/gpu/session_step.hip, one thread per row), so that both planes accept the same rows
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

// Whether `row`'s processors follow every rule of device_session.h: penalties in range
// (repetition finite and > 0, presence and frequency in [-2, 2], as SamplingParams), offsets
// in order and within the capacities, token ids in [0, vocab) and strictly increasing, no NaN
// bias, in_prompt 0 or 1. Written so that NaN fails every comparison. Reads the row's entries
// once each.
SAMPLERD_HOST_DEVICE inline bool SessionRowValid(const SessionProcessors& p, uint32_t row,
                                                 int64_t vocab) {
  const float r = p.repetition[row];
  const float presence = p.presence[row];
  const float frequency = p.frequency[row];
  if (!(r > 0.0f && r < __builtin_huge_valf())) return false;
  if (!(presence >= -2.0f && presence <= 2.0f && frequency >= -2.0f && frequency <= 2.0f)) {
    return false;
  }
  const uint32_t b0 = p.bias_offsets[row], b1 = p.bias_offsets[row + 1];
  if (b0 > b1 || b1 > p.bias_capacity) return false;
  int64_t last = -1;
  for (uint32_t i = b0; i < b1; ++i) {
    const int64_t t = p.bias_tokens[i];
    if (t <= last || t >= vocab) return false;  // last >= -1: also t >= 0
    if (p.biases[i] != p.biases[i]) return false;
    last = t;
  }
  const uint32_t h0 = p.history_offsets[row], h1 = p.history_offsets[row + 1];
  if (h0 > h1 || h1 > p.history_capacity) return false;
  last = -1;
  for (uint32_t i = h0; i < h1; ++i) {
    const int64_t t = p.history_tokens[i];
    if (t <= last || t >= vocab) return false;
    if (p.in_prompt[i] > 1) return false;
    last = t;
  }
  return true;
}

// Merges a valid row's bias and history entries (both sorted) into TokenAdjust entries sorted
// by token, one per token, dropping those that change nothing (as SampleRequest's merge does).
// Writes them to `out` unless it is null; returns how many there are (<= the row's bias plus
// history entries).
SAMPLERD_HOST_DEVICE inline uint32_t MergeSessionRow(const SessionProcessors& p, uint32_t row,
                                                     TokenAdjust* out) {
  const float repetition = p.repetition[row];
  const float presence = p.presence[row];
  const float frequency = p.frequency[row];
  uint32_t b = p.bias_offsets[row];
  const uint32_t b_end = p.bias_offsets[row + 1];
  uint32_t h = p.history_offsets[row];
  const uint32_t h_end = p.history_offsets[row + 1];
  uint32_t n = 0;
  while (b < b_end || h < h_end) {
    const int32_t bt = b < b_end ? p.bias_tokens[b] : INT32_MAX;
    const int32_t ht = h < h_end ? p.history_tokens[h] : INT32_MAX;
    TokenAdjust a;
    a.token = bt < ht ? bt : ht;
    if (bt == a.token) a.bias = p.biases[b++];
    if (ht == a.token) {
      HistoryAdjust(p.output_counts[h], p.in_prompt[h] != 0, repetition, presence, frequency, &a);
      ++h;
    }
    if (IsNoOpAdjust(a)) continue;
    if (out != nullptr) out[n] = a;
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
