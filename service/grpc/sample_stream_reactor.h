// The SampleStream reactor: one per stream. Steps are read while earlier ones are sampled,
// answered strictly in the order they arrived, and a bad step is answered with a non-OK
// StepStatus without ending the stream.
//
// A step may be split into chunks: a message with `request` and `more_chunks` set starts it,
// messages with only `chunk` continue it, the first without `more_chunks` ends it.
#ifndef SAMPLERD_SERVICE_GRPC_SAMPLE_STREAM_REACTOR_H_
#define SAMPLERD_SERVICE_GRPC_SAMPLE_STREAM_REACTOR_H_

#include <grpcpp/grpcpp.h>

#include <deque>
#include <memory>
#include <mutex>

#include "absl/status/status.h"
#include "samplerd/v1/sampler.pb.h"
#include "service/core/sampler_core.h"
#include "service/metrics/sampler_metrics.h"

namespace samplerd::grpc_transport {

class SampleStreamReactor final
    : public grpc::ServerBidiReactor<v1::SampleStreamRequest, v1::SampleStreamResponse> {
 public:
  // Steps read ahead of the oldest unanswered one; bounds a stream's memory.
  static constexpr size_t kMaxStepsInFlight = 32;
  // The largest chunked step, reassembled (1 GiB); more is RESOURCE_EXHAUSTED for that step.
  static constexpr int64_t kMaxStepBytes = int64_t{1} << 30;

  // Steps that name a region need a unix-socket peer unless `allow_remote_regions` (peer.h).
  // Each answered step is counted in `metrics` (null: none), which must outlive the stream.
  SampleStreamReactor(core::SamplerCore* core, grpc::CallbackServerContext* context,
                      bool allow_remote_regions, metrics::SamplerMetrics* metrics = nullptr);

  void OnReadDone(bool ok) override;
  void OnWriteDone(bool ok) override;
  void OnDone() override { delete this; }

 private:
  struct Step {
    v1::SampleStreamRequest message;  // owns the logits bytes while the step is sampled
    v1::SampleStreamResponse response;
    absl::Status error;  // set while assembling: the step fails once its last chunk arrives
    bool ready = false;  // `response` is final
  };

  // Handles the message in read_ (mu_ held).
  void HandleMessageLocked();
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
  std::mutex mu_;
  v1::SampleStreamRequest read_;
  std::deque<std::unique_ptr<Step>> steps_;  // arrival order; front is the next to write
  Step* assembling_ = nullptr;               // a chunked step waiting for more chunks
  size_t computing_ = 0;                     // steps handed to the core, not yet answered
  bool reading_ = false;
  bool reads_done_ = false;
  bool writing_ = false;
  bool broken_ = false;  // a write failed: drop answers, finish when the core is done
  bool finished_ = false;
};

}  // namespace samplerd::grpc_transport

#endif  // SAMPLERD_SERVICE_GRPC_SAMPLE_STREAM_REACTOR_H_
