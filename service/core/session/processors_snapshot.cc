#include "service/core/session/processors_snapshot.h"

#include <algorithm>

namespace samplerd::core {
namespace {

template <typename T>
void CopyRange(const T* from, uint32_t begin, uint32_t end, std::vector<T>& to) {
  std::copy(from + begin, from + end, to.begin() + begin);
}

// Grows `v` to at least `n` entries (zero-filled), doubling but never past `capacity`, so that
// a session's copies reach the entries its steps use in a few allocations.
template <typename T>
void GrowTo(std::vector<T>& v, uint32_t n, uint32_t capacity) {
  if (n <= v.size()) return;
  const size_t size = std::min<size_t>(capacity, std::max<size_t>(n, 2 * v.size()));
  v.reserve(size);  // exactly `size`: resize alone could double past the capacity
  v.resize(size);
}

}  // namespace

SessionProcessorsSnapshot::SessionProcessorsSnapshot(const kernels::SessionProcessors& shared,
                                                     uint32_t max_batch)
    : repetition_(max_batch),
      presence_(max_batch),
      frequency_(max_batch),
      bias_offsets_(max_batch + 1),
      history_offsets_(max_batch + 1) {
  view_.repetition = repetition_.data();
  view_.presence = presence_.data();
  view_.frequency = frequency_.data();
  view_.bias_offsets = bias_offsets_.data();
  view_.history_offsets = history_offsets_.data();
  view_.bias_capacity = shared.bias_capacity;
  view_.history_capacity = shared.history_capacity;
  PointAtEntries();
}

void SessionProcessorsSnapshot::PointAtEntries() {
  view_.bias_tokens = bias_tokens_.data();
  view_.biases = biases_.data();
  view_.history_tokens = history_tokens_.data();
  view_.output_counts = output_counts_.data();
  view_.in_prompt = in_prompt_.data();
}

void SessionProcessorsSnapshot::GrowEntries(uint32_t bias, uint32_t history) {
  if (bias <= bias_tokens_.size() && history <= history_tokens_.size()) return;
  GrowTo(bias_tokens_, bias, view_.bias_capacity);
  GrowTo(biases_, bias, view_.bias_capacity);
  GrowTo(history_tokens_, history, view_.history_capacity);
  GrowTo(output_counts_, history, view_.history_capacity);
  GrowTo(in_prompt_, history, view_.history_capacity);
  PointAtEntries();
}

size_t SessionProcessorsSnapshot::entry_bytes() const {
  return bias_tokens_.capacity() * sizeof(int32_t) + biases_.capacity() * sizeof(float) +
         history_tokens_.capacity() * sizeof(int32_t) +
         output_counts_.capacity() * sizeof(uint32_t) + in_prompt_.capacity() * sizeof(uint8_t);
}

const kernels::SessionProcessors& SessionProcessorsSnapshot::Take(
    const kernels::SessionProcessors& shared, uint32_t batch) {
  CopyRange(shared.repetition, 0, batch, repetition_);
  CopyRange(shared.presence, 0, batch, presence_);
  CopyRange(shared.frequency, 0, batch, frequency_);
  CopyRange(shared.bias_offsets, 0, batch + 1, bias_offsets_);
  CopyRange(shared.history_offsets, 0, batch + 1, history_offsets_);
  for (uint32_t row = 0; row < batch; ++row) {
    if (!kernels::SessionRowHeaderValid(view_, row)) continue;  // bounds the ranges below
    const uint32_t b0 = bias_offsets_[row], b1 = bias_offsets_[row + 1];
    const uint32_t h0 = history_offsets_[row], h1 = history_offsets_[row + 1];
    GrowEntries(b1, h1);  // within the capacities: the header is valid
    CopyRange(shared.bias_tokens, b0, b1, bias_tokens_);
    CopyRange(shared.biases, b0, b1, biases_);
    CopyRange(shared.history_tokens, h0, h1, history_tokens_);
    CopyRange(shared.output_counts, h0, h1, output_counts_);
    CopyRange(shared.in_prompt, h0, h1, in_prompt_);
  }
  return view_;
}

}  // namespace samplerd::core
