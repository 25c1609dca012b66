// The GPU plane (gpu_plane.h): a feeder thread keeps `steps_ahead` device-session steps
// enqueued on the session's own stream, each gated by a stream wait on the engine's doorbell,
// so that a step costs the server no host work; the thread only notices completed steps and
// tops the queue up.
#include "service/core/session/gpu_plane.h"

#include <atomic>
#include <chrono>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/gpu/runtime.h"
#include "kernels/gpu/session_step.h"
#include "proto/samplerd/v1/device_session.h"

namespace samplerd::core {
namespace {

namespace gpu = kernels::gpu;

// After a step completes the feeder polls without sleeping for this long (the engine is
// decoding and the next steps must be enqueued in time), then falls back to sleeping polls.
constexpr auto kSpin = std::chrono::milliseconds(2);
constexpr auto kSleep = std::chrono::microseconds(30);
// How long Stop() waits for the released steps before it gives up on the device (and leaks
// the session's device memory rather than free memory that may still be in use).
constexpr auto kStopDeadline = std::chrono::seconds(1);

std::string RuntimeText(int code) {
  return absl::StrCat(gpu::ErrorString(code), " (code ", code, ")");
}

// Returns INTERNAL naming `what` from the enclosing function when a runtime call fails.
#define RETURN_IF_RUNTIME(call, what)                                                          \
  do {                                                                                         \
    const int _code = (call);                                                                  \
    if (_code != 0) {                                                                          \
      (void)gpu::LastError();                                                                  \
      return absl::InternalError(absl::StrCat("GPU plane: ", what, ": ", RuntimeText(_code))); \
    }                                                                                          \
  } while (false)

// Device allocations and streams of ended sessions, kept for later sessions instead of freed.
// DeviceFree may synchronize the whole device, and so wait behind another session's parked
// doorbell wait until that engine rings (which an idle engine never does). Streams are mapped
// onto the device's hardware queues round robin in creation order (CUDA_DEVICE_MAX_CONNECTIONS),
// and a parked wait blocks its whole queue: reusing streams keeps the number ever created at
// the peak of open sessions, so that sessions never share a queue while that peak stays below
// the queue count. Holds at most that peak per device. Thread-safe.
class AllocationCache {
 public:
  static AllocationCache& Get() {
    static AllocationCache* cache = new AllocationCache();  // never destroyed
    return *cache;
  }

  // The smallest cached allocation of at least `bytes` on `ordinal`, else a new one (the
  // current device must be `ordinal`). Returns the runtime's code; *got is the real size.
  int Take(int ordinal, size_t bytes, void** ptr, size_t* got) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto best = free_.end();
      for (auto it = free_.begin(); it != free_.end(); ++it) {
        if (it->ordinal == ordinal && it->bytes >= bytes &&
            (best == free_.end() || it->bytes < best->bytes)) {
          best = it;
        }
      }
      if (best != free_.end()) {
        *ptr = best->ptr;
        *got = best->bytes;
        free_.erase(best);
        return 0;
      }
    }
    *got = bytes;
    return gpu::DeviceMalloc(ptr, bytes);
  }

  // Returns an allocation that no pending work touches any more.
  void Give(int ordinal, void* ptr, size_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    free_.push_back({ordinal, ptr, bytes});
  }

  // A cached idle stream of `ordinal`, else a new non-blocking one (current device: `ordinal`).
  int TakeStream(int ordinal, gpu::Stream* stream) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto it = streams_.begin(); it != streams_.end(); ++it) {
        if (it->first == ordinal) {
          *stream = it->second;
          streams_.erase(it);
          return 0;
        }
      }
    }
    return gpu::StreamCreate(stream);
  }

  // Returns a stream with no pending work.
  void GiveStream(int ordinal, gpu::Stream stream) {
    std::lock_guard<std::mutex> lock(mu_);
    streams_.emplace_back(ordinal, stream);
  }

 private:
  struct Entry {
    int ordinal;
    void* ptr;
    size_t bytes;
  };
  std::mutex mu_;
  std::vector<Entry> free_;                           // guarded by mu_
  std::vector<std::pair<int, gpu::Stream>> streams_;  // guarded by mu_
};

absl::Status ValidateSpec(const SessionSpec& spec, const GpuPlaneOptions& options) {
  if (spec.plane != SessionPlane::kGpu) {
    return absl::InvalidArgumentError("expected a GPU-plane session spec, got a host-plane one");
  }
  if (spec.device_ordinal < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected a device ordinal >= 0, got ", spec.device_ordinal));
  }
  if (spec.control == nullptr || spec.logits == nullptr || spec.params == nullptr ||
      spec.token_ids == nullptr || spec.row_status == nullptr) {
    return absl::InvalidArgumentError(
        "expected control, logits, params, token_ids and row_status buffers, got a null one");
  }
  if (spec.max_batch < 1 || spec.max_batch > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected max_batch in [1, 65535], got ", spec.max_batch));
  }
  if (spec.vocab < 1 || spec.row_stride < spec.vocab) {
    return absl::InvalidArgumentError(absl::StrCat(
        "expected vocab >= 1 and row_stride >= vocab, got ", spec.vocab, " and ", spec.row_stride));
  }
  if (options.steps_ahead < 1 || options.steps_ahead > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected steps_ahead in [1, 64], got ", options.steps_ahead));
  }
  return absl::OkStatus();
}

class GpuPlaneRunner final : public PlaneRunner {
 public:
  GpuPlaneRunner(SessionSpec spec, const GpuPlaneOptions& options,
                 PlaneRunner::FaultCallback on_fault)
      : spec_(std::move(spec)), options_(options), on_fault_(std::move(on_fault)) {}

  ~GpuPlaneRunner() override {
    Stop();
    if (!leaked_) FreeDeviceResources();
  }

  // Allocates the stream, workspace and events on the caller's thread (so that errors are
  // returned), then starts the feeder.
  absl::Status Start() {
    RETURN_IF_RUNTIME(gpu::SetDevice(spec_.device_ordinal), "selecting the device");
    bool supported = false;
    RETURN_IF_RUNTIME(gpu::StreamMemOpsSupported(spec_.device_ordinal, &supported),
                      "querying stream memory operations");
    if (!supported) {
      return absl::FailedPreconditionError(absl::StrCat(
          "expected a device with stream memory operations (wait/write value), got device ",
          spec_.device_ordinal, " without them"));
    }
    RETURN_IF_RUNTIME(AllocationCache::Get().TakeStream(spec_.device_ordinal, &stream_),
                      "creating the session stream");
    RETURN_IF_RUNTIME(AllocationCache::Get().TakeStream(spec_.device_ordinal, &release_stream_),
                      "creating the release stream");
    args_.control = spec_.control;
    args_.max_batch = spec_.max_batch;
    args_.dtype = spec_.dtype;
    args_.vocab = spec_.vocab;
    args_.row_stride = static_cast<int64_t>(spec_.row_stride);
    args_.logits = spec_.logits;
    args_.params = spec_.params;
    args_.token_ids = spec_.token_ids;
    args_.row_status = spec_.row_status;
    args_.sampled_logprobs = spec_.sampled_logprobs;
    args_.logprob_source = spec_.logprob_source;
    // The abort word sits in the workspace's first 256 bytes, before the step's own.
    workspace_bytes_ = gpu::SessionStepWorkspaceBytes(spec_.max_batch, spec_.vocab,
                                                      spec_.sampled_logprobs != nullptr);
    const int code = AllocationCache::Get().Take(
        spec_.device_ordinal, kAbortBytes + workspace_bytes_, &allocation_, &allocation_bytes_);
    if (code != 0) {
      allocation_ = nullptr;
      (void)gpu::LastError();
      return absl::ResourceExhaustedError(absl::StrCat(
          "expected ", kAbortBytes + workspace_bytes_,
          " bytes of device memory for the session's workspace, got ", RuntimeText(code)));
    }
    abort_ = static_cast<uint32_t*>(allocation_);
    workspace_ = static_cast<uint8_t*>(allocation_) + kAbortBytes;
    args_.abort = abort_;
    RETURN_IF_RUNTIME(gpu::StreamWriteValue32(stream_, abort_, 0), "clearing the abort word");
    RETURN_IF_RUNTIME(gpu::StreamSynchronize(stream_), "clearing the abort word");
    events_.assign(static_cast<size_t>(options_.steps_ahead), nullptr);
    for (gpu::Event& event : events_) {
      RETURN_IF_RUNTIME(gpu::EventCreate(&event, /*interprocess=*/false), "creating an event");
    }
    RETURN_IF_RUNTIME(gpu::EventCreate(&release_done_, /*interprocess=*/false),
                      "creating an event");
    try {
      thread_ = std::thread([this] { Run(); });
      started_ = true;
    } catch (const std::system_error& e) {
      return absl::ResourceExhaustedError(
          absl::StrCat("expected to start the session's feeder thread, got ", e.what()));
    }
    return absl::OkStatus();
  }

  void Stop() override {
    std::lock_guard<std::mutex> lock(stop_mu_);
    if (stopped_) return;
    stopped_ = true;
    stop_.store(true, std::memory_order_relaxed);
    if (thread_.joinable()) thread_.join();
    if (started_) ReleaseWaits();
  }

  uint64_t steps() const override { return steps_.load(std::memory_order_relaxed); }

 private:
  static constexpr size_t kAbortBytes = 256;

  uint8_t* ControlWord(uint32_t offset) const { return spec_.control + offset; }

  // The feeder: keeps steps_ahead steps enqueued and notices completions.
  void Run() {
    if (!Check(gpu::SetDevice(spec_.device_ordinal), "selecting the device")) return;
    auto last_activity = std::chrono::steady_clock::now();
    uint64_t enqueued = 0;
    while (!stop_.load(std::memory_order_relaxed)) {
      while (pending_.size() < events_.size()) {
        if (!EnqueueStep(events_[enqueued % events_.size()])) return;
        ++enqueued;
      }
      const int code = gpu::EventQuery(pending_.front());
      if (code == 0) {
        pending_.pop_front();
        steps_.fetch_add(1, std::memory_order_relaxed);
        last_activity = std::chrono::steady_clock::now();
        continue;
      }
      if (!gpu::IsNotReady(code)) {
        Check(code, "waiting for a step");
        return;
      }
      if (std::chrono::steady_clock::now() - last_activity < kSpin) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(kSleep);
      }
    }
  }

  // One step, in stream order: wait doorbell == RING; doorbell = 0; SessionStep; done = DONE;
  // record `event`. The step counts as pending from its wait on, so that Stop() releases it.
  bool EnqueueStep(gpu::Event event) {
    if (!Check(
            gpu::StreamWaitValue32(stream_, ControlWord(SAMPLERD_CONTROL_DOORBELL), SAMPLERD_RING),
            "enqueueing the doorbell wait")) {
      return false;
    }
    pending_.push_back(event);
    const bool ok =
        Check(gpu::StreamWriteValue32(stream_, ControlWord(SAMPLERD_CONTROL_DOORBELL), 0),
              "enqueueing the doorbell reset") &&
        Check(gpu::SessionStep(args_, workspace_, workspace_bytes_, stream_),
              "enqueueing the sampling step") &&
        Check(gpu::StreamWriteValue32(stream_, ControlWord(SAMPLERD_CONTROL_DONE), SAMPLERD_DONE),
              "enqueueing the done write");
    // Recorded even after a failure, so that Stop() can tell when the released wait is over.
    const bool recorded = Check(gpu::EventRecord(event, stream_), "recording the step event");
    return ok && recorded;
  }

  // Reports the first runtime failure through on_fault; true when `code` is success.
  bool Check(int code, const char* what) {
    if (code == 0) return true;
    (void)gpu::LastError();
    if (!faulted_.exchange(true) && on_fault_) {
      on_fault_(absl::InternalError(absl::StrCat("GPU plane: ", what, ": ", RuntimeText(code))));
    }
    return false;
  }

  // After the feeder has stopped: aborts every pending step and releases its doorbell wait in
  // turn from the release stream (each release waits for the previous step to finish, so that
  // its doorbell reset cannot swallow the next ring), then writes step_status = ABORTED and
  // done = DONE once more for a pending or future engine wait. Waits up to kStopDeadline.
  void ReleaseWaits() {
    bool ok = gpu::SetDevice(spec_.device_ordinal) == 0 &&
              gpu::StreamWriteValue32(release_stream_, abort_, 1) == 0;
    for (gpu::Event event : pending_) {
      ok = ok &&
           gpu::StreamWriteValue32(release_stream_, ControlWord(SAMPLERD_CONTROL_DOORBELL),
                                   SAMPLERD_RING) == 0 &&
           gpu::StreamWaitEvent(release_stream_, event) == 0;
    }
    ok = ok &&
         gpu::StreamWriteValue32(release_stream_, ControlWord(SAMPLERD_CONTROL_STEP_STATUS),
                                 SAMPLERD_STEP_ABORTED) == 0 &&
         gpu::StreamWriteValue32(release_stream_, ControlWord(SAMPLERD_CONTROL_DONE),
                                 SAMPLERD_DONE) == 0 &&
         gpu::EventRecord(release_done_, release_stream_) == 0;
    pending_.clear();
    if (!ok) {
      // The waits could not all be released: keep the memory and streams (see below).
      (void)gpu::LastError();
      leaked_ = true;
      return;
    }
    const auto deadline = std::chrono::steady_clock::now() + kStopDeadline;
    while (true) {
      const int code = gpu::EventQuery(release_done_);
      if (code == 0) break;
      if (!gpu::IsNotReady(code) || std::chrono::steady_clock::now() > deadline) {
        // The device does not finish the released steps: keep the memory rather than free
        // what a stuck kernel may still touch.
        (void)gpu::LastError();
        leaked_ = true;
        return;
      }
      std::this_thread::sleep_for(kSleep);
    }
    (void)gpu::StreamSynchronize(stream_);
    (void)gpu::StreamSynchronize(release_stream_);
  }

  void FreeDeviceResources() {
    if (stream_ == nullptr && release_stream_ == nullptr && allocation_ == nullptr) return;
    (void)gpu::SetDevice(spec_.device_ordinal);
    for (gpu::Event event : events_) {
      if (event != nullptr) (void)gpu::EventDestroy(event);
    }
    if (release_done_ != nullptr) (void)gpu::EventDestroy(release_done_);
    if (stream_ != nullptr) AllocationCache::Get().GiveStream(spec_.device_ordinal, stream_);
    if (release_stream_ != nullptr) {
      AllocationCache::Get().GiveStream(spec_.device_ordinal, release_stream_);
    }
    if (allocation_ != nullptr) {
      AllocationCache::Get().Give(spec_.device_ordinal, allocation_, allocation_bytes_);
    }
    (void)gpu::LastError();
  }

#undef RETURN_IF_RUNTIME

  const SessionSpec spec_;
  const GpuPlaneOptions options_;
  const PlaneRunner::FaultCallback on_fault_;

  gpu::SessionStepArgs args_;
  gpu::Stream stream_ = nullptr;
  gpu::Stream release_stream_ = nullptr;  // Stop()'s releases: never behind the session's waits
  void* allocation_ = nullptr;            // abort word + workspace (AllocationCache)
  size_t allocation_bytes_ = 0;
  uint32_t* abort_ = nullptr;  // device word: nonzero aborts every pending step
  uint8_t* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  std::vector<gpu::Event> events_;  // one per enqueued step, reused round robin
  gpu::Event release_done_ = nullptr;
  std::deque<gpu::Event> pending_;  // enqueued steps not seen complete, oldest first
  bool started_ = false;            // the feeder ran: Stop() must release its waits
  bool leaked_ = false;

  std::atomic<bool> stop_{false};
  std::atomic<bool> faulted_{false};
  std::atomic<uint64_t> steps_{0};
  std::mutex stop_mu_;
  bool stopped_ = false;  // guarded by stop_mu_
  std::thread thread_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<PlaneRunner>> StartGpuPlane(SessionSpec spec,
                                                           const GpuPlaneOptions& options,
                                                           PlaneRunner::FaultCallback on_fault) {
  if (absl::Status valid = ValidateSpec(spec, options); !valid.ok()) return valid;
  auto runner = std::make_unique<GpuPlaneRunner>(std::move(spec), options, std::move(on_fault));
  if (absl::Status started = runner->Start(); !started.ok()) return started;
  return std::unique_ptr<PlaneRunner>(std::move(runner));
}

}  // namespace samplerd::core
