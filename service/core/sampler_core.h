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
  SessionSupport device_sessions;
};

class SamplerCore {
 public:
  using Callback = std::function<void(absl::StatusOr<SampleResult>)>;

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
  absl::Status SampleAsync(SampleRequest request, Callback done);

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
  // Takes an in-flight slot, or RESOURCE_EXHAUSTED when limits().max_inflight are taken.
  absl::Status Admit();
  // Validates, binds and queues an admitted request (SampleAsync's second half).
  absl::Status Queue(SampleRequest request, Callback done);
  // Runs a queued request on the executor thread.
  void Run(SampleRequest& request, ValidatedBatch& batch, BoundIo& bound, const Callback& done);
  // Reads the request's bias list and token history packed in regions into `request`, keeping
  // their leases in `bound` (ReadProcessorLists), and merges them into `batch`
  // (ValidateProcessors). On the executor thread: a GPU IPC slice is copied after the request's
  // ready event, a wait no transport thread should make. Errors: those two functions'.
  absl::Status ResolveProcessorLists(SampleRequest& request, ValidatedBatch& batch, BoundIo& bound);
  // Gives the admission slot back: right before the answer is handed to the caller.
  void ReleaseAdmission();
  // Ends the request for Drain: after its callback has run and its leases are released.
  void Finish();
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
  int64_t admitted_ = 0;     // guarded by mu_: admitted, not yet answered (max_inflight)
  uint64_t admissions_ = 0;  // guarded by mu_: admitted since start
  int64_t in_flight_ = 0;    // guarded by mu_: admitted, callback not yet returned (Drain)
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
