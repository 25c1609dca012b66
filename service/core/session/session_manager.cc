// SessionManager: open validation (the rules of device_session.h, in a fixed order so that each
// bad open gets one exact code), the map of open sessions, and their ends.
//
// Ends: whoever takes a session out of the map ends it (stops the runner, which releases the
// leases when destroyed) and, unless that is Close, calls its EndCallback. A runner's fault
// arrives on the runner's own thread, where the runner cannot be stopped, so the manager's
// ender thread ends faulted sessions.
#include "service/core/session/session_manager.h"

#include <algorithm>
#include <array>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "proto/samplerd/v1/device_session.h"
#include "service/core/backend/device_match.h"
#include "service/core/model/status_macros.h"

namespace samplerd::core {
namespace {

// The buffers in SessionSpec::leases order.
// The first kSampledLogprobs are required, the rest optional.
enum Buffer {
  kControl,
  kLogits,
  kParams,
  kTokenIds,
  kRowStatus,
  kSampledLogprobs,
  kTokenBitmask,
  kProcessors,
  kBuffers
};

constexpr std::array<const char*, kBuffers> kBufferNames = {
    "control",    "logits",           "params",        "token_ids",
    "row_status", "sampled_logprobs", "token_bitmask", "processors"};

std::string Field(int buffer) { return absl::StrCat("DeviceSessionOpen.", kBufferNames[buffer]); }

absl::Status Invalid(absl::string_view expected, absl::string_view got) {
  return absl::InvalidArgumentError(absl::StrCat("expected ", expected, ", got ", got));
}

const char* KindName(RegionKind kind) {
  return kind == RegionKind::kGpuIpc ? "GPU IPC" : "host shm";
}

absl::StatusOr<kernels::DType> DTypeOf(int32_t dtype) {
  switch (dtype) {
    case 1:
      return kernels::DType::kFp32;
    case 2:
      return kernels::DType::kFp16;
    case 3:
      return kernels::DType::kBf16;
    default:
      break;
  }
  return Invalid("DeviceSessionOpen.dtype DTYPE_FP32, DTYPE_FP16 or DTYPE_BF16",
                 dtype == 0 ? "DTYPE_UNSPECIFIED" : absl::StrCat("the unknown value ", dtype));
}

// Prefixes a lease error with the buffer it is about, keeping its code.
absl::Status AboutBuffer(int buffer, absl::string_view what, const absl::Status& status) {
  return absl::Status(status.code(),
                      absl::StrCat(Field(buffer), " (", what, "): ", status.message()));
}

// Whether two control blocks' bytes overlap in one shm object: the same object registered under
// two region names (or twice under one) maps at two addresses, and two pollers on one doorbell
// would both take its rings.
bool SameControlBlock(const RegionView& a, const RegionView& b) {
  if (a.object_ino == 0 || a.object_dev != b.object_dev || a.object_ino != b.object_ino) {
    return false;
  }
  const uint64_t lo = std::max(a.object_offset, b.object_offset);
  const uint64_t hi = std::min(a.object_offset, b.object_offset) + SAMPLERD_CONTROL_BYTES;
  return lo < hi;
}

}  // namespace

SessionManager::SessionManager(RegionRegistry* regions, BackendKind backend, DeviceInfo device,
                               Limits limits, DeviceSessionOptions options, RunnerFactory factory)
    : regions_(regions),
      backend_(backend),
      device_(std::move(device)),
      limits_(limits),
      options_(std::move(options)),
      factory_(std::move(factory)),
      ender_([this] { EnderLoop(); }) {}

SessionManager::~SessionManager() {
  CloseAll();
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  ender_cv_.notify_all();
  ender_.join();
}

absl::Status SessionManager::Prepare(const SessionOpen& open, SessionSpec* spec,
                                     OpenedSession* opened) {
  // Shape and enums.
  ASSIGN_OR_RETURN(spec->dtype, DTypeOf(open.dtype));
  if (open.max_batch < 1) return Invalid("DeviceSessionOpen.max_batch >= 1", "0");
  if (open.vocab < 1) return Invalid("DeviceSessionOpen.vocab >= 1", "0");
  if (open.max_batch > limits_.max_batch) {
    return absl::ResourceExhaustedError(absl::StrCat("expected max_batch <= ", limits_.max_batch,
                                                     " (server limit), got ", open.max_batch));
  }
  if (open.vocab > limits_.max_vocab) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "expected vocabulary size V <= ", limits_.max_vocab, " (server limit), got ", open.vocab));
  }
  const uint64_t stride = open.row_stride == 0 ? open.vocab : open.row_stride;
  if (stride < open.vocab) {
    return Invalid(absl::StrCat("DeviceSessionOpen.row_stride 0 or >= V = ", open.vocab),
                   absl::StrCat(open.row_stride));
  }
  // Bounds the byte counts below far from overflow (V is bounded already), as Sample does.
  const uint64_t max_stride = static_cast<uint64_t>(limits_.max_vocab) * 16;
  if (stride > max_stride) {
    return Invalid(absl::StrCat("DeviceSessionOpen.row_stride <= ", max_stride),
                   absl::StrCat(open.row_stride));
  }
  switch (open.logprob_source) {
    case 0:
    case 1:
      spec->logprob_source = kernels::LogprobSource::kRaw;
      break;
    case 2:
      spec->logprob_source = kernels::LogprobSource::kProcessed;
      break;
    default:
      return Invalid("DeviceSessionOpen.logprob_source 0 to 2 (LogprobSource)",
                     absl::StrCat("the unknown value ", open.logprob_source));
  }
  if (open.plane < 0 || open.plane > 2) {
    return Invalid("DeviceSessionOpen.plane 0 to 2 (DevicePlane)",
                   absl::StrCat("the unknown value ", open.plane));
  }
  const uint64_t m = open.max_batch;
  const uint64_t max_entries = m * open.vocab;  // each row names a token at most once
  for (const auto& [name, capacity] :
       {std::pair<const char*, uint32_t>{"logit_bias_capacity", open.logit_bias_capacity},
        {"token_history_capacity", open.token_history_capacity}}) {
    if (capacity != 0 && open.processors.region.empty()) {
      return Invalid(absl::StrCat("DeviceSessionOpen.", name, " 0 without a processors buffer"),
                     absl::StrCat(capacity));
    }
    if (capacity > max_entries) {
      return Invalid(absl::StrCat("DeviceSessionOpen.", name, " <= max_batch * vocab = ",
                                  max_entries, " (a row names each token at most once)"),
                     absl::StrCat(capacity));
    }
  }
  // The merged entries of a step are indexed with 32 bits (SampleArgs::adjust_offsets).
  const uint64_t entries = uint64_t{open.logit_bias_capacity} + open.token_history_capacity;
  if (entries > INT32_MAX) {
    return Invalid(absl::StrCat("DeviceSessionOpen.logit_bias_capacity + "
                                "token_history_capacity <= ",
                                INT32_MAX),
                   absl::StrCat(entries));
  }
  // Each host-plane step copies the processors rows into server memory (processors_snapshot.h)
  // and merges them, and the GPU plane sizes its device workspace by NB + NH: both bounded as
  // the same lists in one Sample request are. A sparse shm object announcing 2^31 entries made
  // one open zero-fill ~19 GiB of server memory.
  const uint64_t processors_bytes = samplerd_processors_bytes(
      open.max_batch, open.logit_bias_capacity, open.token_history_capacity);
  if (!open.processors.region.empty() &&
      processors_bytes > static_cast<uint64_t>(limits_.max_region_list_bytes)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "expected a DeviceSessionOpen.processors buffer of at most ", limits_.max_region_list_bytes,
        " bytes (--max_message_bytes, as the same lists in one Sample request), got ",
        processors_bytes, " bytes (samplerd_processors_bytes(max_batch ", m,
        ", logit_bias_capacity ", open.logit_bias_capacity, ", token_history_capacity ",
        open.token_history_capacity, ")): open it with smaller capacities"));
  }
  const bool gpu_served = backend_ == BackendKind::kGpu && device_.ipc_memory;
  if (open.plane == 1 && !gpu_served) {
    return absl::FailedPreconditionError(absl::StrCat(
        "expected DEVICE_PLANE_HOST or an unset plane on this server, got DEVICE_PLANE_GPU, but ",
        backend_ == BackendKind::kCpu
            ? "this server samples on the CPU: use host shm buffers (the host plane)"
            : "this GPU server has no GPU IPC: use host shm buffers (the host plane)"));
  }

  // The buffers: present, leased with their full size.
  const std::array<const SessionSlice*, kBuffers> slices = {
      &open.control,    &open.logits,           &open.params,        &open.token_ids,
      &open.row_status, &open.sampled_logprobs, &open.token_bitmask, &open.processors};
  std::array<bool, kBuffers> present;
  for (int b = 0; b < kBuffers; ++b) present[b] = !slices[b]->region.empty();
  for (int b = 0; b < kSampledLogprobs; ++b) {
    if (slices[b]->region.empty()) {
      return Invalid(absl::StrCat(Field(b), " to name a registered region"), "none");
    }
  }
  const uint64_t elem = static_cast<uint64_t>(kernels::DTypeSize(spec->dtype));
  const std::array<uint64_t, kBuffers> bytes = {SAMPLERD_CONTROL_BYTES,
                                                m * stride * elem,
                                                samplerd_params_bytes(open.max_batch),
                                                4 * m,
                                                4 * m,
                                                4 * m,
                                                samplerd_bitmask_bytes(open.max_batch, open.vocab),
                                                processors_bytes};
  const std::array<uint64_t, kBuffers> align = {
      SAMPLERD_CONTROL_ALIGN,   elem, SAMPLERD_PARAMS_ALIGN, 4, 4, 4, SAMPLERD_BITMASK_ALIGN,
      SAMPLERD_PROCESSORS_ALIGN};
  const std::array<std::string, kBuffers> what = {
      absl::StrCat(SAMPLERD_CONTROL_BYTES, " bytes"),
      absl::StrCat("[max_batch ", m, ", row_stride ", stride, "] ",
                   kernels::DTypeName(spec->dtype)),
      absl::StrCat("36 * max_batch ", m, " bytes"),
      absl::StrCat("int32[max_batch ", m, "]"),
      absl::StrCat("int32[max_batch ", m, "]"),
      absl::StrCat("float32[max_batch ", m, "]"),
      absl::StrCat("int32[max_batch ", m, ", ceil(V / 32) ", samplerd_bitmask_words(open.vocab),
                   "]"),
      absl::StrCat("samplerd_processors_bytes(max_batch ", m, ", logit_bias_capacity ",
                   open.logit_bias_capacity, ", token_history_capacity ",
                   open.token_history_capacity, ") bytes")};
  for (int b = 0; b < kBuffers; ++b) {
    if (!present[b]) continue;
    absl::StatusOr<RegionLease> lease =
        regions_->Acquire(slices[b]->region, slices[b]->offset, bytes[b]);
    if (!lease.ok()) return AboutBuffer(b, what[b], lease.status());
    spec->leases[b] = *std::move(lease);
  }

  // The control block is host shm in both planes: the server polls it on the host and never
  // parks a GPU wait (a parked wait blocks every device-wide synchronisation in the server:
  // docs/DEVICE_SESSIONS.md). The other buffers are of one kind, which decides the plane.
  if (spec->leases[kControl].view().kind != RegionKind::kHostShm) {
    return Invalid(absl::StrCat(Field(kControl), " in a host shm region (both planes)"),
                   "a GPU IPC region");
  }
  const RegionKind kind = spec->leases[kLogits].view().kind;
  for (int b = kLogits + 1; b < kBuffers; ++b) {
    if (!present[b]) continue;
    const RegionKind other = spec->leases[b].view().kind;
    if (other != kind) {
      return Invalid("the data buffers in one kind of region (all host shm or all GPU IPC)",
                     absl::StrCat(Field(kLogits), " in ", KindName(kind), " and ", Field(b), " in ",
                                  KindName(other)));
    }
  }
  if (open.plane == 1 && kind != RegionKind::kGpuIpc) {
    return absl::FailedPreconditionError(
        "expected GPU IPC buffers for DEVICE_PLANE_GPU, got host shm regions (their plane is "
        "DEVICE_PLANE_HOST)");
  }
  if (open.plane == 2 && kind != RegionKind::kHostShm) {
    return absl::FailedPreconditionError(
        "expected host shm buffers for DEVICE_PLANE_HOST, got GPU IPC regions (their plane is "
        "DEVICE_PLANE_GPU)");
  }
  if (kind == RegionKind::kGpuIpc) {
    if (!gpu_served) {
      return absl::FailedPreconditionError(
          "expected host shm buffers on a server without the GPU plane, got GPU IPC regions");
    }
    RETURN_IF_ERROR(MatchDevice(open.device, device_));
    for (int b = kLogits; b < kBuffers; ++b) {
      if (!present[b]) continue;
      const int ordinal = spec->leases[b].view().device_ordinal;
      if (ordinal != device_.ordinal) {
        return absl::FailedPreconditionError(
            absl::StrCat("expected every buffer on this server's GPU ", device_.pci_bus_id,
                         ", got ", Field(b), " on another GPU (runtime ordinal ", ordinal, ")"));
      }
    }
    spec->plane = SessionPlane::kGpu;
    spec->device_ordinal = device_.ordinal;
    opened->plane = SessionPlane::kGpu;
    opened->device = device_.pci_bus_id;
  } else {
    spec->plane = SessionPlane::kHost;
    opened->plane = SessionPlane::kHost;
  }
  for (int b : {kControl, kTokenIds, kRowStatus, kSampledLogprobs}) {
    if (present[b] && spec->leases[b].view().kind == RegionKind::kHostShm &&
        !spec->leases[b].view().writable) {
      return absl::FailedPreconditionError(
          absl::StrCat("expected ", Field(b),
                       " in a region samplerd can write, got a host shm object it could open only "
                       "read-only (give the server's user write permission on it)"));
    }
  }

  // Alignment and overlap, on the resolved addresses.
  for (int b = 0; b < kBuffers; ++b) {
    if (!present[b]) continue;
    const uintptr_t address = reinterpret_cast<uintptr_t>(spec->leases[b].view().data);
    if (address % align[b] != 0) {
      return Invalid(absl::StrCat(Field(b), " aligned to ", align[b], " bytes"),
                     absl::StrCat("an address ", address % align[b], " bytes past a multiple of ",
                                  align[b], " (region offset ", slices[b]->offset, ")"));
    }
  }
  for (int a = 0; a < kBuffers; ++a) {
    for (int b = a + 1; b < kBuffers; ++b) {
      if (!present[a] || !present[b]) continue;
      const RegionView& x = spec->leases[a].view();
      const RegionView& y = spec->leases[b].view();
      if (x.kind != y.kind) continue;  // host and device addresses never alias
      const uintptr_t x0 = reinterpret_cast<uintptr_t>(x.data);
      const uintptr_t y0 = reinterpret_cast<uintptr_t>(y.data);
      const uintptr_t start = std::max(x0, y0);
      const uintptr_t end = std::min(x0 + x.size, y0 + y.size);
      if (start < end) {
        return Invalid(
            "buffers that do not overlap",
            absl::StrCat(Field(a), " and ", Field(b), " sharing ", end - start, " bytes"));
      }
    }
  }

  spec->max_batch = open.max_batch;
  spec->vocab = open.vocab;
  spec->row_stride = stride;
  spec->control = spec->leases[kControl].view().data;
  spec->logits = spec->leases[kLogits].view().data;
  spec->params = spec->leases[kParams].view().data;
  spec->token_ids = reinterpret_cast<int32_t*>(spec->leases[kTokenIds].view().data);
  spec->row_status = reinterpret_cast<int32_t*>(spec->leases[kRowStatus].view().data);
  spec->sampled_logprobs =
      present[kSampledLogprobs]
          ? reinterpret_cast<float*>(spec->leases[kSampledLogprobs].view().data)
          : nullptr;
  spec->token_bitmask =
      present[kTokenBitmask]
          ? reinterpret_cast<const uint32_t*>(spec->leases[kTokenBitmask].view().data)
          : nullptr;
  spec->processors = present[kProcessors] ? spec->leases[kProcessors].view().data : nullptr;
  spec->logit_bias_capacity = open.logit_bias_capacity;
  spec->token_history_capacity = open.token_history_capacity;
  return absl::OkStatus();
}

absl::StatusOr<OpenedSession> SessionManager::Open(const SessionOpen& open, EndCallback on_end) {
  const absl::Status draining =
      absl::UnavailableError("samplerd is shutting down; open the session on another instance");
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closing_all_) return draining;
  }
  SessionSpec spec;
  OpenedSession opened;
  RETURN_IF_ERROR(Prepare(open, &spec, &opened));

  // Reserve the session (its control block and a slot) before starting its runner.
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closing_all_) return draining;
    const RegionView& control = spec.leases[kControl].view();
    for (const auto& [id, session] : sessions_) {
      if (session->control == spec.control || SameControlBlock(session->control_view, control)) {
        return absl::AlreadyExistsError(
            absl::StrCat("expected a control block no open session uses, got the one of session ",
                         id, " (close it first; one session per control block)"));
      }
    }
    if (static_cast<int64_t>(sessions_.size()) >= options_.max_sessions) {
      return absl::ResourceExhaustedError(
          absl::StrCat("expected at most ", options_.max_sessions,
                       " open device sessions (--max_device_sessions), got a request for one "
                       "more; close one or retry later"));
    }
    const uint64_t host_bytes = spec.plane == SessionPlane::kHost ? HostSessionBytes(spec) : 0;
    if (options_.max_host_session_bytes > 0 && host_bytes > 0) {
      // Each share is bounded by the limits (< 2^58 bytes) and the shares held by the cap, so
      // the sum cannot overflow.
      uint64_t held = 0;
      for (const auto& [id, session] : sessions_) held += session->host_bytes;
      const uint64_t cap = static_cast<uint64_t>(options_.max_host_session_bytes);
      if (held + host_bytes > cap) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "expected host-plane device sessions reserving at most ", cap,
            " bytes in total for their copies of a step's logits (--max_host_session_bytes), got ",
            held, " bytes held by the open ones plus ", host_bytes, " for this one (max_batch ",
            spec.max_batch, " x vocab ", spec.vocab, " x ", kernels::DTypeSize(spec.dtype),
            " bytes ", kernels::DTypeName(spec.dtype),
            "): open it with a smaller max_batch, close a session, or raise "
            "--max_host_session_bytes"));
      }
    }
    opened.id = absl::StrCat("ds-", ++next_id_);
    auto session = std::make_unique<Session>();
    session->id = opened.id;
    session->host_bytes = host_bytes;
    session->control = spec.control;
    session->control_view = control;
    session->on_end = std::move(on_end);
    if (open.unregister_regions_on_end) {
      const std::array<const SessionSlice*, kBuffers> slices = {
          &open.control,    &open.logits,           &open.params,        &open.token_ids,
          &open.row_status, &open.sampled_logprobs, &open.token_bitmask, &open.processors};
      for (int b = 0; b < kBuffers; ++b) {
        if (slices[b]->region.empty()) continue;
        session->owned_regions.emplace_back(slices[b]->region, spec.leases[b].registration());
      }
    }
    sessions_.emplace(opened.id, std::move(session));
  }
  spec.id = opened.id;
  absl::StatusOr<std::unique_ptr<PlaneRunner>> runner = factory_(
      std::move(spec), [this, id = opened.id](const absl::Status& status) { OnFault(id, status); });

  std::unique_ptr<Session> failed;
  absl::Status error;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = sessions_.find(opened.id);  // only this call removes a session while it starts
    if (!runner.ok()) {
      error = runner.status();
    } else if (closing_all_) {
      error = draining;
    } else if (!it->second->early_fault.ok()) {
      error = it->second->early_fault;
    } else {
      it->second->runner = *std::move(runner);
      return opened;
    }
    failed = std::move(it->second);
    sessions_.erase(it);
  }
  // A session that never opened leaves its regions registered: the client may retry.
  if (runner.ok() && *runner != nullptr) (*runner)->Stop();
  return error;
}

absl::StatusOr<uint64_t> SessionManager::Close(const std::string& id) {
  std::unique_ptr<Session> session;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = sessions_.find(id);
    if (it == sessions_.end() || it->second->runner == nullptr) {
      return absl::NotFoundError(
          absl::StrCat("expected an open device session, got \"", id, "\", which has ended"));
    }
    session = std::move(it->second);
    sessions_.erase(it);
  }
  const uint64_t steps = session->runner->steps();
  End(*session);
  return steps;
}

void SessionManager::End(Session& session) {
  if (session.runner != nullptr) session.runner->Stop();
  session.runner.reset();  // releases the leases
  // A region may be named twice, or be gone already (the client unregistered it, perhaps
  // registering another region under its name, which stays): all fine.
  for (const auto& [name, registration] : session.owned_regions) {
    regions_->UnregisterRegistration(name, registration).IgnoreError();
  }
  session.owned_regions.clear();
}

void SessionManager::CloseAll() {
  std::vector<std::unique_ptr<Session>> ending;
  {
    std::lock_guard<std::mutex> lock(mu_);
    closing_all_ = true;
    for (auto it = sessions_.begin(); it != sessions_.end();) {
      if (it->second->runner == nullptr) {  // starting: its Open ends it
        ++it;
        continue;
      }
      ending.push_back(std::move(it->second));
      it = sessions_.erase(it);
    }
  }
  // Every engine wait is released first (Stop writes ABORTED), then the callbacks run.
  for (const std::unique_ptr<Session>& session : ending) session->runner->Stop();
  const absl::Status status = absl::UnavailableError(
      "samplerd is shutting down: the device session has ended (its engine wait completed with "
      "step status ABORTED); open a new one on another instance");
  for (std::unique_ptr<Session>& session : ending) {
    End(*session);
    if (session->on_end) session->on_end(status);
  }
}

void SessionManager::OnFault(const std::string& id, const absl::Status& status) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    faults_.emplace_back(id,
                         status.ok() ? absl::InternalError("the plane runner stopped") : status);
  }
  ender_cv_.notify_all();
}

void SessionManager::EnderLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    ender_cv_.wait(lock, [this] { return stopping_ || !faults_.empty(); });
    if (faults_.empty()) return;  // stopping_
    auto [id, status] = std::move(faults_.front());
    faults_.pop_front();
    auto it = sessions_.find(id);
    if (it == sessions_.end()) continue;  // closed meanwhile
    if (it->second->runner == nullptr) {  // still starting: Open ends it
      it->second->early_fault = status;
      continue;
    }
    std::unique_ptr<Session> session = std::move(it->second);
    sessions_.erase(it);
    lock.unlock();
    End(*session);
    if (session->on_end) session->on_end(status);
    session.reset();
    lock.lock();
  }
}

int SessionManager::open_count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(sessions_.size());
}

SessionSupport SessionManager::Support() const {
  SessionSupport support;
  support.max_sessions = options_.max_sessions;
  support.max_host_session_bytes = options_.max_host_session_bytes;
  support.gpu_plane = backend_ == BackendKind::kGpu && device_.ipc_memory;
  support.host_plane = true;
  support.open_sessions = open_count();
  return support;
}

}  // namespace samplerd::core
