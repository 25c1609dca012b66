// The samplerd server on the GPU backend, against a second samplerd on the CPU backend, over unix
// sockets: the device in GetServerInfo, device naming in requests, tokens (identical for greedy,
// >= 99.9% identical elsewhere, disagreements printed with the scores that explain them), row
// statuses, logprobs, and a SampleStream session.
//
// The servers are started by tests/gpu/run_on_gpu.sh and named by two environment variables:
//   SAMPLERD_TEST_GPU_SERVER  gRPC target of the --backend=gpu server, e.g. unix:///tmp/x/g.sock
//   SAMPLERD_TEST_CPU_SERVER  gRPC target of the --backend=cpu server (the comparison tests)
// Every test skips when the variable it needs is not set, so ctest passes on machines without a
// GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/common/philox.h"
#include "samplerd/client.h"

namespace samplerd::gpu_server_test {
namespace {

constexpr char kGpuEnv[] = "SAMPLERD_TEST_GPU_SERVER";
constexpr char kCpuEnv[] = "SAMPLERD_TEST_CPU_SERVER";
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

std::string Env(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? std::string() : std::string(value);
}

std::unique_ptr<Client> Connect(const std::string& target) {
  ClientOptions options;
  // The CPU server samples 128 x 151,936 rows on the host: give it time.
  options.default_deadline = std::chrono::seconds(300);
  return std::make_unique<Client>(target, options);
}

const char* DTypeName(v1::DType dtype) { return dtype == v1::DTYPE_BF16 ? "bf16" : "fp32"; }

// Round to nearest even, NaN kept a (quiet) NaN.
uint16_t FloatToBf16(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

float Bf16ToFloat(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float v;
  std::memcpy(&v, &bits, 4);
  return v;
}

// A dense [batch, vocab] logits tensor in fp32 or bf16 storage (little-endian bytes).
struct Logits {
  v1::DType dtype = v1::DTYPE_FP32;
  int64_t batch = 0;
  int64_t vocab = 0;
  std::string bytes;

  size_t ElementSize() const { return dtype == v1::DTYPE_BF16 ? 2 : 4; }

  void Set(int64_t r, int64_t j, float v) {
    char* at = &bytes[static_cast<size_t>(r * vocab + j) * ElementSize()];
    if (dtype == v1::DTYPE_BF16) {
      const uint16_t h = FloatToBf16(v);
      std::memcpy(at, &h, 2);
    } else {
      std::memcpy(at, &v, 4);
    }
  }

  float Get(int64_t r, int64_t j) const {
    const char* at = &bytes[static_cast<size_t>(r * vocab + j) * ElementSize()];
    if (dtype == v1::DTYPE_BF16) {
      uint16_t h;
      std::memcpy(&h, at, 2);
      return Bf16ToFloat(h);
    }
    float v;
    std::memcpy(&v, at, 4);
    return v;
  }
};

// N(0, 3^2) logits from a fixed seed.
Logits RandomLogits(v1::DType dtype, int64_t batch, int64_t vocab, uint64_t seed) {
  Logits l;
  l.dtype = dtype;
  l.batch = batch;
  l.vocab = vocab;
  l.bytes.assign(static_cast<size_t>(batch * vocab) * l.ElementSize(), '\0');
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (int64_t r = 0; r < batch; ++r) {
    for (int64_t j = 0; j < vocab; ++j) l.Set(r, j, normal(rng));
  }
  return l;
}

// A request carrying `logits` inline, with no params yet.
v1::SampleRequest RequestFor(const Logits& l) {
  v1::SampleRequest request;
  v1::Tensor* t = request.mutable_logits();
  t->set_dtype(l.dtype);
  t->add_shape(l.batch);
  t->add_shape(l.vocab);
  t->set_inline_data(l.bytes);
  return request;
}

// Replaces the request's params with one entry per row: `setting` with a fixed seed and
// position per row, so both servers draw from the same Philox streams.
void SetRowParams(v1::SampleRequest& request, const v1::SamplingParams& setting,
                  uint64_t seed_base) {
  request.clear_params();
  const int64_t batch = request.logits().shape(0);
  for (int64_t r = 0; r < batch; ++r) {
    v1::SamplingParams* p = request.add_params();
    *p = setting;
    p->set_seed(seed_base + 7919 * static_cast<uint64_t>(r));
    p->set_position(static_cast<uint64_t>(r) * 13 + 5);
  }
}

struct Setting {
  const char* name;
  v1::SamplingParams params;
};

v1::SamplingParams Params(float temperature, int32_t top_k, float top_p, float min_p,
                          v1::TopPMode mode = v1::TOP_P_MODE_TOP_K_FIRST) {
  v1::SamplingParams p;
  p.set_temperature(temperature);
  p.set_top_k(top_k);
  p.set_top_p(top_p);
  p.set_min_p(min_p);
  p.set_top_p_mode(mode);
  return p;
}

const std::vector<Setting>& Settings() {
  static const std::vector<Setting> settings = {
      {"greedy", Params(0.0f, 0, 1.0f, 0.0f)},
      {"temperature_0.8", Params(0.8f, 0, 1.0f, 0.0f)},
      {"top_k_50", Params(1.0f, 50, 1.0f, 0.0f)},
      {"top_p_0.95", Params(1.0f, 0, 0.95f, 0.0f)},
      {"top_k_50_top_p_0.9", Params(1.0f, 50, 0.9f, 0.0f)},
      {"min_p_0.1", Params(1.0f, 0, 1.0f, 0.1f)},
      {"joint_top_k_50_top_p_0.9", Params(1.0f, 50, 0.9f, 0.0f, v1::TOP_P_MODE_JOINT)},
  };
  return settings;
}

bool IsGreedy(const v1::SamplingParams& p) { return p.temperature() < 1e-5f; }

// The Gumbel-perturbed score of token j in row r (the CPU's draw maximises it over the
// survivors): printed beside a disagreement, it shows the near-tie that explains it.
double Score(const Logits& l, const v1::SampleRequest& request, int64_t r, int32_t j) {
  if (j < 0 || j >= l.vocab) return std::nan("");
  const v1::SamplingParams& p = request.params(request.params_size() == 1 ? 0 : r);
  const double x = l.Get(r, j);
  if (IsGreedy(p)) return x;
  return x / p.temperature() + kernels::GumbelNoise(p.seed(), p.position(), j);
}

// Both servers, shared by every test of the suite.
class GpuServerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    gpu_target_ = Env(kGpuEnv);
    cpu_target_ = Env(kCpuEnv);
    if (!gpu_target_.empty()) gpu_ = Connect(gpu_target_).release();
    if (!cpu_target_.empty()) cpu_ = Connect(cpu_target_).release();
  }
  static void TearDownTestSuite() {
    delete gpu_;
    delete cpu_;
    gpu_ = cpu_ = nullptr;
  }

  void SetUp() override {
    if (gpu_ == nullptr) {
      GTEST_SKIP() << kGpuEnv << " is not set: no GPU server to test (tests/gpu/run_on_gpu.sh "
                   << "starts one on a GPU machine)";
    }
  }

  // Skips the current test when there is no CPU server to compare with.
  bool NeedCpuServer() {
    if (cpu_ != nullptr) return true;
    std::printf("%s is not set: no CPU server to compare with\n", kCpuEnv);
    return false;
  }

  // Sends `request` to `client`; fails the test (and returns false) unless it is OK.
  static bool SampleOk(Client* client, const char* which, const v1::SampleRequest& request,
                       v1::SampleResponse* response) {
    const grpc::Status status = client->Sample(request, response);
    EXPECT_TRUE(status.ok()) << which << " server: code " << status.error_code() << ": "
                             << status.error_message();
    if (!status.ok()) return false;
    EXPECT_EQ(response->token_ids_size(), request.logits().shape(0)) << which;
    EXPECT_EQ(response->row_status_size(), request.logits().shape(0)) << which;
    EXPECT_EQ(response->seeds_size(), request.logits().shape(0)) << which;
    return response->token_ids_size() == request.logits().shape(0) &&
           response->row_status_size() == request.logits().shape(0) &&
           response->seeds_size() == request.logits().shape(0);
  }

  inline static std::string gpu_target_;
  inline static std::string cpu_target_;
  inline static Client* gpu_ = nullptr;
  inline static Client* cpu_ = nullptr;
};

TEST_F(GpuServerTest, ServerInfoListsTheGpu) {
  v1::GetServerInfoResponse info;
  const grpc::Status status = gpu_->GetServerInfo(&info);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(info.backend(), v1::BACKEND_GPU) << info.DebugString();
  ASSERT_GE(info.devices_size(), 1) << info.DebugString();
  for (const v1::Device& d : info.devices()) {
    std::printf("device %d: pci_bus_id %s uuid %s name \"%s\" ipc_memory %d ipc_events %d\n",
                d.ordinal(), d.pci_bus_id().c_str(), d.uuid().c_str(), d.name().c_str(),
                d.ipc_memory(), d.ipc_events());
    EXPECT_FALSE(d.pci_bus_id().empty());
    EXPECT_FALSE(d.uuid().empty());
    EXPECT_NE(d.uuid(), "cpu");
    EXPECT_FALSE(d.name().empty());
  }
  std::printf("version %s, limits: %s\n", info.version().c_str(),
              info.limits().ShortDebugString().c_str());
}

TEST_F(GpuServerTest, TheCpuServerReportsTheCpuBackend) {
  if (!NeedCpuServer()) GTEST_SKIP() << kCpuEnv << " is not set";
  v1::GetServerInfoResponse info;
  const grpc::Status status = cpu_->GetServerInfo(&info);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(info.backend(), v1::BACKEND_CPU) << info.DebugString();
}

TEST_F(GpuServerTest, RequestsMayNameTheDeviceByBusIdOrUuid) {
  v1::GetServerInfoResponse info;
  ASSERT_TRUE(gpu_->GetServerInfo(&info).ok());
  ASSERT_GE(info.devices_size(), 1);
  const v1::Device& device = info.devices(0);

  v1::SampleRequest request = RequestFor(RandomLogits(v1::DTYPE_FP32, 2, 1000, 3));
  SetRowParams(request, Params(1.0f, 50, 0.9f, 0.0f), 77);
  v1::SampleResponse first;
  ASSERT_TRUE(SampleOk(gpu_, "GPU", request, &first));

  for (const std::string& name : {device.pci_bus_id(), device.uuid()}) {
    request.set_device(name);
    v1::SampleResponse response;
    const grpc::Status status = gpu_->Sample(request, &response);
    EXPECT_TRUE(status.ok()) << "device \"" << name << "\": code " << status.error_code() << ": "
                             << status.error_message();
    EXPECT_EQ(std::vector<int32_t>(response.token_ids().begin(), response.token_ids().end()),
              std::vector<int32_t>(first.token_ids().begin(), first.token_ids().end()))
        << "device \"" << name << "\"";
  }

  const std::string other =
      device.pci_bus_id().find("ff:1f.7") == std::string::npos ? "0000:ff:1f.7" : "0000:fe:1f.7";
  request.set_device(other);
  v1::SampleResponse response;
  const grpc::Status status = gpu_->Sample(request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION)
      << "device \"" << other << "\": " << status.error_message();
  std::printf("device \"%s\": code %d: %s\n", other.c_str(), status.error_code(),
              status.error_message().c_str());
}

TEST_F(GpuServerTest, TokensMatchTheCpuServer) {
  if (!NeedCpuServer()) GTEST_SKIP() << kCpuEnv << " is not set";
  struct Shape {
    int64_t batch, vocab;
  };
  const Shape shapes[] = {{1, 111}, {8, 32000}, {32, 151936}, {128, 151936}};
  int64_t rows = 0, mismatches = 0, greedy_rows = 0, greedy_mismatches = 0;
  uint64_t shape_seed = 1000;
  for (const Shape& shape : shapes) {
    for (v1::DType dtype : {v1::DTYPE_FP32, v1::DTYPE_BF16}) {
      const Logits logits = RandomLogits(dtype, shape.batch, shape.vocab, ++shape_seed);
      v1::SampleRequest request = RequestFor(logits);
      uint64_t setting_seed = shape_seed * 1000003;
      for (const Setting& setting : Settings()) {
        SCOPED_TRACE(std::string(setting.name) + " " + DTypeName(dtype) + " " +
                     std::to_string(shape.batch) + "x" + std::to_string(shape.vocab));
        SetRowParams(request, setting.params, ++setting_seed);
        v1::SampleResponse gpu, cpu;
        if (!SampleOk(gpu_, "GPU", request, &gpu) || !SampleOk(cpu_, "CPU", request, &cpu)) {
          continue;
        }
        const bool greedy = IsGreedy(setting.params);
        int64_t here = 0;
        for (int64_t r = 0; r < shape.batch; ++r) {
          EXPECT_EQ(gpu.row_status(r), v1::ROW_STATUS_OK) << "row " << r;
          EXPECT_EQ(cpu.row_status(r), v1::ROW_STATUS_OK) << "row " << r;
          EXPECT_GE(gpu.token_ids(r), 0) << "row " << r;
          EXPECT_LT(gpu.token_ids(r), shape.vocab) << "row " << r;
          EXPECT_EQ(gpu.seeds(r), request.params(r).seed()) << "row " << r;
          ++(greedy ? greedy_rows : rows);
          if (gpu.token_ids(r) == cpu.token_ids(r)) continue;
          ++(greedy ? greedy_mismatches : mismatches);
          ++here;
          std::printf(
              "mismatch %s %s B=%ld V=%ld row %ld: cpu %d (logit %.7g, score %.7f) "
              "gpu %d (logit %.7g, score %.7f)\n",
              setting.name, DTypeName(dtype), static_cast<long>(shape.batch),
              static_cast<long>(shape.vocab), static_cast<long>(r), cpu.token_ids(r),
              logits.Get(r, cpu.token_ids(r)), Score(logits, request, r, cpu.token_ids(r)),
              gpu.token_ids(r),
              gpu.token_ids(r) >= 0 && gpu.token_ids(r) < shape.vocab
                  ? logits.Get(r, gpu.token_ids(r))
                  : kNaN,
              Score(logits, request, r, gpu.token_ids(r)));
        }
        std::printf(
            "%-26s %s %4ldx%-6ld gpu compute %8.1f us, cpu compute %9.1f us, %ld "
            "mismatches\n",
            setting.name, DTypeName(dtype), static_cast<long>(shape.batch),
            static_cast<long>(shape.vocab), gpu.timings().compute_ns() / 1e3,
            cpu.timings().compute_ns() / 1e3, static_cast<long>(here));
        std::fflush(stdout);  // the log stays complete if the run is cut off
      }
    }
  }
  std::printf(
      "GPU server vs CPU server: greedy %ld rows, %ld mismatches; other settings %ld "
      "rows, %ld mismatches (%.4f%%)\n",
      static_cast<long>(greedy_rows), static_cast<long>(greedy_mismatches), static_cast<long>(rows),
      static_cast<long>(mismatches), rows > 0 ? 100.0 * mismatches / rows : 0.0);
  EXPECT_EQ(greedy_mismatches, 0) << "greedy must be identical";
  EXPECT_LE(mismatches * 1000, rows) << "more than 0.1% of rows disagree";
}

TEST_F(GpuServerTest, NanRowIsInvalidAndItsNeighboursAreFine) {
  for (v1::DType dtype : {v1::DTYPE_FP32, v1::DTYPE_BF16}) {
    SCOPED_TRACE(DTypeName(dtype));
    Logits logits = RandomLogits(dtype, 5, 32000, 42);
    logits.Set(1, 777, kNaN);
    for (int64_t j = 0; j < logits.vocab; ++j) logits.Set(3, j, -kInf);
    v1::SampleRequest request = RequestFor(logits);
    SetRowParams(request, Params(1.0f, 50, 0.9f, 0.0f), 4242);
    v1::SampleResponse gpu;
    ASSERT_TRUE(SampleOk(gpu_, "GPU", request, &gpu));
    EXPECT_EQ(gpu.row_status(1), v1::ROW_STATUS_INVALID_NAN);
    EXPECT_EQ(gpu.token_ids(1), -1);
    EXPECT_EQ(gpu.row_status(3), v1::ROW_STATUS_INVALID_NO_FINITE);
    EXPECT_EQ(gpu.token_ids(3), -1);
    for (int r : {0, 2, 4}) {
      EXPECT_EQ(gpu.row_status(r), v1::ROW_STATUS_OK) << "row " << r;
      EXPECT_GE(gpu.token_ids(r), 0) << "row " << r;
    }
    if (cpu_ == nullptr) continue;
    v1::SampleResponse cpu;
    ASSERT_TRUE(SampleOk(cpu_, "CPU", request, &cpu));
    for (int r = 0; r < 5; ++r) {
      EXPECT_EQ(gpu.row_status(r), cpu.row_status(r)) << "row " << r;
      EXPECT_EQ(gpu.token_ids(r), cpu.token_ids(r)) << "row " << r;
    }
  }
}

// Equal, or both the same infinity, or within `tolerance`.
::testing::AssertionResult Close(float gpu, float cpu, float tolerance) {
  if (gpu == cpu) return ::testing::AssertionSuccess();
  if (std::isfinite(gpu) && std::isfinite(cpu) && std::fabs(gpu - cpu) <= tolerance) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << "gpu " << gpu << " vs cpu " << cpu;
}

TEST_F(GpuServerTest, LogprobsMatchTheCpuServer) {
  if (!NeedCpuServer()) GTEST_SKIP() << kCpuEnv << " is not set";
  constexpr float kTolerance = 2e-4f;
  constexpr int kTopN = 5;
  const char* const names[] = {"greedy", "temperature_0.8", "top_k_50_top_p_0.9", "min_p_0.1",
                               "joint_top_k_50_top_p_0.9"};
  int64_t compared = 0, skipped = 0;
  uint64_t seed = 500;
  for (int64_t vocab : {int64_t{32000}, int64_t{151936}}) {
    for (v1::DType dtype : {v1::DTYPE_FP32, v1::DTYPE_BF16}) {
      const int64_t batch = vocab == 32000 ? 8 : 32;
      v1::SampleRequest request = RequestFor(RandomLogits(dtype, batch, vocab, ++seed));
      for (const Setting& setting : Settings()) {
        bool wanted = false;
        for (const char* name : names) wanted = wanted || std::strcmp(name, setting.name) == 0;
        if (!wanted) continue;
        for (v1::LogprobSource source : {v1::LOGPROB_SOURCE_RAW, v1::LOGPROB_SOURCE_PROCESSED}) {
          SCOPED_TRACE(std::string(setting.name) + " " + DTypeName(dtype) +
                       " V=" + std::to_string(vocab) +
                       (source == v1::LOGPROB_SOURCE_RAW ? " raw" : " processed"));
          SetRowParams(request, setting.params, ++seed * 31);
          request.mutable_logprobs()->set_top_n(kTopN);
          request.mutable_logprobs()->set_source(source);
          v1::SampleResponse gpu, cpu;
          if (!SampleOk(gpu_, "GPU", request, &gpu) || !SampleOk(cpu_, "CPU", request, &cpu)) {
            continue;
          }
          ASSERT_EQ(gpu.logprobs_size(), batch);
          ASSERT_EQ(cpu.logprobs_size(), batch);
          for (int64_t r = 0; r < batch; ++r) {
            if (gpu.token_ids(r) != cpu.token_ids(r)) {
              ++skipped;  // a near-tie draw: counted by TokensMatchTheCpuServer
              continue;
            }
            ++compared;
            const v1::RowLogprobs& g = gpu.logprobs(r);
            const v1::RowLogprobs& c = cpu.logprobs(r);
            EXPECT_TRUE(Close(g.sampled_logprob(), c.sampled_logprob(), kTolerance))
                << "row " << r << " sampled logprob";
            EXPECT_EQ(g.sampled_rank(), c.sampled_rank()) << "row " << r;
            ASSERT_EQ(g.top_token_ids_size(), kTopN) << "row " << r;
            ASSERT_EQ(c.top_token_ids_size(), kTopN) << "row " << r;
            ASSERT_EQ(g.top_logprobs_size(), kTopN) << "row " << r;
            for (int i = 0; i < kTopN; ++i) {
              EXPECT_EQ(g.top_token_ids(i), c.top_token_ids(i)) << "row " << r << " top " << i;
              EXPECT_TRUE(Close(g.top_logprobs(i), c.top_logprobs(i), kTolerance))
                  << "row " << r << " top " << i;
            }
          }
        }
      }
    }
  }
  std::printf("logprobs compared on %ld rows (%ld rows with different tokens skipped)\n",
              static_cast<long>(compared), static_cast<long>(skipped));
  EXPECT_GT(compared, 0);
}

TEST_F(GpuServerTest, StreamSessionAnswersTwentyStepsInOrder) {
  constexpr int kSteps = 20;
  std::unique_ptr<SampleSession> session = gpu_->OpenStream();
  int64_t cpu_rows = 0, cpu_mismatches = 0;
  for (int step = 0; step < kSteps; ++step) {
    const Logits logits = RandomLogits(step % 2 == 0 ? v1::DTYPE_FP32 : v1::DTYPE_BF16, 4, 32000,
                                       9000 + static_cast<uint64_t>(step));
    v1::SampleRequest request = RequestFor(logits);
    request.set_request_id("gpu-step-" + std::to_string(step));
    SetRowParams(request, Params(1.0f, 50, 0.9f, 0.0f), 555);
    for (v1::SamplingParams& p : *request.mutable_params()) p.set_position(p.position() + step);

    v1::SampleResponse streamed;
    const grpc::Status status = session->Step(request, &streamed);
    ASSERT_TRUE(status.ok()) << "step " << step << ": code " << status.error_code() << ": "
                             << status.error_message();
    EXPECT_EQ(streamed.request_id(), request.request_id());
    ASSERT_EQ(streamed.token_ids_size(), 4) << "step " << step;

    // The same request, unary, on the same GPU: the same tokens, bit for bit.
    v1::SampleResponse unary;
    ASSERT_TRUE(SampleOk(gpu_, "GPU", request, &unary));
    EXPECT_EQ(std::vector<int32_t>(streamed.token_ids().begin(), streamed.token_ids().end()),
              std::vector<int32_t>(unary.token_ids().begin(), unary.token_ids().end()))
        << "step " << step;
    if (cpu_ != nullptr) {
      v1::SampleResponse cpu;
      ASSERT_TRUE(SampleOk(cpu_, "CPU", request, &cpu));
      for (int r = 0; r < 4; ++r) {
        ++cpu_rows;
        if (cpu.token_ids(r) != streamed.token_ids(r)) {
          ++cpu_mismatches;
          std::printf("stream step %d row %d: cpu %d gpu %d\n", step, r, cpu.token_ids(r),
                      streamed.token_ids(r));
        }
      }
    }
  }
  EXPECT_TRUE(session->Close().ok());
  if (cpu_rows > 0) {
    std::printf("stream vs CPU server: %ld rows, %ld mismatches\n", static_cast<long>(cpu_rows),
                static_cast<long>(cpu_mismatches));
    EXPECT_LE(cpu_mismatches, 1) << "more stream rows disagree with the CPU server than near-ties "
                                    "explain";
  }
}

}  // namespace
}  // namespace samplerd::gpu_server_test
