// samplerd::DeviceSession: buffers and regions, the DeviceSession stream and its watcher thread,
// and the two ways to step (host spin-wait, GPU stream memory operations). The control block is
// host shm in both planes (the session's shm object), so the server polls it on the host, and
// the watcher releases a pending wait with plain stores.
#include "samplerd/device_session.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <map>
#include <utility>

#include "gpu_stream_ops.h"

namespace samplerd {
namespace {

using internal::GpuStreamOps;
using internal::GpuVendor;

constexpr uint64_t kBufferAlign = 256;
constexpr std::chrono::seconds kUnaryDeadline{5};
constexpr std::chrono::seconds kCloseWait{5};

uint64_t AlignUp(uint64_t value) {
  return (value + kBufferAlign - 1) / kBufferAlign * kBufferAlign;
}

uint64_t ElementBytes(v1::DType dtype) { return dtype == v1::DTYPE_FP32 ? 4 : 2; }

uint64_t LogitsBytes(const DeviceSessionOptions& o) {
  const uint64_t stride = o.row_stride != 0 ? o.row_stride : o.vocab;
  return uint64_t{o.max_batch} * stride * ElementBytes(o.dtype);
}

uint64_t ProcessorsBytes(const DeviceSessionOptions& o) {
  return samplerd_processors_bytes(o.max_batch, o.logit_bias_capacity, o.token_history_capacity);
}

std::string NextName() {
  static std::atomic<int> counter{0};
  return "ds-" + std::to_string(getpid()) + "-" + std::to_string(counter++);
}

grpc::Status Invalid(const std::string& message) {
  return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, message);
}

GpuVendor ToVendor(GpuRuntime runtime) {
  switch (runtime) {
    case GpuRuntime::kCuda:
      return GpuVendor::kCuda;
    case GpuRuntime::kHip:
      return GpuVendor::kHip;
    case GpuRuntime::kAuto:
      break;
  }
  return GpuVendor::kAuto;
}

// The server's own open checks on the sizes (SessionManager::Prepare), with its codes and
// messages, made before the client sizes the shm object by them.
grpc::Status CheckServerLimits(const DeviceSessionOptions& o, const v1::Limits& limits) {
  if (o.max_batch > static_cast<uint64_t>(limits.max_batch())) {
    return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                        "expected max_batch <= " + std::to_string(limits.max_batch()) +
                            " (server limit), got " + std::to_string(o.max_batch));
  }
  if (o.vocab > static_cast<uint64_t>(limits.max_vocab())) {
    return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                        "expected vocabulary size V <= " + std::to_string(limits.max_vocab()) +
                            " (server limit), got " + std::to_string(o.vocab));
  }
  const uint64_t max_stride = static_cast<uint64_t>(limits.max_vocab()) * 16;
  if (o.row_stride > max_stride) {
    return Invalid("expected row_stride <= " + std::to_string(max_stride) + ", got " +
                   std::to_string(o.row_stride));
  }
  const uint64_t max_entries = uint64_t{o.max_batch} * o.vocab;
  for (const auto& [name, capacity] :
       {std::pair<const char*, uint32_t>{"logit_bias_capacity", o.logit_bias_capacity},
        {"token_history_capacity", o.token_history_capacity}}) {
    if (capacity > max_entries) {
      return Invalid(std::string("expected ") + name + " <= max_batch * vocab = " +
                     std::to_string(max_entries) + ", got " + std::to_string(capacity));
    }
  }
  const uint64_t entries = uint64_t{o.logit_bias_capacity} + o.token_history_capacity;
  if (entries > INT32_MAX) {
    return Invalid("expected logit_bias_capacity + token_history_capacity <= " +
                   std::to_string(INT32_MAX) + ", got " + std::to_string(entries));
  }
  return grpc::Status::OK;
}

const GpuStreamOps* Ops(const void* ops) { return static_cast<const GpuStreamOps*>(ops); }

// Host-side atomic access to a control word shared with another process.
uint32_t LoadAcquire(const uint32_t* word) { return __atomic_load_n(word, __ATOMIC_ACQUIRE); }
void StoreRelease(uint32_t* word, uint32_t value) {
  __atomic_store_n(word, value, __ATOMIC_RELEASE);
}

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

}  // namespace

DeviceSessionLayout ComputeDeviceSessionLayout(const DeviceSessionOptions& options) {
  DeviceSessionLayout layout;
  uint64_t at = 0;
  if (options.plane == SessionPlane::kHost) {  // the GPU plane's is a shm object of its own
    layout.control = at;
    at = AlignUp(at + SAMPLERD_CONTROL_BYTES);
  }
  layout.logits = at;
  at = AlignUp(at + LogitsBytes(options));
  layout.params = at;
  at = AlignUp(at + samplerd_params_bytes(options.max_batch));
  layout.token_ids = at;
  at = AlignUp(at + 4ull * options.max_batch);
  layout.row_status = at;
  at = AlignUp(at + 4ull * options.max_batch);
  if (options.logprobs) {
    layout.sampled_logprobs = at;
    at = AlignUp(at + 4ull * options.max_batch);
  }
  if (options.token_bitmask) {
    layout.token_bitmask = at;
    at = AlignUp(at + samplerd_bitmask_bytes(options.max_batch, options.vocab));
  }
  if (options.processors) {
    layout.processors = at;
    at = AlignUp(at + ProcessorsBytes(options));
  }
  layout.total_bytes = at;
  return layout;
}

grpc::Status DeviceSession::Open(Client* client, const DeviceSessionOptions& options,
                                 std::unique_ptr<DeviceSession>* session) {
  if (client == nullptr || session == nullptr) {
    return Invalid("expected a client and a session pointer, got null");
  }
  std::unique_ptr<DeviceSession> opened(new DeviceSession());
  grpc::Status status = opened->Start(client, options);
  if (!status.ok()) return status;  // the destructor unregisters and frees what was made
  *session = std::move(opened);
  return grpc::Status::OK;
}

grpc::Status DeviceSession::Start(Client* client, const DeviceSessionOptions& options) {
  options_ = options;
  if (options.max_batch == 0) return Invalid("expected max_batch >= 1, got 0");
  if (options.vocab == 0) return Invalid("expected vocab >= 1, got 0");
  if (options.row_stride != 0 && options.row_stride < options.vocab) {
    return Invalid("expected row_stride 0 or >= vocab " + std::to_string(options.vocab) + ", got " +
                   std::to_string(options.row_stride));
  }
  if (options.dtype != v1::DTYPE_FP32 && options.dtype != v1::DTYPE_FP16 &&
      options.dtype != v1::DTYPE_BF16) {
    return Invalid("expected dtype DTYPE_FP32, DTYPE_FP16 or DTYPE_BF16, got " +
                   v1::DType_Name(options.dtype));
  }
  if (!options.processors &&
      (options.logit_bias_capacity != 0 || options.token_history_capacity != 0)) {
    return Invalid(
        "expected logit_bias_capacity and token_history_capacity 0 without "
        "processors, got " +
        std::to_string(options.logit_bias_capacity) + " and " +
        std::to_string(options.token_history_capacity));
  }
  // The server's limits are checked before anything is allocated: the host plane's shm object
  // is sized by max_batch, vocab and row_stride and zeroed whole, so options the server would
  // refuse at open could otherwise fill /dev/shm (and kill the engine) first.
  v1::GetServerInfoResponse info;
  grpc::Status status = client->GetServerInfo(&info);
  if (!status.ok()) return status;
  status = CheckServerLimits(options, info.limits());
  if (!status.ok()) return status;
  if ((options.token_bitmask || options.processors) && !info.device_sessions().processors()) {
    // A server without them ignores the buffers (proto3): refuse rather than skip them.
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        "expected a server that applies device-session processors, got one "
                        "without (GetServerInfo device_sessions.processors is false)");
  }
  layout_ = ComputeDeviceSessionLayout(options);
  channel_ = client->channel();
  stub_ = v1::SamplerService::NewStub(channel_);

  status =
      options.plane == SessionPlane::kHost ? AllocateHostBuffers(client) : UseGpuBuffers(client);
  if (!status.ok()) return status;

  v1::DeviceSessionOpen open;
  open.set_dtype(options.dtype);
  open.set_max_batch(options.max_batch);
  open.set_vocab(options.vocab);
  open.set_row_stride(options.row_stride);
  open.set_unregister_regions_on_end(true);  // a dead engine leaves nothing mapped
  open.set_logprob_source(options.logprob_source);
  open.set_logit_bias_capacity(options.logit_bias_capacity);
  open.set_token_history_capacity(options.token_history_capacity);
  open.set_plane(options.plane == SessionPlane::kHost ? v1::DEVICE_PLANE_HOST
                                                      : v1::DEVICE_PLANE_GPU);
  if (options.plane == SessionPlane::kHost) {
    const std::string& region = regions_.front();
    const auto slice = [&region](v1::RegionSlice* s, uint64_t offset) {
      s->set_region(region);
      s->set_offset(offset);
    };
    slice(open.mutable_control(), layout_.control);
    slice(open.mutable_logits(), layout_.logits);
    slice(open.mutable_params(), layout_.params);
    slice(open.mutable_token_ids(), layout_.token_ids);
    slice(open.mutable_row_status(), layout_.row_status);
    if (options.logprobs) slice(open.mutable_sampled_logprobs(), layout_.sampled_logprobs);
    if (options.token_bitmask) slice(open.mutable_token_bitmask(), layout_.token_bitmask);
    if (options.processors) slice(open.mutable_processors(), layout_.processors);
  } else {
    open.set_device(options.gpu.device);
    open.mutable_control()->set_region(shm_region_);
    open.mutable_control()->set_offset(control_offset_);
    // UseGpuBuffers registered one region per IPC handle, starting at the lowest offset.
    std::map<std::string, const GpuRegion*> by_handle;
    for (const GpuRegion& region : gpu_regions_) by_handle[region.handle] = &region;
    const auto slice = [&by_handle](v1::RegionSlice* s, const GpuBuffer& buffer) {
      const GpuRegion& region = *by_handle.at(buffer.ipc_handle);
      s->set_region(region.name);
      s->set_offset(buffer.offset - region.base);
    };
    slice(open.mutable_logits(), options.gpu.logits);
    slice(open.mutable_params(), options.gpu.params);
    slice(open.mutable_token_ids(), options.gpu.token_ids);
    slice(open.mutable_row_status(), options.gpu.row_status);
    if (options.logprobs) slice(open.mutable_sampled_logprobs(), options.gpu.sampled_logprobs);
    if (options.token_bitmask) slice(open.mutable_token_bitmask(), options.gpu.token_bitmask);
    if (options.processors) slice(open.mutable_processors(), options.gpu.processors);
  }
  return OpenStream(open);
}

grpc::Status DeviceSession::AllocateShm(Client* client, const std::string& name, uint64_t bytes,
                                        uint64_t control_offset) {
  const std::string key = options_.shm_key.empty() ? "/samplerd-" + name : options_.shm_key;
  std::string error;
  shm_ = HostShmBuffer::Create(key, bytes, &error);
  if (shm_ == nullptr) {
    return grpc::Status(
        grpc::StatusCode::RESOURCE_EXHAUSTED,
        "expected a host shm object of " + std::to_string(bytes) + " bytes, got " + error);
  }
  std::memset(shm_->data(), 0, bytes);
  control_offset_ = control_offset;
  control_ =
      reinterpret_cast<samplerd_control*>(static_cast<uint8_t*>(shm_->data()) + control_offset);
  grpc::Status status = client->RegisterHostShm(name, shm_->key(), 0, bytes);
  if (!status.ok()) return status;
  regions_.push_back(name);
  shm_region_ = name;
  return grpc::Status::OK;
}

grpc::Status DeviceSession::AllocateHostBuffers(Client* client) {
  grpc::Status status = AllocateShm(client, NextName(), layout_.total_bytes, layout_.control);
  if (!status.ok()) return status;
  auto* base = static_cast<uint8_t*>(shm_->data());
  logits_ = base + layout_.logits;
  uint8_t* params = base + layout_.params;
  const uint32_t m = options_.max_batch;
  params_.seed = reinterpret_cast<uint64_t*>(params + samplerd_params_seed_offset(m));
  params_.position = reinterpret_cast<uint64_t*>(params + samplerd_params_position_offset(m));
  params_.temperature = reinterpret_cast<float*>(params + samplerd_params_temperature_offset(m));
  params_.top_k = reinterpret_cast<int32_t*>(params + samplerd_params_top_k_offset(m));
  params_.top_p = reinterpret_cast<float*>(params + samplerd_params_top_p_offset(m));
  params_.min_p = reinterpret_cast<float*>(params + samplerd_params_min_p_offset(m));
  params_.top_p_mode = reinterpret_cast<int32_t*>(params + samplerd_params_top_p_mode_offset(m));
  for (uint32_t i = 0; i < m; ++i) {
    params_.temperature[i] = 1.0f;
    params_.top_p[i] = 1.0f;
  }
  token_ids_ = reinterpret_cast<int32_t*>(base + layout_.token_ids);
  row_status_ = reinterpret_cast<int32_t*>(base + layout_.row_status);
  if (options_.logprobs) {
    sampled_logprobs_ = reinterpret_cast<float*>(base + layout_.sampled_logprobs);
  }
  // The processors start as "allow everything, no penalties, no lists".
  if (options_.token_bitmask) {
    token_bitmask_ = reinterpret_cast<int32_t*>(base + layout_.token_bitmask);
    std::memset(token_bitmask_, 0xff, samplerd_bitmask_bytes(m, options_.vocab));
  }
  if (options_.processors) {
    processors_ = base + layout_.processors;
    std::vector<uint8_t> none;
    grpc::Status status = PackSessionProcessors(options_, 0, {}, &none);
    if (!status.ok()) return status;
    std::memcpy(processors_, none.data(), none.size());
  }
  return grpc::Status::OK;
}

grpc::Status DeviceSession::UseGpuBuffers(Client* client) {
  const GpuBuffers& gpu = options_.gpu;
  struct Need {
    const GpuBuffer* buffer;
    uint64_t bytes;
    const char* what;
  };
  std::vector<Need> needs = {{&gpu.logits, LogitsBytes(options_), "logits"},
                             {&gpu.params, samplerd_params_bytes(options_.max_batch), "params"},
                             {&gpu.token_ids, 4ull * options_.max_batch, "token_ids"},
                             {&gpu.row_status, 4ull * options_.max_batch, "row_status"}};
  if (options_.logprobs) {
    needs.push_back({&gpu.sampled_logprobs, 4ull * options_.max_batch, "sampled_logprobs"});
  }
  if (options_.token_bitmask) {
    needs.push_back({&gpu.token_bitmask, samplerd_bitmask_bytes(options_.max_batch, options_.vocab),
                     "token_bitmask"});
  }
  if (options_.processors) {
    needs.push_back({&gpu.processors, ProcessorsBytes(options_), "processors"});
  }
  for (const Need& need : needs) {
    if (need.buffer->device_ptr == nullptr || need.buffer->ipc_handle.empty()) {
      return Invalid(std::string("expected gpu.") + need.what +
                     " to have a device pointer and an IPC handle, got none");
    }
  }
  // One region per allocation (IPC handle), spanning the buffers that lie in it.
  std::map<std::string, std::pair<uint64_t, uint64_t>> spans;  // handle -> [begin, end)
  for (const Need& need : needs) {
    const uint64_t begin = need.buffer->offset, end = begin + need.bytes;
    auto [it, inserted] = spans.emplace(need.buffer->ipc_handle, std::make_pair(begin, end));
    if (!inserted) {
      it->second.first = std::min(it->second.first, begin);
      it->second.second = std::max(it->second.second, end);
    }
  }
  grpc::Status status;
  for (const auto& [handle, span] : spans) {
    const std::string name = NextName();
    status = client->RegisterGpuIpc(name, handle, span.first, span.second - span.first, gpu.device);
    if (!status.ok()) return status;
    regions_.push_back(name);
    gpu_regions_.push_back({name, handle, span.first});
  }
  // The control block: one page of host shm (pinned whole at the first EnqueueStep).
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  status = AllocateShm(client, NextName(), std::max<uint64_t>(page, SAMPLERD_CONTROL_BYTES), 0);
  if (!status.ok()) return status;
  logits_ = gpu.logits.device_ptr;
  auto* params = static_cast<uint8_t*>(gpu.params.device_ptr);
  const uint32_t m = options_.max_batch;
  params_.seed = reinterpret_cast<uint64_t*>(params + samplerd_params_seed_offset(m));
  params_.position = reinterpret_cast<uint64_t*>(params + samplerd_params_position_offset(m));
  params_.temperature = reinterpret_cast<float*>(params + samplerd_params_temperature_offset(m));
  params_.top_k = reinterpret_cast<int32_t*>(params + samplerd_params_top_k_offset(m));
  params_.top_p = reinterpret_cast<float*>(params + samplerd_params_top_p_offset(m));
  params_.min_p = reinterpret_cast<float*>(params + samplerd_params_min_p_offset(m));
  params_.top_p_mode = reinterpret_cast<int32_t*>(params + samplerd_params_top_p_mode_offset(m));
  token_ids_ = static_cast<int32_t*>(gpu.token_ids.device_ptr);
  row_status_ = static_cast<int32_t*>(gpu.row_status.device_ptr);
  if (options_.logprobs) sampled_logprobs_ = static_cast<float*>(gpu.sampled_logprobs.device_ptr);
  if (options_.token_bitmask) token_bitmask_ = static_cast<int32_t*>(gpu.token_bitmask.device_ptr);
  if (options_.processors) processors_ = static_cast<uint8_t*>(gpu.processors.device_ptr);
  return grpc::Status::OK;
}

grpc::Status DeviceSession::OpenStream(const v1::DeviceSessionOpen& open) {
  stream_ = stub_->DeviceSession(&context_);
  v1::DeviceSessionRequest request;
  *request.mutable_open() = open;
  // A failed write shows as the end of the call, which the watcher reports.
  stream_->Write(request);
  watcher_ = std::thread(&DeviceSession::Watch, this);

  std::unique_lock<std::mutex> lock(mutex_);
  if (!changed_.wait_for(lock, options_.open_timeout, [this] { return opened_ || ended_; })) {
    lock.unlock();
    context_.TryCancel();
    watcher_.join();
    return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                        "expected the server to answer the open within " +
                            std::to_string(options_.open_timeout.count()) + " ms, got no answer");
  }
  if (opened_) return grpc::Status::OK;
  lock.unlock();
  watcher_.join();
  if (!final_status_.ok()) return final_status_;
  return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                      "expected an opened session, got the end of the call");
}

void DeviceSession::Watch() {
  v1::DeviceSessionResponse response;
  while (stream_->Read(&response)) {
    if (response.has_opened()) {
      std::lock_guard<std::mutex> lock(mutex_);
      opened_ = true;
      session_id_ = response.opened().session_id();
      changed_.notify_all();
    }
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    final_status_ = stream_->Finish();
    ended_ = true;
  }
  if (opened_) ReleaseWaits();
  changed_.notify_all();
}

void DeviceSession::ReleaseWaits() {
  if (control_ == nullptr) return;
  StoreRelease(&control_->step_status, SAMPLERD_STEP_ABORTED);
  StoreRelease(&control_->done, SAMPLERD_DONE);
}

bool DeviceSession::open() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return opened_ && !ended_ && !close_sent_;
}

grpc::Status DeviceSession::EndedStatus() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::string why = close_sent_ ? "closed by the client" : "ended by the server";
  if (ended_ && !final_status_.ok()) why += ": " + final_status_.error_message();
  return grpc::Status(grpc::StatusCode::ABORTED, "expected an open device session, got one " + why);
}

uint32_t DeviceSession::step_status() const { return LoadAcquire(&control_->step_status); }

grpc::Status DeviceSession::StepOnHost(int batch) {
  if (options_.plane != SessionPlane::kHost) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        "expected a host-plane session for StepOnHost, got a GPU-plane one");
  }
  if (batch < 1 || static_cast<uint32_t>(batch) > options_.max_batch) {
    return Invalid("expected batch in [1, " + std::to_string(options_.max_batch) + "], got " +
                   std::to_string(batch));
  }
  if (!open()) return EndedStatus();
  StoreRelease(&control_->batch, static_cast<uint32_t>(batch));
  StoreRelease(&control_->doorbell, SAMPLERD_RING);
  // Spin: a futex costs 6-8 us per direction, a spin flag ~0.3 us (docs/DEVICE_SESSIONS.md).
  // Ends when the server answers, or when the watcher releases the wait (session over). Yields
  // now and then so that the server's own threads get a core on a small machine.
  for (uint32_t spins = 1; LoadAcquire(&control_->done) != SAMPLERD_DONE; ++spins) {
    if ((spins & 1023u) == 0) {
      std::this_thread::yield();
    } else {
      CpuRelax();
    }
  }
  StoreRelease(&control_->done, 0);
  switch (LoadAcquire(&control_->step_status)) {
    case SAMPLERD_STEP_OK:
      return grpc::Status::OK;
    case SAMPLERD_STEP_BAD_BATCH:
      return Invalid("expected the server to accept batch " + std::to_string(batch) +
                     ", got step status BAD_BATCH");
    default:
      return EndedStatus();
  }
}

grpc::Status DeviceSession::EnqueueStep(void* stream, int batch) {
  if (batch < 1 || static_cast<uint32_t>(batch) > options_.max_batch) {
    return Invalid("expected batch in [1, " + std::to_string(options_.max_batch) + "], got " +
                   std::to_string(batch));
  }
  if (!open()) return EndedStatus();
  std::string error;
  if (gpu_ops_ == nullptr) {
    gpu_ops_ = GpuStreamOps::Get(ToVendor(options_.gpu_runtime), &error);
    if (gpu_ops_ == nullptr) return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, error);
  }
  const GpuStreamOps* ops = Ops(gpu_ops_);
  if (!host_pinned_) {
    uint64_t base = 0;
    error = ops->RegisterHost(shm_->data(), shm_->size(), &base);
    if (!error.empty()) return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, error);
    host_pinned_ = true;
    control_device_address_ = base + control_offset_;
  }
  const uint64_t control = control_device_address_;
  error = ops->WriteValue32(stream, control + SAMPLERD_CONTROL_BATCH, static_cast<uint32_t>(batch));
  if (error.empty())
    error = ops->WriteValue32(stream, control + SAMPLERD_CONTROL_DOORBELL, SAMPLERD_RING);
  if (error.empty())
    error = ops->WaitValue32Eq(stream, control + SAMPLERD_CONTROL_DONE, SAMPLERD_DONE);
  if (error.empty()) error = ops->WriteValue32(stream, control + SAMPLERD_CONTROL_DONE, 0);
  if (!error.empty()) return grpc::Status(grpc::StatusCode::INTERNAL, error);
  return grpc::Status::OK;
}

grpc::Status DeviceSession::Close() {
  if (stream_ != nullptr) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!ended_ && !close_sent_) {
        v1::DeviceSessionRequest request;
        request.mutable_close();
        stream_->Write(request);
        stream_->WritesDone();
        close_sent_ = true;
      }
    }
    std::unique_lock<std::mutex> lock(mutex_);
    if (!changed_.wait_for(lock, kCloseWait, [this] { return ended_; })) {
      context_.TryCancel();  // a server that does not answer close within 5 s
    }
    lock.unlock();
    if (watcher_.joinable()) watcher_.join();
  }
  Unregister();
  std::lock_guard<std::mutex> lock(mutex_);
  return final_status_;
}

void DeviceSession::Unregister() {
  for (const std::string& name : regions_) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + kUnaryDeadline);
    v1::UnregisterRegionRequest request;
    request.set_name(name);
    v1::UnregisterRegionResponse response;
    stub_->UnregisterRegion(&context, request, &response).ok();  // best effort
  }
  regions_.clear();
}

DeviceSession::~DeviceSession() {
  Close().ok();
  if (host_pinned_) Ops(gpu_ops_)->UnregisterHost(shm_->data());
}

}  // namespace samplerd
