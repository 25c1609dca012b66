// DefaultRunnerFactory (session_manager.h): the real planes. Apart from session_manager.cc so
// that tests of the manager link without the planes.
#include "absl/status/status.h"
#include "service/core/session/host_plane.h"
#include "service/core/session/session_manager.h"

#if SAMPLERD_HAVE_GPU
#include "service/core/session/gpu_plane.h"
#endif

namespace samplerd::core {

RunnerFactory DefaultRunnerFactory(const DeviceSessionOptions& options) {
  return [options](
             SessionSpec spec,
             PlaneRunner::FaultCallback on_fault) -> absl::StatusOr<std::unique_ptr<PlaneRunner>> {
    if (spec.plane == SessionPlane::kHost) {
      return StartHostPlane(std::move(spec), options.host, std::move(on_fault));
    }
#if SAMPLERD_HAVE_GPU
    return StartGpuPlane(std::move(spec), options.gpu, std::move(on_fault));
#else
    return absl::FailedPreconditionError(
        "expected a build with a GPU backend for DEVICE_PLANE_GPU, got a CPU-only build");
#endif
  };
}

}  // namespace samplerd::core
