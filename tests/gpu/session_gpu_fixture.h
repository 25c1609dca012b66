// The shared part of samplerd_session_gpu_test (session_gpu_test.cc: steps against the kernels;
// session_gpu_lifetime_test.cc: Stop(), two sessions on one page, latency, the unary path): the
// GpuPlaneTest fixture and the helpers that write random rows and check a step's outputs. The
// process-wide setup (queues, eager module loading, the process watchdog, the summary line) is
// defined once, in session_gpu_fixture.cc.
#ifndef SAMPLERD_TESTS_GPU_SESSION_GPU_FIXTURE_H_
#define SAMPLERD_TESTS_GPU_SESSION_GPU_FIXTURE_H_

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "kernels/gpu/runtime.h"
#include "proto/samplerd/v1/device_session.h"
#include "service/core/session/gpu_plane.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/gpu/session_test_engine.h"

namespace samplerd::core::gpu_plane_testing {

namespace gpu = kernels::gpu;
using kernels::DType;
using kernels::RowParams;
using kernels::TopPMode;
using kernels::testing::Batch;
using kernels::testing::Outputs;
using session_testing::ControlShm;
using session_testing::DirectSampler;
using session_testing::EngineRow;
using session_testing::EngineSide;
using session_testing::IsValid;
using session_testing::ToRowParams;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Set before the runtime starts (see session_gpu_fixture.cc): more hardware queues than streams,
// eager module loading; the process watchdog (kProcessLimit); the PASS/FAIL summary line.
extern const bool kQueuesSet;
extern const bool kProcessWatchdog;
extern const bool kSummaryAdded;

constexpr auto kStepLimit = std::chrono::milliseconds(5000);

// A random row: mostly valid settings from the GPU sampler tests, sometimes an invalid value.
EngineRow RandomRow(std::mt19937_64& rng, bool allow_invalid);

// The batch of rows [0, b) that the reference samples.
Batch ReferenceBatch(DType dtype, int64_t vocab, int64_t stride, const std::vector<uint8_t>& bytes,
                     const std::vector<EngineRow>& rows, bool logprobs);

// Checks one step's outputs against kernels::gpu::Sample on the same rows (and the CPU
// reference for greedy rows). Returns the number of mismatching rows.
int CheckStep(DirectSampler& direct, const EngineSide& engine, const Batch& ref_batch,
              const std::vector<EngineRow>& rows, bool logprobs, int step);

// Runs every sampling path once per dtype, with and without logprobs, the first time it is
// called in the process. A kernel's first launch may have to grow the context's local memory
// (its stack), and the driver then waits for the context to go idle, which an engine parked on
// done in this process prevents, as lazy module loading did (session_gpu_fixture.cc). The
// server warms its kernels at start (GpuSampler::Warmup) and parks nothing.
void WarmKernels();

class GpuPlaneTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(kQueuesSet && kProcessWatchdog && kSummaryAdded);
    std::string why;
    if (!kernels::testing::HaveGpu(&why)) GTEST_SKIP() << "no GPU: " << why;
    bool yes = false;
    ASSERT_EQ(gpu::StreamMemOpsSupported(0, &yes), 0);
    if (!yes) GTEST_SKIP() << "device 0 has no stream memory operations";
    ASSERT_EQ(gpu::SetDevice(0), 0);
  }

  std::unique_ptr<PlaneRunner> Start(const EngineSide& engine, const std::string& id) {
    WarmKernels();
    GpuPlaneOptions options;
    auto runner = StartGpuPlane(engine.Spec(id), options, [this](const absl::Status& s) {
      std::lock_guard<std::mutex> lock(fault_mu_);
      fault_ = s.ToString();
    });
    EXPECT_TRUE(runner.ok()) << runner.status();
    return runner.ok() ? std::move(*runner) : nullptr;
  }

  void TearDown() override {
    std::lock_guard<std::mutex> lock(fault_mu_);
    EXPECT_EQ(fault_, "");
  }

  std::mutex fault_mu_;
  std::string fault_;  // a runner's fault, if any (guarded by fault_mu_)
};

std::vector<uint8_t> RandomLogits(DType dtype, int64_t rows, int64_t vocab, int64_t stride,
                                  std::mt19937_64& rng);

// Runs `steps` steps of random batch sizes and parameters; every token checked.
void RunSteps(DirectSampler& direct, EngineSide& engine, DType dtype, uint32_t max_batch,
              int64_t vocab, int64_t stride, bool logprobs, int steps, uint64_t seed);

}  // namespace samplerd::core::gpu_plane_testing

#endif  // SAMPLERD_TESTS_GPU_SESSION_GPU_FIXTURE_H_
