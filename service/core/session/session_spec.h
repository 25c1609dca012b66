// A device session's validated open: its shape and where its buffers are, resolved to pointers.
//
// SessionManager (session_manager.h) builds one from a DeviceSessionOpen after checking every
// rule of proto/samplerd/v1/device_session.h (sizes, alignment, no overlap, one kind of
// region, the device); a plane runner (plane_runner.h) then serves it. The leases keep the
// regions mapped for as long as the session lives.
#ifndef SAMPLERD_SERVICE_CORE_SESSION_SESSION_SPEC_H_
#define SAMPLERD_SERVICE_CORE_SESSION_SESSION_SPEC_H_

#include <cstdint>
#include <string>

#include "kernels/common/sampling_types.h"
#include "service/core/regions/region_registry.h"

namespace samplerd::core {

enum class SessionPlane { kGpu, kHost };

struct SessionSpec {
  std::string id;  // the server's id, for logs and metrics
  SessionPlane plane = SessionPlane::kHost;
  int device_ordinal = -1;  // GPU plane: the runtime ordinal of the regions' device
  kernels::DType dtype = kernels::DType::kFp32;
  uint32_t max_batch = 0;
  uint32_t vocab = 0;
  uint64_t row_stride = 0;  // elements, >= vocab
  kernels::LogprobSource logprob_source = kernels::LogprobSource::kRaw;

  // The buffers. control is always a host pointer (the server's mapping of a host shm region);
  // the data buffers are host pointers (host plane, host shm mappings) or device pointers of
  // device_ordinal (GPU plane, GPU IPC mappings). Layouts: device_session.h.
  uint8_t* control = nullptr;  // samplerd_control
  const void* logits = nullptr;
  const uint8_t* params = nullptr;  // struct of arrays, samplerd_params_*_offset(max_batch)
  int32_t* token_ids = nullptr;
  int32_t* row_status = nullptr;
  float* sampled_logprobs = nullptr;  // null: none
  // The optional logits processors (device_session.h): null when the session has none.
  const uint32_t* token_bitmask = nullptr;  // [max_batch, ceil(vocab / 32)]
  const uint8_t* processors = nullptr;      // samplerd_processors_bytes(max_batch, NB, NH)
  uint32_t logit_bias_capacity = 0;         // NB
  uint32_t token_history_capacity = 0;      // NH

  // Keep the regions mapped while the session lives (control, logits, params, token_ids,
  // row_status, sampled_logprobs, token_bitmask, processors; the optional ones may be empty).
  RegionLease leases[8];
};

}  // namespace samplerd::core

#endif  // SAMPLERD_SERVICE_CORE_SESSION_SESSION_SPEC_H_
