// The host plane (host_plane.h): one poller thread per session and a FastCpuSampler.
//
// Every access to the session's buffers (host shm another process may truncate) runs under
// GuardedRun: the poller's whole loop, and each of the sampler's worker tasks. A bus error ends
// the runner with the fault callback instead of killing the server.
#include "service/core/session/host_plane.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <new>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/common/sampling_types.h"
#include "kernels/common/session_processors.h"
#include "kernels/cpu_fast/fast_cpu_sampler.h"
#include "proto/samplerd/v1/device_session.h"
#include "service/core/backend/guarded_copy.h"
#include "service/core/model/thread_name.h"
#include "service/core/session/processors_snapshot.h"

namespace samplerd::core {
namespace {

constexpr int kMaxDefaultThreads = 8;

inline uint32_t LoadAcquire(const uint8_t* control, uint32_t offset) {
  return __atomic_load_n(reinterpret_cast<const uint32_t*>(control + offset), __ATOMIC_ACQUIRE);
}

inline void Store(uint8_t* control, uint32_t offset, uint32_t value, int order) {
  __atomic_store_n(reinterpret_cast<uint32_t*>(control + offset), value, order);
}

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

template <typename T>
T ReadParam(const uint8_t* params, uint64_t offset, uint32_t row) {
  T value;
  std::memcpy(&value, params + offset + sizeof(T) * row, sizeof(T));
  return value;
}

// Row `row` of the params buffer as RowParams; false when a value breaks the rules of
// SamplingParams (validation.cc) or device_session.h (top_p_mode 0, 1 or 2).
bool ReadRowParams(const uint8_t* params, uint32_t max_batch, uint32_t row,
                   kernels::RowParams* out) {
  const uint32_t m = max_batch;
  out->seed = ReadParam<uint64_t>(params, samplerd_params_seed_offset(m), row);
  out->position = ReadParam<uint64_t>(params, samplerd_params_position_offset(m), row);
  out->temperature = ReadParam<float>(params, samplerd_params_temperature_offset(m), row);
  out->top_k = ReadParam<int32_t>(params, samplerd_params_top_k_offset(m), row);
  out->top_p = ReadParam<float>(params, samplerd_params_top_p_offset(m), row);
  out->min_p = ReadParam<float>(params, samplerd_params_min_p_offset(m), row);
  const int32_t mode = ReadParam<int32_t>(params, samplerd_params_top_p_mode_offset(m), row);
  if (!(out->temperature >= 0.0f) || std::isinf(out->temperature)) return false;
  if (out->top_k < -1) return false;
  if (!(out->top_p > 0.0f && out->top_p <= 1.0f)) return false;
  if (!(out->min_p >= 0.0f && out->min_p <= 1.0f)) return false;
  if (mode == 0 || mode == 1) {
    out->top_p_mode = kernels::TopPMode::kTopKFirst;
  } else if (mode == 2) {
    out->top_p_mode = kernels::TopPMode::kJoint;
  } else {
    return false;
  }
  return true;
}

int32_t RowStatusNumber(kernels::RowStatus status) {
  switch (status) {
    case kernels::RowStatus::kOk:
      return SAMPLERD_ROW_OK;
    case kernels::RowStatus::kNan:
      return SAMPLERD_ROW_INVALID_NAN;
    case kernels::RowStatus::kNoFinite:
      return SAMPLERD_ROW_INVALID_NO_FINITE;
    case kernels::RowStatus::kNoAllowed:
      return SAMPLERD_ROW_INVALID_NO_ALLOWED;
    default:
      return SAMPLERD_ROW_INVALID_PARAMS;
  }
}

absl::Status TruncatedError() {
  return absl::FailedPreconditionError(
      "expected the session's host shm objects to cover their regions, got a bus error: the "
      "client truncated a host shm region of the session");
}

// The session's sampler reads the engine's shared logits: every pass under the bus-error
// guard, and every pass after the first from its own copy (the engine may write them mid-step).
// The copy of a full step (max_batch x V elements) is reserved when the session opens: an
// engine could otherwise open a session over a sparse shm object of any size within the limits
// (M = 2,048, V = 4,194,304 fp32: 32 GiB) and make the first full step throw std::bad_alloc on
// the poller thread, which ended the server.
kernels::FastCpuSampler::Options SamplerOptions(int threads, const HostPlaneOptions& options,
                                                const SessionSpec& spec) {
  kernels::FastCpuSampler::Options o;
  o.threads = threads;
  o.spin_us = std::max(0, options.spin_us);
  o.guard = GuardedRun;
  o.snapshot_logits = true;
  o.snapshot_reserve_bytes = static_cast<size_t>(HostSessionBytes(spec));
  return o;
}

class HostPlaneRunner : public PlaneRunner {
 public:
  HostPlaneRunner(SessionSpec spec, const HostPlaneOptions& options, int threads,
                  FaultCallback on_fault)
      : spec_(std::move(spec)),
        spin_(std::chrono::microseconds(std::max(0, options.spin_us))),
        sleep_(std::chrono::microseconds(std::max(1, options.sleep_us))),
        on_fault_(std::move(on_fault)),
        sampler_(SamplerOptions(threads, options, spec_)) {
    const uint32_t m = spec_.max_batch;
    params_.resize(m);
    valid_.resize(m);
    tokens_.resize(m);
    status_.resize(m);
    if (spec_.sampled_logprobs != nullptr) logprobs_.resize(m);
    if (spec_.processors != nullptr) {
      processors_ = kernels::ResolveSessionProcessors(
          spec_.processors, m, spec_.logit_bias_capacity, spec_.token_history_capacity);
      snapshot_ = std::make_unique<SessionProcessorsSnapshot>(processors_, m);
      adjust_offsets_.resize(m + 1);
    }
  }

  ~HostPlaneRunner() override { Stop(); }

  void Start() {
    poller_ = std::thread([this] {
      NameThisThread("sd-host-session");
      Loop();
    });
  }

  void Stop() override {
    std::lock_guard<std::mutex> lock(stop_mu_);
    if (stopped_) return;
    stop_.store(true, std::memory_order_release);
    if (poller_.joinable()) poller_.join();
    stopped_ = true;
    // A truncated control block makes this fault; then no engine wait can be completed anyway.
    GuardedRun([this] {
      Store(spec_.control, SAMPLERD_CONTROL_STEP_STATUS, SAMPLERD_STEP_ABORTED, __ATOMIC_RELAXED);
      Store(spec_.control, SAMPLERD_CONTROL_DONE, SAMPLERD_DONE, __ATOMIC_RELEASE);
    });
  }

  uint64_t steps() const override { return steps_.load(std::memory_order_relaxed); }

 private:
  void Loop() {
    bool sampler_ok = true;
    const bool ok = GuardedRun([&] {
      auto last_step = std::chrono::steady_clock::now();
      int polls = 0;
      while (!stop_.load(std::memory_order_acquire)) {
        if (LoadAcquire(spec_.control, SAMPLERD_CONTROL_DOORBELL) == SAMPLERD_RING) {
          Store(spec_.control, SAMPLERD_CONTROL_DOORBELL, 0, __ATOMIC_RELAXED);
          sampler_ok = Step(LoadAcquire(spec_.control, SAMPLERD_CONTROL_BATCH));
          if (!sampler_ok) return;
          last_step = std::chrono::steady_clock::now();
          continue;
        }
        // Reading the clock costs ~20 ns; spinning polls look at it every 64th time.
        if ((++polls & 63) != 0) {
          CpuRelax();
          continue;
        }
        if (std::chrono::steady_clock::now() - last_step < spin_) continue;
        std::this_thread::sleep_for(sleep_);
      }
    });
    if (!ok || !sampler_ok) {
      if (on_fault_) on_fault_(TruncatedError());
    }
  }

  // Serves one rung step; false when the sampler hit a bus error (the caller reports it).
  bool Step(uint32_t batch) {
    uint8_t* control = spec_.control;
    if (batch < 1 || batch > spec_.max_batch) {
      Finish(SAMPLERD_STEP_BAD_BATCH);
      return true;
    }
    bool any_valid = false;
    for (uint32_t i = 0; i < batch; ++i) {
      valid_[i] = ReadRowParams(spec_.params, spec_.max_batch, i, &params_[i]);
      if (!valid_[i]) params_[i] = kernels::RowParams{0.0f};  // greedy: cheap, ignored below
      any_valid = any_valid || valid_[i];
    }
    if (spec_.processors != nullptr) any_valid = MergeProcessors(batch);
    if (any_valid) {
      kernels::SampleArgs args;
      args.logits = spec_.logits;
      args.dtype = spec_.dtype;
      args.batch = batch;
      args.vocab = spec_.vocab;
      args.row_stride = static_cast<int64_t>(spec_.row_stride);
      args.params = params_.data();
      args.params_count = batch;
      args.token_ids = tokens_.data();
      args.status = status_.data();
      if (spec_.token_bitmask != nullptr) {
        args.allowed_bitmask = spec_.token_bitmask;
        args.bitmask_words = static_cast<int64_t>(samplerd_bitmask_words(spec_.vocab));
      }
      if (!adjusts_.empty()) {
        args.adjusts = adjusts_.data();
        args.adjust_offsets = adjust_offsets_.data();
      }
      if (spec_.sampled_logprobs != nullptr) {
        args.top_logprobs = 0;
        args.logprob_source = spec_.logprob_source;
        args.sampled_logprob = logprobs_.data();
      }
      if (!sampler_.Sample(args)) return false;
    }
    constexpr float kNegInf = -std::numeric_limits<float>::infinity();
    for (uint32_t i = 0; i < batch; ++i) {
      spec_.token_ids[i] = valid_[i] ? tokens_[i] : -1;
      spec_.row_status[i] = valid_[i] ? RowStatusNumber(status_[i]) : SAMPLERD_ROW_INVALID_PARAMS;
      if (spec_.sampled_logprobs != nullptr) {
        spec_.sampled_logprobs[i] = valid_[i] ? logprobs_[i] : kNegInf;
      }
    }
    (void)control;
    Finish(SAMPLERD_STEP_OK);
    return true;
  }

  // Checks every row's processors (a bad row becomes invalid) and merges the valid rows' entries
  // into adjusts_ / adjust_offsets_ (rows [0, batch)), with the code the GPU plane runs per row
  // (kernels/common/session_processors.h). Returns whether any row is still valid. Reads the
  // step's copy of the buffer (processors_snapshot.h), never the engine's shared memory twice.
  bool MergeProcessors(uint32_t batch) {
    const kernels::SessionProcessors& processors = snapshot_->Take(processors_, batch);
    bool any_valid = false;
    adjusts_.clear();
    adjust_offsets_[0] = 0;
    for (uint32_t i = 0; i < batch; ++i) {
      if (valid_[i] && !kernels::SessionRowValid(processors, i, spec_.vocab)) {
        valid_[i] = false;
        params_[i] = kernels::RowParams{0.0f};
      }
      if (valid_[i]) {
        const size_t at = adjusts_.size();
        const uint32_t n = kernels::MergeSessionRow(processors, i, nullptr);
        if (!kernels::SessionEntriesFit(at, n, processors)) {
          valid_[i] = false;
          params_[i] = kernels::RowParams{0.0f};
        } else {
          adjusts_.resize(at + n);
          kernels::MergeSessionRow(processors, i, adjusts_.data() + at);
          any_valid = true;
        }
      }
      adjust_offsets_[i + 1] = static_cast<uint32_t>(adjusts_.size());
    }
    return any_valid;
  }

  // step_status, steps_done, then done with a release store (the outputs before it).
  void Finish(uint32_t step_status) {
    const uint64_t steps = steps_.load(std::memory_order_relaxed) + 1;
    Store(spec_.control, SAMPLERD_CONTROL_STEP_STATUS, step_status, __ATOMIC_RELAXED);
    Store(spec_.control, SAMPLERD_CONTROL_STEPS_DONE, static_cast<uint32_t>(steps),
          __ATOMIC_RELAXED);
    Store(spec_.control, SAMPLERD_CONTROL_DONE, SAMPLERD_DONE, __ATOMIC_RELEASE);
    steps_.store(steps, std::memory_order_relaxed);
  }

  const SessionSpec spec_;
  const std::chrono::microseconds spin_;
  const std::chrono::microseconds sleep_;
  const FaultCallback on_fault_;
  kernels::FastCpuSampler sampler_;

  std::vector<kernels::RowParams> params_;
  std::vector<uint8_t> valid_;
  std::vector<int32_t> tokens_;
  std::vector<kernels::RowStatus> status_;
  std::vector<float> logprobs_;
  kernels::SessionProcessors processors_;                // resolved when the session has processors
  std::unique_ptr<SessionProcessorsSnapshot> snapshot_;  // each step's copy of processors_
  std::vector<kernels::TokenAdjust> adjusts_;            // the step's merged entries
  std::vector<uint32_t> adjust_offsets_;                 // [max_batch + 1]

  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> steps_{0};
  std::mutex stop_mu_;
  bool stopped_ = false;  // guarded by stop_mu_
  std::thread poller_;
};

absl::Status CheckSpec(const SessionSpec& spec) {
  if (spec.plane != SessionPlane::kHost) {
    return absl::InvalidArgumentError("expected a host-plane session spec, got a GPU-plane one");
  }
  if (spec.control == nullptr || spec.logits == nullptr || spec.params == nullptr ||
      spec.token_ids == nullptr || spec.row_status == nullptr) {
    return absl::InvalidArgumentError(
        "expected the control, logits, params, token_ids and row_status buffers, got a null "
        "pointer");
  }
  if (spec.max_batch < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected max_batch >= 1, got ", spec.max_batch));
  }
  if (spec.vocab < 1 || spec.row_stride < spec.vocab) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected vocab >= 1 and row_stride >= vocab, got vocab ", spec.vocab,
                     " and row_stride ", spec.row_stride));
  }
  return absl::OkStatus();
}

}  // namespace

uint64_t HostSessionBytes(const SessionSpec& spec) {
  return uint64_t{spec.max_batch} * spec.vocab *
         static_cast<uint64_t>(kernels::DTypeSize(spec.dtype));
}

absl::StatusOr<std::unique_ptr<PlaneRunner>> StartHostPlane(SessionSpec spec,
                                                            const HostPlaneOptions& options,
                                                            PlaneRunner::FaultCallback on_fault) {
  if (absl::Status status = CheckSpec(spec); !status.ok()) return status;
  int threads = options.threads;
  if (threads <= 0) {
    threads =
        std::clamp(static_cast<int>(std::thread::hardware_concurrency()), 1, kMaxDefaultThreads);
  }
  const uint64_t bytes = HostSessionBytes(spec);
  const uint32_t max_batch = spec.max_batch;
  const uint32_t vocab = spec.vocab;
  try {
    auto runner =
        std::make_unique<HostPlaneRunner>(std::move(spec), options, threads, std::move(on_fault));
    runner->Start();
    return std::unique_ptr<PlaneRunner>(std::move(runner));
  } catch (const std::system_error& e) {
    return absl::ResourceExhaustedError(
        absl::StrCat("expected to start ", threads, " host-plane threads, got: ", e.what()));
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        absl::StrCat("expected to allocate ", bytes,
                     " bytes for the session's copy of a step's logits "
                     "(max_batch ",
                     max_batch, " x vocab ", vocab,
                     " elements), got an allocation failure: open it with a smaller max_batch"));
  }
}

}  // namespace samplerd::core
