// samplerd::DeviceSession: a per-step data plane with no RPC per step (SamplerService.
// DeviceSession; layout and protocol in samplerd/v1/device_session.h, installed beside this
// header).
//
// Host plane (any server; the engine's GPU never switches to the server's context):
//
//   samplerd::DeviceSessionOptions options;
//   options.max_batch = 32;
//   options.vocab = 151936;
//   std::unique_ptr<samplerd::DeviceSession> session;
//   grpc::Status status = samplerd::DeviceSession::Open(&client, options, &session);
//   // CPU engine: fill session->logits() and session->params() rows [0, B), then
//   status = session->StepOnHost(B);            // tokens in session->token_ids()[0, B)
//   // GPU engine: cudaMemcpyAsync the logits and params into the same pointers on `stream`
//   // (the buffers are pinned for the GPU at the first EnqueueStep), then
//   status = session->EnqueueStep(stream, B);  // ring, wait, reset: stream ops only
//   // after the stream passes that point, token_ids() and row_status() hold the step's rows.
//   status = session->Close();
//
// GPU plane (a GPU server; pays two GPU context switches per step without CUDA MPS, see
// docs/DEVICE_SESSIONS.md): the client cannot allocate device memory (it links no GPU
// runtime), so the engine allocates the data buffers (logits, params, token_ids, row_status,
// sampled_logprobs, token_bitmask, processors) and passes their device pointers and IPC handles in
// DeviceSessionOptions::gpu; ComputeDeviceSessionLayout() gives one allocation's offsets.
// Those pointers are device pointers. The control block is host shm in both planes: the
// session allocates it (a one-page shm object, its own region) and pins it at the first
// EnqueueStep, so the server polls the doorbell on the host and never parks a GPU wait.
//
// Errors follow samplerd/client.h: grpc::Status values, messages "expected X, got Y".
#ifndef SAMPLERD_CLIENT_CPP_INCLUDE_SAMPLERD_DEVICE_SESSION_H_
#define SAMPLERD_CLIENT_CPP_INCLUDE_SAMPLERD_DEVICE_SESSION_H_

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "samplerd/client.h"
#include "samplerd/host_shm_buffer.h"
#include "samplerd/processors.h"
#include "samplerd/v1/device_session.h"
#include "samplerd/v1/sampler.grpc.pb.h"

namespace samplerd {

// Where a session's buffers live, and so who samples (device_session.h, "Planes").
enum class SessionPlane { kHost, kGpu };

// Which GPU runtime EnqueueStep (and the GPU plane) drives. kAuto: the one the process has
// loaded already (libcuda.so.1 or libamdhip64.so), else CUDA if installed, else HIP.
enum class GpuRuntime { kAuto, kCuda, kHip };

// One engine-owned GPU buffer: its device pointer, and the IPC memory handle (64 bytes, e.g.
// cudaIpcMemHandle_t) of the allocation it lies in, `offset` bytes from that allocation's base.
struct GpuBuffer {
  void* device_ptr = nullptr;
  std::string ipc_handle;
  uint64_t offset = 0;
};

// GPU-plane data buffers (sizes and alignment: ComputeDeviceSessionLayout). Buffers with the
// same ipc_handle are registered as one region. No control block: the session makes it.
struct GpuBuffers {
  std::string device;  // the GPU's PCI bus id or UUID, as GetServerInfo lists it
  GpuBuffer logits, params, token_ids, row_status;
  GpuBuffer sampled_logprobs;  // only with DeviceSessionOptions::logprobs
  GpuBuffer token_bitmask;     // only with DeviceSessionOptions::token_bitmask
  GpuBuffer processors;        // only with DeviceSessionOptions::processors
};

// What to open.
struct DeviceSessionOptions {
  uint32_t max_batch = 0;   // M: most rows of one step, 1..Limits.max_batch
  uint32_t vocab = 0;       // V
  uint64_t row_stride = 0;  // elements between logits rows; 0 = V
  v1::DType dtype = v1::DTYPE_FP32;
  SessionPlane plane = SessionPlane::kHost;
  // Also write each row's sampled-token logprob (float32) to sampled_logprobs().
  bool logprobs = false;
  v1::LogprobSource logprob_source = v1::LOGPROB_SOURCE_RAW;
  // Logits processors (device_session.h, "Logits processors"): an allowed-token bitmask buffer
  // (int32 words [max_batch, BitmaskWords(vocab)]), and a processors buffer for the penalties
  // and the packed logit-bias and token-history lists of up to logit_bias_capacity and
  // token_history_capacity entries over all rows (PackSessionProcessors fills it). The host
  // plane starts them as "allow everything, no penalties".
  bool token_bitmask = false;
  bool processors = false;
  uint32_t logit_bias_capacity = 0;     // only with processors
  uint32_t token_history_capacity = 0;  // only with processors
  // The POSIX shm key of the session's shm object: every buffer (host plane) or the control
  // block alone (GPU plane). Empty: "/samplerd-ds-<pid>-<n>". Must start with the server's
  // --shm_prefix.
  std::string shm_key;
  // GPU plane: the engine's data buffers.
  GpuBuffers gpu;
  GpuRuntime gpu_runtime = GpuRuntime::kAuto;
  // How long Open waits for the server's answer.
  std::chrono::milliseconds open_timeout{10000};
};

// Byte offsets of the buffers in one allocation (each aligned to 256 bytes) and its size.
struct DeviceSessionLayout {
  uint64_t control = 0;  // host plane only: the GPU plane's allocation has no control block
  uint64_t logits = 0, params = 0, token_ids = 0, row_status = 0;
  uint64_t sampled_logprobs = 0;  // meaningful only with logprobs
  uint64_t token_bitmask = 0;     // meaningful only with token_bitmask
  uint64_t processors = 0;        // meaningful only with processors
  uint64_t total_bytes = 0;
};

// The layout of one allocation holding the buffers of a session with `options` (plane,
// max_batch, vocab, row_stride, dtype, logprobs, token_bitmask, processors and the two
// processor capacities): every buffer for the host plane (its shm
// object), the data buffers for the GPU plane (a GPU engine may allocate total_bytes once and
// pass base + offset for each buffer).
DeviceSessionLayout ComputeDeviceSessionLayout(const DeviceSessionOptions& options);

// One step's processors for rows [0, B), as engines name them (Client::Sample's semantics,
// samplerd/processors.h). Each vector is empty (none / off) or has B entries.
struct SessionProcessorRows {
  std::vector<TokenBias> logit_bias;
  std::vector<std::vector<int32_t>> prompt_token_ids, output_token_ids;
  std::vector<float> repetition_penalty, presence_penalty, frequency_penalty;
};

// The bytes of the processors buffer of a session opened with `options` (processors set) for
// rows [0, batch) of `rows`: penalties, then each row's bias and distinct history tokens in
// increasing order, rows after `batch` empty (device_session.h). Copy them into processors()
// before the step (memcpy on the host plane, cudaMemcpyAsync on the GPU plane). Returns
// INVALID_ARGUMENT for a vector that is neither empty nor `batch` long, a batch outside
// [0, max_batch] (0: every row empty), or lists longer than the capacities; the server checks
// the values.
grpc::Status PackSessionProcessors(const DeviceSessionOptions& options, int batch,
                                   const SessionProcessorRows& rows, std::vector<uint8_t>* out);

// Pointers to the per-row parameter arrays (device_session.h, "params"); rows [0, max_batch).
struct DeviceSessionParams {
  uint64_t* seed = nullptr;
  uint64_t* position = nullptr;
  float* temperature = nullptr;   // < 1e-5: greedy
  int32_t* top_k = nullptr;       // 0 or -1: off
  float* top_p = nullptr;         // 1: off
  float* min_p = nullptr;         // 0: off
  int32_t* top_p_mode = nullptr;  // v1::TopPMode
};

// One open device session. A thread of the session holds the gRPC stream; when the stream ends
// without Close (the server died, drained or closed it), that thread writes step_status
// ABORTED and done into the control block (plain stores: it is host memory in both planes), so
// that no pending wait (StepOnHost's, or an engine stream's after EnqueueStep) hangs. Not
// thread-safe: one step at a time.
class DeviceSession {
 public:
  // Opens a session through `client` (which must outlive Open only; the session keeps the
  // channel). Host plane: creates and registers the shm object, fills every row's parameters
  // with defaults (greedy off: temperature 1, no filters, seed 0, position 0). GPU plane:
  // registers options.gpu's buffers (the engine initialises them) and creates and registers
  // the control block's shm object. Returns OK and stores the
  // session in *session, or the server's code for the open (e.g. FAILED_PRECONDITION for a
  // plane it cannot serve), DEADLINE_EXCEEDED after options.open_timeout, INVALID_ARGUMENT
  // for options the client can check itself, RESOURCE_EXHAUSTED for a max_batch or vocab over
  // the server's limits (GetServerInfo, asked first: nothing is allocated for such options), or
  // FAILED_PRECONDITION when the options ask for processors and the server does not apply them
  // (GetServerInfo device_sessions.processors).
  static grpc::Status Open(Client* client, const DeviceSessionOptions& options,
                           std::unique_ptr<DeviceSession>* session);

  // Closes the session if still open (see Close), then frees the buffers it allocated.
  ~DeviceSession();
  DeviceSession(const DeviceSession&) = delete;
  DeviceSession& operator=(const DeviceSession&) = delete;

  // The buffers, rows [0, max_batch): host pointers (host plane) or the engine's device
  // pointers (GPU plane). logits() holds max_batch rows of row_stride elements of dtype.
  // control() is a host pointer in both planes.
  void* logits() const { return logits_; }
  DeviceSessionParams params() const { return params_; }
  int32_t* token_ids() const { return token_ids_; }
  int32_t* row_status() const { return row_status_; }
  float* sampled_logprobs() const { return sampled_logprobs_; }  // null without logprobs
  // The bitmask words [max_batch, BitmaskWords(vocab)] and the processors buffer
  // (samplerd_processors_bytes(max_batch, NB, NH) bytes); null when not opened with them.
  int32_t* token_bitmask() const { return token_bitmask_; }
  uint8_t* processors() const { return processors_; }
  samplerd_control* control() const { return control_; }

  const std::string& session_id() const { return session_id_; }
  SessionPlane plane() const { return options_.plane; }
  const DeviceSessionOptions& options() const { return options_; }

  // Host plane, from the host: rings for `batch` rows, spin-waits for the server, resets done.
  // Returns OK when token_ids() and row_status() hold rows [0, batch); INVALID_ARGUMENT for a
  // batch outside [1, max_batch] (nothing is rung); ABORTED (with the stream's final status)
  // when the session has ended, now or before. FAILED_PRECONDITION on the GPU plane.
  grpc::Status StepOnHost(int batch);

  // Enqueues one step on `stream` (a cudaStream_t / hipStream_t, or null for the default
  // stream): write batch, ring, wait for done, reset done, all on the control block's host
  // memory; every value fixed, so the sequence can be captured in a CUDA graph and replayed
  // (for the same batch). The engine enqueues its logits and params writes before it and reads
  // the outputs after it. The first call page-locks the session's shm object (host plane:
  // every buffer; GPU plane: the control block) for the GPU (cudaHostRegister, portable and
  // mapped) on the calling thread's current device. Returns an error when the GPU runtime
  // cannot be used or the session has ended. Check step_status() after the stream passes the
  // step.
  grpc::Status EnqueueStep(void* stream, int batch);

  // The control block's step_status of the last step (SAMPLERD_STEP_*), either plane.
  uint32_t step_status() const;

  // Sends close, waits for the server to end the call, unregisters the regions. Returns the
  // call's final status (OK for a clean close). Idempotent. Do not close while an enqueued step
  // is pending on a stream: the server completes it with ABORTED. Synchronize the engine's
  // stream before destroying the session, whose destructor unpins and frees the control block.
  grpc::Status Close();

  // Whether the stream is still open (not closed, not ended by the server).
  bool open() const;

 private:
  DeviceSession() = default;
  grpc::Status Start(Client* client, const DeviceSessionOptions& options);
  grpc::Status AllocateHostBuffers(Client* client);
  grpc::Status UseGpuBuffers(Client* client);
  // Creates and registers the shm object (`bytes`, zeroed) as region `name`; control_ at
  // `control_offset` in it.
  grpc::Status AllocateShm(Client* client, const std::string& name, uint64_t bytes,
                           uint64_t control_offset);
  grpc::Status OpenStream(const v1::DeviceSessionOpen& open);
  // The stream thread: reads `opened`, then waits for the end of the call.
  void Watch();
  // Completes any pending engine wait with ABORTED (control block words).
  void ReleaseWaits();
  void Unregister();
  grpc::Status EndedStatus() const;

  DeviceSessionOptions options_;
  DeviceSessionLayout layout_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::SamplerService::Stub> stub_;
  std::vector<std::string> regions_;  // registered by this session
  std::string shm_region_;            // the shm object's region
  struct GpuRegion {
    std::string name;
    std::string handle;  // the allocation's IPC handle
    uint64_t base = 0;   // the region's start from the allocation's base
  };
  std::vector<GpuRegion> gpu_regions_;  // GPU plane

  // Every buffer (host plane) or the control block alone (GPU plane).
  std::unique_ptr<HostShmBuffer> shm_;
  uint64_t control_offset_ = 0;  // of the control block in shm_
  samplerd_control* control_ = nullptr;
  void* logits_ = nullptr;
  DeviceSessionParams params_;
  int32_t* token_ids_ = nullptr;
  int32_t* row_status_ = nullptr;
  float* sampled_logprobs_ = nullptr;
  int32_t* token_bitmask_ = nullptr;
  uint8_t* processors_ = nullptr;

  // GPU side (EnqueueStep); resolved at first use.
  const void* gpu_ops_ = nullptr;  // internal::GpuStreamOps
  uint64_t control_device_address_ = 0;
  bool host_pinned_ = false;  // shm_ is registered with the GPU runtime

  // The stream, its thread and what it saw.
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::DeviceSessionRequest, v1::DeviceSessionResponse>>
      stream_;
  std::thread watcher_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  bool opened_ = false;        // the server answered `opened`
  bool ended_ = false;         // the call ended (Finish ran)
  bool close_sent_ = false;    // Close wrote close + WritesDone
  grpc::Status final_status_;  // once ended_
  std::string session_id_;
};

}  // namespace samplerd

#endif  // SAMPLERD_CLIENT_CPP_INCLUDE_SAMPLERD_DEVICE_SESSION_H_
