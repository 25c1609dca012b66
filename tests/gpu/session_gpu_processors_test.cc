// The GPU plane with logits processors (a token_bitmask and a processors buffer in device
// memory, device_session.h): every step's tokens and statuses equal kernels::gpu::Sample run
// directly on the same rows with the bitmask and the adjusts that the host merges from the same
// bytes (kernels/common/session_processors.h on the CPU); rows with nothing allowed get status
// 5; a row whose processors break a rule gets status 4 and token -1 from the device's checks,
// and its neighbours are sampled as usual. Skips without a GPU (the fixture).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "kernels/common/session_processors.h"
#include "tests/gpu/session_gpu_fixture.h"

namespace samplerd::core::gpu_plane_testing {
namespace {

constexpr uint32_t kMaxBatch = 10;
constexpr int64_t kVocab = 20000;
constexpr uint32_t kWords = (kVocab + 31) / 32;
constexpr uint32_t kNb = kMaxBatch * 8;
constexpr uint32_t kNh = kMaxBatch * 96;

// One step's processors as the engine writes them: the bitmask words [M, W] and the processors
// buffer of device_session.h, rows packed one after the other.
struct StepProcessors {
  std::vector<uint32_t> mask = std::vector<uint32_t>(kMaxBatch * kWords, 0);
  std::vector<uint8_t> buffer =
      std::vector<uint8_t>(samplerd_processors_bytes(kMaxBatch, kNb, kNh));

  template <typename T>
  void Put(uint64_t offset, T v) {
    std::memcpy(buffer.data() + offset, &v, sizeof(T));
  }
};

// Random processors for rows [0, batch): row 0 allows one token, row 1 none (batch >= 3), the
// rest random masks; up to 8 bias entries (+-inf among them) and 96 history entries a row.
StepProcessors RandomProcessors(std::mt19937_64& rng, uint32_t batch) {
  StepProcessors s;
  const uint32_t m = kMaxBatch;
  const double density = std::vector<double>{0.02, 0.3, 0.9}[rng() % 3];
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  uint32_t b = 0, h = 0;
  for (uint32_t r = 0; r <= m; ++r) {
    s.Put(samplerd_processors_bias_offsets_offset(m) + 4 * r, b);
    s.Put(samplerd_processors_history_offsets_offset(m, kNb) + 4 * r, h);
    if (r == m) break;
    uint32_t* words = s.mask.data() + r * kWords;
    if (r == 0) {
      const int64_t only = static_cast<int64_t>(rng() % kVocab);
      words[only / 32] = 1u << (only % 32);
    } else if (!(r == 1 && batch >= 3)) {
      for (int64_t t = 0; t < kVocab; ++t) {
        if (unit(rng) < density) words[t / 32] |= 1u << (t % 32);
      }
    }
    s.Put(samplerd_processors_repetition_offset(m) + 4 * r, static_cast<float>(0.5 + unit(rng)));
    s.Put(samplerd_processors_presence_offset(m) + 4 * r, static_cast<float>(2 * unit(rng) - 1));
    s.Put(samplerd_processors_frequency_offset(m) + 4 * r, static_cast<float>(2 * unit(rng) - 1));
    std::map<int32_t, float> bias;
    const int biases = 1 + static_cast<int>(rng() % 8);
    for (int i = 0; i < biases; ++i) {
      const uint64_t kind = rng() % 6;
      bias[static_cast<int32_t>(rng() % kVocab)] = kind == 0 ? -kInf
                                                   : kind == 1
                                                       ? kInf
                                                       : static_cast<float>(6 * unit(rng) - 3);
    }
    for (const auto& [token, value] : bias) {
      s.Put(samplerd_processors_bias_tokens_offset(m) + 4 * b, token);
      s.Put(samplerd_processors_biases_offset(m, kNb) + 4 * b, value);
      ++b;
    }
    std::map<int32_t, uint32_t> history;
    const int entries = 1 + static_cast<int>(rng() % 96);
    for (int i = 0; i < entries; ++i) history[static_cast<int32_t>(rng() % kVocab)] = rng() % 4;
    for (const auto& [token, count] : history) {
      s.Put(samplerd_processors_history_tokens_offset(m, kNb) + 4 * h, token);
      s.Put(samplerd_processors_output_counts_offset(m, kNb, kNh) + 4 * h, count);
      s.buffer[samplerd_processors_in_prompt_offset(m, kNb, kNh) + h] =
          static_cast<uint8_t>(rng() % 2);
      ++h;
    }
  }
  return s;
}

// Breaks one rule in row `row` (which has bias and history entries).
void BreakRow(StepProcessors& s, uint32_t row, uint64_t rule) {
  const uint32_t m = kMaxBatch;
  uint32_t b0, h0;
  std::memcpy(&b0, s.buffer.data() + samplerd_processors_bias_offsets_offset(m) + 4 * row, 4);
  std::memcpy(&h0, s.buffer.data() + samplerd_processors_history_offsets_offset(m, kNb) + 4 * row,
              4);
  switch (rule % 6) {
    case 0:
      s.Put(samplerd_processors_repetition_offset(m) + 4 * row, 0.0f);
      break;
    case 1:
      s.Put(samplerd_processors_presence_offset(m) + 4 * row, kNaN);
      break;
    case 2:
      s.Put(samplerd_processors_frequency_offset(m) + 4 * row, 2.5f);
      break;
    case 3:
      s.Put(samplerd_processors_bias_tokens_offset(m) + 4 * b0, static_cast<int32_t>(kVocab));
      break;
    case 4:
      s.Put(samplerd_processors_biases_offset(m, kNb) + 4 * b0, kNaN);
      break;
    default:
      s.buffer[samplerd_processors_in_prompt_offset(m, kNb, kNh) + h0] = 2;
      break;
  }
}

TEST_F(GpuPlaneTest, ProcessorsMatchTheKernelsOnTheMergedRowsAndABadRowIsStatusFour) {
  EngineSide engine(kMaxBatch, kVocab, kVocab, DType::kFp32, /*logprobs=*/false);
  void* mask = nullptr;
  void* procs = nullptr;
  const size_t procs_bytes = samplerd_processors_bytes(kMaxBatch, kNb, kNh);
  ASSERT_EQ(gpu::DeviceMalloc(&mask, kMaxBatch * kWords * 4), 0);
  ASSERT_EQ(gpu::DeviceMalloc(&procs, procs_bytes), 0);
  gpu::Stream stream = nullptr;
  ASSERT_EQ(gpu::StreamCreate(&stream), 0);
  SessionSpec spec = engine.Spec("processors");
  spec.token_bitmask = static_cast<const uint32_t*>(mask);
  spec.processors = static_cast<const uint8_t*>(procs);
  spec.logit_bias_capacity = kNb;
  spec.token_history_capacity = kNh;
  auto runner = StartGpuPlane(std::move(spec), GpuPlaneOptions{}, [this](const absl::Status& s) {
    std::lock_guard<std::mutex> lock(fault_mu_);
    fault_ = s.ToString();
  });
  ASSERT_TRUE(runner.ok()) << runner.status();

  std::mt19937_64 rng(2024);
  int bad = 0, no_allowed = 0, rejected = 0, compared = 0;
  for (int step = 0; step < 120 && bad < 10; ++step) {
    const uint32_t batch = 1 + static_cast<uint32_t>(rng() % kMaxBatch);
    std::vector<EngineRow> rows;
    for (uint32_t i = 0; i < batch; ++i) rows.push_back(RandomRow(rng, false));
    const std::vector<uint8_t> bytes = RandomLogits(DType::kFp32, batch, kVocab, kVocab, rng);
    StepProcessors p = RandomProcessors(rng, batch);
    const uint32_t broken = step % 3 == 2 ? static_cast<uint32_t>(rng() % batch) : kMaxBatch;
    if (broken < kMaxBatch) BreakRow(p, broken, rng());
    ASSERT_EQ(gpu::CopyToDevice(mask, p.mask.data(), p.mask.size() * 4, stream), 0);
    ASSERT_EQ(gpu::CopyToDevice(procs, p.buffer.data(), procs_bytes, stream), 0);
    ASSERT_EQ(gpu::StreamSynchronize(stream), 0);
    engine.WriteInputs(bytes, rows);
    engine.Ring(batch);
    engine.WaitDone();
    ASSERT_TRUE(engine.Finish(kStepLimit)) << "step " << step;
    ASSERT_EQ(engine.ControlWord(SAMPLERD_CONTROL_STEP_STATUS), SAMPLERD_STEP_OK);

    // The reference: the kernels on the rows, with the adjusts merged on the host.
    const kernels::SessionProcessors view =
        kernels::ResolveSessionProcessors(p.buffer.data(), kMaxBatch, kNb, kNh);
    Batch ref = ReferenceBatch(DType::kFp32, kVocab, kVocab, bytes, rows, false);
    ref.greedy_hint = false;  // the session runs the general kernels
    ref.bitmask.assign(p.mask.begin(), p.mask.begin() + batch * kWords);
    ref.adjust_offsets.push_back(0);
    std::vector<bool> valid(batch);
    for (uint32_t i = 0; i < batch; ++i) {
      valid[i] = kernels::SessionRowValid(view, i, kVocab);
      if (valid[i]) {
        const size_t at = ref.adjusts.size();
        ref.adjusts.resize(at + kernels::MergeSessionRow(view, i, nullptr));
        kernels::MergeSessionRow(view, i, ref.adjusts.data() + at);
      }
      ref.adjust_offsets.push_back(static_cast<uint32_t>(ref.adjusts.size()));
    }
    EXPECT_EQ(valid[broken < batch ? broken : 0], broken >= batch) << "step " << step;
    const Outputs want = kernels::testing::RunGpu(ref);
    for (uint32_t i = 0; i < batch; ++i) {
      const int32_t want_status =
          valid[i] ? static_cast<int32_t>(want.status[i]) + 1 : SAMPLERD_ROW_INVALID_PARAMS;
      const int32_t want_token = valid[i] ? want.tokens[i] : -1;
      if (engine.tokens[i] != want_token || engine.status[i] != want_status) {
        ADD_FAILURE() << "step " << step << " row " << i << "/" << batch << ": expected token "
                      << want_token << " status " << want_status << ", got " << engine.tokens[i]
                      << " status " << engine.status[i];
        ++bad;
      }
      no_allowed += engine.status[i] == SAMPLERD_ROW_INVALID_NO_ALLOWED;
      rejected += engine.status[i] == SAMPLERD_ROW_INVALID_PARAMS;
      ++compared;
    }
    if (batch >= 3 && broken != 1) {
      EXPECT_EQ(engine.status[1], SAMPLERD_ROW_INVALID_NO_ALLOWED) << "step " << step;
    }
  }
  (*runner)->Stop();
  EXPECT_EQ(bad, 0);
  EXPECT_GT(no_allowed, 10);
  EXPECT_GT(rejected, 10);
  EXPECT_GT(compared, 300);
  gpu::DeviceFree(mask);
  gpu::DeviceFree(procs);
  gpu::StreamDestroy(stream);
}

}  // namespace
}  // namespace samplerd::core::gpu_plane_testing
