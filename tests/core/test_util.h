// Helpers shared by the tests/core fixtures that drive a SamplerCore: collecting the answer of
// one SampleAsync call, and submitting a request then waiting for its answer.
#ifndef SAMPLERD_TESTS_CORE_TEST_UTIL_H_
#define SAMPLERD_TESTS_CORE_TEST_UTIL_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "service/core/sampler_core.h"

namespace samplerd::core {

// Collects one request's answer: pass Callback() to SampleAsync, then wait on `done` before
// reading `result`. Must outlive the call it is passed to.
struct Answer {
  absl::Notification done;
  absl::StatusOr<SampleResult> result;

  SamplerCore::Callback Callback() {
    return [this](absl::StatusOr<SampleResult> r) {
      result = std::move(r);
      done.Notify();
    };
  }
};

// Submits `request` to `core` and waits for its callback. Returns SampleAsync's status when the
// core refuses the request up front (the callback is then never called).
inline absl::StatusOr<SampleResult> SampleAndWait(SamplerCore& core, SampleRequest request) {
  Answer answer;
  const absl::Status queued = core.SampleAsync(std::move(request), answer.Callback());
  if (!queued.ok()) return queued;
  answer.done.WaitForNotification();
  return std::move(answer.result);
}

}  // namespace samplerd::core

#endif  // SAMPLERD_TESTS_CORE_TEST_UTIL_H_
