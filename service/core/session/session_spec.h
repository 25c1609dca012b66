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

  // Keep the regions mapped while the session lives (control, logits, params, token_ids,
  // row_status, sampled_logprobs; the last may be empty).
  RegionLease leases[6];
};

}  // namespace samplerd::core

#endif  // SAMPLERD_SERVICE_CORE_SESSION_SESSION_SPEC_H_
