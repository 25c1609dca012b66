// The host plane: a device session whose buffers are host shared memory. A poller thread spins
// on the doorbell (then backs off to short sleeps when the engine is idle), samples the step
// with the fast multi-threaded CPU sampler (kernels/cpu_fast, tested against the kernels/cpu
// oracle) and writes the outputs and the done flag. The GPU never runs anything for samplerd,
// so the engine's GPU never switches context (measured: docs/DEVICE_SESSIONS.md).
#ifndef SAMPLERD_SERVICE_CORE_SESSION_HOST_PLANE_H_
#define SAMPLERD_SERVICE_CORE_SESSION_HOST_PLANE_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "service/core/session/plane_runner.h"
#include "service/core/session/session_spec.h"

namespace samplerd::core {

struct HostPlaneOptions {
  // CPU threads that sample one step (rows, or chunks of a row when B is small); 0 = one per
  // core, at most 8.
  int threads = 0;
  // How long the poller spins after the last step before it falls back to sleeping polls
  // (sleep_us apart). Spinning costs a core; sleeping adds up to sleep_us to a step.
  int spin_us = 20000;
  int sleep_us = 50;
};

// The bytes a host-plane session of `spec`'s shape reserves for its copy of a full step's logits
// (max_batch x vocab elements of its dtype; the row stride's padding is not copied). Reserved
// by StartHostPlane; SessionManager sums them against --max_host_session_bytes.
uint64_t HostSessionBytes(const SessionSpec& spec);

// Starts serving `spec` (plane kHost; host pointers). Errors: INVALID_ARGUMENT for a spec that
// is not a host-plane spec; RESOURCE_EXHAUSTED when threads cannot be started.
absl::StatusOr<std::unique_ptr<PlaneRunner>> StartHostPlane(SessionSpec spec,
                                                            const HostPlaneOptions& options,
                                                            PlaneRunner::FaultCallback on_fault);

}  // namespace samplerd::core

#endif  // SAMPLERD_SERVICE_CORE_SESSION_HOST_PLANE_H_
