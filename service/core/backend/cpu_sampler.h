// The CPU backend: the reference sampler (kernels/cpu) spread over a thread pool. Every batch,
// logits processors included, runs on the reference; the fast CPU sampler (kernels/cpu_fast)
// serves only the device sessions' host plane (and hands its steps with processors to the
// reference rows too).
#ifndef SAMPLERD_SERVICE_CORE_BACKEND_CPU_SAMPLER_H_
#define SAMPLERD_SERVICE_CORE_BACKEND_CPU_SAMPLER_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "service/core/backend/sampler.h"
#include "service/core/backend/thread_pool.h"

namespace samplerd::core {

class CpuSampler final : public Sampler {
 public:
  // `threads` host threads (>= 1) share the rows of each batch.
  explicit CpuSampler(int threads);

  absl::Status Sample(const ValidatedBatch& batch, const SampleIo& io,
                      SampleResult* result) override;
  BackendKind kind() const override { return BackendKind::kCpu; }
  const DeviceInfo& device() const override { return device_; }

 private:
  ThreadPool pool_;
  DeviceInfo device_;
  // Grow-only private copy of host shm logits (see Sample).
  std::unique_ptr<char[]> shm_copy_;
  size_t shm_copy_bytes_ = 0;
  // Private, aligned copy of a host shm or unaligned inline bitmask (see Sample).
  std::vector<uint32_t> bitmask_copy_;
};

}  // namespace samplerd::core

#endif  // SAMPLERD_SERVICE_CORE_BACKEND_CPU_SAMPLER_H_
