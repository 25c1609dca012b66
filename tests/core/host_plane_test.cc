// The host plane (service/core/session/host_plane.h): the test thread plays the engine over
// plain host memory (and one real shm object for truncation), ringing the doorbell and waiting
// on the done flag as device_session.h describes, and checks the outputs against the kernels/cpu
// oracle.
#include "service/core/session/host_plane.h"

#include <fcntl.h>
#include <malloc.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <thread>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/common/inverse_cdf.h"
#include "kernels/common/philox.h"
#include "kernels/cpu/cpu_sampler.h"
#include "proto/samplerd/v1/device_session.h"
#include "tests/core/shm_test_util.h"

namespace samplerd::core {
namespace {

using kernels::RowParams;
using kernels::RowStatus;
using kernels::TopPMode;

constexpr float kInf = std::numeric_limits<float>::infinity();

// One parameter row as the engine writes it.
struct EngineParams {
  uint64_t seed = 0;
  uint64_t position = 0;
  float temperature = 1.0f;
  int32_t top_k = 0;
  float top_p = 1.0f;
  float min_p = 0.0f;
  int32_t top_p_mode = 0;
};

// The engine's side of one session: the five (six) buffers in aligned host memory.
class Engine {
 public:
  Engine(uint32_t max_batch, uint32_t vocab, bool logprobs) : max_batch_(max_batch), vocab_(vocab) {
    control_ = Alloc(SAMPLERD_CONTROL_BYTES);
    logits_ = static_cast<float*>(Alloc(sizeof(float) * max_batch * vocab));
    params_ = static_cast<uint8_t*>(Alloc(samplerd_params_bytes(max_batch)));
    tokens_ = static_cast<int32_t*>(Alloc(4 * max_batch));
    status_ = static_cast<int32_t*>(Alloc(4 * max_batch));
    if (logprobs) logprobs_ = static_cast<float*>(Alloc(4 * max_batch));
  }
  ~Engine() {
    for (void* p : allocations_) std::free(p);
  }

  SessionSpec Spec() const {
    SessionSpec spec;
    spec.id = "test";
    spec.plane = SessionPlane::kHost;
    spec.dtype = kernels::DType::kFp32;
    spec.max_batch = max_batch_;
    spec.vocab = vocab_;
    spec.row_stride = vocab_;
    spec.control = static_cast<uint8_t*>(control_);
    spec.logits = logits_;
    spec.params = params_;
    spec.token_ids = tokens_;
    spec.row_status = status_;
    spec.sampled_logprobs = logprobs_;
    return spec;
  }

  float* logits() { return logits_; }
  void set_logits(const void* logits) { logits_ = static_cast<float*>(const_cast<void*>(logits)); }
  int32_t* tokens() { return tokens_; }
  int32_t* status() { return status_; }
  float* logprobs() { return logprobs_; }

  void SetParams(uint32_t row, const EngineParams& p) {
    const uint32_t m = max_batch_;
    Put(samplerd_params_seed_offset(m) + 8 * row, p.seed);
    Put(samplerd_params_position_offset(m) + 8 * row, p.position);
    Put(samplerd_params_temperature_offset(m) + 4 * row, p.temperature);
    Put(samplerd_params_top_k_offset(m) + 4 * row, p.top_k);
    Put(samplerd_params_top_p_offset(m) + 4 * row, p.top_p);
    Put(samplerd_params_min_p_offset(m) + 4 * row, p.min_p);
    Put(samplerd_params_top_p_mode_offset(m) + 4 * row, p.top_p_mode);
  }

  uint32_t Word(uint32_t offset) const {
    return __atomic_load_n(reinterpret_cast<const uint32_t*>(Control() + offset), __ATOMIC_ACQUIRE);
  }
  void SetWord(uint32_t offset, uint32_t value) {
    __atomic_store_n(reinterpret_cast<uint32_t*>(Control() + offset), value, __ATOMIC_RELEASE);
  }

  // Steps 1-2 of the protocol (the logits and params are already written).
  void Ring(uint32_t batch) {
    SetWord(SAMPLERD_CONTROL_BATCH, batch);
    SetWord(SAMPLERD_CONTROL_DOORBELL, SAMPLERD_RING);
  }

  // Steps 3-4: waits up to `timeout` for done, then resets it. False on timeout.
  bool WaitDone(std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (Word(SAMPLERD_CONTROL_DONE) != SAMPLERD_DONE) {
      if (std::chrono::steady_clock::now() > deadline) return false;
      std::this_thread::yield();
    }
    SetWord(SAMPLERD_CONTROL_DONE, 0);
    return true;
  }

 private:
  void* Alloc(size_t bytes) {
    void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    std::memset(p, 0, bytes);
    allocations_.push_back(p);
    return p;
  }
  uint8_t* Control() const { return static_cast<uint8_t*>(control_); }
  template <typename T>
  void Put(uint64_t offset, T value) {
    std::memcpy(params_ + offset, &value, sizeof(T));
  }

  uint32_t max_batch_;
  uint32_t vocab_;
  std::vector<void*> allocations_;
  void* control_;
  float* logits_;
  uint8_t* params_;
  int32_t* tokens_;
  int32_t* status_;
  float* logprobs_ = nullptr;
};

RowParams ToRowParams(const EngineParams& p) {
  RowParams r;
  r.seed = p.seed;
  r.position = p.position;
  r.temperature = p.temperature;
  r.top_k = p.top_k;
  r.top_p = p.top_p;
  r.min_p = p.min_p;
  r.top_p_mode = p.top_p_mode == 2 ? TopPMode::kJoint : TopPMode::kTopKFirst;
  return r;
}

// The oracle's outputs for rows [0, batch) of `logits`.
struct Oracle {
  std::vector<int32_t> tokens;
  std::vector<RowStatus> status;
  std::vector<float> logprobs;
};

Oracle RunOracle(const float* logits, uint32_t batch, uint32_t vocab,
                 const std::vector<RowParams>& params, bool logprobs) {
  Oracle out;
  out.tokens.assign(batch, -2);
  out.status.assign(batch, RowStatus::kOk);
  out.logprobs.assign(batch, 0.0f);
  kernels::SampleArgs args;
  args.logits = logits;
  args.batch = batch;
  args.vocab = vocab;
  args.row_stride = vocab;
  args.params = params.data();
  args.params_count = batch;
  args.token_ids = out.tokens.data();
  args.status = out.status.data();
  if (logprobs) {
    args.top_logprobs = 0;
    args.sampled_logprob = out.logprobs.data();
  }
  kernels::CpuSampleRows(args, 0, batch);
  return out;
}

// True when tokens a and b of a filtered row score within float rounding of each other, so that
// either may win the Gumbel-max draw depending on summation order (a near-tie).
bool NearTie(const float* x, const RowParams& p, int32_t a, int32_t b) {
  if (a < 0 || b < 0) return false;
  const float sa = x[a] / p.temperature + kernels::GumbelNoise(p.seed, p.position, a);
  const float sb = x[b] / p.temperature + kernels::GumbelNoise(p.seed, p.position, b);
  return std::fabs(sa - sb) <= 1e-5f * std::fmax(1.0f, std::fabs(sa));
}

HostPlaneOptions TestOptions() {
  HostPlaneOptions options;
  options.threads = 2;
  options.spin_us = 2000;
  options.sleep_us = 50;
  return options;
}

TEST(HostPlaneTest, AThousandStepsMatchTheCpuOracle) {
  constexpr uint32_t kMaxBatch = 8;
  constexpr uint32_t kVocab = 1000;
  Engine engine(kMaxBatch, kVocab, /*logprobs=*/false);
  auto runner = StartHostPlane(engine.Spec(), TestOptions(), nullptr);
  ASSERT_TRUE(runner.ok()) << runner.status();

  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  const EngineParams settings[] = {
      {0, 0, 0.0f},                      // greedy
      {0, 0, 1.0f},                      // temperature only
      {0, 0, 0.8f, 50, 0.9f, 0.0f, 0},   // top-k + top-p
      {0, 0, 1.0f, 0, 0.95f, 0.0f, 0},   // top-p
      {0, 0, 0.7f, 0, 1.0f, 0.1f, 0},    // min-p
      {0, 0, 1.0f, 20, 0.8f, 0.05f, 2},  // joint
      {0, 0, 1.0f, 1, 1.0f, 0.0f, 1},    // top-k 1
  };
  int greedy_rows = 0;
  int differences = 0;
  for (int step = 0; step < 1000; ++step) {
    const uint32_t batch = 1 + rng() % kMaxBatch;
    std::vector<RowParams> params(batch);
    for (uint32_t i = 0; i < batch; ++i) {
      EngineParams p = settings[rng() % std::size(settings)];
      p.seed = rng();
      p.position = static_cast<uint64_t>(step);
      engine.SetParams(i, p);
      params[i] = ToRowParams(p);
      for (uint32_t j = 0; j < kVocab; ++j) engine.logits()[i * kVocab + j] = normal(rng);
      if (step % 97 == 0 && i == 0) engine.logits()[3] = kInf;  // a +inf token now and then
    }
    engine.Ring(batch);
    ASSERT_TRUE(engine.WaitDone()) << "step " << step;
    ASSERT_EQ(engine.Word(SAMPLERD_CONTROL_STEP_STATUS), SAMPLERD_STEP_OK);
    ASSERT_EQ(engine.Word(SAMPLERD_CONTROL_STEPS_DONE), static_cast<uint32_t>(step + 1));
    const Oracle oracle = RunOracle(engine.logits(), batch, kVocab, params, false);
    for (uint32_t i = 0; i < batch; ++i) {
      ASSERT_EQ(engine.status()[i], SAMPLERD_ROW_OK) << "step " << step << " row " << i;
      if (params[i].temperature < kernels::kGreedyTemperature) {
        ++greedy_rows;
        ASSERT_EQ(engine.tokens()[i], oracle.tokens[i]) << "step " << step << " row " << i;
      } else if (kernels::IsPlainTemperature(params[i], kVocab)) {
        // The inverse-CDF draw: the fast sampler defers to the oracle wherever it could differ.
        ASSERT_EQ(engine.tokens()[i], oracle.tokens[i]) << "step " << step << " row " << i;
      } else if (engine.tokens()[i] != oracle.tokens[i]) {
        ++differences;
        EXPECT_TRUE(
            NearTie(engine.logits() + i * kVocab, params[i], engine.tokens()[i], oracle.tokens[i]))
            << "step " << step << " row " << i;
      }
    }
  }
  EXPECT_GT(greedy_rows, 100);
  EXPECT_LE(differences, 5);
  EXPECT_EQ((*runner)->steps(), 1000u);
}

TEST(HostPlaneTest, AnInvalidParamsRowGetsStatusFourAndLeavesItsNeighboursAlone) {
  Engine engine(4, 100, /*logprobs=*/true);
  auto runner = StartHostPlane(engine.Spec(), TestOptions(), nullptr);
  ASSERT_TRUE(runner.ok()) << runner.status();
  std::mt19937 rng(3);
  for (int j = 0; j < 300; ++j) engine.logits()[j] = static_cast<float>(rng() % 1000) / 100.0f;
  const EngineParams good{7, 1, 0.9f, 10, 0.9f};
  const EngineParams bad_rows[] = {
      {7, 1, -1.0f},
      {7, 1, kInf},
      {7, 1, 1.0f, -2},
      {7, 1, 1.0f, 0, 0.0f},
      {7, 1, 1.0f, 0, 1.5f},
      {7, 1, 1.0f, 0, 1.0f, 2.0f},
      {7, 1, 1.0f, 0, 1.0f, 0.0f, 3},
  };
  for (const EngineParams& bad : bad_rows) {
    engine.SetParams(0, good);
    engine.SetParams(1, bad);
    engine.SetParams(2, good);
    engine.Ring(3);
    ASSERT_TRUE(engine.WaitDone());
    EXPECT_EQ(engine.Word(SAMPLERD_CONTROL_STEP_STATUS), SAMPLERD_STEP_OK);
    EXPECT_EQ(engine.status()[1], SAMPLERD_ROW_INVALID_PARAMS);
    EXPECT_EQ(engine.tokens()[1], -1);
    EXPECT_EQ(engine.logprobs()[1], -kInf);
    const std::vector<RowParams> params(3, ToRowParams(good));
    const Oracle oracle = RunOracle(engine.logits(), 3, 100, params, true);
    for (int i : {0, 2}) {
      EXPECT_EQ(engine.status()[i], SAMPLERD_ROW_OK);
      EXPECT_EQ(engine.tokens()[i], oracle.tokens[i]);
      EXPECT_EQ(engine.logprobs()[i], oracle.logprobs[i]);
    }
  }
}

TEST(HostPlaneTest, ABatchOfZeroOrAboveMaxBatchIsABadBatch) {
  Engine engine(4, 10, /*logprobs=*/false);
  auto runner = StartHostPlane(engine.Spec(), TestOptions(), nullptr);
  ASSERT_TRUE(runner.ok()) << runner.status();
  engine.SetParams(0, EngineParams{});
  for (uint32_t batch : {0u, 5u, 1000000u}) {
    engine.tokens()[0] = 12345;
    engine.Ring(batch);
    ASSERT_TRUE(engine.WaitDone());
    EXPECT_EQ(engine.Word(SAMPLERD_CONTROL_STEP_STATUS), SAMPLERD_STEP_BAD_BATCH) << batch;
    EXPECT_EQ(engine.tokens()[0], 12345) << "nothing is sampled";
  }
  engine.Ring(1);  // and the session goes on
  ASSERT_TRUE(engine.WaitDone());
  EXPECT_EQ(engine.Word(SAMPLERD_CONTROL_STEP_STATUS), SAMPLERD_STEP_OK);
  EXPECT_EQ((*runner)->steps(), 4u);
}

TEST(HostPlaneTest, StopReleasesAWaitingEngineWithAborted) {
  Engine engine(2, 10, /*logprobs=*/false);
  auto runner = StartHostPlane(engine.Spec(), TestOptions(), nullptr);
  ASSERT_TRUE(runner.ok()) << runner.status();
  std::atomic<bool> released{false};
  std::thread waiter([&] { released = engine.WaitDone(std::chrono::seconds(1)); });
  (*runner)->Stop();
  waiter.join();
  EXPECT_TRUE(released);
  EXPECT_EQ(engine.Word(SAMPLERD_CONTROL_STEP_STATUS), SAMPLERD_STEP_ABORTED);
}

TEST(HostPlaneTest, StopWhenIdleIsQuickAndIdempotent) {
  Engine engine(2, 10, /*logprobs=*/false);
  HostPlaneOptions options = TestOptions();
  options.spin_us = 0;  // already sleeping between polls
  options.sleep_us = 1000;
  auto runner = StartHostPlane(engine.Spec(), options, nullptr);
  ASSERT_TRUE(runner.ok()) << runner.status();
  const auto start = std::chrono::steady_clock::now();
  (*runner)->Stop();
  (*runner)->Stop();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(100));
  EXPECT_EQ(engine.Word(SAMPLERD_CONTROL_DONE), SAMPLERD_DONE);
  EXPECT_EQ(engine.Word(SAMPLERD_CONTROL_STEP_STATUS), SAMPLERD_STEP_ABORTED);
  runner->reset();  // destruction after Stop is fine
}

TEST(HostPlaneTest, ASpecForTheGpuPlaneIsRejected) {
  Engine engine(2, 10, /*logprobs=*/false);
  SessionSpec spec = engine.Spec();
  spec.plane = SessionPlane::kGpu;
  auto runner = StartHostPlane(std::move(spec), TestOptions(), nullptr);
  EXPECT_EQ(runner.status().code(), absl::StatusCode::kInvalidArgument);
  spec = engine.Spec();
  spec.row_stride = 5;
  EXPECT_EQ(StartHostPlane(std::move(spec), TestOptions(), nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Truncates `shm` to 0 bytes, rings a step of `batch` rows and waits up to 10 s for the
// runner's fault callback to count one fault.
::testing::AssertionResult TruncateAndRing(const TestShm& shm, Engine& engine, uint32_t batch,
                                           const std::atomic<int>& faults) {
  const int fd = shm_open(shm.key().c_str(), O_RDWR, 0);
  if (fd < 0 || ftruncate(fd, 0) != 0) return ::testing::AssertionFailure() << "truncate failed";
  close(fd);
  engine.Ring(batch);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (faults.load(std::memory_order_acquire) == 0 &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::yield();
  }
  const int n = faults.load(std::memory_order_acquire);
  if (n == 1) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "expected 1 fault within 10 s, got " << n;
}

TEST(HostPlaneTest, ATruncatedShmRegionFaultsTheRunnerWithoutACrash) {
  constexpr uint32_t kVocab = 4096;
  Engine engine(2, kVocab, /*logprobs=*/false);
  TestShm shm(2 * kVocab * sizeof(float));
  ASSERT_TRUE(shm.ok());
  std::memset(shm.data(), 0, shm.size());
  engine.set_logits(shm.data());
  std::atomic<int> faults{0};
  absl::Status fault;
  auto runner = StartHostPlane(engine.Spec(), TestOptions(), [&](const absl::Status& status) {
    fault = status;
    faults.fetch_add(1, std::memory_order_release);
  });
  ASSERT_TRUE(runner.ok()) << runner.status();
  engine.SetParams(0, EngineParams{1, 2, 1.0f});
  engine.SetParams(1, EngineParams{1, 2, 0.0f});
  engine.Ring(2);  // a good step first
  ASSERT_TRUE(engine.WaitDone());
  EXPECT_EQ(engine.Word(SAMPLERD_CONTROL_STEP_STATUS), SAMPLERD_STEP_OK);

  ASSERT_TRUE(TruncateAndRing(shm, engine, 2, faults));
  EXPECT_EQ(fault.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(fault.message().find("truncated a host shm region"), std::string::npos);
  (*runner)->Stop();  // the owner ends the session: the engine's wait completes
  EXPECT_TRUE(engine.WaitDone(std::chrono::seconds(1)));
  EXPECT_EQ(engine.Word(SAMPLERD_CONTROL_STEP_STATUS), SAMPLERD_STEP_ABORTED);
}

// A bus error in a guarded task used to jump out of the oracle's CpuSampleRows (the path of
// sessions with logprobs, a bitmask or processors) past its RowScratch, leaking ~14 vocab-sized
// vectors per task: a client that truncates its shm under a step, reopens and repeats grew the
// server by ~12 MB a fault at V = 262,144 (hundreds of MB at the default max_vocab).
TEST(HostPlaneTest, ATruncatedShmRegionUnderTheOracleLeaksNothing) {
  constexpr uint32_t kVocab = 65536;
  constexpr int kFaults = 6;
  Engine engine(2, kVocab, /*logprobs=*/true);
  engine.SetParams(0, EngineParams{1, 2, 1.0f});
  engine.SetParams(1, EngineParams{3, 4, 0.7f, 50});
  auto in_use = [] {
    const struct mallinfo2 m = mallinfo2();
    return static_cast<int64_t>(m.uordblks + m.hblkhd);
  };
  int64_t before = 0;
  for (int i = 0; i <= kFaults; ++i) {
    if (i == 1) before = in_use();  // after one round: lazily grown state of the process
    TestShm shm(2 * kVocab * sizeof(float));
    ASSERT_TRUE(shm.ok());
    std::memset(shm.data(), 0, shm.size());
    engine.set_logits(shm.data());
    std::atomic<int> faults{0};
    auto runner = StartHostPlane(engine.Spec(), TestOptions(), [&](const absl::Status&) {
      faults.fetch_add(1, std::memory_order_release);
    });
    ASSERT_TRUE(runner.ok()) << runner.status();
    engine.Ring(2);
    ASSERT_TRUE(engine.WaitDone());
    ASSERT_EQ(engine.Word(SAMPLERD_CONTROL_STEP_STATUS), SAMPLERD_STEP_OK);
    ASSERT_TRUE(TruncateAndRing(shm, engine, 2, faults));
    (*runner)->Stop();
    EXPECT_TRUE(engine.WaitDone(std::chrono::seconds(1)));
    runner->reset();
  }
  const int64_t grown = in_use() - before;
  // One leaked task alone holds > 1 MB at this V (x, z, order: 3 x 256 KiB; doubles: 512 KiB).
  EXPECT_LT(grown, 1 << 20) << "bytes in use grew by " << grown << " over " << kFaults << " faults";
}

// The session's copy of a step's logits (max_batch x V elements) is allocated when the runner
// starts. It was allocated at the first full step instead, on the poller thread, where
// std::bad_alloc ended the server: an engine opened M = 2,048, V = 4,194,304 (32 GiB) over a
// sparse shm object, rang once, and the server aborted. Now the start fails with
// RESOURCE_EXHAUSTED. (Sanitizer allocators do not throw std::bad_alloc for this: skipped.)
TEST(HostPlaneTest, AStepCopyThatCannotBeAllocatedFailsTheStartNotTheServer) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "sanitizer allocators abort instead of throwing std::bad_alloc";
#endif
  Engine engine(1, 16, /*logprobs=*/false);
  SessionSpec spec = engine.Spec();
  spec.max_batch = 0xffffffffu;  // x V x 4 bytes = 2^56: no address space holds it
  spec.vocab = 1u << 22;
  spec.row_stride = spec.vocab;
  auto runner = StartHostPlane(std::move(spec), TestOptions(), nullptr);
  ASSERT_FALSE(runner.ok());
  EXPECT_EQ(runner.status().code(), absl::StatusCode::kResourceExhausted) << runner.status();
  EXPECT_NE(runner.status().message().find("copy of a step's logits"), std::string::npos)
      << runner.status();
}

}  // namespace
}  // namespace samplerd::core
