// SessionStep (session_step.h): one device-session step as three launches on the caller's
// stream, SessionPrepareKernel -> Sample (sample.hip) -> SessionFinishKernel (six with a
// processors buffer: SessionCheckKernel, SessionOffsetsKernel and SessionWriteKernel after the
// prepare), so that the engine's step costs no host work in samplerd.
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
  RowParams* row_params;      // [max_batch]
  uint32_t* valid;            // [max_batch]: 1 when the row's parameters passed validation
  RowStatus* status;          // [max_batch]: Sample's row status
  uint32_t* counts;           // [max_batch]: merged entries per row (processors only)
  SessionRowHeader* headers;  // [max_batch]: each row's header as checked (processors only)
  uint32_t* offsets;          // [max_batch + 1]: SampleArgs::adjust_offsets (processors only)
  TokenAdjust* adjusts;       // [NB + NH]: SampleArgs::adjusts (processors only)
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

// What the processors kernels read and write.
struct ProcessorsStep {
  SessionProcessors procs;  // the engine's buffer, resolved on the host
  uint32_t max_batch;
  int64_t vocab;
  const StepWords* words;
  RowParams* row_params;
  uint32_t* valid;
  uint32_t* counts;
  SessionRowHeader* headers;
  uint32_t* offsets;
  TokenAdjust* adjusts;
};

__device__ __forceinline__ void RejectRow(const ProcessorsStep& p, uint32_t row) {
  p.valid[row] = 0u;
  p.row_params[row].temperature = 0.0f;  // greedy: the cheapest row, its output is overwritten
}

// Whether token t is in the sorted tokens[begin, end); *rank: how many of them are below t.
__device__ __forceinline__ bool Contains(const int32_t* tokens, uint32_t begin, uint32_t end,
                                         int32_t t, uint32_t* rank) {
  const uint32_t at = SessionLowerBound(tokens, begin, end, t);
  *rank = at - begin;
  return at < end && tokens[at] == t;
}

// Launch: grid (max_batch), kStepThreads threads; after SessionPrepareKernel. Block `row` checks
// a valid row's processors (the header, then every entry in parallel: a bad row becomes
// invalid) and counts its merged entries, the size of the union of its bias and history tokens
// (a binary search per bias entry finds the tokens both lists hold). Rows past the batch and
// invalid rows count 0.
__global__ void __launch_bounds__(kStepThreads) SessionCheckKernel(ProcessorsStep p) {
  const uint32_t row = blockIdx.x;
  __shared__ uint32_t common;
  __shared__ SessionRowHeader head;
  if (row >= p.words->batch || p.valid[row] == 0) {
    if (threadIdx.x == 0) p.counts[row] = 0;
    return;
  }
  const SessionProcessors& q = p.procs;
  if (threadIdx.x == 0) {
    common = 0;
    // Read once: the engine may rewrite its buffer during the step, and every thread here and
    // SessionWriteKernel must use the offsets that were checked.
    head = ReadSessionRowHeader(q, row);
    p.headers[row] = head;
  }
  __syncthreads();
  const bool header = SessionRowHeaderValid(head, q);
  bool bad = !header;
  uint32_t mine = 0;
  uint32_t b0 = 0, b1 = 0, h0 = 0, h1 = 0;
  if (header) {
    b0 = head.b0;
    b1 = head.b1;
    h0 = head.h0;
    h1 = head.h1;
    for (uint32_t i = h0 + threadIdx.x; i < h1; i += kStepThreads) {
      bad |= !SessionHistoryEntryValid(q, i, h0, p.vocab);
    }
    for (uint32_t i = b0 + threadIdx.x; i < b1; i += kStepThreads) {
      bad |= !SessionBiasEntryValid(q, i, b0, p.vocab);
      uint32_t rank;
      mine += Contains(q.history_tokens, h0, h1, q.bias_tokens[i], &rank) ? 1u : 0u;
    }
  }
  if (mine != 0) atomicAdd(&common, mine);
  bad = __syncthreads_or(bad);
  if (threadIdx.x != 0) return;
  if (bad) {
    RejectRow(p, row);
    p.counts[row] = 0;
  } else {
    p.counts[row] = (b1 - b0) + (h1 - h0) - common;  // exact only for a valid row (sorted lists)
  }
}

// Launch: 1 block of kStepThreads, after SessionCheckKernel. The offsets over all max_batch
// rows: a block scan of the counts, or, when the rows' entries overrun NB + NH (ranges that
// overlap next to a row with decreasing offsets), a serial pass by thread 0 that rejects the
// rows that do not fit, in row order, as the host plane does (SessionEntriesFit).
__global__ void __launch_bounds__(kStepThreads) SessionOffsetsKernel(ProcessorsStep p) {
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
  if (carry <= capacity || threadIdx.x != 0) return;
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

// Writes the merged entries of one list of a row: each entry x of `list` [x0, x1) goes to its
// rank in the union, (its index in the list) + (the other list's tokens below it) - (the
// tokens of both lists below it, an exclusive block scan of `in other` flags over the list,
// chunk by chunk). With `primary`, entries in both lists are written here, merged; otherwise
// they are skipped (the primary list writes them).
//
// The lists are read where SessionCheckKernel checked them (the header it read, `h`), and an
// entry is written only to one of the row's `count` slots and only with a token in [0, vocab):
// an engine that rewrites its buffer during the step (a bug on its side) would otherwise make
// this kernel write past the merged list, or MarkAdjustsKernel index `marked` by a token it
// never checked. Returns true when the row's entries are not those that were checked (some
// entry could not be written): the row is then rejected.
__device__ bool WriteUnionSide(const ProcessorsStep& p, const SessionRowHeader& h, uint32_t count,
                               bool primary, TokenAdjust* out) {
  const SessionProcessors& q = p.procs;
  const uint32_t b0 = h.b0, b1 = h.b1;
  const uint32_t h0 = h.h0, h1 = h.h1;
  const int32_t* list = primary ? q.bias_tokens : q.history_tokens;
  const int32_t* other = primary ? q.history_tokens : q.bias_tokens;
  const uint32_t x0 = primary ? b0 : h0, x1 = primary ? b1 : h1;
  const uint32_t y0 = primary ? h0 : b0, y1 = primary ? h1 : b1;
  __shared__ uint32_t scan[kStepThreads];
  __shared__ uint32_t carry;
  if (threadIdx.x == 0) carry = 0;
  bool changed = false;
  for (uint32_t base = x0; base < x1; base += kStepThreads) {
    const uint32_t i = base + threadIdx.x;
    uint32_t rank = 0;
    const bool both = i < x1 && Contains(other, y0, y1, list[i], &rank);
    scan[threadIdx.x] = both ? 1u : 0u;
    __syncthreads();
    for (int d = 1; d < kStepThreads; d <<= 1) {
      const uint32_t add = threadIdx.x >= static_cast<unsigned>(d) ? scan[threadIdx.x - d] : 0;
      __syncthreads();
      scan[threadIdx.x] += add;
      __syncthreads();
    }
    const uint32_t below = carry + scan[threadIdx.x] - (both ? 1u : 0u);  // exclusive
    if (i < x1 && (primary || !both)) {
      const uint32_t bias = primary ? i : kNoEntry;
      const uint32_t history = primary ? (both ? y0 + rank : kNoEntry) : i;
      const uint32_t at = (i - x0) + rank - below;
      const TokenAdjust a = SessionAdjust(q, h, bias, history);
      if (at < count && a.token >= 0 && a.token < p.vocab) {
        out[at] = a;
      } else {
        changed = true;
      }
    }
    __syncthreads();
    if (threadIdx.x == kStepThreads - 1) carry += scan[threadIdx.x];
    __syncthreads();
  }
  return __syncthreads_or(changed);
}

// Launch: grid (max_batch), kStepThreads threads; after SessionOffsetsKernel. Block `row`
// writes a valid row's merged entries at adjusts[offsets[row]], sorted by token as the
// sampling kernels need (row_processors.h): the bias side, then the history entries that no
// bias entry shares.
__global__ void __launch_bounds__(kStepThreads) SessionWriteKernel(ProcessorsStep p) {
  const uint32_t row = blockIdx.x;
  if (row >= p.words->batch || p.valid[row] == 0) return;
  const SessionRowHeader h = p.headers[row];
  const uint32_t count = p.counts[row];
  TokenAdjust* out = p.adjusts + p.offsets[row];
  bool changed = WriteUnionSide(p, h, count, /*primary=*/true, out);
  changed |= WriteUnionSide(p, h, count, /*primary=*/false, out);
  // The slots left unwritten keep earlier steps' entries (tokens in [0, vocab), or zeroes).
  if (changed && threadIdx.x == 0) RejectRow(p, row);
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
  out.headers = nullptr;
  out.offsets = nullptr;
  out.adjusts = nullptr;
  if (adjusts >= 0) {
    out.counts = reinterpret_cast<uint32_t*>(ws);
    ws += AlignUp(m * sizeof(uint32_t));
    out.headers = reinterpret_cast<SessionRowHeader*>(ws);
    ws += AlignUp(m * sizeof(SessionRowHeader));
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
                 AlignUp(max_batch * sizeof(SessionRowHeader)) +
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
        buffers.headers,
        buffers.offsets,
        buffers.adjusts};
    const unsigned rows = args.max_batch;
    SessionCheckKernel<<<rows, kStepThreads, 0, s>>>(procs);
    SessionOffsetsKernel<<<1, kStepThreads, 0, s>>>(procs);
    SessionWriteKernel<<<rows, kStepThreads, 0, s>>>(procs);
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
