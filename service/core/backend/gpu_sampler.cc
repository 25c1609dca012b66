#include "service/core/backend/gpu_sampler.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/gpu/runtime.h"
#include "service/core/backend/guarded_copy.h"
#include "service/core/model/status_macros.h"
#include "service/core/model/validated_batch.h"

namespace samplerd::core {
namespace {

namespace gpu = kernels::gpu;

// Sub-buffers start on this boundary (coalesced access, any element type).
constexpr size_t kAlign = 256;
// Buffers grow in steps of this, so that slowly growing requests do not reallocate each time.
constexpr size_t kGrowStep = size_t{2} << 20;
// Logits are staged and sent in chunks of this: the host copies chunk i + 1 into pinned
// memory while the DMA engine sends chunk i.
constexpr size_t kStageChunk = size_t{8} << 20;

size_t AlignUp(size_t n, size_t a) { return (n + a - 1) / a * a; }

// Where each output lives inside the output block (device and pinned copies alike).
struct OutputLayout {
  size_t token_ids = 0;        // int32 [B]
  size_t status = 0;           // RowStatus [B]
  size_t sampled_logprob = 0;  // float [B]            (logprobs only)
  size_t sampled_rank = 0;     // int64 [B]            (logprobs only)
  size_t top_ids = 0;          // int32 [B, N]         (logprobs only)
  size_t top_values = 0;       // float [B, N]         (logprobs only)
  size_t bytes = 0;

  static OutputLayout For(int64_t batch, int32_t top_logprobs) {
    const size_t b = static_cast<size_t>(batch);
    OutputLayout l;
    size_t at = 0;
    auto take = [&at](size_t bytes) {
      const size_t offset = at;
      at = AlignUp(at + bytes, kAlign);
      return offset;
    };
    l.token_ids = take(b * sizeof(int32_t));
    l.status = take(b * sizeof(kernels::RowStatus));
    if (top_logprobs >= 0) {
      const size_t n = static_cast<size_t>(top_logprobs);
      l.sampled_logprob = take(b * sizeof(float));
      l.sampled_rank = take(b * sizeof(int64_t));
      l.top_ids = take(b * n * sizeof(int32_t));
      l.top_values = take(b * n * sizeof(float));
    }
    l.bytes = at;
    return l;
  }
};

// Warm-up logits: `vocab` positive values rising with the column, so the argmax is the last
// column. Positive IEEE floats order like their bit patterns, so the bits of 1.0 plus the
// column index make such a row in any dtype without a conversion routine.
std::vector<char> RisingLogits(kernels::DType dtype, int64_t batch, int64_t vocab) {
  std::vector<char> bytes(static_cast<size_t>(batch * vocab * kernels::DTypeSize(dtype)));
  for (int64_t i = 0; i < batch * vocab; ++i) {
    const uint32_t column = static_cast<uint32_t>(i % vocab);
    if (dtype == kernels::DType::kFp32) {
      const uint32_t bits = 0x3f800000u + column;
      std::memcpy(bytes.data() + i * 4, &bits, 4);
    } else {
      const uint16_t bits =
          static_cast<uint16_t>((dtype == kernels::DType::kFp16 ? 0x3c00u : 0x3f80u) + column);
      std::memcpy(bytes.data() + i * 2, &bits, 2);
    }
  }
  return bytes;
}

template <typename T>
T* At(void* base, size_t offset) {
  return reinterpret_cast<T*>(static_cast<char*>(base) + offset);
}

}  // namespace

std::vector<DeviceInfo> ListGpuDevices(std::string* why_none) {
  std::string why;
  std::vector<DeviceInfo> out;
  for (const gpu::DeviceProperties& p : gpu::ListDevices(&why)) {
    DeviceInfo d;
    d.ordinal = p.ordinal;
    d.pci_bus_id = p.pci_bus_id;
    d.uuid = p.uuid;
    d.name = p.name;
    d.ipc_memory = p.ipc_memory;
    d.ipc_events = p.ipc_events;
    out.push_back(std::move(d));
  }
  if (out.empty()) {
    *why_none = absl::StrCat(gpu::RuntimeName(), " runtime: ", why.empty() ? "no devices" : why);
  }
  return out;
}

absl::StatusOr<std::unique_ptr<GpuSampler>> GpuSampler::Create(int ordinal) {
  std::string why;
  std::vector<DeviceInfo> devices = ListGpuDevices(&why);
  const auto it = std::find_if(devices.begin(), devices.end(),
                               [ordinal](const DeviceInfo& d) { return d.ordinal == ordinal; });
  if (it == devices.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat(gpu::RuntimeName(), " device ", ordinal, " is not among the ", devices.size(),
                     " devices listed", why.empty() ? "" : " (", why, why.empty() ? "" : ")"));
  }
  const std::string name =
      absl::StrCat(gpu::RuntimeName(), " device ", ordinal, " (", it->pci_bus_id, ")");
  const int set = gpu::SetDevice(ordinal);
  if (set != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(name, ": making it current failed: ", gpu::ErrorString(set)));
  }
  gpu::Stream stream = nullptr;
  const int created = gpu::StreamCreate(&stream);
  if (created != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(name, ": creating a stream failed: ", gpu::ErrorString(created)));
  }
  gpu::Event staged = nullptr;
  const int event = gpu::EventCreate(&staged, /*interprocess=*/false);
  if (event != 0) {
    (void)gpu::StreamDestroy(stream);
    return absl::FailedPreconditionError(
        absl::StrCat(name, ": creating an event failed: ", gpu::ErrorString(event)));
  }
  return std::unique_ptr<GpuSampler>(new GpuSampler(std::move(*it), stream, staged));
}

GpuSampler::GpuSampler(DeviceInfo device, gpu::Stream stream, gpu::Event staged)
    : device_(std::move(device)), stream_(stream), staged_(staged) {}

GpuSampler::~GpuSampler() {
  (void)gpu::SetDevice(device_.ordinal);
  (void)gpu::StreamSynchronize(stream_);
  for (Buffer* b : {&pinned_in_, &device_in_, &device_out_, &pinned_out_, &workspace_}) {
    Release(b);
  }
  (void)gpu::EventDestroy(staged_);
  (void)gpu::StreamDestroy(stream_);
}

void GpuSampler::Release(Buffer* buffer) {
  if (buffer->ptr != nullptr) {
    (void)(buffer->pinned ? gpu::PinnedFree(buffer->ptr) : gpu::DeviceFree(buffer->ptr));
  }
  buffer->ptr = nullptr;
  buffer->bytes = 0;
}

absl::Status GpuSampler::Reserve(Buffer* buffer, size_t bytes, absl::string_view what) {
  if (bytes <= buffer->bytes) return absl::OkStatus();
  // The old buffer can go once the stream no longer uses it: a request that returned at its done
  // event may still have kernels queued (pinned staging was waited for in Sample already).
  if (unsynced_ && !buffer->pinned) {
    RETURN_IF_ERROR(Check(gpu::StreamSynchronize(stream_), "finishing the previous request"));
    unsynced_ = false;
  }
  Release(buffer);
  const size_t want = AlignUp(bytes, kGrowStep);
  const int code = buffer->pinned ? gpu::PinnedMalloc(&buffer->ptr, want)
                                  : gpu::DeviceMalloc(&buffer->ptr, want);
  if (code != 0) {
    // Out of memory is not a fault: clear the error and let smaller requests go on. A real
    // fault shows up again at the next copy or launch.
    (void)gpu::LastError();
    buffer->ptr = nullptr;
    return absl::ResourceExhaustedError(absl::StrCat(
        "expected ", want, " bytes of ", buffer->pinned ? "pinned host" : "device", " memory for ",
        what, " on GPU ", device_.pci_bus_id, ", got ", gpu::ErrorString(code)));
  }
  buffer->bytes = want;
  if (buffer->zeroed) {
    return Check(gpu::ZeroDevice(buffer->ptr, want, stream_), absl::StrCat("zeroing ", what));
  }
  return absl::OkStatus();
}

absl::Status GpuSampler::Check(int code, absl::string_view what) {
  if (code == 0) return absl::OkStatus();
  const std::string message = absl::StrCat(what, ": ", gpu::ErrorString(code));
  if (!faulted_) {
    faulted_ = true;
    fault_ = message;
  }
  (void)gpu::LastError();
  return absl::InternalError(absl::StrCat("GPU ", device_.pci_bus_id, ": ", message));
}

absl::Status GpuSampler::Warmup() {
  constexpr int64_t kVocab = 16;
  constexpr int32_t kTopK = 4;
  for (kernels::DType dtype :
       {kernels::DType::kFp32, kernels::DType::kBf16, kernels::DType::kFp16}) {
    ValidatedBatch batch;
    batch.dtype = dtype;
    batch.batch = 2;
    batch.vocab = kVocab;
    batch.row_stride = kVocab;
    kernels::RowParams greedy;
    greedy.temperature = 0.0f;
    kernels::RowParams top_k;
    top_k.top_k = kTopK;
    top_k.seed = 1;
    batch.params = {greedy, top_k};
    batch.seeds = {0, 1};
    batch.top_logprobs = 1;
    const std::vector<char> logits = RisingLogits(dtype, batch.batch, kVocab);
    SampleResult result;
    SampleIo io;
    io.logits = logits.data();
    const absl::Status status = Sample(batch, io, &result);
    const std::string what = absl::StrCat("the ", kernels::DTypeName(dtype),
                                          " warm-up batch on GPU ", device_.pci_bus_id);
    if (!status.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("expected ", what, " to sample, got: ", status.message()));
    }
    const bool ok =
        result.row_status.size() == 2 && result.row_status[0] == kernels::RowStatus::kOk &&
        result.row_status[1] == kernels::RowStatus::kOk && result.token_ids[0] == kVocab - 1 &&
        result.token_ids[1] >= kVocab - kTopK && result.token_ids[1] < kVocab;
    if (!ok) {
      return absl::FailedPreconditionError(
          absl::StrCat("expected ", what, " to return tokens ", kVocab - 1, " (greedy) and ",
                       kVocab - kTopK, "..", kVocab - 1, " (top-k), got ",
                       result.token_ids.size() == 2
                           ? absl::StrCat(result.token_ids[0], " and ", result.token_ids[1])
                           : absl::StrCat(result.token_ids.size(), " tokens")));
    }
  }
  return absl::OkStatus();
}

absl::Status GpuSampler::Sample(const ValidatedBatch& batch, const SampleIo& io,
                                SampleResult* result) {
  if (faulted_) {
    return absl::UnavailableError(absl::StrCat("the GPU backend on ", device_.pci_bus_id,
                                               " faulted earlier (", fault_,
                                               "); samplerd needs a restart"));
  }
  const int64_t element_bytes = kernels::DTypeSize(batch.dtype);
  if (io.logits_on_device && reinterpret_cast<uintptr_t>(io.logits) % element_bytes != 0) {
    // A misaligned element load would be a sticky fault of the whole context: refuse it here.
    return absl::InvalidArgumentError(absl::StrCat(
        "expected device logits aligned to their ", element_bytes,
        "-byte elements, got an address ", reinterpret_cast<uintptr_t>(io.logits) % element_bytes,
        " bytes past a boundary (check the region offset)"));
  }
  if (io.bitmask_on_device && reinterpret_cast<uintptr_t>(io.bitmask) % sizeof(uint32_t) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected a device token_bitmask aligned to its 4-byte words, got an address ",
                     reinterpret_cast<uintptr_t>(io.bitmask) % sizeof(uint32_t),
                     " bytes past a boundary (check the region offset)"));
  }
  if (io.done_event != nullptr && io.output == nullptr) {
    return absl::InvalidArgumentError("expected an output with a done event, got none");
  }
  // With a done event and a device output, nothing needs the host: enqueue, record, return.
  const bool reply_early = io.done_event != nullptr && io.output_on_device;

  const int64_t b = batch.batch;
  const int32_t n = batch.top_logprobs;
  // Inputs, pinned and device alike: [logits | params | processors], where the logits are left
  // out when on the device (read where they are), and the processors are the adjust offsets,
  // the adjusts and a host bitmask, each when present.
  const size_t logits_bytes =
      io.logits_on_device
          ? 0
          : static_cast<size_t>(InlineBytes(batch.dtype, b, batch.vocab, batch.row_stride));
  const size_t params_offset = AlignUp(logits_bytes, kAlign);
  const size_t params_bytes = batch.params.size() * sizeof(kernels::RowParams);
  const size_t offsets_offset = AlignUp(params_offset + params_bytes, kAlign);
  const size_t offsets_bytes = batch.adjust_offsets.size() * sizeof(uint32_t);
  const size_t adjusts_offset = AlignUp(offsets_offset + offsets_bytes, kAlign);
  const size_t adjusts_bytes = batch.adjusts.size() * sizeof(kernels::TokenAdjust);
  const size_t bitmask_offset = AlignUp(adjusts_offset + adjusts_bytes, kAlign);
  const size_t bitmask_bytes = batch.bitmask_words > 0 && !io.bitmask_on_device
                                   ? static_cast<size_t>(b * batch.bitmask_words) * sizeof(uint32_t)
                                   : 0;
  const size_t input_bytes = bitmask_offset + bitmask_bytes;
  const OutputLayout out = OutputLayout::For(b, n);
  const size_t workspace_bytes = gpu::SampleWorkspaceBytes(b, batch.vocab, n);

  RETURN_IF_ERROR(Check(gpu::SetDevice(device_.ordinal), "selecting the device"));
  if (unsynced_) {
    // The previous request returned at its done event: its copies from pinned staging may still
    // be queued. Wait for those copies only, not for its kernels.
    RETURN_IF_ERROR(Check(gpu::EventSynchronize(staged_), "waiting for the previous inputs"));
  }
  RETURN_IF_ERROR(Reserve(&pinned_in_, input_bytes, "staging the inputs"));
  RETURN_IF_ERROR(Reserve(&device_in_, input_bytes, "the inputs"));
  RETURN_IF_ERROR(Reserve(&device_out_, out.bytes, "the outputs"));
  RETURN_IF_ERROR(Reserve(&pinned_out_, out.bytes, "staging the outputs"));
  RETURN_IF_ERROR(Reserve(&workspace_, workspace_bytes, "the kernels' workspace"));

  // Host logits in chunks (host copy of the next chunk overlaps the DMA of this one), then the
  // parameters.
  const char* src = static_cast<const char*>(io.logits);
  for (size_t at = 0; at < logits_bytes; at += kStageChunk) {
    const size_t len = std::min(kStageChunk, logits_bytes - at);
    // Guarded: host shm logits may be truncated by their owner under us (inline bytes never
    // fault, and the guard costs a sigsetjmp per chunk).
    if (!GuardedCopy(At<char>(pinned_in_.ptr, at), src + at, len)) {
      // The chunks already queued read pinned memory only; the next request waits for them.
      RETURN_IF_ERROR(Check(gpu::StreamSynchronize(stream_), "finishing the staged chunks"));
      return ShrunkShmError("the logits region");
    }
    RETURN_IF_ERROR(Check(
        gpu::CopyToDevice(At<char>(device_in_.ptr, at), At<char>(pinned_in_.ptr, at), len, stream_),
        "copying the logits to the device"));
  }
  std::memcpy(At<char>(pinned_in_.ptr, params_offset), batch.params.data(), params_bytes);
  if (!batch.adjusts.empty()) {  // (memcpy from an empty vector's null data() is undefined)
    std::memcpy(At<char>(pinned_in_.ptr, offsets_offset), batch.adjust_offsets.data(),
                offsets_bytes);
    std::memcpy(At<char>(pinned_in_.ptr, adjusts_offset), batch.adjusts.data(), adjusts_bytes);
  }
  // Guarded like the logits: a host shm bitmask may be truncated under us.
  if (bitmask_bytes > 0 &&
      !GuardedCopy(At<char>(pinned_in_.ptr, bitmask_offset), io.bitmask, bitmask_bytes)) {
    RETURN_IF_ERROR(Check(gpu::StreamSynchronize(stream_), "finishing the staged chunks"));
    return ShrunkShmError("the token_bitmask region");
  }
  RETURN_IF_ERROR(Check(gpu::CopyToDevice(At<char>(device_in_.ptr, params_offset),
                                          At<char>(pinned_in_.ptr, params_offset),
                                          input_bytes - params_offset, stream_),
                        "copying the parameters to the device"));
  if (reply_early) {
    // Recorded before the ready-event wait, so that the next request waits for these copies
    // only, never for the producer.
    RETURN_IF_ERROR(Check(gpu::EventRecord(staged_, stream_), "recording the staging event"));
  }
  if (io.ready_event != nullptr) {
    RETURN_IF_ERROR(
        Check(gpu::StreamWaitEvent(stream_, io.ready_event), "waiting on the ready event"));
  }

  kernels::SampleArgs args;
  args.logits = io.logits_on_device ? io.logits : device_in_.ptr;
  args.dtype = batch.dtype;
  args.batch = b;
  args.vocab = batch.vocab;
  args.row_stride = batch.row_stride;
  args.params = At<const kernels::RowParams>(device_in_.ptr, params_offset);
  args.params_count = static_cast<int64_t>(batch.params.size());
  // The two-pass top-p kernel is launched only for batches that have such rows.
  args.top_p_rows = gpu::HasTopPRows(batch.params.data(), args.params_count, batch.vocab);
  // A batch of greedy rows is one kernel launch.
  args.all_greedy = gpu::AllGreedy(batch.params.data(), args.params_count);
  args.top_logprobs = n;
  args.logprob_source = batch.logprob_source;
  if (batch.bitmask_words > 0) {
    args.allowed_bitmask = io.bitmask_on_device
                               ? static_cast<const uint32_t*>(io.bitmask)
                               : At<const uint32_t>(device_in_.ptr, bitmask_offset);
    args.bitmask_words = batch.bitmask_words;
  }
  if (!batch.adjusts.empty()) {
    args.adjust_offsets = At<const uint32_t>(device_in_.ptr, offsets_offset);
    args.adjusts = At<const kernels::TokenAdjust>(device_in_.ptr, adjusts_offset);
  }
  args.token_ids = At<int32_t>(device_out_.ptr, out.token_ids);
  args.status = At<kernels::RowStatus>(device_out_.ptr, out.status);
  if (n >= 0) {
    args.sampled_logprob = At<float>(device_out_.ptr, out.sampled_logprob);
    args.sampled_rank = At<int64_t>(device_out_.ptr, out.sampled_rank);
    args.top_ids = At<int32_t>(device_out_.ptr, out.top_ids);
    args.top_values = At<float>(device_out_.ptr, out.top_values);
  }
  RETURN_IF_ERROR(Check(gpu::Sample(args, workspace_.ptr, workspace_bytes, stream_),
                        "launching the sampling kernels"));
  const size_t token_bytes = static_cast<size_t>(b) * sizeof(int32_t);
  if (io.output != nullptr && io.output_on_device) {
    RETURN_IF_ERROR(Check(gpu::CopyDeviceToDevice(io.output, args.token_ids, token_bytes, stream_),
                          "copying the token ids to the output region"));
  }
  if (reply_early) {
    RETURN_IF_ERROR(Check(gpu::EventRecord(io.done_event, stream_), "recording the done event"));
    unsynced_ = true;
    result->token_ids.clear();
    result->row_status.clear();
    result->logprobs.clear();
    return absl::OkStatus();
  }

  RETURN_IF_ERROR(Check(gpu::CopyToHost(pinned_out_.ptr, device_out_.ptr, out.bytes, stream_),
                        "copying the outputs to the host"));
  RETURN_IF_ERROR(Check(gpu::StreamSynchronize(stream_), "sampling"));
  unsynced_ = false;

  const int32_t* token_ids = At<const int32_t>(pinned_out_.ptr, out.token_ids);
  if (io.output != nullptr && !io.output_on_device) {
    if (!GuardedCopy(io.output, token_ids, token_bytes)) return ShrunkShmError("the output region");
  }
  if (io.done_event != nullptr) {
    // A host output is written by now; the event completes at once (the stream is idle). The
    // reply carries no tokens, as with a device output.
    RETURN_IF_ERROR(Check(gpu::EventRecord(io.done_event, stream_), "recording the done event"));
    result->token_ids.clear();
    result->row_status.clear();
    result->logprobs.clear();
    return absl::OkStatus();
  }
  const kernels::RowStatus* status = At<const kernels::RowStatus>(pinned_out_.ptr, out.status);
  result->token_ids.assign(token_ids, token_ids + b);
  result->row_status.assign(status, status + b);
  if (n >= 0) {
    const float* sampled_logprob = At<const float>(pinned_out_.ptr, out.sampled_logprob);
    const int64_t* sampled_rank = At<const int64_t>(pinned_out_.ptr, out.sampled_rank);
    const int32_t* top_ids = At<const int32_t>(pinned_out_.ptr, out.top_ids);
    const float* top_values = At<const float>(pinned_out_.ptr, out.top_values);
    result->logprobs.resize(b);
    for (int64_t r = 0; r < b; ++r) {
      RowLogprobs& lp = result->logprobs[r];
      lp.sampled_logprob = sampled_logprob[r];
      lp.sampled_rank = sampled_rank[r];
      lp.top_ids.assign(top_ids + r * n, top_ids + (r + 1) * n);
      lp.top_values.assign(top_values + r * n, top_values + (r + 1) * n);
    }
  }
  return absl::OkStatus();
}

}  // namespace samplerd::core
