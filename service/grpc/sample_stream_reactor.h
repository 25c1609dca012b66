// The SampleStream reactor: one per stream. Steps are read while earlier ones are sampled,
// answered strictly in the order they arrived, and a bad step is answered with a non-OK
// StepStatus without ending the stream.
//
// A step may be split into chunks: a message with `request` and `more_chunks` set starts it,
// messages with only `chunk` continue it, the first without `more_chunks` ends it. The bytes its
// shape needs are reserved against --max_inflight_bytes at its first message
// (SamplerCore::ReserveInflightBytes) and held until the step is answered, fails or the stream
// ends; a step that does not fit is answered RESOURCE_EXHAUSTED after its last chunk (its
// chunks are dropped as they arrive) and the stream goes on.
//
// A chunked step must end (its last chunk arrive) within `chunk_timeout` (--chunk_timeout_ms)
// of its first message, or a client could send one small first message of a large step, stall
// and hold the step's bytes of --max_inflight_bytes for ever. When that time passes first, an
// alarm answers the step at once, with no message from the client: DEADLINE_EXCEEDED (or the
// error that failed the step already), its reserved bytes and buffer freed. The stream goes on:
// the rest of that step's chunks are skipped as they arrive (up to the one without
// `more_chunks`, or until a message with `request` starts the next step).
//
// A message that does not parse as a SampleStreamRequest ends the stream: nothing after it is
// read, every step before it is answered, then the stream finishes INVALID_ARGUMENT with
// ParseMessage's message (a chunked step it interrupts is answered INVALID_ARGUMENT first).
// Messages arrive raw (raw_message.h) so that this is told apart from the client's half-close.
#ifndef SAMPLERD_SERVICE_GRPC_SAMPLE_STREAM_REACTOR_H_
#define SAMPLERD_SERVICE_GRPC_SAMPLE_STREAM_REACTOR_H_

#include <grpcpp/alarm.h>
#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "samplerd/v1/sampler.pb.h"
#include "service/core/sampler_core.h"
#include "service/metrics/sampler_metrics.h"

namespace samplerd::grpc_transport {

class SampleStreamReactor final
    : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  // Steps read ahead of the oldest unanswered one; bounds a stream's memory.
  static constexpr size_t kMaxStepsInFlight = 32;
  // The largest chunked step, reassembled (1 GiB); more is RESOURCE_EXHAUSTED for that step.
  static constexpr int64_t kMaxStepBytes = int64_t{1} << 30;
  // How long a chunked step may take from its first message to its last, by default
  // (--chunk_timeout_ms).
  static constexpr absl::Duration kDefaultChunkTimeout = absl::Seconds(10);

  // Steps that name a region need a unix-socket peer unless `allow_remote_regions` (peer.h).
  // Each answered step is counted in `metrics` (null: none), which must outlive the stream.
  // `chunk_timeout` (> 0) bounds each chunked step's assembly.
  SampleStreamReactor(core::SamplerCore* core, grpc::CallbackServerContext* context,
                      bool allow_remote_regions, metrics::SamplerMetrics* metrics = nullptr,
                      absl::Duration chunk_timeout = kDefaultChunkTimeout);

  void OnReadDone(bool ok) override;
  void OnWriteDone(bool ok) override;
  // Deletes the reactor, or leaves that to the last alarm callback still to run.
  void OnDone() override;

 private:
  struct Step {
    v1::SampleStreamRequest message;  // owns the logits bytes while the step is sampled
    v1::SampleStreamResponse response;
    absl::Status error;  // set while assembling: the step fails at its last chunk (or deadline)
    int64_t expected_bytes = 0;  // a chunked step's logits bytes, from its shape and dtype
    int64_t messages = 0;        // a chunked step's messages so far, its first included
    // A chunked step's expected_bytes, reserved at its first message; handed to the core with
    // the step, or given back when the step fails.
    core::SamplerCore::InflightBytes reserved;
    bool ready = false;  // `response` is final
  };

  // Handles the message in read_ (mu_ held).
  void HandleMessageLocked();
  // Reads a chunked step's shape and dtype from its first message into `step->expected_bytes`
  // and reserves those bytes (`step->reserved`); an error (a shape over the server's limits or
  // over kMaxStepBytes, or bytes over --max_inflight_bytes) fails the step.
  absl::Status ExpectStepBytesLocked(Step* step);
  // Makes `step` (queued in steps_) the step in assembly and sets its deadline (mu_ held).
  void StartAssemblyLocked(Step* step);
  // Ends the assembly in progress, its last chunk come or the step failed: cancels its deadline
  // (mu_ held).
  void EndAssemblyLocked();
  // The callback of deadline `alarm`, run once on gRPC's executor when its time passed or it was
  // cancelled: fails its step if that is still assembling. May delete this.
  void OnChunkDeadline(const grpc::Alarm* alarm);
  // Starts sampling `step` (mu_ held; the step is already queued in steps_).
  void SubmitLocked(Step* step);
  // Marks `step` answered with `status` (mu_ held).
  void FailLocked(Step* step, const absl::Status& status);
  // Starts the next read, write or the final Finish as the state allows (mu_ held).
  void ProgressLocked();

  core::SamplerCore* const core_;
  grpc::CallbackServerContext* const context_;
  const bool allow_remote_regions_;
  metrics::SamplerMetrics* const metrics_;
  const absl::Duration chunk_timeout_;
  std::mutex mu_;
  grpc::ByteBuffer read_bytes_;  // the message being read; parsed into read_
  v1::SampleStreamRequest read_;
  grpc::ByteBuffer write_bytes_;             // the front step's response, serialized, while writing
  std::deque<std::unique_ptr<Step>> steps_;  // arrival order; front is the next to write
  Step* assembling_ = nullptr;               // a chunked step waiting for more chunks
  // assembling_'s deadline (null: none); one alarm per chunked step. gRPC runs an alarm's
  // callback exactly once (fired or cancelled) on its executor threads, never inside Set or
  // Cancel (grpc src/cpp/common/alarm.cc), so alarms are set and cancelled with mu_ held. They
  // are deleted by their own callback, never with mu_ held: ~Alarm may drop gRPC's last library
  // reference, and grpc_shutdown joins the executor threads, one of which may be waiting for
  // mu_ in an alarm's callback (a deadlock the stream fuzzer found).
  grpc::Alarm* chunk_alarm_ = nullptr;
  int alarms_pending_ = 0;  // alarm callbacks still to run; the last one may delete this
  bool skipping_ = false;   // dropping the rest of a step that expired in assembly
  bool done_ = false;       // OnDone has run: the reactor goes once no alarm is pending
  size_t computing_ = 0;    // steps handed to the core, not yet answered
  bool reading_ = false;
  bool reads_done_ = false;
  bool writing_ = false;
  bool broken_ = false;      // a write failed: drop answers, finish when the core is done
  absl::Status end_status_;  // the stream's final status when not broken (a message's parse error)
  bool finished_ = false;
};

}  // namespace samplerd::grpc_transport

#endif  // SAMPLERD_SERVICE_GRPC_SAMPLE_STREAM_REACTOR_H_
