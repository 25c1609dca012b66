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
//
// This file: steps against the kernels and the CPU reference (fp32, bf16/fp16 with a stride),
// invalid rows, bad batches. Stop(), two sessions on one control page, the latency diagnostic
// and the unary path are in session_gpu_lifetime_test.cc; the fixture and the process-wide
// setup in session_gpu_fixture.h/.cc.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "tests/gpu/session_gpu_fixture.h"

namespace samplerd::core::gpu_plane_testing {
namespace {

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

}  // namespace
}  // namespace samplerd::core::gpu_plane_testing
