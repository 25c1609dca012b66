// The GPU backend: kernels/gpu on one device (HIP or CUDA, whichever this build has).
//
// Compiled only when the build has a GPU backend (SAMPLERD_HAVE_GPU). Buffers grow to the
// largest request seen and are reused afterwards, so a request no larger than an earlier one
// allocates nothing.
#ifndef SAMPLERD_SERVICE_CORE_BACKEND_GPU_SAMPLER_H_
#define SAMPLERD_SERVICE_CORE_BACKEND_GPU_SAMPLER_H_

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/gpu/runtime.h"
#include "kernels/gpu/sample.h"
#include "service/core/backend/sampler.h"

namespace samplerd::core {

// The devices the GPU runtime lists, as GetServerInfo reports them. Never fails: without a
// driver or a device the list is empty and *why_none (not null) says why, naming the runtime.
std::vector<DeviceInfo> ListGpuDevices(std::string* why_none);

class GpuSampler final : public Sampler {
 public:
  // Brings up the device with runtime ordinal `ordinal` (as ListGpuDevices numbers them): makes
  // it current on the calling thread and creates a non-blocking stream. Errors:
  // FAILED_PRECONDITION when there is no such device or the runtime cannot use it.
  static absl::StatusOr<std::unique_ptr<GpuSampler>> Create(int ordinal);

  // Waits for the stream and frees the buffers; runtime errors are ignored.
  ~GpuSampler() override;
  GpuSampler(const GpuSampler&) = delete;
  GpuSampler& operator=(const GpuSampler&) = delete;

  // Samples `batch` on the device. Host logits (io.logits) are staged through pinned memory;
  // device logits (io.logits_on_device: a GPU IPC region of this device, aligned to the dtype's
  // element size) are read where they are. Parameters always go through pinned staging. With
  // io.ready_event the stream waits on that event before the kernels (no host wait).
  //
  // io.output receives the B int32 token ids: a device output by a device-to-device copy on
  // the stream, a host output from the pinned result after the stream is synchronized. With
  // io.done_event and a device output the event is recorded after that copy and Sample returns
  // at once, without waiting for the device: *result then holds no tokens, statuses or logprobs,
  // and a device fault shows at a later call. With io.done_event and a host output the event is
  // recorded after the output is written (the reply carries no tokens either).
  //
  // Errors: INVALID_ARGUMENT for misaligned device logits or a done event without an output;
  // RESOURCE_EXHAUSTED when device or pinned memory for a new, larger request cannot be
  // allocated (the sampler stays usable); INTERNAL with the runtime's message for any other
  // runtime error, after which the sampler is faulted and every later call fails with
  // UNAVAILABLE (the GPU context may be lost: restart the process).
  absl::Status Sample(const ValidatedBatch& batch, const SampleIo& io,
                      SampleResult* result) override;

  // Samples a [2, 16] batch (one greedy row, one top-k row, top-1 logprobs) in each dtype, so
  // that the runtime loads every kernel (CUDA loads modules lazily, on first launch) and the
  // buffers exist before the first request. Errors: FAILED_PRECONDITION with the runtime's
  // message when a launch fails or the greedy row does not return the argmax.
  absl::Status Warmup() override;

  bool faulted() const override { return faulted_; }
  BackendKind kind() const override { return BackendKind::kGpu; }
  const DeviceInfo& device() const override { return device_; }

 private:
  // Memory that only grows. `pinned` selects page-locked host memory, else device memory.
  struct Buffer {
    void* ptr = nullptr;
    size_t bytes = 0;
    bool pinned = false;
    bool zeroed = false;  // zero-filled when (re)allocated: the kernels' workspace (sample.h)
  };

  GpuSampler(DeviceInfo device, kernels::gpu::Stream stream, kernels::gpu::Event staged);

  // Makes `buffer` hold at least `bytes`, reallocating only when it is smaller (after waiting
  // for the stream when an earlier request may still use the old buffer).
  absl::Status Reserve(Buffer* buffer, size_t bytes, absl::string_view what);
  static void Release(Buffer* buffer);
  // Returns OK for code 0; otherwise marks the sampler faulted and returns INTERNAL.
  absl::Status Check(int code, absl::string_view what);

  const DeviceInfo device_;
  kernels::gpu::Stream stream_ = nullptr;
  // Recorded after the input copies of a request that returns at its done event: once it
  // completes, the pinned staging buffer may be rewritten.
  kernels::gpu::Event staged_ = nullptr;
  // The last request returned without synchronizing the stream (done event).
  bool unsynced_ = false;
  Buffer pinned_in_{nullptr, 0, true};         // [logits | params], filled by the host
  Buffer device_in_;                           // the same layout on the device
  Buffer device_out_;                          // outputs (OutputLayout in gpu_sampler.cc)
  Buffer pinned_out_{nullptr, 0, true};        // the outputs copied back
  Buffer workspace_{nullptr, 0, false, true};  // kernels::gpu::SampleWorkspaceBytes, zeroed
  bool faulted_ = false;
  std::string fault_;  // what failed first, for the UNAVAILABLE message
};

}  // namespace samplerd::core

#endif  // SAMPLERD_SERVICE_CORE_BACKEND_GPU_SAMPLER_H_
