// The Sampler backend interface: one implementation per kind of device (CPU, GPU).
#ifndef SAMPLERD_SERVICE_CORE_BACKEND_SAMPLER_H_
#define SAMPLERD_SERVICE_CORE_BACKEND_SAMPLER_H_

#include <atomic>
#include <string>

#include "absl/status/status.h"
#include "service/core/model/request.h"
#include "service/core/model/validated_batch.h"

namespace samplerd::core {

// What GetServerInfo says about a device.
struct DeviceInfo {
  int ordinal = 0;
  std::string pci_bus_id;  // empty for the CPU
  std::string uuid;        // "cpu" for the CPU
  std::string name;
  bool ipc_memory = false;
  bool ipc_events = false;
};

enum class BackendKind { kCpu, kGpu };

// Where one batch's logits are and where its outputs also go (issue #4 transports).
struct SampleIo {
  // Laid out as the batch says: host memory (inline bytes, host shm), or device memory of this
  // sampler's device when `logits_on_device` (a GPU IPC region).
  const void* logits = nullptr;
  bool logits_on_device = false;
  // GPU only: an opened IPC event the stream waits on before reading device logits.
  void* ready_event = nullptr;
  // Optional: B int32 token ids (-1 for invalid rows) are also written here, host memory or
  // (when `output_on_device`) device memory of this sampler's device.
  void* output = nullptr;
  bool output_on_device = false;
  // GPU only, with `output`: an opened IPC event recorded after `output` is written. The sampler
  // then returns without waiting for the device, and `result` holds no tokens.
  void* done_event = nullptr;
  // Host shm logits: the client may truncate the object under us, so backends read them with
  // GuardedCopy only (service/core/backend/guarded_copy.h), never in place. (Host outputs are
  // always host shm and always written with GuardedCopy.)
  bool logits_in_shm = false;
  // Set by the core while it drains (may be null): once true, a backend that can stop a batch
  // part-way (the CPU backend, between rows) returns CANCELLED with the outputs unspecified.
  // A GPU launch runs to its end.
  const std::atomic<bool>* cancel = nullptr;
  // The allowed-token bitmask (ValidatedBatch::bitmask_words > 0): [batch, bitmask_words]
  // uint32 words in host memory (inline bytes; host shm when `bitmask_in_shm`, read with
  // GuardedCopy like the logits) or, when `bitmask_on_device`, device memory of this
  // sampler's device (a GPU IPC region).
  const void* bitmask = nullptr;
  bool bitmask_on_device = false;
  bool bitmask_in_shm = false;
};

// Samples validated batches on one device. Calls come from that device's executor thread, one
// at a time, so implementations need not be thread-safe.
class Sampler {
 public:
  virtual ~Sampler() = default;

  // Runs whatever must happen before the first request is served quickly (loading kernels,
  // first allocations), so that the server reports SERVING only once it is ready. Called once,
  // before any Sample, from the thread that creates the core. A non-OK status means the backend
  // cannot serve. The default does nothing.
  virtual absl::Status Warmup() { return absl::OkStatus(); }

  // Samples `batch` from io.logits and fills result->token_ids, row_status and (when asked)
  // logprobs, and io.output when given. The core only passes device pointers, events and
  // device outputs to a sampler whose DeviceInfo says it supports them (UNIMPLEMENTED
  // otherwise). Returns a non-OK status for device faults; bad rows are reported per row.
  virtual absl::Status Sample(const ValidatedBatch& batch, const SampleIo& io,
                              SampleResult* result) = 0;

  // True once a fault has left the backend unable to sample (e.g. a sticky GPU error that
  // poisons the context): every later Sample would fail, and only a process restart helps.
  // Read on the executor thread after Sample returns. The default never faults.
  virtual bool faulted() const { return false; }

  virtual BackendKind kind() const = 0;
  virtual const DeviceInfo& device() const = 0;
};

}  // namespace samplerd::core

#endif  // SAMPLERD_SERVICE_CORE_BACKEND_SAMPLER_H_
