// The CPU backend: the reference sampler (kernels/cpu) spread over a thread pool. Every batch,
// logits processors included, runs on the reference; the fast CPU sampler (kernels/cpu_fast)
// serves only the device sessions' host plane (and hands its steps with processors to the
// reference rows too).
#ifndef SAMPLERD_SERVICE_CORE_BACKEND_CPU_SAMPLER_H_
#define SAMPLERD_SERVICE_CORE_BACKEND_CPU_SAMPLER_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/common/sampling_types.h"
#include "service/core/backend/sampler.h"
#include "service/core/backend/thread_pool.h"

namespace samplerd::core {

class CpuSampler final : public Sampler {
 public:
  // Bytes of host shm logits rows copied out at a time (see Sample).
  static constexpr size_t kShmBlockBytes = size_t{64} << 20;

  // `threads` host threads (>= 1) share the rows of each batch. Host shm logits are copied out
  // `shm_block_bytes` of rows at a time (at least one row per thread; tests make it small).
  explicit CpuSampler(int threads, size_t shm_block_bytes = kShmBlockBytes);

  absl::Status Sample(const ValidatedBatch& batch, const SampleIo& io,
                      SampleResult* result) override;
  BackendKind kind() const override { return BackendKind::kCpu; }
  const DeviceInfo& device() const override { return device_; }

 private:
  // Samples rows [0, args.batch) of `args` on the pool; CANCELLED when `cancel` stopped them.
  absl::Status SampleRows(const kernels::SampleArgs& args, const std::atomic<bool>* cancel);

  ThreadPool pool_;
  const int threads_;
  const size_t shm_block_bytes_;
  DeviceInfo device_;
  // Grow-only private copy of a block of host shm logits rows (see Sample): at most
  // max(shm_block_bytes_, threads_ rows) bytes.
  std::unique_ptr<char[]> shm_copy_;
  size_t shm_copy_bytes_ = 0;
  // Private, aligned copy of a host shm or unaligned inline bitmask (see Sample).
  std::vector<uint32_t> bitmask_copy_;
};

}  // namespace samplerd::core

#endif  // SAMPLERD_SERVICE_CORE_BACKEND_CPU_SAMPLER_H_
