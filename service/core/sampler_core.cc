#include "service/core/sampler_core.h"

#include <algorithm>
#include <random>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "service/core/backend/device_match.h"
#include "service/core/backend/mps.h"
#include "service/core/model/status_macros.h"
#include "service/core/processors.h"
#include "service/core/regions/counting_gpu_ipc.h"
#include "service/core/regions/request_io.h"
#include "service/core/validation.h"

#if SAMPLERD_HAVE_GPU
#include "service/core/regions/gpu_ipc_runtime.h"
#endif

namespace samplerd::core {

const char kVersion[] = "0.1.0";

namespace {

uint64_t RandomSeedStart() {
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) ^ rd();
}

// The devices GPU IPC regions may be opened on: the backend's, when it supports IPC memory.
std::vector<IpcDevice> IpcDevices(const Sampler& sampler) {
  const DeviceInfo& d = sampler.device();
  if (sampler.kind() != BackendKind::kGpu || !d.ipc_memory) return {};
  return {IpcDevice{d.ordinal, d.pci_bus_id, d.uuid}};
}

// The sampler's device as device sessions see it: IPC memory only with a GpuIpc.
DeviceInfo SessionDevice(const Sampler& sampler, bool has_gpu_ipc) {
  DeviceInfo device = sampler.device();
  if (!has_gpu_ipc) device.ipc_memory = device.ipc_events = false;
  return device;
}

// Whether a bias list or token history is packed in a region (read in Run, before sampling).
bool ReadsProcessorLists(const SampleRequest& request) {
  return (request.logit_bias.has_value() && request.logit_bias->region.has_value()) ||
         (request.token_history.has_value() && request.token_history->region.has_value());
}

}  // namespace

absl::StatusOr<std::unique_ptr<SamplerCore>> SamplerCore::Create(const CoreOptions& options) {
  ASSIGN_OR_RETURN(SelectedBackend backend,
                   SelectBackend(options.backend, options.gpu, options.threads));
  CoreOptions core_options = options;
#if SAMPLERD_HAVE_GPU
  // GPU IPC regions and events go through the runtime unless the caller brought its own.
  if (backend.sampler->kind() == BackendKind::kGpu && core_options.gpu_ipc == nullptr) {
    core_options.gpu_ipc = MakeRuntimeGpuIpc();
  }
#endif
  auto core =
      std::make_unique<SamplerCore>(core_options, std::move(backend.sampler), RandomSeedStart());
  core->devices_ = std::move(backend.devices);
  return core;
}

SamplerCore::SamplerCore(const CoreOptions& options, std::unique_ptr<Sampler> sampler,
                         uint64_t seed_start)
    : options_(options),
      sampler_(std::move(sampler)),
      seeds_(seed_start),
      gpu_ipc_(WithOpenCounting(options.gpu_ipc, options.metrics)),
      regions_(
          std::make_unique<RegionRegistry>(options.regions, gpu_ipc_.get(), IpcDevices(*sampler_))),
      events_(gpu_ipc_ != nullptr ? std::make_unique<IpcEventCache>(gpu_ipc_.get()) : nullptr),
      sessions_(std::make_unique<SessionManager>(
          regions_.get(), sampler_->kind(), SessionDevice(*sampler_, gpu_ipc_ != nullptr),
          options.limits, options.sessions, DefaultRunnerFactory(options.sessions))),
      executor_(std::make_unique<Executor>()) {}

SamplerCore::~SamplerCore() { executor_.reset(); }

void SamplerCore::CloseRegions() {
  if (events_ != nullptr) events_->CloseAll();
  regions_->CloseAll();
}

absl::Status SamplerCore::SampleAsync(SampleRequest request, Callback done) {
  return SampleAsync(std::move(request), std::move(done), InflightBytes());
}

absl::Status SamplerCore::SampleAsync(SampleRequest request, Callback done,
                                      InflightBytes reserved) {
  RETURN_IF_ERROR(CheckServing());
  const absl::Time now = absl::Now();
  if (now >= request.deadline) {
    return absl::DeadlineExceededError(absl::StrCat(
        "expected a deadline in the future, got one that passed ",
        absl::FormatDuration(now - request.deadline), " ago, before the request was queued"));
  }
  // The inline bytes the server holds for this request (checked against the shape later, in
  // validation), less what the transport reserved for it already.
  const int64_t inline_bytes =
      request.has_inline_data ? static_cast<int64_t>(request.inline_data.size()) : 0;
  RETURN_IF_ERROR(Admit(std::max<int64_t>(0, inline_bytes - reserved.bytes())));
  const int64_t bytes = std::max(inline_bytes, reserved.Take());
  absl::Status status = Queue(std::move(request), std::move(done), bytes);
  if (!status.ok()) {
    ReleaseAdmission(bytes);
    Finish();
  }
  return status;
}

absl::Status SamplerCore::CheckServing() const {
  if (faulted()) return FaultedError();
  if (draining_.load(std::memory_order_acquire)) {
    return absl::UnavailableError("samplerd is shutting down; retry on another instance");
  }
  return absl::OkStatus();
}

absl::StatusOr<SamplerCore::InflightBytes> SamplerCore::ReserveInflightBytes(int64_t bytes) {
  // A step that can never run is refused before its chunks are collected.
  RETURN_IF_ERROR(CheckServing());
  {
    std::lock_guard<std::mutex> lock(mu_);
    RETURN_IF_ERROR(CheckBytesLocked(bytes));
    inflight_bytes_ += bytes;
  }
  if (options_.metrics != nullptr) options_.metrics->AddInflightBytes(bytes);
  return InflightBytes(this, bytes);
}

absl::Status SamplerCore::CheckBytesLocked(int64_t bytes) const {
  const int64_t limit = options_.limits.max_inflight_bytes;
  if (limit <= 0 || bytes <= limit - inflight_bytes_) return absl::OkStatus();
  // RESOURCE_EXHAUSTED also for a request larger than the whole budget, not INVALID_ARGUMENT:
  // the request is well-formed and only over this server's configured capacity, which is how
  // every size limit is answered (--max_batch, --max_vocab, --max_message_bytes, a chunked
  // step over 1 GiB); the message tells it from a full budget so that clients do not retry.
  if (bytes > limit) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "expected at most ", limit, " inline logits bytes in flight (--max_inflight_bytes), got ",
        bytes,
        " bytes in one request, which can never fit; split the batch or send the logits "
        "in a region"));
  }
  return absl::ResourceExhaustedError(absl::StrCat(
      "expected at most ", limit, " inline logits bytes in flight (--max_inflight_bytes), got ",
      bytes, " more with ", inflight_bytes_, " in flight; retry later"));
}

absl::Status SamplerCore::Admit(int64_t more_bytes) {
  const int64_t limit = options_.limits.max_inflight;
  const int64_t max_bytes = options_.limits.max_inflight_bytes;
  {
    std::lock_guard<std::mutex> lock(mu_);
    // A request that can never fit is told so whatever the load.
    if (max_bytes > 0 && more_bytes > max_bytes) return CheckBytesLocked(more_bytes);
    if (limit > 0 && admitted_ >= limit) {
      return absl::ResourceExhaustedError(absl::StrCat("server busy: ", admitted_,
                                                       " requests in flight, limit ", limit,
                                                       " (--max_inflight); retry later"));
    }
    RETURN_IF_ERROR(CheckBytesLocked(more_bytes));
    ++admitted_;
    ++admissions_;
    ++in_flight_;
    inflight_bytes_ += more_bytes;
  }
  if (options_.metrics != nullptr) {
    options_.metrics->AddInflight(1);
    options_.metrics->AddInflightBytes(more_bytes);
  }
  return absl::OkStatus();
}

void SamplerCore::ReleaseAdmission(int64_t bytes) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    --admitted_;
    inflight_bytes_ -= bytes;
  }
  if (options_.metrics != nullptr) {
    options_.metrics->AddInflight(-1);
    options_.metrics->AddInflightBytes(-bytes);
  }
}

void SamplerCore::ReleaseBytes(int64_t bytes) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    inflight_bytes_ -= bytes;
  }
  if (options_.metrics != nullptr) options_.metrics->AddInflightBytes(-bytes);
}

SamplerCore::InflightBytes& SamplerCore::InflightBytes::operator=(InflightBytes&& other) noexcept {
  if (this != &other) {
    Reset();
    core_ = std::exchange(other.core_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

void SamplerCore::InflightBytes::Reset() {
  if (core_ != nullptr) core_->ReleaseBytes(bytes_);
  core_ = nullptr;
  bytes_ = 0;
}

int64_t SamplerCore::InflightBytes::Take() {
  core_ = nullptr;
  return std::exchange(bytes_, 0);
}

absl::Status SamplerCore::Queue(SampleRequest request, Callback done, int64_t bytes) {
  absl::StatusOr<ValidatedBatch> batch =
      ValidateSampleRequest(request, options_.limits, [this] { return seeds_.Next(); });
  if (!batch.ok()) return batch.status();
  RETURN_IF_ERROR(MatchDevice(request.device, sampler_->device()));
  absl::StatusOr<BoundIo> io =
      BindSampleIo(request, *batch, *sampler_, *regions_, events_.get(), devices_);
  if (!io.ok()) return io.status();
  // Bias lists and histories in regions are read in Run, on the executor thread: a GPU IPC
  // slice's copy waits for the request's ready event, which must not block the caller (a gRPC
  // reactor, sometimes holding its stream's lock).
  // Shared: the executor's tasks must be copyable, leases are not.
  auto bound = std::make_shared<BoundIo>(*std::move(io));
  executor_->Submit([this, request = std::move(request), batch = *std::move(batch),
                     done = std::move(done), bound = std::move(bound), bytes]() mutable {
    Run(request, batch, *bound, done, bytes);
    // The leases outlive the completion; a region unregistered meanwhile is closed by the
    // registry's closer thread, not here.
    bound.reset();
    Finish();
  });
  return absl::OkStatus();
}

void SamplerCore::Run(SampleRequest& request, ValidatedBatch& batch, BoundIo& bound,
                      const Callback& done, int64_t bytes) {
  metrics::SamplerMetrics* const metrics = options_.metrics;
  const absl::Time start = absl::Now();
  if (metrics != nullptr) metrics->ObserveQueueWait(start - request.arrival);
  // Refused before the backend: the deadline first (a passed deadline also cancels the call);
  // last, lists in regions that cannot be read or fail the checks.
  absl::Status refused;
  if (start >= request.deadline) {
    refused = absl::DeadlineExceededError(
        absl::StrCat("expected to start sampling before the request's deadline, got there ",
                     absl::FormatDuration(start - request.deadline), " after it, having waited ",
                     absl::FormatDuration(start - request.arrival), " in the queue; not sampled"));
  } else if (request.is_cancelled && request.is_cancelled()) {
    refused = absl::CancelledError(
        "the client cancelled the request or its deadline passed before sampling started");
  } else if (faulted()) {
    refused = FaultedError();
  } else if (cancelled_.load(std::memory_order_acquire)) {
    refused = CancelledByDrainError();
  } else if (ReadsProcessorLists(request)) {
    refused = ResolveProcessorLists(request, batch, bound);
  }
  if (!refused.ok()) {
    ReleaseAdmission(bytes);
    done(refused);
    if (metrics != nullptr) metrics->ObserveTotal(absl::Now() - request.arrival);
    return;
  }

  SampleResult result;
  result.request_id = request.request_id;
  result.seeds = std::move(batch.seeds);
  SampleIo io = bound.io;
  io.cancel = &cancelled_;
  absl::Status status = sampler_->Sample(batch, io, &result);
  if (absl::IsCancelled(status) && cancelled_.load(std::memory_order_acquire)) {
    status = CancelledByDrainError();
  }
  const absl::Time end = absl::Now();
  result.timings.queue = start - request.arrival;
  result.timings.compute = end - start;
  result.timings.total = end - request.arrival;
  // A sticky fault is recorded before `done` runs, so that a client retrying at once is
  // already refused.
  bool fatal = false;
  if (sampler_->faulted()) {
    if (status.ok()) status = absl::InternalError("the backend faulted");
    std::lock_guard<std::mutex> lock(mu_);
    if (!faulted_.load(std::memory_order_relaxed)) {
      fault_ = status;
      faulted_.store(true, std::memory_order_release);
      fatal = true;
    }
  }
  if (metrics != nullptr) {
    metrics->ObserveBackend(result.timings.compute);
    metrics->ObserveTotal(result.timings.total);
    if (status.ok()) {
      const metrics::Transport transport = request.has_inline_data ? metrics::Transport::kInline
                                           : bound.logits.view().kind == RegionKind::kGpuIpc
                                               ? metrics::Transport::kGpuIpc
                                               : metrics::Transport::kHostShm;
      metrics->CountSampled(transport, batch.batch,
                            InlineBytes(batch.dtype, batch.batch, batch.vocab, batch.row_stride));
    }
  }
  // The slot is free before the answer leaves: a client that sends its next request as soon as
  // it has this answer must find it free (and its bytes).
  ReleaseAdmission(bytes);
  if (status.ok()) {
    done(std::move(result));
  } else {
    done(status);
  }
  if (fatal && options_.on_fatal) options_.on_fatal(status);
}

absl::Status SamplerCore::ResolveProcessorLists(SampleRequest& request, ValidatedBatch& batch,
                                                BoundIo& bound) {
  RETURN_IF_ERROR(ReadProcessorLists(batch.batch, batch.vocab,
                                     options_.limits.max_region_list_bytes, *sampler_, *regions_,
                                     gpu_ipc_.get(), devices_, &request, &bound));
  return ValidateProcessors(request, &batch);
}

absl::Status SamplerCore::FaultedError() const {
  std::string why;
  {
    std::lock_guard<std::mutex> lock(mu_);
    why = std::string(fault_.message());
  }
  return absl::UnavailableError(
      absl::StrCat("expected a working backend on ", sampler_->device().name, ", got a fault (",
                   why, "); samplerd is restarting, retry on another instance"));
}

absl::Status SamplerCore::CancelledByDrainError() const {
  return absl::UnavailableError(
      "samplerd is shutting down and its grace period (--grace_period) ended before this request "
      "was sampled; retry on another instance");
}

void SamplerCore::Finish() {
  std::lock_guard<std::mutex> lock(mu_);
  if (--in_flight_ == 0) idle_cv_.notify_all();
}

int64_t SamplerCore::admitted() const {
  std::lock_guard<std::mutex> lock(mu_);
  return admitted_;
}

uint64_t SamplerCore::admissions() const {
  std::lock_guard<std::mutex> lock(mu_);
  return admissions_;
}

int64_t SamplerCore::inflight_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return inflight_bytes_;
}

bool SamplerCore::Drain(absl::Time deadline) {
  draining_.store(true, std::memory_order_release);
  sessions_->CloseAll();
  return WaitIdle(deadline);
}

bool SamplerCore::CancelInFlight(absl::Time deadline) {
  draining_.store(true, std::memory_order_release);
  cancelled_.store(true, std::memory_order_release);
  return WaitIdle(deadline);
}

bool SamplerCore::WaitIdle(absl::Time deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  return idle_cv_.wait_for(
      lock, absl::ToChronoNanoseconds(std::max(deadline - absl::Now(), absl::ZeroDuration())),
      [this] { return in_flight_ == 0; });
}

ServerInfo SamplerCore::Info() const {
  ServerInfo info;
  info.version = kVersion;
  info.backend = sampler_->kind();
  if (devices_.empty()) {
    info.devices.push_back(sampler_->device());
  } else {
    info.devices = devices_;
  }
  if (options_.gpu_ipc == nullptr) {
    for (DeviceInfo& d : info.devices) d.ipc_memory = d.ipc_events = false;
  }
  info.limits = options_.limits;
  info.max_region_bytes = options_.regions.max_region_bytes;
  info.max_regions = options_.regions.max_regions;
  info.device_sessions = sessions_->Support();
  info.device_sessions.mps = UnderMps();
  return info;
}

}  // namespace samplerd::core
