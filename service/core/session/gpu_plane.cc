// The GPU plane (gpu_plane.h): a feeder thread polls the host-shm doorbell and, for each ring,
// enqueues one step on the session's stream (SessionStep, then a fenced stream write of done),
// one step in flight at a time. Nothing the server enqueues ever waits on the engine, so
// device-wide synchronisations elsewhere in the server are never held up by an idle session.
#include "service/core/session/gpu_plane.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <unordered_map>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/gpu/runtime.h"
#include "kernels/gpu/session_step.h"
#include "proto/samplerd/v1/device_session.h"
#include "service/core/backend/guarded_copy.h"
#include "service/core/model/thread_name.h"

namespace samplerd::core {
namespace {

namespace gpu = kernels::gpu;

// How long Stop() waits for the step in flight before it gives up on the device (and leaks
// the session's device memory and page registrations rather than free what a stuck kernel may
// still touch).
constexpr auto kStopDeadline = std::chrono::seconds(1);
// After Stop() has written done = DONE it keeps re-writing it for this long after the last
// completed step whenever it reads 0: the engine resets done right after it saw the last
// step's DONE, and that reset may land after Stop()'s write, which would leave a later engine
// wait hanging.
constexpr auto kDoneGrace = std::chrono::milliseconds(20);
constexpr auto kGracePoll = std::chrono::microseconds(100);

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

size_t PageSize() {
  static const size_t page = [] {
    const long n = sysconf(_SC_PAGESIZE);
    return n > 0 ? static_cast<size_t>(n) : size_t{4096};
  }();
  return page;
}

// Registrations of host pages with the GPU runtime (Portable | Mapped), shared by the sessions
// whose control blocks lie on them: two control blocks may share a page, and the runtime
// refuses to register a page twice. A page is registered by its first user and unregistered
// by its last. Thread-safe.
class HostPageTable {
 public:
  static HostPageTable& Get() {
    static HostPageTable* table = new HostPageTable();  // never destroyed
    return *table;
  }

  // Takes a reference on each of the `count` pages from `first` (page-aligned), registering
  // the ones not yet registered. On failure holds no reference and returns the runtime's code.
  int Acquire(uint8_t* first, size_t count) {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < count; ++i) {
      uint8_t* page = first + i * PageSize();
      int& refs = refs_[reinterpret_cast<uintptr_t>(page)];
      if (refs == 0) {
        const int code = gpu::HostRegister(page, PageSize());
        if (code != 0) {
          (void)gpu::LastError();
          refs_.erase(reinterpret_cast<uintptr_t>(page));
          ReleaseLocked(first, i);
          return code;
        }
      }
      ++refs;
    }
    return 0;
  }

  // Drops the references Acquire took; unregisters pages that no session uses any more.
  void Release(uint8_t* first, size_t count) {
    std::lock_guard<std::mutex> lock(mu_);
    ReleaseLocked(first, count);
  }

 private:
  void ReleaseLocked(uint8_t* first, size_t count) {
    for (size_t i = 0; i < count; ++i) {
      uint8_t* page = first + i * PageSize();
      auto it = refs_.find(reinterpret_cast<uintptr_t>(page));
      if (it == refs_.end()) continue;
      if (--it->second == 0) {
        if (gpu::HostUnregister(page) != 0) (void)gpu::LastError();
        refs_.erase(it);
      }
    }
  }

  std::mutex mu_;
  std::unordered_map<uintptr_t, int> refs_;  // page address -> sessions using it; guarded by mu_
};

absl::Status ValidateSpec(const SessionSpec& spec) {
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
  if (reinterpret_cast<uintptr_t>(spec.control) % SAMPLERD_CONTROL_ALIGN != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected the control block aligned to ", SAMPLERD_CONTROL_ALIGN,
                     " bytes, got address offset ",
                     reinterpret_cast<uintptr_t>(spec.control) % SAMPLERD_CONTROL_ALIGN));
  }
  if (spec.max_batch < 1 || spec.max_batch > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected max_batch in [1, 65535], got ", spec.max_batch));
  }
  if (spec.vocab < 1 || spec.row_stride < spec.vocab) {
    return absl::InvalidArgumentError(absl::StrCat(
        "expected vocab >= 1 and row_stride >= vocab, got ", spec.vocab, " and ", spec.row_stride));
  }
  return absl::OkStatus();
}

class GpuPlaneRunner final : public PlaneRunner {
 public:
  GpuPlaneRunner(SessionSpec spec, const GpuPlaneOptions& options,
                 PlaneRunner::FaultCallback on_fault)
      : spec_(std::move(spec)),
        spin_(std::chrono::microseconds(std::max(0, options.spin_us))),
        sleep_(std::chrono::microseconds(std::max(1, options.sleep_us))),
        on_fault_(std::move(on_fault)) {}

  ~GpuPlaneRunner() override {
    Stop();
    if (leaked_) {
      // The device may still write the control block and read the buffers: keep the regions
      // mapped and the pages registered for the life of the process.
      auto* kept = new SessionSpec(std::move(spec_));
      (void)kept;
      return;
    }
    FreeResources();
  }

  // Registers the control block's pages and allocates the stream, workspace and event on the
  // caller's thread (so that errors are returned), then starts the feeder.
  absl::Status Start() {
    RETURN_IF_RUNTIME(gpu::SetDevice(spec_.device_ordinal), "selecting the device");
    bool supported = false;
    RETURN_IF_RUNTIME(gpu::StreamMemOpsSupported(spec_.device_ordinal, &supported),
                      "querying stream memory operations");
    if (!supported) {
      return absl::FailedPreconditionError(
          absl::StrCat("expected a device with stream memory operations (write value), got device ",
                       spec_.device_ordinal, " without them"));
    }
    if (absl::Status s = RegisterControl(); !s.ok()) return s;
    RETURN_IF_RUNTIME(gpu::StreamCreate(&stream_), "creating the session stream");
    RETURN_IF_RUNTIME(gpu::EventCreate(&event_, /*interprocess=*/false), "creating an event");
    args_.control = device_control_;
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
    args_.token_bitmask = spec_.token_bitmask;
    args_.processors = spec_.processors;
    args_.logit_bias_capacity = spec_.logit_bias_capacity;
    args_.token_history_capacity = spec_.token_history_capacity;
    args_.abort = nullptr;  // Stop() never leaves steps enqueued
    workspace_bytes_ = gpu::SessionStepWorkspaceBytes(
        spec_.max_batch, spec_.vocab, spec_.sampled_logprobs != nullptr,
        spec_.processors == nullptr
            ? -1
            : int64_t{spec_.logit_bias_capacity} + spec_.token_history_capacity);
    const int code = gpu::DeviceMalloc(&workspace_, workspace_bytes_);
    if (code != 0) {
      workspace_ = nullptr;
      (void)gpu::LastError();
      return absl::ResourceExhaustedError(absl::StrCat(
          "expected ", workspace_bytes_,
          " bytes of device memory for the session's workspace, got ", RuntimeText(code)));
    }
    // Zero-filled before first use, as kernels/gpu/sample.h asks (ordered before every step).
    RETURN_IF_RUNTIME(gpu::ZeroDevice(workspace_, workspace_bytes_, stream_),
                      "zeroing the session's workspace");
    try {
      thread_ = std::thread([this] {
        NameThisThread("sd-gpu-session");
        Run();
      });
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
    stop_.store(true, std::memory_order_release);
    if (thread_.joinable()) thread_.join();
    if (!started_) return;  // Start() failed: nothing was enqueued, no engine was told to ring
    (void)gpu::SetDevice(spec_.device_ordinal);
    if (in_flight_ && !WaitInFlight()) {
      // The step does not finish: keep everything it may touch (see the destructor).
      leaked_ = true;
    }
    // Completes a pending or future engine wait: step_status first, done after it.
    if (!Store(SAMPLERD_CONTROL_STEP_STATUS, SAMPLERD_STEP_ABORTED) ||
        !Store(SAMPLERD_CONTROL_DONE, SAMPLERD_DONE)) {
      return;  // the control block's shm was truncated: no engine wait can be completed
    }
    const auto grace_end = last_completion_ + kDoneGrace;
    while (std::chrono::steady_clock::now() < grace_end) {
      uint32_t done = SAMPLERD_DONE;
      if (!Load(SAMPLERD_CONTROL_DONE, &done)) return;
      if (done != SAMPLERD_DONE && !Store(SAMPLERD_CONTROL_DONE, SAMPLERD_DONE)) return;
      std::this_thread::sleep_for(kGracePoll);
    }
  }

  uint64_t steps() const override { return steps_.load(std::memory_order_relaxed); }

 private:
  // Page-locks the control block's pages and resolves its device address (device_control_).
  absl::Status RegisterControl() {
    const uintptr_t begin = reinterpret_cast<uintptr_t>(spec_.control);
    const uintptr_t end = begin + SAMPLERD_CONTROL_BYTES;
    const uintptr_t first = begin / PageSize() * PageSize();
    const size_t count = (end - first + PageSize() - 1) / PageSize();
    uint8_t* first_page = reinterpret_cast<uint8_t*>(first);
    const int code = HostPageTable::Get().Acquire(first_page, count);
    if (code != 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("expected to page-lock the control block's host shm pages for the device "
                       "(cudaHostRegister/hipHostRegister, portable and mapped), got ",
                       RuntimeText(code)));
    }
    pages_ = first_page;
    page_count_ = count;
    void* device_first = nullptr;
    for (size_t i = 0; i < count; ++i) {
      void* device_page = nullptr;
      RETURN_IF_RUNTIME(gpu::HostGetDevicePointer(&device_page, first_page + i * PageSize()),
                        "resolving the control block's device address");
      if (i == 0) {
        device_first = device_page;
      } else if (device_page != static_cast<uint8_t*>(device_first) + i * PageSize()) {
        // Separately registered pages need not be contiguous for the device.
        return absl::FailedPreconditionError(
            "expected the control block's pages contiguous in the device address space, got "
            "a control block across a page boundary that the runtime maps apart; place it "
            "within one page");
      }
    }
    device_control_ = static_cast<uint8_t*>(device_first) + (begin - first);
    return absl::OkStatus();
  }

  // Guarded accesses to the control block's host shm (a client may truncate it): false on a
  // bus error. Each lambda captures two pointers, which std::function stores without a heap
  // allocation.
  bool Load(uint32_t offset, uint32_t* out) const {
    const uint32_t* word = reinterpret_cast<const uint32_t*>(spec_.control + offset);
    return GuardedRun([word, out] { *out = __atomic_load_n(word, __ATOMIC_ACQUIRE); });
  }
  bool Store(uint32_t offset, uint32_t value) const {
    uint32_t* word = reinterpret_cast<uint32_t*>(spec_.control + offset);
    return GuardedRun([word, value] { __atomic_store_n(word, value, __ATOMIC_SEQ_CST); });
  }

  // The feeder: polls the doorbell, enqueues a step per ring, notices its completion.
  void Run() {
    if (!Check(gpu::SetDevice(spec_.device_ordinal), "selecting the device")) return;
    last_step_ = std::chrono::steady_clock::now();
    int polls = 0;
    while (!stop_.load(std::memory_order_acquire)) {
      if (in_flight_) {
        const int code = gpu::EventQuery(event_);
        if (code == 0) {
          in_flight_ = false;
          steps_.fetch_add(1, std::memory_order_relaxed);
          last_step_ = last_completion_ = std::chrono::steady_clock::now();
        } else if (!gpu::IsNotReady(code)) {
          Check(code, "running a step");
          return;
        } else {
          continue;  // a step takes microseconds to milliseconds: spin
        }
      }
      uint32_t doorbell = 0;
      if (!Load(SAMPLERD_CONTROL_DOORBELL, &doorbell)) {
        Fault(ShrunkShmError("the control block"));
        return;
      }
      if (doorbell == SAMPLERD_RING) {
        // Reset before enqueueing: done (written by the stream after this) tells the engine
        // it may ring again, and that ring must not be swallowed.
        if (!Store(SAMPLERD_CONTROL_DOORBELL, 0)) {
          Fault(ShrunkShmError("the control block"));
          return;
        }
        if (!EnqueueStep()) return;
        in_flight_ = true;
        continue;
      }
      // Reading the clock costs ~20 ns; spinning polls look at it every 64th time.
      if ((++polls & 63) != 0) continue;
      if (std::chrono::steady_clock::now() - last_step_ < spin_) {
        std::this_thread::yield();
        continue;
      }
      std::this_thread::sleep_for(sleep_);
    }
  }

  // One step, in stream order: SessionStep (reads control.batch, writes step_status and
  // steps_done through the device address of the control block), then done = DONE (fenced
  // after the kernels), then the step's event. No wait of any kind.
  bool EnqueueStep() {
    return Check(gpu::SessionStep(args_, workspace_, workspace_bytes_, stream_),
                 "enqueueing the sampling step") &&
           Check(gpu::StreamWriteValue32(stream_, device_control_ + SAMPLERD_CONTROL_DONE,
                                         SAMPLERD_DONE),
                 "enqueueing the done write") &&
           Check(gpu::EventRecord(event_, stream_), "recording the step event");
  }

  // Polls the step in flight until it completes, up to kStopDeadline; false if it does not.
  bool WaitInFlight() {
    const auto deadline = std::chrono::steady_clock::now() + kStopDeadline;
    while (true) {
      const int code = gpu::EventQuery(event_);
      if (code == 0) {
        in_flight_ = false;
        steps_.fetch_add(1, std::memory_order_relaxed);
        last_completion_ = std::chrono::steady_clock::now();
        return true;
      }
      if (!gpu::IsNotReady(code) || std::chrono::steady_clock::now() > deadline) {
        (void)gpu::LastError();
        return false;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }

  // Reports the first runtime failure through on_fault; true when `code` is success.
  bool Check(int code, const char* what) {
    if (code == 0) return true;
    (void)gpu::LastError();
    Fault(absl::InternalError(absl::StrCat("GPU plane: ", what, ": ", RuntimeText(code))));
    return false;
  }

  void Fault(const absl::Status& status) {
    if (!faulted_.exchange(true) && on_fault_) on_fault_(status);
  }

  void FreeResources() {
    if (stream_ != nullptr || workspace_ != nullptr || event_ != nullptr) {
      (void)gpu::SetDevice(spec_.device_ordinal);
    }
    if (stream_ != nullptr) {
      (void)gpu::StreamSynchronize(stream_);
      (void)gpu::StreamDestroy(stream_);
    }
    if (event_ != nullptr) (void)gpu::EventDestroy(event_);
    if (workspace_ != nullptr) (void)gpu::DeviceFree(workspace_);
    if (pages_ != nullptr) HostPageTable::Get().Release(pages_, page_count_);
    (void)gpu::LastError();
  }

#undef RETURN_IF_RUNTIME

  SessionSpec spec_;
  const std::chrono::microseconds spin_;
  const std::chrono::microseconds sleep_;
  const PlaneRunner::FaultCallback on_fault_;

  gpu::SessionStepArgs args_;
  uint8_t* pages_ = nullptr;  // the control block's registered pages (HostPageTable)
  size_t page_count_ = 0;
  uint8_t* device_control_ = nullptr;  // the control block's device address
  gpu::Stream stream_ = nullptr;
  gpu::Event event_ = nullptr;  // recorded after each step's done write
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;

  // The feeder's state; Stop() reads and writes it only after joining the feeder.
  bool in_flight_ = false;  // a step was enqueued and not yet seen complete
  std::chrono::steady_clock::time_point last_step_{};        // start, or the last completion
  std::chrono::steady_clock::time_point last_completion_{};  // epoch: no step completed
  bool started_ = false;                                     // the feeder thread runs
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
  if (absl::Status valid = ValidateSpec(spec); !valid.ok()) return valid;
  auto runner = std::make_unique<GpuPlaneRunner>(std::move(spec), options, std::move(on_fault));
  if (absl::Status started = runner->Start(); !started.ok()) return started;
  return std::unique_ptr<PlaneRunner>(std::move(runner));
}

}  // namespace samplerd::core
