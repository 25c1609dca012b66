// The GPU plane of device sessions (service/core/session/gpu_plane.h) in one process: the test
// plays the engine on its own stream with stream memory operations, exactly as
// proto/samplerd/v1/device_session.h describes, against a control block in host shm (mapped
// twice: the engine's and the server's mapping) and device buffers from DeviceMalloc.
// Tokens must equal kernels::gpu::Sample run directly on the same rows (and the CPU reference
// for greedy rows); bad rows, bad batches and Stop() in every state must behave as the contract
// says; an open idle session must not hold up the unary path's device work. Prints the median
// ring -> done latency as a diagnostic, and a one-line PASS/FAIL summary at the end. Skips
// without a GPU. Never hangs: engine waits are bounded by EngineSide's watchdog, and the whole
// run by a process watchdog (kProcessLimit).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kernels/gpu/runtime.h"
#include "proto/samplerd/v1/device_session.h"
#include "service/core/session/gpu_plane.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/gpu/session_test_engine.h"

namespace samplerd::core {
namespace {

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

// A stream blocked in a stream wait blocks its hardware queue and every stream sharing it; the
// engines played here park their streams on done in this process while the session's stream
// must run, so the test asks for more queues than it has streams before the runtime starts
// (HIP: GPU_MAX_HW_QUEUES). The server itself never parks a stream. CUDA's lazy module loading
// (the default since CUDA 12.2) loads a kernel at its first launch and waits for the context to
// go idle to do it, which a parked engine wait in this process prevents: the first H200 run of
// this test deadlocked on it at each dtype's first step. Kernels are loaded eagerly instead.
// (The server has no such wait: its engines are other processes.)
const bool kQueuesSet = [] {
  setenv("CUDA_MODULE_LOADING", "EAGER", /*overwrite=*/0);
  setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", /*overwrite=*/0);
  setenv("GPU_MAX_HW_QUEUES", "16", /*overwrite=*/0);
  return true;
}();

constexpr auto kStepLimit = std::chrono::milliseconds(5000);

// The whole run must end well within 2 minutes (it takes well under one on an H200); past this
// the process watchdog prints a FAIL line and exits, whatever hangs.
constexpr auto kProcessLimit = std::chrono::seconds(110);

const bool kProcessWatchdog = [] {
  std::thread([] {
    std::this_thread::sleep_for(kProcessLimit);
    std::fprintf(stderr,
                 "\n[ SUMMARY ] samplerd_session_gpu_test: FAIL (process watchdog: still running "
                 "after %lld s; a wait hung)\n",
                 static_cast<long long>(kProcessLimit.count()));
    std::fflush(stderr);
    _exit(3);
  }).detach();
  return true;
}();

// Prints one line after the last test: PASS or FAIL, the counts and the time taken.
class SummaryPrinter : public ::testing::EmptyTestEventListener {
  void OnTestProgramEnd(const ::testing::UnitTest& unit) override {
    const bool pass = unit.Passed();
    std::printf(
        "\n[ SUMMARY ] samplerd_session_gpu_test: %s (%d tests run, %d passed, %d failed, %d "
        "skipped, %.1f s)\n",
        pass ? "PASS" : "FAIL", unit.test_to_run_count(), unit.successful_test_count(),
        unit.failed_test_count(), unit.skipped_test_count(),
        static_cast<double>(unit.elapsed_time()) / 1000.0);
    std::fflush(stdout);
  }
};

const bool kSummaryAdded = [] {
  ::testing::UnitTest::GetInstance()->listeners().Append(new SummaryPrinter());
  return true;
}();

// A random row: mostly valid settings from the GPU sampler tests, sometimes an invalid value.
EngineRow RandomRow(std::mt19937_64& rng, bool allow_invalid) {
  static const EngineRow kSettings[] = {
      {0, 0, 0.0f, 0, 1.0f, 0.0f, 1},    {0, 0, 0.8f, 0, 1.0f, 0.0f, 1},
      {0, 0, 1.0f, 50, 1.0f, 0.0f, 0},   {0, 0, 1.0f, 0, 0.95f, 0.0f, 1},
      {0, 0, 1.0f, 50, 0.9f, 0.0f, 1},   {0, 0, 1.0f, 50, 0.9f, 0.0f, 2},
      {0, 0, 1.0f, 0, 1.0f, 0.1f, 1},    {0, 0, 1.0f, 1, 1.0f, 0.0f, 1},
      {0, 0, 0.9f, 1000, 0.8f, 0.0f, 1}, {0, 0, 1.3f, 0, 0.7f, 0.0f, 2},
      {0, 0, 0.7f, 40, 0.8f, 0.05f, 1},  {0, 0, 1e-6f, -1, 1.0f, 0.0f, 1},
  };
  EngineRow r = kSettings[rng() % (sizeof(kSettings) / sizeof(kSettings[0]))];
  r.seed = rng();
  r.position = rng() % 100000;
  if (allow_invalid && rng() % 40 == 0) {
    switch (rng() % 12) {
      case 0:
        r.temperature = -1.0f;
        break;
      case 1:
        r.temperature = kInf;
        break;
      case 2:
        r.temperature = kNaN;
        break;
      case 3:
        r.top_k = -2;
        break;
      case 4:
        r.top_p = 0.0f;
        break;
      case 5:
        r.top_p = 1.5f;
        break;
      case 6:
        r.top_p = kNaN;
        break;
      case 7:
        r.min_p = -0.1f;
        break;
      case 8:
        r.min_p = 1.5f;
        break;
      case 9:
        r.min_p = kNaN;
        break;
      case 10:
        r.top_p_mode = 3;
        break;
      default:
        r.top_p_mode = -1;
        break;
    }
  }
  return r;
}

// The batch of rows [0, b) that the reference samples.
Batch ReferenceBatch(DType dtype, int64_t vocab, int64_t stride, const std::vector<uint8_t>& bytes,
                     const std::vector<EngineRow>& rows, bool logprobs) {
  Batch b;
  b.dtype = dtype;
  b.batch = static_cast<int64_t>(rows.size());
  b.vocab = vocab;
  b.row_stride = stride;
  b.bytes = bytes;
  for (const EngineRow& r : rows) b.params.push_back(ToRowParams(r));
  b.top_logprobs = logprobs ? 0 : -1;
  b.source = kernels::LogprobSource::kRaw;
  return b;
}

// Checks one step's outputs against kernels::gpu::Sample on the same rows (and the CPU
// reference for greedy rows). Returns the number of mismatching rows.
int CheckStep(DirectSampler& direct, const EngineSide& engine, const Batch& ref_batch,
              const std::vector<EngineRow>& rows, bool logprobs, int step) {
  const Outputs ref = direct.Run(ref_batch);
  int bad = 0;
  // The CPU reference runs the greedy rows only (the oracle is slow on full rows).
  std::vector<size_t> greedy_rows;
  Batch greedy = ref_batch;
  greedy.bytes.clear();
  greedy.params.clear();
  greedy.top_logprobs = -1;
  const size_t row_bytes = static_cast<size_t>(ref_batch.row_stride) *
                           static_cast<size_t>(kernels::DTypeSize(ref_batch.dtype));
  for (size_t i = 0; i < rows.size(); ++i) {
    if (IsValid(rows[i]) && rows[i].temperature < kernels::kGreedyTemperature) {
      greedy_rows.push_back(i);
      greedy.bytes.insert(greedy.bytes.end(), ref_batch.bytes.begin() + i * row_bytes,
                          ref_batch.bytes.begin() + (i + 1) * row_bytes);
      greedy.params.push_back(ref_batch.params[i]);
    }
  }
  greedy.batch = static_cast<int64_t>(greedy_rows.size());
  Outputs cpu;
  if (!greedy_rows.empty()) cpu = kernels::testing::RunCpu(greedy);
  for (size_t i = 0; i < rows.size(); ++i) {
    if (!IsValid(rows[i])) {
      if (engine.status[i] != SAMPLERD_ROW_INVALID_PARAMS || engine.tokens[i] != -1 ||
          (logprobs && !(engine.logprobs[i] == -kInf))) {
        ADD_FAILURE() << "step " << step << " row " << i << ": expected status 4, token -1, got "
                      << engine.status[i] << ", " << engine.tokens[i];
        ++bad;
      }
      continue;
    }
    const int32_t want_status = static_cast<int32_t>(ref.status[i]) + 1;
    const bool lp_ok =
        !logprobs || std::memcmp(&engine.logprobs[i], &ref.sampled_logprob[i], 4) == 0;
    if (engine.tokens[i] != ref.tokens[i] || engine.status[i] != want_status || !lp_ok) {
      ADD_FAILURE() << "step " << step << " row " << i << ": expected token " << ref.tokens[i]
                    << " status " << want_status << ", got " << engine.tokens[i] << " status "
                    << engine.status[i];
      ++bad;
    }
  }
  for (size_t g = 0; g < greedy_rows.size(); ++g) {
    const size_t i = greedy_rows[g];
    if (engine.tokens[i] != cpu.tokens[g]) {
      ADD_FAILURE() << "step " << step << " greedy row " << i << ": CPU " << cpu.tokens[g]
                    << ", GPU plane " << engine.tokens[i];
      ++bad;
    }
  }
  return bad;
}

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
                                  std::mt19937_64& rng) {
  Batch b;
  b.dtype = dtype;
  b.batch = rows;
  b.vocab = vocab;
  b.row_stride = stride;
  kernels::testing::FillLogits(b, rng() % 2 ? "randn3" : "peaked", rng);
  return b.bytes;
}

// Runs `steps` steps of random batch sizes and parameters; every token checked.
void RunSteps(DirectSampler& direct, EngineSide& engine, DType dtype, uint32_t max_batch,
              int64_t vocab, int64_t stride, bool logprobs, int steps, uint64_t seed) {
  std::mt19937_64 rng(seed);
  int bad = 0;
  for (int step = 0; step < steps && bad < 20; ++step) {
    const uint32_t b = 1 + static_cast<uint32_t>(rng() % max_batch);
    const std::vector<uint8_t> bytes = RandomLogits(dtype, b, vocab, stride, rng);
    std::vector<EngineRow> rows;
    for (uint32_t i = 0; i < b; ++i) rows.push_back(RandomRow(rng, /*allow_invalid=*/true));
    engine.WriteInputs(bytes, rows);
    engine.Ring(b);
    engine.WaitDone();
    ASSERT_TRUE(engine.Finish(kStepLimit)) << "step " << step << " did not complete";
    ASSERT_EQ(engine.ControlWord(SAMPLERD_CONTROL_STEP_STATUS), SAMPLERD_STEP_OK);
    ASSERT_EQ(engine.ControlWord(SAMPLERD_CONTROL_STEPS_DONE), static_cast<uint32_t>(step + 1));
    ASSERT_EQ(engine.ControlWord(SAMPLERD_CONTROL_DOORBELL), 0u);
    bad += CheckStep(direct, engine, ReferenceBatch(dtype, vocab, stride, bytes, rows, logprobs),
                     rows, logprobs, step);
  }
  EXPECT_EQ(bad, 0);
}

TEST_F(GpuPlaneTest, ThousandStepsMatchTheKernelsAndTheCpuReference) {
  constexpr uint32_t kMaxBatch = 12;
  constexpr int64_t kVocab = 32000;
  EngineSide engine(kMaxBatch, kVocab, kVocab, DType::kFp32, /*logprobs=*/true);
  DirectSampler direct(kMaxBatch, kVocab, kVocab, DType::kFp32);
  auto runner = Start(engine, "fp32");
  ASSERT_NE(runner, nullptr);
  RunSteps(direct, engine, DType::kFp32, kMaxBatch, kVocab, kVocab, true, 1000, 1234);
  runner->Stop();
  EXPECT_EQ(runner->steps(), 1000u);
}

TEST_F(GpuPlaneTest, HalfPrecisionSessionsWithAStrideMatchTheKernels) {
  for (DType dtype : {DType::kBf16, DType::kFp16}) {
    EngineSide engine(5, 8193, 8200, dtype, /*logprobs=*/false);
    DirectSampler direct(5, 8193, 8200, dtype);
    auto runner = Start(engine, "half");
    ASSERT_NE(runner, nullptr);
    RunSteps(direct, engine, dtype, 5, 8193, 8200, false, 100, 99 + static_cast<int>(dtype));
  }
}

TEST_F(GpuPlaneTest, AnInvalidRowGetsStatusFourAndLeavesItsNeighboursAlone) {
  constexpr uint32_t kMaxBatch = 8;
  constexpr int64_t kVocab = 5000;
  EngineSide engine(kMaxBatch, kVocab, kVocab, DType::kFp32, /*logprobs=*/true);
  DirectSampler direct(kMaxBatch, kVocab, kVocab, DType::kFp32);
  auto runner = Start(engine, "invalid");
  ASSERT_NE(runner, nullptr);
  std::mt19937_64 rng(7);
  const std::vector<uint8_t> bytes = RandomLogits(DType::kFp32, kMaxBatch, kVocab, kVocab, rng);
  std::vector<EngineRow> rows;
  for (uint32_t i = 0; i < kMaxBatch; ++i) rows.push_back(RandomRow(rng, false));
  rows[3].top_p = 0.0f;
  rows[5].temperature = kNaN;
  engine.WriteInputs(bytes, rows);
  engine.Ring(kMaxBatch);
  engine.WaitDone();
  ASSERT_TRUE(engine.Finish(kStepLimit));
  EXPECT_EQ(engine.ControlWord(SAMPLERD_CONTROL_STEP_STATUS), SAMPLERD_STEP_OK);
  EXPECT_EQ(engine.status[3], SAMPLERD_ROW_INVALID_PARAMS);
  EXPECT_EQ(engine.tokens[3], -1);
  EXPECT_EQ(engine.logprobs[3], -kInf);
  EXPECT_EQ(engine.status[5], SAMPLERD_ROW_INVALID_PARAMS);
  EXPECT_EQ(
      CheckStep(direct, engine, ReferenceBatch(DType::kFp32, kVocab, kVocab, bytes, rows, true),
                rows, true, 0),
      0);
}

TEST_F(GpuPlaneTest, BatchZeroOrAboveMaxBatchIsABadBatchAndSamplesNothing) {
  constexpr uint32_t kMaxBatch = 4;
  constexpr int64_t kVocab = 1000;
  EngineSide engine(kMaxBatch, kVocab, kVocab, DType::kFp32, /*logprobs=*/false);
  auto runner = Start(engine, "bad_batch");
  ASSERT_NE(runner, nullptr);
  std::mt19937_64 rng(11);
  std::vector<EngineRow> rows;
  for (uint32_t i = 0; i < kMaxBatch; ++i) rows.push_back(RandomRow(rng, false));
  engine.WriteInputs(RandomLogits(DType::kFp32, kMaxBatch, kVocab, kVocab, rng), rows);
  for (uint32_t b : {0u, kMaxBatch + 1, 0xffffffffu}) {
    engine.Ring(b);
    engine.WaitDone();
    ASSERT_TRUE(engine.Finish(kStepLimit)) << "B = " << b;
    EXPECT_EQ(engine.ControlWord(SAMPLERD_CONTROL_STEP_STATUS), SAMPLERD_STEP_BAD_BATCH)
        << "B = " << b;
    for (uint32_t i = 0; i < kMaxBatch; ++i) {
      EXPECT_EQ(engine.tokens[i], 777) << "B = " << b << ": row " << i << " was written";
      EXPECT_EQ(engine.status[i], 777) << "B = " << b << ": row " << i << " was written";
    }
  }
  // The session goes on after a bad batch.
  engine.Ring(kMaxBatch);
  engine.WaitDone();
  ASSERT_TRUE(engine.Finish(kStepLimit));
  EXPECT_EQ(engine.ControlWord(SAMPLERD_CONTROL_STEP_STATUS), SAMPLERD_STEP_OK);
  EXPECT_EQ(engine.status[0], SAMPLERD_ROW_OK);
}

TEST_F(GpuPlaneTest, StopReleasesAnEngineWaitingOnDoneWithinOneSecond) {
  EngineSide engine(4, 1000, 1000, DType::kFp32, false);
  auto runner = Start(engine, "stop_engine_waits");
  ASSERT_NE(runner, nullptr);
  // The engine waits for a step it never rang (as if the server were to end the session).
  engine.WaitDone();
  const auto start = std::chrono::steady_clock::now();
  runner->Stop();
  const bool released = engine.Finish(std::chrono::milliseconds(1000));
  const auto elapsed = std::chrono::steady_clock::now() - start;
  ASSERT_TRUE(released) << "the engine's wait on done was not released";
  EXPECT_LT(elapsed, std::chrono::seconds(1));
  EXPECT_EQ(engine.ControlWord(SAMPLERD_CONTROL_STEP_STATUS), SAMPLERD_STEP_ABORTED);
  EXPECT_EQ(engine.tokens[0], 777);  // nothing was sampled
  runner->Stop();                    // idempotent
}

TEST_F(GpuPlaneTest, StopOfAnIdleSessionReturnsWithinOneSecondAndAbortsLaterWaits) {
  for (int round = 0; round < 3; ++round) {
    EngineSide engine(4, 1000, 1000, DType::kFp32, false);
    auto runner = Start(engine, "stop_idle");
    ASSERT_NE(runner, nullptr);
    const auto start = std::chrono::steady_clock::now();
    runner->Stop();
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(1))
        << "round " << round;
    // A later engine wait completes at once, aborted.
    engine.WaitDone();
    ASSERT_TRUE(engine.Finish(std::chrono::milliseconds(1000)));
    EXPECT_EQ(engine.ControlWord(SAMPLERD_CONTROL_STEP_STATUS), SAMPLERD_STEP_ABORTED);
    EXPECT_EQ(engine.ControlWord(SAMPLERD_CONTROL_STEPS_DONE), 0u);
  }
}

// The two control blocks share one page of one shm object (offsets 0 and 256), so the runners
// share its registration: stopping one must leave the other working.
TEST_F(GpuPlaneTest, TwoSessionsOnOneControlPageEachGetTheirOwnTokens) {
  constexpr uint32_t kMaxBatch = 6;
  constexpr int64_t kVocab = 20000;
  ControlShm shm;
  EngineSide a(kMaxBatch, kVocab, kVocab, DType::kFp32, true, &shm, 0);
  EngineSide b(kMaxBatch, kVocab, kVocab, DType::kBf16, false, &shm, SAMPLERD_CONTROL_BYTES);
  DirectSampler direct_a(kMaxBatch, kVocab, kVocab, DType::kFp32);
  DirectSampler direct_b(kMaxBatch, kVocab, kVocab, DType::kBf16);
  auto runner_a = Start(a, "a");
  auto runner_b = Start(b, "b");
  ASSERT_NE(runner_a, nullptr);
  ASSERT_NE(runner_b, nullptr);
  std::mt19937_64 rng(21);
  int bad = 0;
  for (int step = 0; step < 60 && bad < 10; ++step) {
    const uint32_t ba = 1 + rng() % kMaxBatch, bb = 1 + rng() % kMaxBatch;
    const auto bytes_a = RandomLogits(DType::kFp32, ba, kVocab, kVocab, rng);
    const auto bytes_b = RandomLogits(DType::kBf16, bb, kVocab, kVocab, rng);
    std::vector<EngineRow> rows_a, rows_b;
    for (uint32_t i = 0; i < ba; ++i) rows_a.push_back(RandomRow(rng, true));
    for (uint32_t i = 0; i < bb; ++i) rows_b.push_back(RandomRow(rng, true));
    a.WriteInputs(bytes_a, rows_a);
    b.WriteInputs(bytes_b, rows_b);
    a.Ring(ba);
    b.Ring(bb);
    a.WaitDone();
    b.WaitDone();
    ASSERT_TRUE(a.Finish(kStepLimit));
    ASSERT_TRUE(b.Finish(kStepLimit));
    bad +=
        CheckStep(direct_a, a, ReferenceBatch(DType::kFp32, kVocab, kVocab, bytes_a, rows_a, true),
                  rows_a, true, step);
    bad +=
        CheckStep(direct_b, b, ReferenceBatch(DType::kBf16, kVocab, kVocab, bytes_b, rows_b, false),
                  rows_b, false, step);
  }
  EXPECT_EQ(bad, 0);
  runner_a->Stop();
  EXPECT_EQ(runner_a->steps(), 60u);
  // b goes on alone on the shared page.
  for (int step = 60; step < 70 && bad == 0; ++step) {
    const uint32_t bb = 1 + rng() % kMaxBatch;
    const auto bytes_b = RandomLogits(DType::kBf16, bb, kVocab, kVocab, rng);
    std::vector<EngineRow> rows_b;
    for (uint32_t i = 0; i < bb; ++i) rows_b.push_back(RandomRow(rng, true));
    b.WriteInputs(bytes_b, rows_b);
    b.Ring(bb);
    b.WaitDone();
    ASSERT_TRUE(b.Finish(kStepLimit)) << "step " << step << " after a's stop";
    EXPECT_EQ(b.ControlWord(SAMPLERD_CONTROL_STEP_STATUS), SAMPLERD_STEP_OK);
    bad +=
        CheckStep(direct_b, b, ReferenceBatch(DType::kBf16, kVocab, kVocab, bytes_b, rows_b, false),
                  rows_b, false, step);
  }
  EXPECT_EQ(bad, 0);
  runner_b->Stop();
  EXPECT_EQ(runner_b->steps(), 70u);
}

// Diagnostic: the median ring -> done time on the engine's stream (GPU events), bf16,
// V = 151,936, plain top-k/top-p rows. Asserts only that every step completes.
TEST_F(GpuPlaneTest, PrintsTheMedianStepLatency) {
  constexpr uint32_t kMaxBatch = 128;
  constexpr int64_t kVocab = 151936;
  EngineSide engine(kMaxBatch, kVocab, kVocab, DType::kBf16, false);
  auto runner = Start(engine, "timing");
  ASSERT_NE(runner, nullptr);
  std::mt19937_64 rng(5);
  std::vector<EngineRow> rows;
  for (uint32_t i = 0; i < kMaxBatch; ++i) {
    EngineRow r;
    r.seed = rng();
    r.temperature = 0.8f;
    r.top_k = 50;
    r.top_p = 0.9f;
    rows.push_back(r);
  }
  engine.WriteInputs(RandomLogits(DType::kBf16, kMaxBatch, kVocab, kVocab, rng), rows);
  for (uint32_t b : {1u, kMaxBatch}) {
    std::vector<float> ms;
    for (int step = 0; step < 520; ++step) {
      engine.Ring(b, /*timed=*/true);
      engine.WaitDone(/*timed=*/true);
      ASSERT_TRUE(engine.Finish(kStepLimit));
      ASSERT_EQ(engine.ControlWord(SAMPLERD_CONTROL_STEP_STATUS), SAMPLERD_STEP_OK);
      if (step >= 20) ms.push_back(engine.LastStepMs());
    }
    std::sort(ms.begin(), ms.end());
    std::printf(
        "[ timing ] GPU plane, bf16 V=%lld top-k 50 top-p 0.9, B=%u: median ring->done "
        "%.1f us, p90 %.1f us (500 steps)\n",
        static_cast<long long>(kVocab), b, ms[ms.size() / 2] * 1000.0f,
        ms[ms.size() * 9 / 10] * 1000.0f);
    EXPECT_GT(ms[ms.size() / 2], 0.0f);
  }
}

// What the unary path does on the device for each request (SamplerCore): allocate, copy in,
// sample on its own stream, copy out, synchronize, free. Run on its own thread by the test
// below, which must not wait for it forever.
struct UnaryProbe {
  std::atomic<bool> finished{false};
  std::string error;  // empty: every call succeeded
  std::vector<int32_t> tokens;
};

void RunUnaryWork(UnaryProbe* probe, const Batch& b) {
  auto fail = [probe](const char* what, int code) {
    probe->error = std::string(what) + ": " + gpu::ErrorString(code);
    probe->finished.store(true, std::memory_order_release);
  };
  int code = gpu::SetDevice(0);
  if (code != 0) return fail("SetDevice", code);
  gpu::Stream stream = nullptr;
  if ((code = gpu::StreamCreate(&stream)) != 0) return fail("StreamCreate", code);
  const size_t n = static_cast<size_t>(b.batch);
  const size_t workspace_bytes = gpu::SampleWorkspaceBytes(b.batch, b.vocab, -1);
  void *logits = nullptr, *params = nullptr, *tokens = nullptr, *status = nullptr,
       *workspace = nullptr, *pinned = nullptr;
  const std::pair<void**, size_t> buffers[] = {{&logits, b.bytes.size()},
                                               {&params, n * sizeof(RowParams)},
                                               {&tokens, n * 4},
                                               {&status, n},
                                               {&workspace, workspace_bytes}};
  for (const auto& [ptr, bytes] : buffers) {
    if ((code = gpu::DeviceMalloc(ptr, bytes)) != 0) return fail("DeviceMalloc", code);
  }
  if ((code = gpu::PinnedMalloc(&pinned, n * 4)) != 0) return fail("PinnedMalloc", code);
  if ((code = gpu::CopyToDevice(logits, b.bytes.data(), b.bytes.size(), stream)) != 0 ||
      (code = gpu::CopyToDevice(params, b.params.data(), n * sizeof(RowParams), stream)) != 0) {
    return fail("CopyToDevice", code);
  }
  kernels::SampleArgs a;
  a.logits = logits;
  a.dtype = b.dtype;
  a.batch = b.batch;
  a.vocab = b.vocab;
  a.row_stride = b.vocab;
  a.params = static_cast<const RowParams*>(params);
  a.params_count = b.batch;
  a.token_ids = static_cast<int32_t*>(tokens);
  a.status = static_cast<kernels::RowStatus*>(status);
  if ((code = gpu::Sample(a, workspace, workspace_bytes, stream)) != 0) return fail("Sample", code);
  if ((code = gpu::CopyToHost(pinned, tokens, n * 4, stream)) != 0) return fail("CopyToHost", code);
  if ((code = gpu::StreamSynchronize(stream)) != 0) return fail("StreamSynchronize", code);
  probe->tokens.assign(static_cast<int32_t*>(pinned), static_cast<int32_t*>(pinned) + n);
  for (const auto& [ptr, bytes] : buffers) {
    if ((code = gpu::DeviceFree(*ptr)) != 0) return fail("DeviceFree", code);
  }
  if ((code = gpu::PinnedFree(pinned)) != 0) return fail("PinnedFree", code);
  if ((code = gpu::StreamDestroy(stream)) != 0) return fail("StreamDestroy", code);
  if ((code = gpu::DeviceSynchronize()) != 0) return fail("DeviceSynchronize", code);
  probe->finished.store(true, std::memory_order_release);
}

// The first H200 run's failure: a session's runner parked its stream on the doorbell, and every
// device-wide synchronisation of the server (cudaFree, cudaFreeHost, DeviceSynchronize) waited
// for an engine that never rang. With two sessions open and idle (one after a few steps, one
// never rung), the unary path's device work must finish within 1 s, three times over.
TEST_F(GpuPlaneTest, AnOpenIdleSessionDoesNotBlockTheUnaryPath) {
  constexpr uint32_t kMaxBatch = 4;
  constexpr int64_t kVocab = 32000;
  EngineSide stepped(kMaxBatch, kVocab, kVocab, DType::kFp32, false);
  EngineSide never_rung(kMaxBatch, kVocab, kVocab, DType::kFp32, false);
  auto runner = Start(stepped, "idle_after_steps");
  auto idle = Start(never_rung, "idle");
  ASSERT_NE(runner, nullptr);
  ASSERT_NE(idle, nullptr);
  std::mt19937_64 rng(31);
  std::vector<EngineRow> rows(kMaxBatch);
  stepped.WriteInputs(RandomLogits(DType::kFp32, kMaxBatch, kVocab, kVocab, rng), rows);
  for (int step = 0; step < 3; ++step) {
    stepped.Ring(kMaxBatch);
    stepped.WaitDone();
    ASSERT_TRUE(stepped.Finish(kStepLimit));
  }
  ASSERT_EQ(runner->steps(), 3u);

  Batch b;
  b.dtype = DType::kFp32;
  b.batch = 4;
  b.vocab = kVocab;
  b.row_stride = kVocab;
  kernels::testing::FillLogits(b, "peaked", rng);
  b.params.assign(4, RowParams{});
  for (RowParams& p : b.params) p.temperature = 0.0f;  // greedy: checkable on the CPU
  const Outputs cpu = kernels::testing::RunCpu(b);
  for (int round = 0; round < 3; ++round) {
    auto probe = std::make_shared<UnaryProbe>();
    const auto start = std::chrono::steady_clock::now();
    std::thread worker([probe, b] { RunUnaryWork(probe.get(), b); });
    bool finished = false;
    while (std::chrono::steady_clock::now() - start < std::chrono::seconds(5)) {
      if ((finished = probe->finished.load(std::memory_order_acquire))) break;
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    if (!finished) {
      ADD_FAILURE() << "round " << round
                    << ": the unary path's device work did not finish within 5 s while a "
                       "session was open and idle; stopping the sessions to release it";
      runner->Stop();
      idle->Stop();
      for (int i = 0; i < 5000 && !probe->finished.load(std::memory_order_acquire); ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      if (!probe->finished.load(std::memory_order_acquire)) {
        worker.detach();  // it owns what it touches (probe, b); the process watchdog ends it
        return;
      }
      worker.join();
      return;
    }
    worker.join();
    EXPECT_LT(ms, 1000.0) << "round " << round << ": the unary path's device work took " << ms
                          << " ms with a session open and idle";
    ASSERT_EQ(probe->error, "") << "round " << round;
    ASSERT_EQ(probe->tokens.size(), 4u);
    for (size_t i = 0; i < 4; ++i) {
      EXPECT_EQ(probe->tokens[i], cpu.tokens[i]) << "round " << round << " row " << i;
    }
    std::printf(
        "[ unary  ] round %d: DeviceMalloc..Sample..DeviceFree with 2 idle sessions open: "
        "%.1f ms\n",
        round, ms);
  }
  // The sessions still serve after the unary work.
  stepped.Ring(kMaxBatch);
  stepped.WaitDone();
  ASSERT_TRUE(stepped.Finish(kStepLimit));
  EXPECT_EQ(stepped.ControlWord(SAMPLERD_CONTROL_STEP_STATUS), SAMPLERD_STEP_OK);
  EXPECT_EQ(runner->steps(), 4u);
}

}  // namespace
}  // namespace samplerd::core
