// Choosing and bringing up the backend a server samples on (--backend, --gpu, --threads).
#ifndef SAMPLERD_SERVICE_CORE_BACKEND_SELECT_BACKEND_H_
#define SAMPLERD_SERVICE_CORE_BACKEND_SELECT_BACKEND_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "service/core/backend/sampler.h"

namespace samplerd::core {

enum class BackendChoice { kAuto, kCpu, kGpu };

// A backend brought up by SelectBackend, warmed up and ready to sample.
struct SelectedBackend {
  std::unique_ptr<Sampler> sampler;
  // A GPU backend: every device the runtime lists, the sampling one first (GetServerInfo lists
  // them in this order; the others do not sample). Empty for the CPU backend.
  std::vector<DeviceInfo> devices;
};

// Brings up the backend `choice` asks for. kAuto picks the GPU when this build has a GPU
// backend and the runtime lists a device, else the CPU; `gpu` names the device by PCI bus id or
// UUID (empty: the first listed); `threads` is the CPU backend's thread count (0 = one per
// core). A listed GPU that cannot be brought up is an error, never a silent CPU fallback.
// Errors: INVALID_ARGUMENT for threads < 0, for `gpu` with kCpu or in a build without a GPU
// backend, and for a `gpu` that names no listed device (SelectDevice); FAILED_PRECONDITION when
// kGpu is asked for and no GPU can be used, or a GPU fails to come up or warm up.
absl::StatusOr<SelectedBackend> SelectBackend(BackendChoice choice, const std::string& gpu,
                                              int threads);

}  // namespace samplerd::core

#endif  // SAMPLERD_SERVICE_CORE_BACKEND_SELECT_BACKEND_H_
