// A plane runner serves one open device session: it takes the engine's steps from the control
// block, samples them and writes the outputs, following proto/samplerd/v1/device_session.h.
//
// Two implementations: host_plane.h (CPU threads poll host shm; every build) and gpu_plane.h
// (a GPU stream waits on device memory; GPU builds). SessionManager owns them.
#ifndef SAMPLERD_SERVICE_CORE_SESSION_PLANE_RUNNER_H_
#define SAMPLERD_SERVICE_CORE_SESSION_PLANE_RUNNER_H_

#include <cstdint>
#include <functional>

#include "absl/status/status.h"

namespace samplerd::core {

class PlaneRunner {
 public:
  // Called at most once, from the runner's own thread, when the runner can no longer serve
  // (for example a GPU error). The session is then ended by its owner. Must not block.
  using FaultCallback = std::function<void(const absl::Status&)>;

  // Destruction implies Stop().
  virtual ~PlaneRunner() = default;

  // Ends the session: takes no further step, completes a pending or future engine wait with
  // step_status SAMPLERD_STEP_ABORTED (writes step_status, then done = SAMPLERD_DONE), releases
  // the runner's own pending GPU waits, and returns once the runner no longer touches the
  // buffers. Idempotent; callable from any thread except the runner's own. Bounded: returns
  // within ~100 ms (a step in progress finishes first).
  virtual void Stop() = 0;

  // Steps completed so far. Thread-safe.
  virtual uint64_t steps() const = 0;
};

}  // namespace samplerd::core

#endif  // SAMPLERD_SERVICE_CORE_SESSION_PLANE_RUNNER_H_
