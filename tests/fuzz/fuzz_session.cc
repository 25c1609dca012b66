// Fuzz target: a DeviceSession call, message by message, through the real DeviceSessionReactor
// and a SessionManager of its own (per input) on the CPU backend: the host plane, on the core's
// host shm regions "ctl", "buf" and "r" (fuzz_util.h). No network: a fake gRPC stream
// (SessionStream) hands the reactor each message when it asks to read, completes (or fails) its
// writes, and records how the call finishes; every wait on the reactor is bounded.
//
// Input: a flags byte, then messages, each a 2-byte little-endian length and that many bytes;
// the input's end is the client's half-close. Flags:
//   bit 0     regions allowed from this peer (the fake call's peer is not a unix socket, so
//             without it the call must end PERMISSION_DENIED at once);
//   bit 1     once `opened` is written, ring one step (batch 1) through the control block and
//             wait for its `done` (bounded), as an engine would;
//   bit 2     every write fails (the client is gone);
//   bits 3-4  drain: the manager's CloseAll() just before the reactor's read number 1 to 3 is
//             answered (0: never);
//   bit 5     the manager allows no sessions (max_sessions 0);
//   bit 6     the rung step's row 0 gets valid parameters (top-k 3, top-p 0.9, joint, T 0.7);
//             otherwise they are whatever the params buffer holds (often invalid).
//
// Findings besides crashes and sanitizer reports (device_session_reactor.h, sampler.proto's
// DeviceSession, SessionManager::Open): a call that does not finish exactly once, or hangs; a
// read or write after Finish, a Finish with a write pending, a read after the half-close; an
// error without a message or with a code the call does not document; a bad shape or enum in
// the open that does not get its exact code (the order of SessionManager's checks); a
// GPU-plane open that is not FAILED_PRECONDITION; anything but INVALID_ARGUMENT for a first
// message that does not parse or is not `open`, or for a second message that does not parse,
// is a second `open` or is empty; `opened` that is not the host plane; `closed` missing after
// `close` or the half-close, or present after an error; `closed.steps` other than the steps
// rung; a drain that does not end the call UNAVAILABLE; a session left open after its call; a
// rung step without `done`, with a token and row status that disagree; regions that a session
// should unregister on its end left registered, or ones it should keep gone.
#include <fcntl.h>
#include <google/protobuf/stubs/logging.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "proto/samplerd/v1/device_session.h"
#include "samplerd/v1/sampler.pb.h"
#include "service/core/session/session_manager.h"
#include "service/grpc/device_session_reactor.h"
#include "service/grpc/raw_message.h"
#include "tests/fuzz/fuzz_util.h"

namespace samplerd::fuzz {
namespace {

using absl::StatusCode;

// How long the fake stream waits for the reactor's next operation, and an engine for a rung
// step's `done`, before calling it a hang. The reactor acts at once (SessionManager::Close is
// bounded at ~100 ms), the host plane's poller within a sleep of 50 us.
constexpr auto kPatience = std::chrono::seconds(2);

// The input's flags byte.
struct Flags {
  explicit Flags(uint8_t b)
      : allow_remote_regions(b & 1),
        ring(b & 2),
        writes_fail(b & 4),
        drain_at((b >> 3) & 3),
        no_sessions(b & 32),
        valid_params(b & 64) {}
  bool allow_remote_regions;
  bool ring;
  bool writes_fail;
  int drain_at;  // 1-based read number; 0: no drain
  bool no_sessions;
  bool valid_params;
};

// The regions a session may name, each all of one shm object (fuzz_util.cc's Core()).
constexpr const char* kRegions[] = {"ctl", "buf", "r"};
constexpr size_t kRegionObject[] = {0, 1, 2};

// The fuzzer's own writable mapping of the object behind region i (an engine's view).
uint8_t* Mapping(size_t i) {
  static uint8_t* maps[3] = {};
  if (maps[i] == nullptr) {
    const size_t object = kRegionObject[i];
    const int fd = shm_open(ObjectKey(object).c_str(), O_RDWR, 0);
    Check(fd >= 0, "cannot open a shm object");
    void* p = mmap(nullptr, ObjectSizes()[object], PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    Check(p != MAP_FAILED, "cannot map a shm object");
    maps[i] = static_cast<uint8_t*>(p);
  }
  return maps[i];
}

// The engine's address of `bytes` bytes at `slice`, or null when they are not in a known region.
uint8_t* Engine(const v1::RegionSlice& slice, uint64_t bytes) {
  for (size_t i = 0; i < 3; ++i) {
    if (slice.region() != kRegions[i]) continue;
    const uint64_t size = ObjectSizes()[kRegionObject[i]];
    if (slice.offset() > size || bytes > size - slice.offset()) return nullptr;
    return Mapping(i) + slice.offset();
  }
  return nullptr;
}

// Puts the three regions back when a session unregistered them on its end.
void RestoreRegions() {
  for (size_t i = 0; i < 3; ++i) {
    const size_t object = kRegionObject[i];
    absl::StatusOr<core::RegionInfo> info =
        Core().regions().RegisterHostShm(kRegions[i], ObjectKey(object), 0, ObjectSizes()[object]);
    Check(info.ok() || info.status().code() == StatusCode::kAlreadyExists, "cannot restore");
  }
}

bool Registered(const std::string& name) {
  for (const core::RegionInfo& info : Core().regions().List()) {
    if (info.name == name) return true;
  }
  return false;
}

// Parses `bytes` as the reactor does (ParseMessage); false when they do not parse.
bool Parse(const std::string& bytes, google::protobuf::MessageLite* message) {
  grpc::ByteBuffer buffer = BufferOf(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  return grpc_transport::ParseMessage(&buffer, message).ok();
}

// What happened on the call.
struct Transcript {
  int reads = 0;                                     // reads the reactor started
  std::vector<v1::DeviceSessionResponse> responses;  // what it wrote, in order
  grpc::Status status;
};

// The server side of one DeviceSession call, driven by Run().
class SessionStream final
    : public grpc::ServerCallbackReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  // Run calls these on its own thread, holding no lock.
  struct Hooks {
    std::function<void(int n)> before_read;  // before the read number n (1-based) is answered
    std::function<void()> on_opened;         // after `opened` is written
  };

  explicit SessionStream(grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* reactor)
      : reactor_(reactor) {
    BindReactor(reactor);  // plays what the reactor's constructor started (a read, a Finish)
  }

  void Finish(grpc::Status s) override {
    std::lock_guard<std::mutex> lock(mu_);
    Check(!finished_, "Finish called twice");
    Check(write_ == nullptr, "Finish with a write pending");
    finished_ = true;
    status_ = std::move(s);
    cv_.notify_all();
  }
  void SendInitialMetadata() override {}
  void Read(grpc::ByteBuffer* msg) override {
    std::lock_guard<std::mutex> lock(mu_);
    Check(read_ == nullptr, "a read started while one is pending");
    Check(!finished_, "a read started after Finish");
    read_ = msg;
    ++reads_;
    cv_.notify_all();
  }
  void Write(const grpc::ByteBuffer* msg, grpc::WriteOptions options) override {
    std::lock_guard<std::mutex> lock(mu_);
    Check(write_ == nullptr, "a write started while one is pending");
    Check(!finished_, "a write started after Finish");
    write_ = msg;
    cv_.notify_all();
  }
  void WriteAndFinish(const grpc::ByteBuffer* msg, grpc::WriteOptions options,
                      grpc::Status s) override {
    Fail("WriteAndFinish is not used by the reactor");
  }

  // Plays `messages`, then the half-close, until the call has finished and nothing is pending;
  // then OnDone (which deletes the reactor).
  Transcript Run(const std::vector<std::string>& messages, bool writes_fail, const Hooks& hooks) {
    Transcript t;
    size_t next = 0;
    bool half_closed = false;
    for (;;) {
      std::unique_lock<std::mutex> lock(mu_);
      if (!cv_.wait_for(lock, kPatience,
                        [&] { return finished_ || write_ != nullptr || read_ != nullptr; })) {
        Fail("the call neither finished nor started a read or write for 2 s");
      }
      if (write_ != nullptr) {
        grpc::ByteBuffer copy(*write_);
        write_ = nullptr;
        lock.unlock();
        t.responses.emplace_back();
        Check(grpc_transport::ParseMessage(&copy, &t.responses.back()).ok(),
              "a response that does not parse");
        if (t.responses.back().has_opened() && hooks.on_opened) hooks.on_opened();
        reactor_->OnWriteDone(!writes_fail);
      } else if (read_ != nullptr) {
        grpc::ByteBuffer* read = read_;
        read_ = nullptr;
        const int n = reads_;
        lock.unlock();
        Check(!half_closed, "a read after the half-close");
        if (hooks.before_read) hooks.before_read(n);
        bool finished;
        {
          std::lock_guard<std::mutex> relock(mu_);
          finished = finished_;
        }
        if (finished) {
          reactor_->OnReadDone(false);  // gRPC fails a read pending at Finish
        } else if (next < messages.size()) {
          const std::string& m = messages[next++];
          *read = BufferOf(reinterpret_cast<const uint8_t*>(m.data()), m.size());
          reactor_->OnReadDone(true);
        } else {
          half_closed = true;
          reactor_->OnReadDone(false);
        }
      } else {
        break;  // finished, nothing pending
      }
    }
    reactor_->OnDone();
    t.reads = reads_;
    t.status = status_;
    return t;
  }

 private:
  grpc::internal::ServerReactor* reactor() override { return reactor_; }
  void CallOnDone() override {}

  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* const reactor_;
  std::mutex mu_;
  std::condition_variable cv_;
  grpc::ByteBuffer* read_ = nullptr;
  const grpc::ByteBuffer* write_ = nullptr;
  int reads_ = 0;
  bool finished_ = false;
  grpc::Status status_;
};

// The code of the first bad shape, enum or missing buffer in `open`, in SessionManager::Prepare's
// order (session_manager.cc); nullopt when they pass (the buffers then decide).
std::optional<StatusCode> ShapeError(const v1::DeviceSessionOpen& open) {
  const int64_t max_batch = Core().limits().max_batch;
  const int64_t max_vocab = Core().limits().max_vocab;
  if (open.dtype() < 1 || open.dtype() > 3) return StatusCode::kInvalidArgument;
  if (open.max_batch() < 1 || open.vocab() < 1) return StatusCode::kInvalidArgument;
  if (open.max_batch() > max_batch || open.vocab() > max_vocab) {
    return StatusCode::kResourceExhausted;
  }
  const uint64_t stride = open.row_stride() == 0 ? open.vocab() : open.row_stride();
  if (stride < open.vocab() || stride > static_cast<uint64_t>(max_vocab) * 16) {
    return StatusCode::kInvalidArgument;
  }
  if (open.logprob_source() < 0 || open.logprob_source() > 2) return StatusCode::kInvalidArgument;
  if (open.plane() < 0 || open.plane() > 2) return StatusCode::kInvalidArgument;
  // Processor capacities: none without a processors buffer, at most M * V entries.
  const uint64_t max_entries = uint64_t{open.max_batch()} * open.vocab();
  for (const uint32_t capacity : {open.logit_bias_capacity(), open.token_history_capacity()}) {
    if (capacity != 0 && open.processors().region().empty()) return StatusCode::kInvalidArgument;
    if (capacity > max_entries) return StatusCode::kInvalidArgument;
  }
  if (uint64_t{open.logit_bias_capacity()} + open.token_history_capacity() > INT32_MAX) {
    return StatusCode::kInvalidArgument;
  }
  if (open.plane() == v1::DEVICE_PLANE_GPU) return StatusCode::kFailedPrecondition;  // CPU server
  for (const v1::RegionSlice* s :
       {&open.control(), &open.logits(), &open.params(), &open.token_ids(), &open.row_status()}) {
    if (s->region().empty()) return StatusCode::kInvalidArgument;
  }
  return std::nullopt;
}

// Writes valid sampling parameters for row 0 into the session's params buffer, and valid
// processors for it (no penalties, empty lists) when the session has a processors buffer.
void WriteValidParams(const v1::DeviceSessionOpen& open) {
  const uint32_t m = open.max_batch();
  uint8_t* params = Engine(open.params(), samplerd_params_bytes(m));
  Check(params != nullptr, "an opened session's params are outside their region");
  const uint64_t seed = 7, position = 1;
  const float temperature = 0.7f, top_p = 0.9f, min_p = 0.0f;
  const int32_t top_k = 3, top_p_mode = 2;  // TOP_P_MODE_JOINT
  std::memcpy(params + samplerd_params_seed_offset(m), &seed, 8);
  std::memcpy(params + samplerd_params_position_offset(m), &position, 8);
  std::memcpy(params + samplerd_params_temperature_offset(m), &temperature, 4);
  std::memcpy(params + samplerd_params_top_k_offset(m), &top_k, 4);
  std::memcpy(params + samplerd_params_top_p_offset(m), &top_p, 4);
  std::memcpy(params + samplerd_params_min_p_offset(m), &min_p, 4);
  std::memcpy(params + samplerd_params_top_p_mode_offset(m), &top_p_mode, 4);
  if (open.processors().region().empty()) return;
  uint8_t* procs = Engine(
      open.processors(),
      samplerd_processors_bytes(m, open.logit_bias_capacity(), open.token_history_capacity()));
  Check(procs != nullptr, "an opened session's processors are outside their region");
  const float repetition = 1.0f, zero = 0.0f;
  const uint32_t offsets[2] = {0, 0};
  std::memcpy(procs + samplerd_processors_repetition_offset(m), &repetition, 4);
  std::memcpy(procs + samplerd_processors_presence_offset(m), &zero, 4);
  std::memcpy(procs + samplerd_processors_frequency_offset(m), &zero, 4);
  std::memcpy(procs + samplerd_processors_bias_offsets_offset(m), offsets, 8);
  std::memcpy(procs + samplerd_processors_history_offsets_offset(m, open.logit_bias_capacity()),
              offsets, 8);
}

// As an engine: rings one step of batch 1 on the opened session and checks its outputs (with
// `valid_params`, row 0's parameters are valid, so it is not INVALID_PARAMS).
void RingOneStep(const v1::DeviceSessionOpen& open, bool valid_params) {
  if (valid_params) WriteValidParams(open);
  uint8_t* control = Engine(open.control(), SAMPLERD_CONTROL_BYTES);
  Check(control != nullptr, "an opened session's control block is outside its region");
  auto word = [&](uint32_t offset) { return reinterpret_cast<uint32_t*>(control + offset); };
  __atomic_store_n(word(SAMPLERD_CONTROL_BATCH), 1u, __ATOMIC_RELAXED);
  __atomic_store_n(word(SAMPLERD_CONTROL_DONE), 0u, __ATOMIC_RELAXED);
  __atomic_store_n(word(SAMPLERD_CONTROL_DOORBELL), SAMPLERD_RING, __ATOMIC_RELEASE);
  const auto deadline = std::chrono::steady_clock::now() + kPatience;
  while (__atomic_load_n(word(SAMPLERD_CONTROL_DONE), __ATOMIC_ACQUIRE) != SAMPLERD_DONE) {
    Check(std::chrono::steady_clock::now() < deadline, "a rung step got no done for 2 s");
    std::this_thread::sleep_for(std::chrono::microseconds(10));
  }
  __atomic_store_n(word(SAMPLERD_CONTROL_DONE), 0u, __ATOMIC_RELAXED);
  const uint32_t step_status =
      __atomic_load_n(word(SAMPLERD_CONTROL_STEP_STATUS), __ATOMIC_RELAXED);
  Check(step_status == SAMPLERD_STEP_OK, absl::StrCat("a step of batch 1 ended ", step_status));

  const uint8_t* token_at = Engine(open.token_ids(), 4);
  const uint8_t* status_at = Engine(open.row_status(), 4);
  Check(token_at != nullptr && status_at != nullptr, "an opened session's outputs are elsewhere");
  int32_t token, status;
  std::memcpy(&token, token_at, 4);
  std::memcpy(&status, status_at, 4);
  Trace(absl::StrCat("step: token ", token, ", row status ", status), absl::OkStatus());
  // NO_ALLOWED only with a bitmask or processors (whose bytes the fuzzer left as they were).
  const bool processors =
      !open.token_bitmask().region().empty() || !open.processors().region().empty();
  Check(status >= SAMPLERD_ROW_OK &&
            status <= (processors ? SAMPLERD_ROW_INVALID_NO_ALLOWED : SAMPLERD_ROW_INVALID_PARAMS),
        absl::StrCat("row status ", status));
  Check(!valid_params || status != SAMPLERD_ROW_INVALID_PARAMS, "valid parameters refused");
  Check(status == SAMPLERD_ROW_OK ? token >= 0 && static_cast<uint32_t>(token) < open.vocab()
                                  : token == -1,
        absl::StrCat("token ", token, " with row status ", status, ", V = ", open.vocab()));
  if (!open.sampled_logprobs().region().empty()) {
    const uint8_t* logprob_at = Engine(open.sampled_logprobs(), 4);
    Check(logprob_at != nullptr, "an opened session's logprobs are elsewhere");
    float logprob;
    std::memcpy(&logprob, logprob_at, 4);
    Check(status == SAMPLERD_ROW_OK ? logprob <= 0.0f  // false for NaN
                                    : logprob == -std::numeric_limits<float>::infinity(),
          absl::StrCat("sampled logprob ", logprob, " with row status ", status));
  }
}

void CheckCall(const Flags& flags, const std::vector<std::string>& messages, const Transcript& t) {
  const grpc::StatusCode code = t.status.error_code();
  const absl::Status status(static_cast<StatusCode>(code), t.status.error_message());
  Trace(absl::StrCat("call (", t.reads, " reads, ", t.responses.size(), " responses)"), status);
  CheckError(status,
             {StatusCode::kInvalidArgument, StatusCode::kResourceExhausted, StatusCode::kNotFound,
              StatusCode::kOutOfRange, StatusCode::kFailedPrecondition, StatusCode::kAlreadyExists,
              StatusCode::kUnavailable, StatusCode::kPermissionDenied},
             "the call");
  auto expect = [&](grpc::StatusCode want, absl::string_view why) {
    Check(code == want, absl::StrCat(why, ": expected code ", want, ", got ", status.ToString()));
  };
  if (!flags.allow_remote_regions) {
    expect(grpc::StatusCode::PERMISSION_DENIED, "a peer that may not name regions");
    Check(t.reads == 0 && t.responses.empty(), "a denied call read or wrote");
    return;
  }
  v1::DeviceSessionRequest first;
  if (messages.empty() || !Parse(messages[0], &first) || !first.has_open()) {
    expect(grpc::StatusCode::INVALID_ARGUMENT, "a first message that is not open");
    Check(t.reads == 1 && t.responses.empty(), "read or wrote after a bad first message");
    return;
  }
  const v1::DeviceSessionOpen& open = first.open();
  if (t.responses.empty()) {  // the open failed
    Check(t.reads == 1, "read again after a failed open");
    Check(code != grpc::StatusCode::OK && code != grpc::StatusCode::PERMISSION_DENIED,
          "an open that was answered by nothing");
    if (flags.drain_at == 1) {
      expect(grpc::StatusCode::UNAVAILABLE, "an open after the drain");
    } else if (const std::optional<StatusCode> shape = ShapeError(open)) {
      expect(static_cast<grpc::StatusCode>(*shape), "a bad shape, enum or missing buffer");
    } else {
      Check(code != grpc::StatusCode::UNAVAILABLE, "UNAVAILABLE without a drain");
    }
    for (const char* name : kRegions) {
      Check(Registered(name), "a session that never opened unregistered its regions");
    }
    return;
  }

  const v1::DeviceSessionResponse& r = t.responses[0];
  Check(flags.drain_at != 1, "opened after the drain");
  Check(!ShapeError(open).has_value(), "opened with a bad shape, enum or missing buffer");
  Check(!flags.no_sessions, "opened with max_sessions 0");
  Check(r.has_opened() && !r.opened().session_id().empty() &&
            r.opened().plane() == v1::DEVICE_PLANE_HOST && r.opened().device().empty(),
        "the first response is not opened on the host plane");
  Check(t.reads == 2, absl::StrCat("an opened session read ", t.reads, " messages, not 2"));
  v1::DeviceSessionRequest second;
  const bool parses = messages.size() < 2 || Parse(messages[1], &second);
  if (flags.drain_at == 2) {
    expect(grpc::StatusCode::UNAVAILABLE, "a session drained");
    Check(t.responses.size() == 1, "a drained session answered more than opened");
  } else if (messages.size() < 2 || (parses && second.has_close())) {
    expect(grpc::StatusCode::OK, "close or the half-close");
    Check(t.responses.size() == (flags.writes_fail ? 1u : 2u),
          absl::StrCat("close answered by ", t.responses.size() - 1, " responses"));
    if (!flags.writes_fail) {
      Check(t.responses[1].has_closed(), "close answered by something else than closed");
      Check(t.responses[1].closed().steps() == (flags.ring ? 1u : 0u),
            absl::StrCat("closed.steps ", t.responses[1].closed().steps(), " for ",
                         flags.ring ? 1 : 0, " rung"));
    }
  } else {
    expect(grpc::StatusCode::INVALID_ARGUMENT, "a second message that is not close");
    Check(t.responses.size() == 1, "a bad second message answered");
  }
  // The session's regions: unregistered on its end when it asked for that, else kept.
  for (const v1::RegionSlice* s :
       {&open.control(), &open.logits(), &open.params(), &open.token_ids(), &open.row_status(),
        &open.sampled_logprobs(), &open.token_bitmask(), &open.processors()}) {
    if (s->region().empty()) continue;
    Check(Registered(s->region()) != open.unregister_regions_on_end(),
          absl::StrCat("region ", s->region(), open.unregister_regions_on_end() ? " kept" : " gone",
                       " after the session"));
  }
}

}  // namespace
}  // namespace samplerd::fuzz

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  google::protobuf::SetLogHandler(nullptr);
  samplerd::fuzz::Core();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace samplerd;  // NOLINT
  fuzz::Input input(data, size);
  const fuzz::Flags flags(input.Byte());
  std::vector<std::string> messages;
  while (!input.empty() && messages.size() < 16) messages.push_back(input.Message());

  // An engine opens with a clean control block: no stale doorbell from an earlier input.
  v1::DeviceSessionRequest first;
  if (!messages.empty() && fuzz::Parse(messages[0], &first) && first.has_open()) {
    if (uint8_t* control = fuzz::Engine(first.open().control(), SAMPLERD_CONTROL_BYTES)) {
      std::memset(control, 0, SAMPLERD_CONTROL_BYTES);
    }
  }

  // A manager per input (a drain is for good), on the core's regions, limits and CPU backend.
  core::DeviceSessionOptions options;
  options.max_sessions = flags.no_sessions ? 0 : 1;
  options.host.threads = 1;
  options.host.spin_us = 0;
  core::SessionManager sessions(&fuzz::Core().regions(), core::BackendKind::kCpu,
                                core::DeviceInfo{}, fuzz::Core().limits(), options,
                                core::DefaultRunnerFactory(options));

  grpc::CallbackServerContext context;
  auto* reactor =
      new grpc_transport::DeviceSessionReactor(&sessions, &context, flags.allow_remote_regions);
  fuzz::SessionStream stream(reactor);
  fuzz::SessionStream::Hooks hooks;
  hooks.before_read = [&](int n) {
    if (n == flags.drain_at) sessions.CloseAll();
  };
  hooks.on_opened = [&] {
    if (flags.ring) fuzz::RingOneStep(first.open(), flags.valid_params);
  };
  const fuzz::Transcript transcript = stream.Run(messages, flags.writes_fail, hooks);

  fuzz::Check(sessions.open_count() == 0, "a session outlived its call");
  fuzz::CheckCall(flags, messages, transcript);
  fuzz::RestoreRegions();
  return 0;
}
