// samplerd::DeviceSession (C++ client) on the GPU plane with logits processors, against a
// samplerd on the GPU backend (issue 13): this process plays the engine. It allocates the
// session's data buffers in one device allocation laid out by ComputeDeviceSessionLayout
// (logits, params, token_ids, row_status, token_bitmask, processors), exports it with an IPC
// memory handle, opens the session with plane = kGpu, and per step enqueues on its own stream the
// copies of the logits, the parameters, the bitmask and the packed processors, then
// EnqueueStep, then the copies of the outputs back. Every token and row status must equal the
// same server's unary Sample of the same logits with the same processors set inline by
// samplerd/processors.h: greedy and seeded rows alike (the server runs the same kernels for
// both). Masks with one allowed token and with none (status 5), logit bias with -inf, the three
// penalties on random histories, B from 1 to max_batch. A processors buffer broken in one row
// gives that row status 4 and token -1, its neighbours equal unary.
//
// The host-plane twin against a CPU server is tests/integration/
// cpp_device_session_processors_test.cc. Run by tests/gpu/run_on_gpu.sh (step cpp_session),
// which names the GPU server in SAMPLERD_TEST_GPU_SERVER; without it, or without a GPU visible
// here, every test skips. GPU calls go through kernels/gpu/runtime.h (the CUDA or HIP runtime),
// so this file compiles with the host compiler.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "samplerd/device_session.h"
#include "samplerd/processors.h"
#include "tests/gpu/ipc_raw_util.h"

namespace samplerd::ipc_test {
namespace {

constexpr char kGpuEnv[] = "SAMPLERD_TEST_GPU_SERVER";
constexpr uint32_t kMaxBatch = 16;
// Not a multiple of 32: the last bitmask word of a row has bits past V (left clear here).
constexpr uint32_t kVocab = 50021;
constexpr int64_t kWords = (kVocab + 31) / 32;
constexpr uint32_t kBiasCapacity = kMaxBatch * 8;
constexpr uint32_t kHistoryCapacity = kMaxBatch * 240;  // 239 distinct tokens a row at most

std::string Env(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? std::string() : std::string(value);
}

std::string Code(const grpc::Status& s) {
  return std::to_string(s.error_code()) + " (" + s.error_message() + ")";
}

// The options of every session here; `device` is the GPU's bus id, gpu buffers set by the
// fixture.
DeviceSessionOptions ProcessorOptions() {
  DeviceSessionOptions options;
  options.max_batch = kMaxBatch;
  options.vocab = kVocab;
  options.plane = SessionPlane::kGpu;
  options.gpu_runtime = GpuRuntime::kAuto;
  options.token_bitmask = true;
  options.processors = true;
  options.logit_bias_capacity = kBiasCapacity;
  options.token_history_capacity = kHistoryCapacity;
  return options;
}

// One step: logits, per-row parameters and processors.
struct Step {
  int64_t batch = 0;
  std::vector<float> logits;               // [batch, kVocab]
  std::vector<v1::SamplingParams> params;  // batch rows, temperature always set
  std::vector<int32_t> mask;               // [batch, kWords]
  SessionProcessorRows rows;               // batch rows of each vector
};

// Row r's sampling parameters at `step`: greedy, T 0.8, top-k 50 + top-p 0.9, min-p 0.1 and
// top-k 20 in turn (seeded, never seed 0), position = step.
v1::SamplingParams RowParams(int64_t r, int step) {
  v1::SamplingParams p;
  switch ((r + step) % 5) {
    case 0:
      p.set_temperature(0.0f);
      break;
    case 1:
      p.set_temperature(0.8f);
      break;
    case 2:
      p.set_temperature(0.8f);
      p.set_top_k(50);
      p.set_top_p(0.9f);
      break;
    case 3:
      p.set_temperature(1.0f);
      p.set_min_p(0.1f);
      break;
    default:
      p.set_temperature(1.0f);
      p.set_top_k(20);
      break;
  }
  p.set_seed(1000 + 7919 * static_cast<uint64_t>(r) + static_cast<uint64_t>(step));
  p.set_position(static_cast<uint64_t>(step));
  return p;
}

// A random step of `batch` rows: N(0, 3^2) logits; row 0 allows one token, row 1 none (B >= 2),
// the others random masks of density 1/10, 1/2 or 9/10; up to 8 biases a row, the first -inf;
// repetition in [0.5, 2), presence and frequency in [-1.5, 1.5); histories of 0..119 prompt and
// output tokens (with repeats).
Step RandomStep(int64_t batch, int step, std::mt19937& rng) {
  Step s;
  s.batch = batch;
  std::normal_distribution<float> normal(0.0f, 3.0f);
  s.logits.resize(static_cast<size_t>(batch) * kVocab);
  for (float& x : s.logits) x = normal(rng);
  s.mask.assign(static_cast<size_t>(batch * kWords), 0);
  for (int64_t r = 0; r < batch; ++r) {
    s.params.push_back(RowParams(r, step));
    int32_t* words = s.mask.data() + r * kWords;
    if (r == 0) {
      const uint32_t only = rng() % kVocab;
      words[only / 32] = static_cast<int32_t>(1u << (only % 32));
    } else if (r != 1) {
      const uint32_t tenths = (rng() % 3 == 0) ? 1 : (rng() % 2 == 0 ? 5 : 9);
      for (uint32_t t = 0; t < kVocab; ++t) {
        if (rng() % 10 < tenths) words[t / 32] |= static_cast<int32_t>(1u << (t % 32));
      }
    }
    TokenBias bias;
    const int entries = static_cast<int>(rng() % 9);
    for (int i = 0; i < entries; ++i) {
      bias[static_cast<int32_t>(rng() % kVocab)] =
          i == 0 ? -INFINITY : static_cast<float>(rng() % 600) / 100.0f - 3.0f;
    }
    s.rows.logit_bias.push_back(bias);
    std::vector<int32_t> prompt, output;
    const int prompt_length = static_cast<int>(rng() % 120);
    const int output_length = static_cast<int>(rng() % 120);
    // Tokens from [0, window): a small window makes repeats (output counts above 1).
    const uint32_t window = 1 + rng() % kVocab;
    for (int i = 0; i < prompt_length; ++i) {
      prompt.push_back(static_cast<int32_t>(rng() % window));
    }
    for (int i = 0; i < output_length; ++i) {
      output.push_back(static_cast<int32_t>(rng() % window));
    }
    s.rows.prompt_token_ids.push_back(prompt);
    s.rows.output_token_ids.push_back(output);
    s.rows.repetition_penalty.push_back(0.5f + static_cast<float>(rng() % 150) / 100.0f);
    s.rows.presence_penalty.push_back(static_cast<float>(rng() % 300) / 100.0f - 1.5f);
    s.rows.frequency_penalty.push_back(static_cast<float>(rng() % 300) / 100.0f - 1.5f);
  }
  return s;
}

// The unary request of the same step: logits inline, the penalties in SamplingParams, the
// bitmask, bias and histories set by samplerd/processors.h.
v1::SampleRequest UnaryRequest(const Step& s) {
  std::vector<v1::SamplingParams> rows = s.params;
  for (size_t r = 0; r < rows.size(); ++r) {
    rows[r].set_repetition_penalty(s.rows.repetition_penalty[r]);
    rows[r].set_presence_penalty(s.rows.presence_penalty[r]);
    rows[r].set_frequency_penalty(s.rows.frequency_penalty[r]);
  }
  v1::SampleRequest request = MakeFp32Request(s.logits.data(), s.batch, kVocab, rows);
  SetTokenBitmask(s.mask.data(), s.batch, kVocab, &request);
  EXPECT_TRUE(SetLogitBias(s.rows.logit_bias, &request).ok());
  EXPECT_TRUE(SetTokenHistory(s.rows.prompt_token_ids, s.rows.output_token_ids, &request).ok());
  return request;
}

// The per-row parameter arrays of a step, as the session's params buffer holds them.
struct ParamArrays {
  std::vector<uint64_t> seed, position;
  std::vector<float> temperature, top_p, min_p;
  std::vector<int32_t> top_k, top_p_mode;
};

ParamArrays Arrays(const Step& s) {
  ParamArrays a;
  for (const v1::SamplingParams& p : s.params) {
    a.seed.push_back(p.seed());
    a.position.push_back(p.position());
    a.temperature.push_back(p.temperature());
    a.top_k.push_back(p.top_k());
    a.top_p.push_back(p.has_top_p() ? p.top_p() : 1.0f);
    a.min_p.push_back(p.min_p());
    a.top_p_mode.push_back(static_cast<int32_t>(p.top_p_mode()));
  }
  return a;
}

// What one session step left in the output buffers.
struct StepResult {
  std::vector<int32_t> tokens, statuses;
  uint32_t step_status = ~0u;
};

class CppSessionGpuTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string target = Env(kGpuEnv);
    if (target.empty()) {
      skip_ = std::string(kGpuEnv) +
              " is not set: no GPU server to test (tests/gpu/run_on_gpu.sh starts one)";
      return;
    }
    ClientOptions options;
    options.default_deadline = std::chrono::seconds(120);
    client_ = new Client(target, options);
    v1::GetServerInfoResponse info;
    const grpc::Status status = client_->GetServerInfo(&info);
    if (!status.ok() || info.devices_size() == 0 || info.backend() != v1::BACKEND_GPU) {
      skip_ = "the server at " + target + " reports no GPU: " + Code(status) + " " +
              info.ShortDebugString();
      return;
    }
    device_ = info.devices(0).pci_bus_id();
    ordinal_ = OrdinalOf(device_);
    if (ordinal_ < 0) {
      skip_ = "no GPU with bus id " + device_ + " is visible to this process";
      return;
    }
    if (gpu::SetDevice(ordinal_) != 0 || gpu::StreamCreate(&stream_) != 0) {
      skip_ = "cannot use GPU " + device_ + " (ordinal " + std::to_string(ordinal_) + ") here";
      return;
    }
    std::printf("engine pid %d on GPU %s (ordinal %d), server %s\n", static_cast<int>(getpid()),
                device_.c_str(), ordinal_, target.c_str());
  }

  static void TearDownTestSuite() {
    if (stream_ != nullptr) (void)gpu::StreamDestroy(stream_);
    stream_ = nullptr;
    delete client_;
    client_ = nullptr;
  }

  void SetUp() override {
    if (!skip_.empty()) GTEST_SKIP() << skip_;
    ASSERT_EQ(gpu::SetDevice(ordinal_), 0);
    options_ = ProcessorOptions();
    const DeviceSessionLayout layout = ComputeDeviceSessionLayout(options_);
    buffer_ = DeviceBuffer(layout.total_bytes);
    ASSERT_TRUE(buffer_.ok()) << "DeviceMalloc of " << layout.total_bytes << " bytes failed";
    gpu::IpcHandleBytes handle;
    const int code = gpu::IpcGetMemHandle(&handle, buffer_.data());
    ASSERT_EQ(code, 0) << "IpcGetMemHandle: " << gpu::ErrorString(code);
    const std::string handle_bytes = HandleString(handle);
    const auto at = [&](uint64_t offset) {
      return GpuBuffer{buffer_.data() + offset, handle_bytes, offset};
    };
    options_.gpu.device = device_;
    options_.gpu.logits = at(layout.logits);
    options_.gpu.params = at(layout.params);
    options_.gpu.token_ids = at(layout.token_ids);
    options_.gpu.row_status = at(layout.row_status);
    options_.gpu.token_bitmask = at(layout.token_bitmask);
    options_.gpu.processors = at(layout.processors);
    // The engine initialises the GPU plane's buffers: zeros, every token allowed, no processors.
    ASSERT_EQ(gpu::ZeroDevice(buffer_.data(), layout.total_bytes, stream_), 0);
    std::vector<int32_t> all(static_cast<size_t>(kMaxBatch * kWords), -1);
    ASSERT_EQ(gpu::CopyToDevice(buffer_.data() + layout.token_bitmask, all.data(), all.size() * 4,
                                stream_),
              0);
    std::vector<uint8_t> none;
    ASSERT_TRUE(PackSessionProcessors(options_, 0, {}, &none).ok());
    ASSERT_EQ(
        gpu::CopyToDevice(buffer_.data() + layout.processors, none.data(), none.size(), stream_),
        0);
    ASSERT_EQ(gpu::StreamSynchronize(stream_), 0);
    const grpc::Status status = DeviceSession::Open(client_, options_, &session_);
    ASSERT_TRUE(status.ok()) << "DeviceSession::Open: " << Code(status);
    ASSERT_EQ(session_->plane(), SessionPlane::kGpu);
  }

  void TearDown() override {
    if (session_ != nullptr) {
      (void)gpu::StreamSynchronize(stream_);
      const grpc::Status status = session_->Close();
      EXPECT_TRUE(status.ok()) << "Close: " << Code(status);
      session_.reset();
    }
    buffer_.Free();  // after the session unregistered its regions
  }

  // Enqueues step `s` with the processors buffer `packed` on the stream as an engine would
  // (inputs, EnqueueStep, outputs), synchronises, and returns what the step wrote. The output
  // buffers are set to -7 first so that a step that writes nothing shows.
  StepResult RunStep(const Step& s, const std::vector<uint8_t>& packed) {
    StepResult result;
    const size_t b = static_cast<size_t>(s.batch);
    const ParamArrays a = Arrays(s);
    const DeviceSessionParams p = session_->params();
    const std::vector<int32_t> sentinel(b, -7);
    const auto put = [this](void* dst, const void* src, size_t bytes) {
      EXPECT_EQ(gpu::CopyToDevice(dst, src, bytes, stream_), 0) << "CopyToDevice";
    };
    put(session_->logits(), s.logits.data(), s.logits.size() * sizeof(float));
    put(p.seed, a.seed.data(), b * 8);
    put(p.position, a.position.data(), b * 8);
    put(p.temperature, a.temperature.data(), b * 4);
    put(p.top_k, a.top_k.data(), b * 4);
    put(p.top_p, a.top_p.data(), b * 4);
    put(p.min_p, a.min_p.data(), b * 4);
    put(p.top_p_mode, a.top_p_mode.data(), b * 4);
    put(session_->token_bitmask(), s.mask.data(), s.mask.size() * 4);
    put(session_->processors(), packed.data(), packed.size());
    put(session_->token_ids(), sentinel.data(), b * 4);
    put(session_->row_status(), sentinel.data(), b * 4);
    const grpc::Status status = session_->EnqueueStep(stream_, static_cast<int>(s.batch));
    EXPECT_TRUE(status.ok()) << "EnqueueStep: " << Code(status);
    result.tokens.assign(b, -2);
    result.statuses.assign(b, -2);
    if (status.ok()) {
      EXPECT_EQ(gpu::CopyToHost(result.tokens.data(), session_->token_ids(), b * 4, stream_), 0);
      EXPECT_EQ(gpu::CopyToHost(result.statuses.data(), session_->row_status(), b * 4, stream_), 0);
    }
    const int code = gpu::StreamSynchronize(stream_);
    EXPECT_EQ(code, 0) << "StreamSynchronize: " << gpu::ErrorString(code);
    result.step_status = session_->step_status();
    return result;
  }

  static v1::SampleResponse Unary(const Step& s) {
    v1::SampleResponse response;
    const grpc::Status status = client_->Sample(UnaryRequest(s), &response);
    EXPECT_TRUE(status.ok()) << "unary Sample: " << Code(status);
    return response;
  }

  inline static Client* client_ = nullptr;
  inline static std::string skip_;
  inline static std::string device_;
  inline static int ordinal_ = -1;
  inline static gpu::Stream stream_ = nullptr;

  DeviceSessionOptions options_;
  DeviceBuffer buffer_;
  std::unique_ptr<DeviceSession> session_;
};

TEST_F(CppSessionGpuTest, TokensAndStatusesEqualUnarySampleWithTheSameProcessors) {
  std::mt19937 rng(23);
  constexpr int kSteps = 48;
  int rows_checked = 0, mismatches = 0, no_allowed = 0, one_allowed_ok = 0;
  for (int step = 0; step < kSteps; ++step) {
    // Every B in 1..max_batch, then random ones, ending at max_batch.
    const int64_t batch = step < static_cast<int>(kMaxBatch) ? 1 + step
                          : step == kSteps - 1               ? kMaxBatch
                                                             : 1 + rng() % kMaxBatch;
    const Step s = RandomStep(batch, step, rng);
    std::vector<uint8_t> packed;
    const grpc::Status pack =
        PackSessionProcessors(options_, static_cast<int>(batch), s.rows, &packed);
    ASSERT_TRUE(pack.ok()) << "step " << step << ": " << Code(pack);
    const StepResult got = RunStep(s, packed);
    ASSERT_EQ(got.step_status, SAMPLERD_STEP_OK) << "step " << step;
    const v1::SampleResponse unary = Unary(s);
    ASSERT_EQ(unary.token_ids_size(), batch) << "step " << step;
    ASSERT_EQ(unary.row_status_size(), batch) << "step " << step;
    for (int r = 0; r < static_cast<int>(batch); ++r) {
      const size_t i = static_cast<size_t>(r);
      rows_checked += 1;
      if (got.tokens[i] != unary.token_ids(r) || got.statuses[i] != unary.row_status(r)) {
        mismatches += 1;
      }
      EXPECT_EQ(got.tokens[i], unary.token_ids(r))
          << "step " << step << " B " << batch << " row " << r << " ("
          << s.params[i].ShortDebugString() << ")";
      EXPECT_EQ(got.statuses[i], unary.row_status(r)) << "step " << step << " row " << r;
    }
    // Row 0 allows one token: sampled OK it is that token (or the bias / penalties made it
    // -inf: then status 5 in both).
    if (got.statuses[0] == SAMPLERD_ROW_OK) {
      const int32_t t = got.tokens[0];
      ASSERT_GE(t, 0);
      EXPECT_NE(s.mask[static_cast<size_t>(t / 32)] & static_cast<int32_t>(1u << (t % 32)), 0)
          << "step " << step << ": row 0 sampled a token its mask does not allow";
      one_allowed_ok += 1;
    }
    if (batch >= 2) {
      EXPECT_EQ(got.statuses[1], SAMPLERD_ROW_INVALID_NO_ALLOWED) << "step " << step;
      EXPECT_EQ(got.tokens[1], -1) << "step " << step;
      no_allowed += 1;
    }
  }
  std::printf(
      "GPU plane vs unary: %d rows, %d mismatches; %d rows with one token allowed "
      "sampled OK, %d rows with none allowed\n",
      rows_checked, mismatches, one_allowed_ok, no_allowed);
  EXPECT_GT(no_allowed, kSteps - 4);
  EXPECT_GT(one_allowed_ok, kSteps / 2);
}

TEST_F(CppSessionGpuTest, ARowWithUnsortedBiasGetsStatusFourAndItsNeighboursAreSampled) {
  std::mt19937 rng(5);
  constexpr int64_t kBatch = kMaxBatch;
  constexpr int kBroken = 5;
  Step s = RandomStep(kBatch, /*step=*/3, rng);
  // Two entries a row: row r's at [2r, 2r + 2).
  for (auto& bias : s.rows.logit_bias) bias = {{3, 1.0f}, {8, -INFINITY}};
  std::vector<uint8_t> packed;
  ASSERT_TRUE(PackSessionProcessors(options_, static_cast<int>(kBatch), s.rows, &packed).ok());
  const int32_t unsorted = 2;  // the broken row's second token below its first
  std::memcpy(
      packed.data() + samplerd_processors_bias_tokens_offset(kMaxBatch) + 4 * (2 * kBroken + 1),
      &unsorted, 4);
  const StepResult got = RunStep(s, packed);
  ASSERT_EQ(got.step_status, SAMPLERD_STEP_OK);
  const v1::SampleResponse unary = Unary(s);  // the processors as they should have been
  ASSERT_EQ(unary.token_ids_size(), kBatch);
  for (int r = 0; r < static_cast<int>(kBatch); ++r) {
    const size_t i = static_cast<size_t>(r);
    if (r == kBroken) {
      EXPECT_EQ(got.statuses[i], SAMPLERD_ROW_INVALID_PARAMS);
      EXPECT_EQ(got.tokens[i], -1);
    } else {
      EXPECT_EQ(got.statuses[i], unary.row_status(r)) << "row " << r;
      EXPECT_EQ(got.tokens[i], unary.token_ids(r)) << "row " << r;
    }
  }

  // The session goes on: the same step with the buffer mended equals unary in every row.
  ASSERT_TRUE(PackSessionProcessors(options_, static_cast<int>(kBatch), s.rows, &packed).ok());
  const StepResult mended = RunStep(s, packed);
  ASSERT_EQ(mended.step_status, SAMPLERD_STEP_OK);
  for (int r = 0; r < static_cast<int>(kBatch); ++r) {
    const size_t i = static_cast<size_t>(r);
    EXPECT_EQ(mended.statuses[i], unary.row_status(r)) << "mended, row " << r;
    EXPECT_EQ(mended.tokens[i], unary.token_ids(r)) << "mended, row " << r;
  }
}

}  // namespace
}  // namespace samplerd::ipc_test
