// The GPU plane of device sessions in one process (see session_gpu_test.cc for the setting):
// Stop() with an engine waiting and on an idle session, two sessions on one control page, the
// median ring -> done latency (a diagnostic), and an open idle session not holding up the unary
// path's device work. The fixture and the process-wide setup are in session_gpu_fixture.h/.cc.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "tests/gpu/session_gpu_fixture.h"

namespace samplerd::core::gpu_plane_testing {
namespace {

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
  if ((code = gpu::ZeroDevice(workspace, workspace_bytes, stream)) != 0 ||  // sample.h asks it
      (code = gpu::CopyToDevice(logits, b.bytes.data(), b.bytes.size(), stream)) != 0 ||
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
}  // namespace samplerd::core::gpu_plane_testing
