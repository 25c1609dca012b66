// SessionStep (session_step.h): one device-session step as three launches on the caller's
// stream, SessionPrepareKernel -> Sample (sample.hip) -> SessionFinishKernel (four with a
// processors buffer: SessionProcessorsKernel after the prepare), so that the engine's step
// costs no host work in samplerd.
#include "kernels/common/session_processors.h"
#include "kernels/gpu/device_common.h"
#include "kernels/gpu/platform.h"
#include "kernels/gpu/session_step.h"
#include "proto/samplerd/v1/device_session.h"

namespace samplerd::kernels::gpu {
namespace {

// One block walks every row: a step validates at most max_batch rows of 36 bytes each, far
// below what a second block would pay for its launch.
constexpr int kStepThreads = 256;

// What the prepare kernel decided, for Sample (device_batch) and the finish kernel.
struct StepWords {
  uint32_t batch;    // rows that run this step: B, or 0 (bad batch, aborted)
  uint32_t aborted;  // 1: the session's abort word was set
};

struct StepBuffers {
  StepWords* words;
  RowParams* row_params;  // [max_batch]
  uint32_t* valid;        // [max_batch]: 1 when the row's parameters passed validation
  RowStatus* status;      // [max_batch]: Sample's row status
  uint32_t* counts;       // [max_batch]: merged entries per row (processors only)
  uint32_t* offsets;      // [max_batch + 1]: SampleArgs::adjust_offsets (processors only)
  TokenAdjust* adjusts;   // [NB + NH]: SampleArgs::adjusts (processors only)
  void* sample_workspace;
  size_t sample_workspace_bytes;
};

// The engine's params struct of arrays, resolved on the host (device_session.h's offset
// functions are host code).
struct ParamsArrays {
  const uint64_t* seed;
  const uint64_t* position;
  const float* temperature;
  const int32_t* top_k;
  const float* top_p;
  const float* min_p;
  const int32_t* top_p_mode;
};

ParamsArrays ResolveParams(const uint8_t* base, uint32_t m) {
  return ParamsArrays{
      reinterpret_cast<const uint64_t*>(base + samplerd_params_seed_offset(m)),
      reinterpret_cast<const uint64_t*>(base + samplerd_params_position_offset(m)),
      reinterpret_cast<const float*>(base + samplerd_params_temperature_offset(m)),
      reinterpret_cast<const int32_t*>(base + samplerd_params_top_k_offset(m)),
      reinterpret_cast<const float*>(base + samplerd_params_top_p_offset(m)),
      reinterpret_cast<const float*>(base + samplerd_params_min_p_offset(m)),
      reinterpret_cast<const int32_t*>(base + samplerd_params_top_p_mode_offset(m))};
}

struct StepParams {
  uint8_t* control;
  uint32_t max_batch;
  ParamsArrays params;
  const uint32_t* abort;
  int32_t* token_ids;
  int32_t* row_status;
  float* sampled_logprobs;
  StepWords* words;
  RowParams* row_params;
  uint32_t* valid;
  const RowStatus* status;
};

__device__ __forceinline__ volatile uint32_t* ControlWord(uint8_t* control, uint32_t offset) {
  return reinterpret_cast<volatile uint32_t*>(control + offset);
}

// Row `row` of the params struct of arrays; false when a value is outside what
// service/core/validation.cc accepts for a SampleRequest.
__device__ bool ReadRowParams(const ParamsArrays& in, uint32_t row, RowParams* out) {
  const float temperature = in.temperature[row];
  const int32_t top_k = in.top_k[row];
  const float top_p = in.top_p[row];
  const float min_p = in.min_p[row];
  const int32_t mode = in.top_p_mode[row];
  // Written so that NaN fails every comparison.
  const bool valid = temperature >= 0.0f && temperature < kInfF && top_k >= -1 && top_p > 0.0f &&
                     top_p <= 1.0f && min_p >= 0.0f && min_p <= 1.0f && mode >= 0 && mode <= 2;
  if (!valid) {
    *out = RowParams{};
    out->temperature = 0.0f;  // greedy: the cheapest row, and its output is overwritten
    return false;
  }
  out->temperature = temperature;
  out->top_k = top_k;
  out->top_p = top_p;
  out->min_p = min_p;
  // sampler.proto's TopPMode: 0 (unspecified) and 1 = TOP_K_FIRST, 2 = JOINT.
  out->top_p_mode = mode == 2 ? TopPMode::kJoint : TopPMode::kTopKFirst;
  out->seed = in.seed[row];
  out->position = in.position[row];
  return true;
}

// Launch: 1 block of kStepThreads. Decides the step's batch, writes control.step_status and
// the rows' validated parameters.
__global__ void __launch_bounds__(kStepThreads) SessionPrepareKernel(StepParams p) {
  __shared__ uint32_t batch;
  if (threadIdx.x == 0) {
    const uint32_t requested = *ControlWord(p.control, SAMPLERD_CONTROL_BATCH);
    const bool aborted =
        p.abort != nullptr && *reinterpret_cast<const volatile uint32_t*>(p.abort) != 0;
    uint32_t status = SAMPLERD_STEP_OK;
    uint32_t b = requested;
    if (aborted) {
      status = SAMPLERD_STEP_ABORTED;
      b = 0;
    } else if (requested < 1 || requested > p.max_batch) {
      status = SAMPLERD_STEP_BAD_BATCH;
      b = 0;
    }
    *ControlWord(p.control, SAMPLERD_CONTROL_STEP_STATUS) = status;
    p.words->batch = b;
    p.words->aborted = aborted ? 1u : 0u;
    batch = b;
  }
  __syncthreads();
  const uint32_t b = batch;
  for (uint32_t row = threadIdx.x; row < b; row += kStepThreads) {
    RowParams params;
    p.valid[row] = ReadRowParams(p.params, row, &params) ? 1u : 0u;
    p.row_params[row] = params;
  }
}

// What SessionProcessorsKernel reads and writes.
struct ProcessorsStep {
  SessionProcessors procs;  // the engine's buffer, resolved on the host
  uint32_t max_batch;
  int64_t vocab;
  const StepWords* words;
  RowParams* row_params;
  uint32_t* valid;
  uint32_t* counts;
  uint32_t* offsets;
  TokenAdjust* adjusts;
};

__device__ __forceinline__ void RejectRow(const ProcessorsStep& p, uint32_t row) {
  p.valid[row] = 0u;
  p.row_params[row].temperature = 0.0f;  // greedy: the cheapest row, its output is overwritten
}

// Launch: 1 block of kStepThreads, after SessionPrepareKernel (sessions with a processors
// buffer). 1. A thread per row checks each valid row's processors (a bad row becomes invalid)
// and counts its merged entries. 2. The offsets over all max_batch rows (rows past the batch
// and invalid rows empty): a block scan, or, when the rows' entries overrun NB + NH (ranges
// that overlap next to a row with decreasing offsets), a serial pass by thread 0 that rejects
// the rows that do not fit, in row order, as the host plane does (SessionEntriesFit). 3. A
// thread per row writes its entries. A row's work is sequential over its entries.
__global__ void __launch_bounds__(kStepThreads) SessionProcessorsKernel(ProcessorsStep p) {
  const uint32_t b = p.words->batch;
  for (uint32_t row = threadIdx.x; row < p.max_batch; row += kStepThreads) {
    uint32_t n = 0;
    if (row < b && p.valid[row] != 0) {
      if (SessionRowValid(p.procs, row, p.vocab)) {
        n = MergeSessionRow(p.procs, row, nullptr);
      } else {
        RejectRow(p, row);
      }
    }
    p.counts[row] = n;
  }
  __syncthreads();

  __shared__ uint64_t scan[kStepThreads];
  __shared__ uint64_t carry;
  if (threadIdx.x == 0) {
    carry = 0;
    p.offsets[0] = 0;
  }
  const uint64_t capacity = uint64_t{p.procs.bias_capacity} + p.procs.history_capacity;
  for (uint32_t base = 0; base < p.max_batch; base += kStepThreads) {
    const uint32_t row = base + threadIdx.x;
    scan[threadIdx.x] = row < p.max_batch ? p.counts[row] : 0;
    __syncthreads();
    for (int d = 1; d < kStepThreads; d <<= 1) {
      const uint64_t add = threadIdx.x >= static_cast<unsigned>(d) ? scan[threadIdx.x - d] : 0;
      __syncthreads();
      scan[threadIdx.x] += add;
      __syncthreads();
    }
    const uint64_t end = carry + scan[threadIdx.x];
    if (row < p.max_batch && end <= capacity) p.offsets[row + 1] = static_cast<uint32_t>(end);
    __syncthreads();
    if (threadIdx.x == kStepThreads - 1) carry = end;
    __syncthreads();
  }
  if (carry > capacity) {
    if (threadIdx.x == 0) {
      uint64_t total = 0;
      for (uint32_t row = 0; row < p.max_batch; ++row) {
        uint32_t n = p.counts[row];
        if (n != 0 && !SessionEntriesFit(total, n, p.procs)) {
          RejectRow(p, row);
          n = 0;
        }
        total += n;
        p.offsets[row + 1] = static_cast<uint32_t>(total);
      }
    }
    __syncthreads();
  }

  for (uint32_t row = threadIdx.x; row < b; row += kStepThreads) {
    if (p.valid[row] != 0 && p.offsets[row + 1] != p.offsets[row]) {
      MergeSessionRow(p.procs, row, p.adjusts + p.offsets[row]);
    }
  }
}

__device__ __forceinline__ int32_t ProtoRowStatus(RowStatus status) {
  switch (status) {
    case RowStatus::kOk:
      return SAMPLERD_ROW_OK;
    case RowStatus::kNan:
      return SAMPLERD_ROW_INVALID_NAN;
    case RowStatus::kNoFinite:
      return SAMPLERD_ROW_INVALID_NO_FINITE;
    case RowStatus::kNoAllowed:
      return SAMPLERD_ROW_INVALID_NO_ALLOWED;
    case RowStatus::kInvalidParams:
      break;
  }
  return SAMPLERD_ROW_INVALID_PARAMS;
}

// Launch: 1 block of kStepThreads, after Sample. Writes row_status for rows [0, batch), the
// invalid rows' token and logprob, and counts the step.
__global__ void __launch_bounds__(kStepThreads) SessionFinishKernel(StepParams p) {
  const uint32_t b = p.words->batch;
  for (uint32_t row = threadIdx.x; row < b; row += kStepThreads) {
    if (p.valid[row] != 0) {
      p.row_status[row] = ProtoRowStatus(p.status[row]);
      continue;
    }
    p.token_ids[row] = -1;
    p.row_status[row] = SAMPLERD_ROW_INVALID_PARAMS;
    if (p.sampled_logprobs != nullptr) p.sampled_logprobs[row] = -kInfF;
  }
  if (threadIdx.x == 0 && p.words->aborted == 0) {
    volatile uint32_t* steps_done = ControlWord(p.control, SAMPLERD_CONTROL_STEPS_DONE);
    *steps_done = *steps_done + 1u;
  }
}

constexpr size_t kAlign = 256;
size_t AlignUp(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

int32_t TopLogprobs(bool sampled_logprobs) { return sampled_logprobs ? 0 : -1; }

// Carves `workspace` as SessionStepWorkspaceBytes lays it out (`adjusts` < 0: no processors).
StepBuffers Carve(void* workspace, uint32_t m, int64_t vocab, bool sampled_logprobs,
                  int64_t adjusts) {
  StepBuffers out;
  char* ws = static_cast<char*>(workspace);
  out.words = reinterpret_cast<StepWords*>(ws);
  ws += AlignUp(sizeof(StepWords));
  out.row_params = reinterpret_cast<RowParams*>(ws);
  ws += AlignUp(m * sizeof(RowParams));
  out.valid = reinterpret_cast<uint32_t*>(ws);
  ws += AlignUp(m * sizeof(uint32_t));
  out.status = reinterpret_cast<RowStatus*>(ws);
  ws += AlignUp(m * sizeof(RowStatus));
  out.counts = nullptr;
  out.offsets = nullptr;
  out.adjusts = nullptr;
  if (adjusts >= 0) {
    out.counts = reinterpret_cast<uint32_t*>(ws);
    ws += AlignUp(m * sizeof(uint32_t));
    out.offsets = reinterpret_cast<uint32_t*>(ws);
    ws += AlignUp((m + 1ull) * sizeof(uint32_t));
    out.adjusts = reinterpret_cast<TokenAdjust*>(ws);
    ws += AlignUp(static_cast<size_t>(adjusts) * sizeof(TokenAdjust));
  }
  out.sample_workspace = ws;
  out.sample_workspace_bytes = SampleWorkspaceBytes(m, vocab, TopLogprobs(sampled_logprobs));
  return out;
}

}  // namespace

size_t SessionStepWorkspaceBytes(uint32_t max_batch, int64_t vocab, bool sampled_logprobs,
                                 int64_t adjusts) {
  size_t processors = 0;
  if (adjusts >= 0) {
    processors = AlignUp(max_batch * sizeof(uint32_t)) +
                 AlignUp((max_batch + 1ull) * sizeof(uint32_t)) +
                 AlignUp(static_cast<size_t>(adjusts) * sizeof(TokenAdjust));
  }
  return AlignUp(sizeof(StepWords)) + AlignUp(max_batch * sizeof(RowParams)) +
         AlignUp(max_batch * sizeof(uint32_t)) + AlignUp(max_batch * sizeof(RowStatus)) +
         processors + SampleWorkspaceBytes(max_batch, vocab, TopLogprobs(sampled_logprobs));
}

int SessionStep(const SessionStepArgs& args, void* workspace, size_t workspace_bytes,
                Stream stream) {
  const bool logprobs = args.sampled_logprobs != nullptr;
  const int64_t adjusts =
      args.processors == nullptr
          ? -1
          : static_cast<int64_t>(args.logit_bias_capacity) + args.token_history_capacity;
  if (args.control == nullptr || args.params == nullptr || args.logits == nullptr ||
      args.token_ids == nullptr || args.row_status == nullptr || args.max_batch == 0 ||
      args.max_batch > 65535 || workspace == nullptr || adjusts > INT32_MAX ||
      workspace_bytes < SessionStepWorkspaceBytes(args.max_batch, args.vocab, logprobs, adjusts)) {
    return static_cast<int>(hipErrorInvalidValue);
  }
  const StepBuffers buffers = Carve(workspace, args.max_batch, args.vocab, logprobs, adjusts);
  const StepParams step{args.control,
                        args.max_batch,
                        ResolveParams(args.params, args.max_batch),
                        args.abort,
                        args.token_ids,
                        args.row_status,
                        args.sampled_logprobs,
                        buffers.words,
                        buffers.row_params,
                        buffers.valid,
                        buffers.status};
  auto* s = static_cast<hipStream_t>(stream);
  SessionPrepareKernel<<<1, kStepThreads, 0, s>>>(step);
  hipError_t status = hipGetLastError();
  if (status != hipSuccess) return static_cast<int>(status);
  if (args.processors != nullptr) {
    const ProcessorsStep procs{
        ResolveSessionProcessors(args.processors, args.max_batch, args.logit_bias_capacity,
                                 args.token_history_capacity),
        args.max_batch,
        args.vocab,
        buffers.words,
        buffers.row_params,
        buffers.valid,
        buffers.counts,
        buffers.offsets,
        buffers.adjusts};
    SessionProcessorsKernel<<<1, kStepThreads, 0, s>>>(procs);
    status = hipGetLastError();
    if (status != hipSuccess) return static_cast<int>(status);
  }

  SampleArgs sample;
  sample.logits = args.logits;
  sample.dtype = args.dtype;
  sample.batch = args.max_batch;
  sample.vocab = args.vocab;
  sample.row_stride = args.row_stride;
  sample.params = buffers.row_params;
  sample.params_count = args.max_batch;
  sample.top_logprobs = TopLogprobs(logprobs);
  sample.logprob_source = args.logprob_source;
  sample.token_ids = args.token_ids;
  sample.status = buffers.status;
  sample.sampled_logprob = args.sampled_logprobs;
  sample.device_batch = &buffers.words->batch;
  if (args.token_bitmask != nullptr) {
    sample.allowed_bitmask = args.token_bitmask;
    sample.bitmask_words = (args.vocab + 31) / 32;
  }
  if (args.processors != nullptr) {
    sample.adjusts = buffers.adjusts;
    sample.adjust_offsets = buffers.offsets;
  }
  const int sampled =
      Sample(sample, buffers.sample_workspace, buffers.sample_workspace_bytes, stream);
  if (sampled != 0) return sampled;

  SessionFinishKernel<<<1, kStepThreads, 0, s>>>(step);
  return static_cast<int>(hipGetLastError());
}

}  // namespace samplerd::kernels::gpu
