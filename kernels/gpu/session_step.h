// One step of a GPU-plane device session (proto/samplerd/v1/device_session.h), enqueued on a
// stream with no host work: validate the step's batch and every row's parameters on the device,
// sample with Sample (rows past the batch exit at once), write the engine's outputs and the
// control words. The stream memory operations around it (the doorbell wait, done = DONE) are
// the caller's (service/core/session/gpu_plane.cc).
//
// Plain C++ like sample.h: the server includes it without HIP or CUDA headers.
#ifndef SAMPLERD_KERNELS_GPU_SESSION_STEP_H_
#define SAMPLERD_KERNELS_GPU_SESSION_STEP_H_

#include <cstddef>
#include <cstdint>

#include "kernels/common/sampling_types.h"
#include "kernels/gpu/sample.h"

namespace samplerd::kernels::gpu {

// A session's buffers and shape; every pointer is a device address on the current device (the
// engine's buffers are IPC mappings, its control block registered host memory). Layouts:
// device_session.h.
struct SessionStepArgs {
  // struct samplerd_control: the device address of the server's registration of the control
  // block's host shm pages (HostRegister + HostGetDevicePointer in runtime.h).
  uint8_t* control = nullptr;
  uint32_t max_batch = 0;  // M: the session's largest batch, 1..65535
  DType dtype = DType::kFp32;
  int64_t vocab = 0;
  int64_t row_stride = 0;             // elements, >= vocab
  const void* logits = nullptr;       // [M, row_stride]
  const uint8_t* params = nullptr;    // struct of arrays, samplerd_params_bytes(M)
  int32_t* token_ids = nullptr;       // [M]
  int32_t* row_status = nullptr;      // [M], sampler.proto RowStatus numbers
  float* sampled_logprobs = nullptr;  // [M] or null: none
  LogprobSource logprob_source = LogprobSource::kRaw;
  // The optional logits processors (device_session.h): the allowed-token bitmask
  // [M, ceil(vocab / 32)], and the processors buffer samplerd_processors_bytes(M, NB, NH) with
  // its capacities. Null: none.
  const uint32_t* token_bitmask = nullptr;
  const uint8_t* processors = nullptr;
  uint32_t logit_bias_capacity = 0;     // NB
  uint32_t token_history_capacity = 0;  // NH
  // A server-private device word: nonzero aborts every step that has not started (the step
  // writes step_status ABORTED, samples nothing and leaves the outputs alone).
  const uint32_t* abort = nullptr;
};

// Device workspace bytes that SessionStep needs for a session of this shape; `adjusts` is
// NB + NH of a session with a processors buffer (-1: none).
size_t SessionStepWorkspaceBytes(uint32_t max_batch, int64_t vocab, bool sampled_logprobs,
                                 int64_t adjusts = -1);

// Enqueues one step on `stream`:
//   1. a prepare kernel reads control.batch B and *abort; the step's batch is B when
//      1 <= B <= max_batch and not aborted, else 0; writes control.step_status (OK, BAD_BATCH
//      or ABORTED); validates rows [0, B) as the server does for SampleRequest (temperature
//      NaN, < 0 or +inf; top_k < -1; top_p NaN, <= 0 or > 1; min_p NaN, < 0 or > 1; top_p_mode
//      not 0, 1 or 2) into workspace RowParams (invalid rows get greedy parameters);
//   1b. with a processors buffer, three kernels check each valid row's processors in parallel
//      (a block per row; kernels/common/session_processors.h; a bad row becomes invalid), scan
//      the rows' merged counts into offsets for all max_batch rows (rows past B and invalid rows
//      empty), and write each row's merged TokenAdjust list (a block per row, each entry at its
//      rank in the union of the row's bias and history tokens). The lists are read where the
//      check read the row's header, and written only to the row's counted slots with tokens in
//      [0, vocab): a row whose entries changed after the check (an engine writing during the
//      step) becomes invalid, and nothing is written out of bounds whatever the buffer holds;
//   2. Sample over max_batch rows with device_batch = the step's batch, the bitmask and the
//      merged adjusts;
//   3. a finish kernel writes row_status (1 OK, 2 NaN, 3 no finite logit, 4 invalid
//      parameters or processors, 5 nothing allowed), token -1 and logprob -inf for invalid rows,
//      and increments control.steps_done unless the step was aborted.
// Nothing waits on or writes the doorbell or done. `workspace` holds
// SessionStepWorkspaceBytes(...) device bytes used by one step at a time on this stream.
// Returns 0, or the runtime's error code (invalid arguments: the runtime's invalid-value code).
int SessionStep(const SessionStepArgs& args, void* workspace, size_t workspace_bytes,
                Stream stream);

}  // namespace samplerd::kernels::gpu

#endif  // SAMPLERD_KERNELS_GPU_SESSION_STEP_H_
