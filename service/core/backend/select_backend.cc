#include "service/core/backend/select_backend.h"

#include <algorithm>
#include <system_error>
#include <thread>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "service/core/backend/cpu_sampler.h"
#include "service/core/backend/device_match.h"
#include "service/core/model/status_macros.h"

#if SAMPLERD_HAVE_GPU
#include "service/core/backend/gpu_sampler.h"
#endif

namespace samplerd::core {
namespace {

int ResolveThreads(int threads) {
  if (threads > 0) return threads;
  const unsigned hw = std::thread::hardware_concurrency();
  return hw == 0 ? 1 : static_cast<int>(hw);
}

}  // namespace

absl::StatusOr<SelectedBackend> SelectBackend(BackendChoice choice, const std::string& gpu,
                                              int threads) {
  if (threads < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected threads >= 0 (0 = one per core), got ", threads));
  }
  if (!gpu.empty() && choice == BackendChoice::kCpu) {
    return absl::InvalidArgumentError(
        "expected --gpu only with --backend=gpu or auto, got --backend=cpu");
  }
  if (choice != BackendChoice::kCpu) {
#if SAMPLERD_HAVE_GPU
    // kAuto takes the GPU whenever the runtime lists one; a listed device that then cannot be
    // brought up is an error, not a silent (and far slower) CPU fallback.
    std::string why;
    std::vector<DeviceInfo> gpus = ListGpuDevices(&why);
    if (!gpus.empty() || !gpu.empty()) {
      // One backend device: --gpu's, else the first. GetServerInfo lists it first, then the
      // others (which do not sample).
      ASSIGN_OR_RETURN(const size_t chosen, SelectDevice(gpu, gpus));
      std::rotate(gpus.begin(), gpus.begin() + static_cast<ptrdiff_t>(chosen),
                  gpus.begin() + static_cast<ptrdiff_t>(chosen) + 1);
      absl::StatusOr<std::unique_ptr<GpuSampler>> sampler =
          GpuSampler::Create(gpus.front().ordinal);
      absl::Status status = sampler.ok() ? (*sampler)->Warmup() : sampler.status();
      if (!status.ok()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "expected a usable GPU for --backend=", choice == BackendChoice::kGpu ? "gpu" : "auto",
            ", got: ", status.message()));
      }
      return SelectedBackend{*std::move(sampler), std::move(gpus)};
    }
    if (choice == BackendChoice::kGpu) {
      return absl::FailedPreconditionError(
          absl::StrCat("expected a usable GPU for --backend=gpu, got: ", why));
    }
#else
    if (!gpu.empty()) {
      return absl::InvalidArgumentError(
          "expected --gpu only in a build with a GPU backend (configure with -DSAMPLERD_GPU=cuda "
          "or hip), got a CPU-only build");
    }
    if (choice == BackendChoice::kGpu) {
      return absl::FailedPreconditionError(
          "expected a usable GPU for --backend=gpu, got: a build without a GPU backend "
          "(configure with -DSAMPLERD_GPU=cuda or hip); use --backend=auto or --backend=cpu");
    }
#endif
  }
  const int resolved = ResolveThreads(threads);
  std::unique_ptr<CpuSampler> sampler;
  try {
    sampler = std::make_unique<CpuSampler>(resolved);
  } catch (const std::system_error& e) {  // the process's thread limit (e.g. --threads=100000)
    return absl::ResourceExhaustedError(absl::StrCat(
        "expected to start ", resolved, " CPU sampler threads (--threads), got: ", e.what()));
  }
  RETURN_IF_ERROR(sampler->Warmup());
  return SelectedBackend{std::move(sampler), {}};
}

}  // namespace samplerd::core
