// The Sampler backend interface: one implementation per kind of device (CPU, GPU).
#ifndef SAMPLERD_SERVICE_CORE_SAMPLER_H_
#define SAMPLERD_SERVICE_CORE_SAMPLER_H_

#include <string>

#include "absl/status/status.h"
#include "service/core/request.h"
#include "service/core/validation.h"

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

  // Samples `batch` whose logits are at `host_logits` (host memory, laid out as the batch says)
  // and fills result->token_ids, row_status and (when asked) logprobs. Returns a non-OK status
  // only for device faults; bad rows are reported per row.
  virtual absl::Status Sample(const ValidatedBatch& batch, const void* host_logits,
                              SampleResult* result) = 0;

  // True once a fault has left the backend unable to sample (e.g. a sticky GPU error that
  // poisons the context): every later Sample would fail, and only a process restart helps.
  // Read on the executor thread after Sample returns. The default never faults.
  virtual bool faulted() const { return false; }

  virtual BackendKind kind() const = 0;
  virtual const DeviceInfo& device() const = 0;
};

}  // namespace samplerd::core

#endif  // SAMPLERD_SERVICE_CORE_SAMPLER_H_
