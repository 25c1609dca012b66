// A device session's processors rows, copied out of the engine's shared memory before the host
// plane checks and merges them (host_plane.cc).
//
// The engine can write its processors buffer while a step runs (a bug on its side, or an
// attack). Checking the shared memory and then reading it again lets such a write past the
// checks: a token id changed after SessionRowValid indexed the sampler's row buffer, and an
// offset changed between the count and the merge overran the merged list. Every read of a
// step's processors goes to this copy instead, which no one else writes.
//
// The copy holds the entries the steps have used so far, not the capacities: it grows (at
// Take) to the highest offset a valid row named, never past the capacities, and never shrinks.
// SessionManager bounds the capacities at open (--max_message_bytes); allocated whole, a
// session announcing 100M history entries over a sparse shm object zero-filled 900 MB of
// server memory at open (redteam25 F2).
#ifndef SAMPLERD_SERVICE_CORE_SESSION_PROCESSORS_SNAPSHOT_H_
#define SAMPLERD_SERVICE_CORE_SESSION_PROCESSORS_SNAPSHOT_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/common/session_processors.h"

namespace samplerd::core {

class SessionProcessorsSnapshot {
 public:
  // Room for `max_batch` rows' penalties and offsets; no entries yet (Take grows them, up to the
  // capacities of `shared`).
  SessionProcessorsSnapshot(const kernels::SessionProcessors& shared, uint32_t max_batch);

  // Copies rows [0, batch) of `shared` (batch <= max_batch): the penalties, the offsets, and
  // the entries of each row whose header is valid (SessionRowHeaderValid on the copy); a row
  // whose header is not keeps no entries and still fails that check. Returns the copy, laid out
  // as `shared` (the same indices and capacities), valid until the next Take.
  // Allocates room for the entries of valid rows as it meets them (an allocation only when a
  // row reaches past every earlier step's rows).
  const kernels::SessionProcessors& Take(const kernels::SessionProcessors& shared, uint32_t batch);

  // Bytes allocated for entries (the copy's high-water mark), for tests.
  size_t entry_bytes() const;

 private:
  // Grows the entry arrays to at least `bias` and `history` entries (at most the capacities).
  void GrowEntries(uint32_t bias, uint32_t history);
  // Points view_ at the entry arrays (after they move).
  void PointAtEntries();

  std::vector<float> repetition_, presence_, frequency_;
  std::vector<uint32_t> bias_offsets_, history_offsets_;
  std::vector<int32_t> bias_tokens_, history_tokens_;
  std::vector<float> biases_;
  std::vector<uint32_t> output_counts_;
  std::vector<uint8_t> in_prompt_;
  kernels::SessionProcessors view_;
};

}  // namespace samplerd::core

#endif  // SAMPLERD_SERVICE_CORE_SESSION_PROCESSORS_SNAPSHOT_H_
