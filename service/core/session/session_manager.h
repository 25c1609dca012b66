// SessionManager: the device sessions open on this server. It checks a DeviceSessionOpen
// against every rule of proto/samplerd/v1/device_session.h, resolves its buffers to leased
// pointers (a SessionSpec), starts a plane runner on them, and ends sessions: on Close, on
// CloseAll (drain), or when a runner faults.
//
// Thread-safety: every method may be called from any thread.
#ifndef SAMPLERD_SERVICE_CORE_SESSION_SESSION_MANAGER_H_
#define SAMPLERD_SERVICE_CORE_SESSION_SESSION_MANAGER_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "service/core/backend/sampler.h"
#include "service/core/model/limits.h"
#include "service/core/regions/region_registry.h"
#include "service/core/session/gpu_plane.h"
#include "service/core/session/host_plane.h"
#include "service/core/session/plane_runner.h"
#include "service/core/session/session_spec.h"

namespace samplerd::core {

// One buffer of a session: bytes from `offset` in registered region `region`. An empty region
// name means the buffer is not set.
struct SessionSlice {
  std::string region;
  uint64_t offset = 0;
};

// DeviceSessionOpen (sampler.proto) in the core's terms. The enum fields hold the wire numbers
// of sampler.proto (unknown numbers included), so that the manager rejects them itself.
struct SessionOpen {
  std::string device;       // PCI bus id or UUID; empty: the regions' device
  int32_t dtype = 0;        // DType: 0 unspecified, 1 fp32, 2 fp16, 3 bf16
  uint32_t max_batch = 0;   // M
  uint32_t vocab = 0;       // V
  uint64_t row_stride = 0;  // elements; 0 means V
  SessionSlice control;
  SessionSlice logits;
  SessionSlice params;
  SessionSlice token_ids;
  SessionSlice row_status;
  SessionSlice sampled_logprobs;        // optional
  SessionSlice token_bitmask;           // optional
  SessionSlice processors;              // optional
  uint32_t logit_bias_capacity = 0;     // NB: 0 without processors
  uint32_t token_history_capacity = 0;  // NH: 0 without processors
  int32_t logprob_source = 0;           // LogprobSource: 0 or 1 raw, 2 processed
  int32_t plane = 0;                    // DevicePlane: 0 from the regions, 1 GPU, 2 host
  // Unregister the named regions when the session ends (whatever ends it).
  bool unregister_regions_on_end = false;
};

// DeviceSessionOpened, in the core's terms.
struct OpenedSession {
  std::string id;
  SessionPlane plane = SessionPlane::kHost;
  std::string device;  // PCI bus id of a GPU-plane session; empty for the host plane
};

// What GetServerInfo says about device sessions.
struct SessionSupport {
  int32_t max_sessions = 0;
  bool gpu_plane = false;
  bool host_plane = true;
  bool mps = false;
  int32_t open_sessions = 0;
  bool processors = true;  // DeviceSessionOpen's token_bitmask and processors are applied
  int64_t max_host_session_bytes = 0;  // DeviceSessionOptions::max_host_session_bytes
};

// Starts a runner on a validated spec (host_plane.h, gpu_plane.h; tests inject fakes).
using RunnerFactory = std::function<absl::StatusOr<std::unique_ptr<PlaneRunner>>(
    SessionSpec spec, PlaneRunner::FaultCallback on_fault)>;

// How device sessions run: how many at once, and their planes' settings.
struct DeviceSessionOptions {
  // Most sessions open at once (--max_device_sessions); one more is RESOURCE_EXHAUSTED. 0: none.
  int32_t max_sessions = 8;
  // Most bytes the open host-plane sessions reserve in total for their copies of a step's logits
  // (HostSessionBytes: max_batch x vocab x element size each), --max_host_session_bytes; an
  // open past it is RESOURCE_EXHAUSTED. GPU-plane sessions do not count (their logits stay on
  // the GPU). 0: no limit. The reservation is virtual until full steps touch it, so without a
  // cap the sessions the limits allow (M = 2,048, V = 4,194,304 fp32: 32 GiB each) could take
  // the host's memory.
  int64_t max_host_session_bytes = int64_t{8} << 30;
  HostPlaneOptions host;  // --host_plane_threads, --session_spin_us
  GpuPlaneOptions gpu;    // --session_spin_us
};

// StartHostPlane for host-plane specs, StartGpuPlane for GPU-plane specs (GPU builds; in a CPU
// build a GPU-plane spec is FAILED_PRECONDITION), with `options`.
RunnerFactory DefaultRunnerFactory(const DeviceSessionOptions& options);

class SessionManager {
 public:
  // Called once when a session ends without Close: UNAVAILABLE from CloseAll (drain), or the
  // runner's fault status. Runs on the thread of CloseAll, or on the manager's own thread for
  // faults, after the runner has stopped and the leases are released. Must not call into the
  // manager for this session (it is gone already).
  using EndCallback = std::function<void(const absl::Status&)>;

  // `regions` must outlive the manager. `backend` and `device` are the sampler's; the GPU plane
  // is served only when `backend` is kGpu and device.ipc_memory (GPU IPC regions can be opened).
  SessionManager(RegionRegistry* regions, BackendKind backend, DeviceInfo device, Limits limits,
                 DeviceSessionOptions options, RunnerFactory factory);
  // CloseAll(), then stops the manager's thread.
  ~SessionManager();
  SessionManager(const SessionManager&) = delete;
  SessionManager& operator=(const SessionManager&) = delete;

  // Validates `open`, leases its buffers and starts its runner. Errors (each "expected X, got
  // Y"): INVALID_ARGUMENT for a bad shape, enum value, missing buffer, misalignment, overlap or
  // mixed region kinds; RESOURCE_EXHAUSTED for max_batch or vocab over the limits,
  // options.max_sessions open already, or a host-plane session whose bytes would take the open
  // ones past options.max_host_session_bytes; NOT_FOUND for an unknown region; OUT_OF_RANGE for a
  // slice too small for its buffer; FAILED_PRECONDITION for host outputs samplerd cannot write, a
  // plane the regions or the server do not fit, or another device; ALREADY_EXISTS for a control
  // block an open session uses; UNAVAILABLE after CloseAll; and the runner's own errors.
  // `on_end` (see EndCallback) may be empty.
  absl::StatusOr<OpenedSession> Open(const SessionOpen& open, EndCallback on_end);

  // Ends session `id` without calling its EndCallback: stops its runner (bounded, ~100 ms) and
  // releases its leases. Returns the steps it completed; NOT_FOUND when it is not open (it has
  // ended already, and its EndCallback runs or ran).
  absl::StatusOr<uint64_t> Close(const std::string& id);

  // Refuses later opens with UNAVAILABLE, ends every open session and calls each EndCallback
  // with UNAVAILABLE. Idempotent.
  void CloseAll();

  // Sessions open now (including those being started).
  int open_count() const;

  // GetServerInfo's device-session part (mps is left false; the caller knows).
  SessionSupport Support() const;

 private:
  struct Session {
    std::string id;
    uint8_t* control = nullptr;           // resolved address: one session per control block
    RegionView control_view;              // its shm object and offset, under any region name
    std::unique_ptr<PlaneRunner> runner;  // null while starting
    // Its share of options_.max_host_session_bytes: HostSessionBytes for the host plane, 0 for
    // the GPU plane. Freed when the session leaves sessions_.
    uint64_t host_bytes = 0;
    EndCallback on_end;
    absl::Status early_fault;  // a fault reported while starting
    // Regions to unregister once the session has ended (SessionOpen::unregister_regions_on_end),
    // by name and the registration the open leased (RegionLease::registration): a name
    // registered again meanwhile names another region, which stays.
    std::vector<std::pair<std::string, uint64_t>> owned_regions;
  };

  // Stops the session's runner (releasing its leases) and unregisters its owned regions.
  void End(Session& session);

  // Everything before the runner starts; fills `spec` and `opened`.
  absl::Status Prepare(const SessionOpen& open, SessionSpec* spec, OpenedSession* opened);
  // Called by a runner (its own thread): hands the session to the ender thread.
  void OnFault(const std::string& id, const absl::Status& status);
  // The ender thread: ends faulted sessions off their runners' threads.
  void EnderLoop();

  RegionRegistry* const regions_;
  const BackendKind backend_;
  const DeviceInfo device_;
  const Limits limits_;
  const DeviceSessionOptions options_;
  const RunnerFactory factory_;

  mutable std::mutex mu_;
  bool closing_all_ = false;  // guarded by mu_
  bool stopping_ = false;     // guarded by mu_: the ender thread exits
  uint64_t next_id_ = 0;      // guarded by mu_
  std::map<std::string, std::unique_ptr<Session>> sessions_;  // guarded by mu_
  std::deque<std::pair<std::string, absl::Status>> faults_;   // guarded by mu_
  std::condition_variable ender_cv_;
  std::thread ender_;
};

}  // namespace samplerd::core

#endif  // SAMPLERD_SERVICE_CORE_SESSION_SESSION_MANAGER_H_
