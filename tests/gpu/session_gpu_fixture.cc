// The process-wide setup and the helpers of samplerd_session_gpu_test (declared in
// session_gpu_fixture.h): defined once for the test files of the binary.
#include "tests/gpu/session_gpu_fixture.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

namespace samplerd::core::gpu_plane_testing {

namespace {

// The whole run must end well within 2 minutes (it takes well under one on an H200); past this
// the process watchdog prints a FAIL line and exits, whatever hangs.
constexpr auto kProcessLimit = std::chrono::seconds(110);

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

}  // namespace

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

void WarmKernels() {
  static const bool warmed = [] {
    for (DType dtype : {DType::kFp32, DType::kBf16, DType::kFp16}) {
      for (int32_t top_logprobs : {-1, 0}) {
        kernels::testing::Batch b;
        b.dtype = dtype;
        b.batch = 5;
        b.vocab = 9000;  // two chunks
        b.row_stride = b.vocab;
        std::mt19937_64 rng(1);
        b.bytes = RandomLogits(dtype, b.batch, b.vocab, b.vocab, rng);
        b.params = {kernels::testing::Params(0.0f, 0, 1.0f, 0.0f),
                    kernels::testing::Params(0.8f, 0, 1.0f, 0.0f),
                    kernels::testing::Params(1.0f, 50, 1.0f, 0.0f),
                    kernels::testing::Params(1.0f, 0, 0.9f, 0.0f),
                    kernels::testing::Params(1.0f, 0, 1.0f, 0.1f)};
        b.top_logprobs = top_logprobs;
        kernels::testing::RunGpu(b);
      }
    }
    return true;
  }();
  (void)warmed;
}

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

}  // namespace samplerd::core::gpu_plane_testing
