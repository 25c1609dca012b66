// SamplerCore: the core's API for transports. It validates requests, queues them on the
// device's executor, runs the backend and reports results through callbacks.
//
// Thread-safety: every method may be called from any thread.
#ifndef SAMPLERD_SERVICE_CORE_SAMPLER_CORE_H_
#define SAMPLERD_SERVICE_CORE_SAMPLER_CORE_H_

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "service/core/backend/sampler.h"
#include "service/core/executor.h"
#include "service/core/model/request.h"
#include "service/core/options.h"
#include "service/core/regions/ipc_event_cache.h"
#include "service/core/regions/region_registry.h"
#include "service/core/regions/request_io.h"
#include "service/core/seed_source.h"
#include "service/core/session/session_manager.h"

namespace samplerd::core {

// What GetServerInfo reports.
struct ServerInfo {
  std::string version;
  BackendKind backend = BackendKind::kCpu;
  std::vector<DeviceInfo> devices;
  Limits limits;
  int64_t max_region_bytes = 0;  // RegionOptions::max_region_bytes (0: no limit)
  int64_t max_regions = 0;       // RegionOptions::max_regions (0: no limit)
  SessionSupport device_sessions;
};

class SamplerCore {
 public:
  using Callback = std::function<void(absl::StatusOr<SampleResult>)>;

  // Inline logits bytes reserved against limits().max_inflight_bytes (ReserveInflightBytes) by
  // a transport that assembles a request from pieces, and handed to SampleAsync with the
  // request. Move-only; Reset() or destruction gives the bytes back (at most once). Not
  // thread-safe itself (its owner serialises its use); the core it came from must outlive it.
  class InflightBytes {
   public:
    InflightBytes() = default;
    InflightBytes(InflightBytes&& other) noexcept { *this = std::move(other); }
    InflightBytes& operator=(InflightBytes&& other) noexcept;
    InflightBytes(const InflightBytes&) = delete;
    InflightBytes& operator=(const InflightBytes&) = delete;
    ~InflightBytes() { Reset(); }

    // The bytes held; 0 once reset, moved from or handed to SampleAsync.
    int64_t bytes() const { return bytes_; }
    // Gives the bytes back now.
    void Reset();

   private:
    friend class SamplerCore;
    InflightBytes(SamplerCore* core, int64_t bytes) : core_(core), bytes_(bytes) {}
    // Hands the bytes to the caller (the core, which releases them with the request's
    // admission) and leaves this empty.
    int64_t Take();

    SamplerCore* core_ = nullptr;
    int64_t bytes_ = 0;
  };

  // Brings up the backend `options.backend` asks for (SelectBackend, backend/select_backend.h).
  // kAuto picks the GPU when this build has a GPU backend and a device is present, else the
  // CPU. A GPU backend gets the runtime's GpuIpc unless options.gpu_ipc is set. Errors:
  // SelectBackend's, e.g. FAILED_PRECONDITION when kGpu is asked for and no GPU can be used.
  static absl::StatusOr<std::unique_ptr<SamplerCore>> Create(const CoreOptions& options);

  // For tests: a core over a given backend and seed sequence.
  SamplerCore(const CoreOptions& options, std::unique_ptr<Sampler> sampler, uint64_t seed_start);
  // Waits for queued requests to finish.
  ~SamplerCore();

  // Admits `request`, validates it, leases its regions, opens its IPC events and queues it on
  // the device's executor. Returns a non-OK status (and drops `done` uncalled) when the request
  // is rejected up front: UNAVAILABLE while draining or once the backend has faulted,
  // DEADLINE_EXCEEDED when its deadline has passed already, RESOURCE_EXHAUSTED ("server busy:
  // N requests in flight, limit M") when limits().max_inflight requests are in flight,
  // RESOURCE_EXHAUSTED when its inline logits bytes do not fit in limits().max_inflight_bytes
  // now ("...; retry later") or ever ("... can never fit", checked first),
  // INVALID_ARGUMENT or RESOURCE_EXHAUSTED when it is malformed or over the size limits,
  // FAILED_PRECONDITION when it names a device other than the backend's (MatchDevice),
  // NOT_FOUND / OUT_OF_RANGE / FAILED_PRECONDITION for its regions and events (BindSampleIo).
  // Requests still queued when the backend faults get UNAVAILABLE through `done`, those whose
  // deadline passes in the queue DEADLINE_EXCEEDED, those cancelled meanwhile CANCELLED; none
  // of them is computed. A bias list or token history packed in a region is read and checked
  // on the executor thread before sampling: its errors (ReadProcessorLists, then
  // ValidateProcessors) come through `done`, with the same codes and messages.
  // Otherwise `done` runs exactly once, later, on the executor thread; the region leases are
  // released right after it (an unregistered region is then closed off this thread). The
  // request's inline data must stay alive until `done` runs. Never blocks on sampling nor on
  // the request's ready event; the first use of an IPC event handle opens it (a runtime call).
  // A bias list or token history in a region is leased and copied on the executor thread, a
  // GPU IPC one after the request's ready event.
  //
  // The request's inline logits bytes count against limits().max_inflight_bytes from admission
  // until right before `done` runs (or until SampleAsync refuses it). `reserved` (from
  // ReserveInflightBytes; empty: none) holds bytes reserved for this request already: they are
  // held the same way and only the inline bytes beyond them are reserved here. Refused up
  // front, the request gives `reserved` back before SampleAsync returns.
  absl::Status SampleAsync(SampleRequest request, Callback done, InflightBytes reserved);
  absl::Status SampleAsync(SampleRequest request, Callback done);

  // Reserves `bytes` (>= 0) of limits().max_inflight_bytes for a request whose inline logits
  // arrive in pieces: call it at the first piece, where the shape is known, so that a request
  // that does not fit is refused before its pieces are collected, then pass the result to
  // SampleAsync with the request. Errors: UNAVAILABLE while draining or once the backend has
  // faulted (as SampleAsync), RESOURCE_EXHAUSTED as SampleAsync's for the bytes (no request
  // slot is taken here). Counted (inflight_bytes()) with or without a limit.
  absl::StatusOr<InflightBytes> ReserveInflightBytes(int64_t bytes);

  // Stops accepting requests (later ones get UNAVAILABLE) and device sessions (ending the open
  // ones, sessions().CloseAll()), and waits until requests in flight have finished or
  // `deadline` passes. Returns true when nothing is left in flight.
  bool Drain(absl::Time deadline);

  // Ends the work a Drain left in flight (call it when the grace period is over): the batch
  // being sampled stops early (the CPU backend between rows, within one row per thread; a GPU
  // launch runs to its end) and it and every queued request are answered UNAVAILABLE. Waits
  // until nothing is in flight or `deadline` passes; returns true when nothing is left.
  bool CancelInFlight(absl::Time deadline);

  // Sampling requests and stream steps admitted and not yet answered (what max_inflight
  // bounds).
  int64_t admitted() const;
  // Requests and stream steps admitted since start (a change means activity; IdleTrimmer).
  uint64_t admissions() const;
  // Inline logits bytes of the admitted requests plus those reserved and not yet handed to
  // SampleAsync (what max_inflight_bytes bounds).
  int64_t inflight_bytes() const;

  // True once the backend has faulted for good (see CoreOptions::on_fatal).
  bool faulted() const { return faulted_.load(std::memory_order_acquire); }

  // GetServerInfo's answer. Devices report IPC support only when this core has a GpuIpc.
  ServerInfo Info() const;
  const Limits& limits() const { return options_.limits; }

  // The registered regions (RegisterRegion, UnregisterRegion, ListRegions).
  RegionRegistry& regions() { return *regions_; }

  // The device sessions (DeviceSession). Drain ends them first: call sessions().CloseAll()
  // before waiting for the transport's calls, so that a session's call can finish.
  SessionManager& sessions() { return *sessions_; }

  // Closes every region and cached IPC event. Call after Drain, once nothing is in flight.
  void CloseRegions();

 private:
  // Takes an in-flight slot and reserves `more_bytes` of limits().max_inflight_bytes, both or
  // neither: RESOURCE_EXHAUSTED when the bytes can never fit, when limits().max_inflight are
  // taken, or when the bytes do not fit now.
  absl::Status Admit(int64_t more_bytes);
  // The reason `bytes` more cannot be reserved now (OK: they fit). mu_ held.
  absl::Status CheckBytesLocked(int64_t bytes) const;
  // Gives `bytes` back (mu_ not held).
  void ReleaseBytes(int64_t bytes);
  // Validates, binds and queues an admitted request holding `bytes` (SampleAsync's second
  // half).
  absl::Status Queue(SampleRequest request, Callback done, int64_t bytes);
  // Runs a queued request holding `bytes` on the executor thread.
  void Run(SampleRequest& request, ValidatedBatch& batch, BoundIo& bound, const Callback& done,
           int64_t bytes);
  // Reads the request's bias list and token history packed in regions into `request`, keeping
  // their leases in `bound` (ReadProcessorLists), and merges them into `batch`
  // (ValidateProcessors). On the executor thread: a GPU IPC slice is copied after the request's
  // ready event, a wait no transport thread should make. Errors: those two functions'.
  absl::Status ResolveProcessorLists(SampleRequest& request, ValidatedBatch& batch, BoundIo& bound);
  // Gives the admission slot and the request's `bytes` back: right before the answer is handed
  // to the caller.
  void ReleaseAdmission(int64_t bytes);
  // Ends the request for Drain: after its callback has run and its leases are released.
  void Finish();
  // OK while the core takes new work; else UNAVAILABLE (draining, or FaultedError).
  absl::Status CheckServing() const;
  // The status refusing work after a fault.
  absl::Status FaultedError() const;
  // The status of requests that CancelInFlight ended.
  absl::Status CancelledByDrainError() const;
  // Waits until nothing is in flight or `deadline` passes; true when nothing is left.
  bool WaitIdle(absl::Time deadline);

  const CoreOptions options_;
  std::unique_ptr<Sampler> sampler_;
  // Every device the runtime lists, for Info(); empty: just sampler_->device().
  std::vector<DeviceInfo> devices_;
  SeedSource seeds_;
  std::atomic<bool> draining_{false};
  std::atomic<bool> faulted_{false};
  // Set by CancelInFlight; the running batch reads it through SampleIo::cancel.
  std::atomic<bool> cancelled_{false};
  mutable std::mutex mu_;
  absl::Status fault_;  // guarded by mu_: the status of the request that faulted
  std::condition_variable idle_cv_;
  int64_t admitted_ = 0;        // guarded by mu_: admitted, not yet answered (max_inflight)
  uint64_t admissions_ = 0;     // guarded by mu_: admitted since start
  int64_t inflight_bytes_ = 0;  // guarded by mu_: admitted and reserved (max_inflight_bytes)
  int64_t in_flight_ = 0;       // guarded by mu_: admitted, callback not yet returned (Drain)
  // options_.gpu_ipc, counting its opens when options_.metrics is set. Before regions_ and
  // events_, which use it.
  std::shared_ptr<GpuIpc> gpu_ipc_;
  std::unique_ptr<RegionRegistry> regions_;
  std::unique_ptr<IpcEventCache> events_;  // null without options_.gpu_ipc
  // After regions_: sessions hold leases on them, and end before the registry closes.
  std::unique_ptr<SessionManager> sessions_;
  // Declared last: destroyed first, so queued tasks finish while the members above live.
  std::unique_ptr<Executor> executor_;
};

// The samplerd version string.
extern const char kVersion[];

}  // namespace samplerd::core

#endif  // SAMPLERD_SERVICE_CORE_SAMPLER_CORE_H_
