// The GPU plane: a device session whose buffers are GPU IPC memory on the server's GPU. Each
// session has its own non-blocking stream; a feeder thread keeps `steps_ahead` steps enqueued,
// each: wait doorbell == RING; write doorbell = 0; validate batch and rows on the device;
// sample (kernels/gpu, rows past the step's B exit at once); write outputs, step_status,
// steps_done; write done = DONE. No host work on the step's path.
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
  int steps_ahead = 2;  // steps enqueued on the session's stream before the engine rings
};

// Starts serving `spec` (plane kGpu; device pointers of spec.device_ordinal). Errors:
// INVALID_ARGUMENT for a spec that is not a GPU-plane spec; FAILED_PRECONDITION when the
// runtime has no stream memory operations on this device; RESOURCE_EXHAUSTED when device
// memory for the session's workspace cannot be allocated.
absl::StatusOr<std::unique_ptr<PlaneRunner>> StartGpuPlane(SessionSpec spec,
                                                           const GpuPlaneOptions& options,
                                                           PlaneRunner::FaultCallback on_fault);

}  // namespace samplerd::core

#endif  // SAMPLERD_SERVICE_CORE_SESSION_GPU_PLANE_H_
