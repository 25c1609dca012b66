// The engine's side of a GPU-plane device session for tests: its control block in host shm
// (mapped twice, once as the engine's and once as the server's mapping), its other buffers in
// device memory, its stream, and the per-step protocol of proto/samplerd/v1/device_session.h
// played with stream memory operations; and DirectSampler, kernels::gpu::Sample on the same
// rows for reference.
//
// The engine runs in the test's own process, so its stream's wait on done is a parked wait of
// this process: while one is pending, a DeviceFree here would wait for it. The engine's and
// the reference's device memory is therefore allocated up front, and every wait is bounded by
// the watchdog in EngineSide::Finish().
#ifndef SAMPLERD_TESTS_GPU_SESSION_TEST_ENGINE_H_
#define SAMPLERD_TESTS_GPU_SESSION_TEST_ENGINE_H_

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "kernels/common/sampling_types.h"
#include "kernels/gpu/runtime.h"
#include "kernels/gpu/sample.h"
#include "proto/samplerd/v1/device_session.h"
#include "service/core/session/session_spec.h"
#include "tests/gpu/gpu_test_util.h"

namespace samplerd::core::session_testing {

namespace gpu = kernels::gpu;
using kernels::DType;
using kernels::RowParams;
using kernels::TopPMode;

// Parameters of one row as the engine writes them (device_session.h's params arrays).
struct EngineRow {
  uint64_t seed = 0;
  uint64_t position = 0;
  float temperature = 1.0f;
  int32_t top_k = 0;
  float top_p = 1.0f;
  float min_p = 0.0f;
  int32_t top_p_mode = 1;  // sampler.proto TopPMode: 0/1 TOP_K_FIRST, 2 JOINT
};

// What the server's validation accepts (service/core/validation.cc).
inline bool IsValid(const EngineRow& r) {
  return r.temperature >= 0.0f && !std::isinf(r.temperature) && r.top_k >= -1 && r.top_p > 0.0f &&
         r.top_p <= 1.0f && r.min_p >= 0.0f && r.min_p <= 1.0f && r.top_p_mode >= 0 &&
         r.top_p_mode <= 2;
}

inline RowParams ToRowParams(const EngineRow& r) {
  RowParams p;
  if (!IsValid(r)) {
    p.temperature = 0.0f;  // the reference runs invalid rows greedy; their outputs are ignored
    return p;
  }
  p.temperature = r.temperature;
  p.top_k = r.top_k;
  p.top_p = r.top_p;
  p.min_p = r.min_p;
  p.top_p_mode = r.top_p_mode == 2 ? TopPMode::kJoint : TopPMode::kTopKFirst;
  p.seed = r.seed;
  p.position = r.position;
  return p;
}

// How long an engine-side wait may take before the watchdog releases it and fails the test.
inline constexpr auto kWatchdog = std::chrono::milliseconds(5000);

// A host shm object for control blocks, mapped twice as the engine and the server each map it
// in production: the engine's mapping is page-locked (HostRegister, portable and mapped) for its
// stream memory operations; the server's mapping goes into SessionSpec::control, and the runner
// registers its pages itself. Several sessions may place their control blocks in one object
// (on one page), as engines may.
class ControlShm {
 public:
  explicit ControlShm(size_t bytes = 4096) : bytes_(bytes) {
    fd_ = memfd_create("samplerd-session-gpu-test", 0);
    EXPECT_GE(fd_, 0) << "memfd_create";
    EXPECT_EQ(ftruncate(fd_, static_cast<off_t>(bytes)), 0);
    engine_ = Map();
    server_ = Map();
    if (engine_ == nullptr || server_ == nullptr) return;
    std::memset(engine_, 0, bytes);
    const int code = gpu::HostRegister(engine_, bytes);
    EXPECT_EQ(code, 0) << "engine HostRegister: " << gpu::ErrorString(code);
    registered_ = code == 0;
    void* device = nullptr;
    EXPECT_EQ(gpu::HostGetDevicePointer(&device, engine_), 0);
    engine_device_ = static_cast<uint8_t*>(device);
  }
  ControlShm(const ControlShm&) = delete;
  ControlShm& operator=(const ControlShm&) = delete;

  ~ControlShm() {
    if (registered_) gpu::HostUnregister(engine_);
    if (engine_ != nullptr) munmap(engine_, bytes_);
    if (server_ != nullptr) munmap(server_, bytes_);
    if (fd_ >= 0) close(fd_);
  }

  uint8_t* engine(size_t offset) const { return engine_ + offset; }
  uint8_t* engine_device(size_t offset) const { return engine_device_ + offset; }
  uint8_t* server(size_t offset) const { return server_ + offset; }

 private:
  uint8_t* Map() const {
    void* p = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
    EXPECT_NE(p, MAP_FAILED) << "mmap";
    return p == MAP_FAILED ? nullptr : static_cast<uint8_t*>(p);
  }

  size_t bytes_;
  int fd_ = -1;
  uint8_t* engine_ = nullptr;
  uint8_t* server_ = nullptr;
  uint8_t* engine_device_ = nullptr;
  bool registered_ = false;
};

// The engine: its control block in host shm (ControlShm; its own, or a slice of a shared one),
// its other buffers in device memory, and its stream.
class EngineSide {
 public:
  EngineSide(uint32_t max_batch, int64_t vocab, int64_t stride, DType dtype, bool logprobs,
             ControlShm* shared = nullptr, size_t control_offset = 0)
      : max_batch_(max_batch), vocab_(vocab), stride_(stride), dtype_(dtype) {
    if (shared == nullptr) {
      owned_shm_ = std::make_unique<ControlShm>();
      shared = owned_shm_.get();
      control_offset = 0;
    }
    host_control_ = shared->engine(control_offset);
    device_control_ = shared->engine_device(control_offset);
    server_control_ = shared->server(control_offset);
    std::memset(host_control_, 0, SAMPLERD_CONTROL_BYTES);
    elem_ = kernels::DTypeSize(dtype);
    Alloc(&logits_, static_cast<size_t>(max_batch) * stride * elem_);
    Alloc(&params_, samplerd_params_bytes(max_batch));
    Alloc(&tokens_, max_batch * 4u);
    Alloc(&status_, max_batch * 4u);
    if (logprobs) Alloc(&logprobs_, max_batch * 4u);
    // Pinned host staging: a copy from or to pageable memory may block the host until the
    // stream reaches it, which here may be behind a wait on done.
    EXPECT_EQ(gpu::PinnedMalloc(&pinned_, PinnedBytes()), 0);
    EXPECT_EQ(gpu::StreamCreate(&stream_), 0);
    EXPECT_EQ(gpu::EventCreate(&event_, false), 0);
    EXPECT_EQ(gpu::EventCreate(&t0_, false), 0);
    EXPECT_EQ(gpu::EventCreate(&t1_, false), 0);
    std::memset(pinned_, 0, PinnedBytes());
    int32_t* fill = reinterpret_cast<int32_t*>(InLogits());
    for (uint32_t i = 0; i < max_batch; ++i) fill[i] = 777;
    EXPECT_EQ(gpu::CopyToDevice(tokens_, fill, max_batch * 4u, stream_), 0);
    EXPECT_EQ(gpu::CopyToDevice(status_, fill, max_batch * 4u, stream_), 0);
    EXPECT_TRUE(Finish());
  }

  ~EngineSide() {
    // A wait on done still pending (a test stopped early): release it before anything below
    // synchronizes the device.
    if (waiting_) (void)Finish();
    for (void* p : allocations_) gpu::DeviceFree(p);
    gpu::PinnedFree(pinned_);
    gpu::EventDestroy(event_);
    gpu::EventDestroy(t0_);
    gpu::EventDestroy(t1_);
    gpu::StreamDestroy(stream_);
  }

  SessionSpec Spec(const std::string& id) const {
    SessionSpec spec;
    spec.id = id;
    spec.plane = SessionPlane::kGpu;
    spec.device_ordinal = 0;
    spec.dtype = dtype_;
    spec.max_batch = max_batch_;
    spec.vocab = static_cast<uint32_t>(vocab_);
    spec.row_stride = static_cast<uint64_t>(stride_);
    spec.logprob_source = kernels::LogprobSource::kRaw;
    spec.control = server_control_;  // the server's own mapping of the control block
    spec.logits = logits_;
    spec.params = static_cast<const uint8_t*>(params_);
    spec.token_ids = static_cast<int32_t*>(tokens_);
    spec.row_status = static_cast<int32_t*>(status_);
    spec.sampled_logprobs = static_cast<float*>(logprobs_);
    return spec;
  }

  // Step 1 of the protocol: logits rows [0, B) (bytes of B rows at the stride) and params.
  void WriteInputs(const std::vector<uint8_t>& logits, const std::vector<EngineRow>& rows) {
    if (!logits.empty()) {
      std::memcpy(InLogits(), logits.data(), logits.size());
      EXPECT_EQ(gpu::CopyToDevice(logits_, InLogits(), logits.size(), stream_), 0);
    }
    std::memset(InParams(), 0, samplerd_params_bytes(max_batch_));
    const uint32_t m = max_batch_;
    for (size_t i = 0; i < rows.size(); ++i) {
      Put(samplerd_params_seed_offset(m) + 8 * i, rows[i].seed);
      Put(samplerd_params_position_offset(m) + 8 * i, rows[i].position);
      Put(samplerd_params_temperature_offset(m) + 4 * i, rows[i].temperature);
      Put(samplerd_params_top_k_offset(m) + 4 * i, rows[i].top_k);
      Put(samplerd_params_top_p_offset(m) + 4 * i, rows[i].top_p);
      Put(samplerd_params_min_p_offset(m) + 4 * i, rows[i].min_p);
      Put(samplerd_params_top_p_mode_offset(m) + 4 * i, rows[i].top_p_mode);
    }
    EXPECT_EQ(gpu::CopyToDevice(params_, InParams(), samplerd_params_bytes(max_batch_), stream_),
              0);
  }

  // Steps 1 (batch) and 2 of the protocol, as stream writes to the control block's registered
  // host memory; `timed` records t0 before the ring.
  void Ring(uint32_t batch, bool timed = false) {
    EXPECT_EQ(gpu::StreamWriteValue32(stream_, Word(SAMPLERD_CONTROL_BATCH), batch), 0);
    if (timed) {
      EXPECT_EQ(gpu::EventRecord(t0_, stream_), 0);
    }
    EXPECT_EQ(gpu::StreamWriteValue32(stream_, Word(SAMPLERD_CONTROL_DOORBELL), SAMPLERD_RING), 0);
  }

  // Steps 3-5: the stream waits for done, resets it and reads the outputs back (Finish() then
  // fills the host vectors). Every WaitDone must be followed by a Finish().
  void WaitDone(bool timed = false) {
    EXPECT_EQ(gpu::StreamWaitValue32(stream_, Word(SAMPLERD_CONTROL_DONE), SAMPLERD_DONE), 0);
    waiting_ = true;
    if (timed) {
      EXPECT_EQ(gpu::EventRecord(t1_, stream_), 0);
    }
    EXPECT_EQ(gpu::StreamWriteValue32(stream_, Word(SAMPLERD_CONTROL_DONE), 0), 0);
    EXPECT_EQ(gpu::CopyToHost(OutTokens(), tokens_, max_batch_ * 4u, stream_), 0);
    EXPECT_EQ(gpu::CopyToHost(OutStatus(), status_, max_batch_ * 4u, stream_), 0);
    if (logprobs_ != nullptr) {
      EXPECT_EQ(gpu::CopyToHost(OutLogprobs(), logprobs_, max_batch_ * 4u, stream_), 0);
    }
  }

  // Waits (polling, up to `limit`) until the engine stream's work so far has run, then fills
  // the host vectors; true when it did. The watchdog: when the stream's wait on done is not
  // released within `limit`, fails the test, writes done = DONE itself from the host and waits
  // up to kWatchdog more, so that a server bug cannot leave this process hanging.
  bool Finish(std::chrono::milliseconds limit = kWatchdog) {
    if (gpu::EventRecord(event_, stream_) != 0) {
      ADD_FAILURE() << "engine stream: recording an event failed";
      return false;
    }
    if (Poll(limit)) {
      waiting_ = false;
      Collect();
      return true;
    }
    if (waiting_) {
      ADD_FAILURE() << "watchdog: the engine's wait on done was not released within "
                    << limit.count() << " ms; releasing it from the host";
      __atomic_store_n(reinterpret_cast<uint32_t*>(host_control_ + SAMPLERD_CONTROL_DONE),
                       SAMPLERD_DONE, __ATOMIC_SEQ_CST);
      const bool released = Poll(kWatchdog);
      EXPECT_TRUE(released) << "watchdog: the engine stream did not finish after the release";
      if (released) waiting_ = false;
    } else {
      ADD_FAILURE() << "engine stream: its work did not finish within " << limit.count() << " ms";
    }
    return false;
  }

  float LastStepMs() {
    float ms = -1.0f;
    EXPECT_EQ(gpu::EventElapsedMs(&ms, t0_, t1_), 0);
    return ms;
  }

  // A control word as Finish() last read it.
  uint32_t ControlWord(uint32_t offset) const { return control[offset / 4]; }
  // A control word as it is now (the engine's mapping).
  uint32_t LiveControlWord(uint32_t offset) const {
    return __atomic_load_n(reinterpret_cast<const uint32_t*>(host_control_ + offset),
                           __ATOMIC_ACQUIRE);
  }

  std::vector<int32_t> tokens, status;
  std::vector<float> logprobs;
  std::vector<uint32_t> control;

 private:
  // Polls the engine's event for up to `limit`; true when its work completed.
  bool Poll(std::chrono::milliseconds limit) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (true) {
      const int code = gpu::EventQuery(event_);
      if (code == 0) return true;
      if (!gpu::IsNotReady(code)) {
        ADD_FAILURE() << "engine stream: " << gpu::ErrorString(code);
        return false;
      }
      if (std::chrono::steady_clock::now() >= deadline) return false;
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }

  void Collect() {
    tokens.assign(OutTokens(), OutTokens() + max_batch_);
    status.assign(OutStatus(), OutStatus() + max_batch_);
    logprobs.assign(OutLogprobs(), OutLogprobs() + max_batch_);
    control.resize(SAMPLERD_CONTROL_BYTES / 4);
    for (size_t i = 0; i < control.size(); ++i) control[i] = LiveControlWord(4 * i);
  }

  void Alloc(void** p, size_t bytes) {
    ASSERT_EQ(gpu::DeviceMalloc(p, bytes), 0);
    allocations_.push_back(*p);
  }
  void* Word(uint32_t offset) const { return device_control_ + offset; }
  template <class T>
  void Put(uint64_t offset, T v) {
    std::memcpy(InParams() + offset, &v, sizeof(v));
  }
  // The pinned staging area: inputs (logits, params), then outputs.
  size_t LogitsBytes() const { return static_cast<size_t>(max_batch_) * stride_ * elem_; }
  size_t PinnedBytes() const {
    return LogitsBytes() + samplerd_params_bytes(max_batch_) + 3 * max_batch_ * 4u + 64;
  }
  uint8_t* InLogits() const { return static_cast<uint8_t*>(pinned_); }
  uint8_t* InParams() const { return InLogits() + LogitsBytes(); }
  int32_t* OutTokens() const {
    return reinterpret_cast<int32_t*>(InParams() + samplerd_params_bytes(max_batch_));
  }
  int32_t* OutStatus() const { return OutTokens() + max_batch_; }
  float* OutLogprobs() const { return reinterpret_cast<float*>(OutStatus() + max_batch_); }

  uint32_t max_batch_;
  int64_t vocab_, stride_;
  DType dtype_;
  int64_t elem_;
  std::unique_ptr<ControlShm> owned_shm_;
  uint8_t* host_control_ = nullptr;    // the engine's mapping
  uint8_t* device_control_ = nullptr;  // its device address (the engine's registration)
  uint8_t* server_control_ = nullptr;  // the server's mapping of the same bytes
  void *logits_ = nullptr, *params_ = nullptr, *tokens_ = nullptr, *status_ = nullptr,
       *logprobs_ = nullptr;
  std::vector<void*> allocations_;
  void* pinned_ = nullptr;
  gpu::Stream stream_ = nullptr;
  gpu::Event event_ = nullptr, t0_ = nullptr, t1_ = nullptr;
  bool waiting_ = false;  // a WaitDone not yet seen through by Finish()
};

// kernels::gpu::Sample run directly, on its own stream and buffers (sized for max_batch rows),
// with the session's output layout: tokens, row status and the sampled logprob.
class DirectSampler {
 public:
  DirectSampler(uint32_t max_batch, int64_t vocab, int64_t stride, DType dtype)
      : max_batch_(max_batch) {
    const size_t logits = static_cast<size_t>(max_batch) * stride * kernels::DTypeSize(dtype);
    workspace_bytes_ = gpu::SampleWorkspaceBytes(max_batch, vocab, 0);
    EXPECT_EQ(gpu::StreamCreate(&stream_), 0);
    const size_t m = max_batch;
    const std::pair<void**, size_t> buffers[] = {{&logits_, logits},
                                                 {&params_, m * sizeof(RowParams)},
                                                 {&tokens_, m * 4},
                                                 {&status_, m},
                                                 {&logprobs_, m * 4},
                                                 {&rank_, m * 8},
                                                 {&workspace_, workspace_bytes_}};
    for (const auto& [ptr, bytes] : buffers) EXPECT_EQ(gpu::DeviceMalloc(ptr, bytes), 0);
    EXPECT_EQ(gpu::ZeroDevice(workspace_, workspace_bytes_, stream_), 0);  // sample.h asks it
    EXPECT_EQ(gpu::PinnedMalloc(&pinned_, logits + max_batch * (sizeof(RowParams) + 32)), 0);
  }

  ~DirectSampler() {
    for (void* p : {logits_, params_, tokens_, status_, logprobs_, rank_, workspace_}) {
      gpu::DeviceFree(p);
    }
    gpu::PinnedFree(pinned_);
    gpu::StreamDestroy(stream_);
  }

  // Samples `b` (b.batch <= max_batch; sampled logprobs when b.top_logprobs >= 0).
  kernels::testing::Outputs Run(const kernels::testing::Batch& b) {
    kernels::testing::Outputs out;
    EXPECT_LE(b.batch, static_cast<int64_t>(max_batch_));
    uint8_t* staged = static_cast<uint8_t*>(pinned_);
    std::memcpy(staged, b.bytes.data(), b.bytes.size());
    uint8_t* params = staged + b.bytes.size();
    std::memcpy(params, b.params.data(), b.params.size() * sizeof(RowParams));
    uint8_t* results = params + max_batch_ * sizeof(RowParams);
    EXPECT_EQ(gpu::CopyToDevice(logits_, staged, b.bytes.size(), stream_), 0);
    EXPECT_EQ(gpu::CopyToDevice(params_, params, b.params.size() * sizeof(RowParams), stream_), 0);
    kernels::SampleArgs a;
    a.logits = logits_;
    a.dtype = b.dtype;
    a.batch = b.batch;
    a.vocab = b.vocab;
    a.row_stride = b.row_stride == 0 ? b.vocab : b.row_stride;
    a.params = static_cast<const RowParams*>(params_);
    a.params_count = b.batch;
    a.top_logprobs = b.top_logprobs >= 0 ? 0 : -1;
    a.logprob_source = b.source;
    a.token_ids = static_cast<int32_t*>(tokens_);
    a.status = static_cast<kernels::RowStatus*>(status_);
    a.sampled_logprob = static_cast<float*>(logprobs_);
    a.sampled_rank = static_cast<int64_t*>(rank_);
    const int code = gpu::Sample(a, workspace_, workspace_bytes_, stream_);
    EXPECT_EQ(code, 0) << gpu::ErrorString(code);
    const size_t n = static_cast<size_t>(b.batch);
    EXPECT_EQ(gpu::CopyToHost(results, tokens_, n * 4, stream_), 0);
    EXPECT_EQ(gpu::CopyToHost(results + 4 * n, logprobs_, n * 4, stream_), 0);
    EXPECT_EQ(gpu::CopyToHost(results + 8 * n, status_, n, stream_), 0);
    const int sync = gpu::StreamSynchronize(stream_);
    EXPECT_EQ(sync, 0) << gpu::ErrorString(sync);
    out.tokens.resize(n);
    out.sampled_logprob.resize(n);
    out.status.resize(n);
    std::memcpy(out.tokens.data(), results, n * 4);
    std::memcpy(out.sampled_logprob.data(), results + 4 * n, n * 4);
    std::memcpy(out.status.data(), results + 8 * n, n);
    return out;
  }

 private:
  uint32_t max_batch_;
  size_t workspace_bytes_ = 0;
  gpu::Stream stream_ = nullptr;
  void *logits_ = nullptr, *params_ = nullptr, *tokens_ = nullptr, *status_ = nullptr,
       *logprobs_ = nullptr, *rank_ = nullptr, *workspace_ = nullptr, *pinned_ = nullptr;
};

}  // namespace samplerd::core::session_testing

#endif  // SAMPLERD_TESTS_GPU_SESSION_TEST_ENGINE_H_
