// The GPU plane: a device session whose logits, params and outputs are GPU IPC memory on the
// server's GPU and whose control block is host shm. A feeder thread polls the doorbell on the
// host (spinning, then sleeping when the engine is idle), resets it and enqueues the step on
// the session's own non-blocking stream: validate batch and rows on the device, sample
// (kernels/gpu), write the outputs, step_status and steps_done, then done = DONE with a fenced
// stream write to the control block's registered host pages.
//
// The server's streams never wait on the engine (no stream wait on the doorbell): a stream
// parked in such a wait would block every device-wide synchronisation of the server process
// (cudaFree, IPC opens, other sessions' and unary requests' work) until the engine rang.
//
// Only in GPU builds (SAMPLERD_HAVE_GPU).
#ifndef SAMPLERD_SERVICE_CORE_SESSION_GPU_PLANE_H_
#define SAMPLERD_SERVICE_CORE_SESSION_GPU_PLANE_H_

#include <memory>

#include "absl/status/statusor.h"
#include "service/core/session/plane_runner.h"
#include "service/core/session/session_spec.h"

namespace samplerd::core {

struct GpuPlaneOptions {
  // How long the feeder spins on the doorbell after the last step before it falls back to
  // sleeping polls (sleep_us apart), as the host plane's poller does. Spinning costs a core;
  // sleeping adds up to sleep_us to the first step after an idle spell.
  int spin_us = 20000;
  int sleep_us = 50;
};

// Starts serving `spec` (plane kGpu): spec.control is a host pointer (the server's mapping of
// the control block's host shm); the other buffers are device pointers of spec.device_ordinal.
// The runner page-locks the control block's pages (refcounted: sessions may share a page) for
// as long as it runs. Errors: INVALID_ARGUMENT for a spec that is not a GPU-plane spec;
// FAILED_PRECONDITION when the runtime has no stream memory operations on this device, or the
// control block's pages cannot be registered with the runtime; RESOURCE_EXHAUSTED when device
// memory for the session's workspace cannot be allocated.
absl::StatusOr<std::unique_ptr<PlaneRunner>> StartGpuPlane(SessionSpec spec,
                                                           const GpuPlaneOptions& options,
                                                           PlaneRunner::FaultCallback on_fault);

}  // namespace samplerd::core

#endif  // SAMPLERD_SERVICE_CORE_SESSION_GPU_PLANE_H_
