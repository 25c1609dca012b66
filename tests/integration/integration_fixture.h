// Shared fixture and data for the integration tests: one real samplerd (CPU backend) per test
// suite, a samplerd::Client connected to it, and small logits batches with known answers.
//
// SAMPLERD_BINARY (a compile definition, $<TARGET_FILE:samplerd>) names the server binary.
#ifndef SAMPLERD_TESTS_INTEGRATION_INTEGRATION_FIXTURE_H_
#define SAMPLERD_TESTS_INTEGRATION_INTEGRATION_FIXTURE_H_

#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "samplerd/client.h"
#include "tests/integration/server_process.h"

#ifndef SAMPLERD_BINARY
#error "SAMPLERD_BINARY must name the samplerd binary (see tests/integration/CMakeLists.txt)"
#endif

namespace samplerd::integration {

// Whether this is an AddressSanitizer build (of the tests and the server). Freed memory then
// waits in a quarantine (256 MB by default) instead of being reused, so the server's peak RSS
// grows with every message it receives, kept or dropped: it says nothing about what the server
// holds, and tests that bound it skip that check.
#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kAddressSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
inline constexpr bool kAddressSanitizer = true;
#else
inline constexpr bool kAddressSanitizer = false;
#endif
#else
inline constexpr bool kAddressSanitizer = false;
#endif

// Options for a CPU-backend server of this build on a private unix socket.
inline ServerProcess::Options CpuServerOptions() {
  ServerProcess::Options options;
  options.binary = SAMPLERD_BINARY;
  options.backend = "cpu";
  // Two cores here: keep the server's pool small so that tests and server share fairly.
  options.extra_args = {"--threads=2", "--grace_period=5s"};
  return options;
}

// A suite-wide server. Derived fixtures replace SetUpTestSuite to start it differently.
class ServerSuite : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { StartServer(CpuServerOptions()); }
  static void TearDownTestSuite() { StopServer(); }

  // Starts the suite's server; on failure every test of the suite fails with the reason.
  static void StartServer(const ServerProcess::Options& options) {
    start_error_.clear();
    server_ = ServerProcess::Start(options, &start_error_);
  }

  // Starts the suite's CPU server, with `flags` too, and its metrics endpoint on a free loopback
  // port; returns the port.
  static int StartServerWithMetrics(const std::vector<std::string>& flags = {}) {
    const int port = PickFreeTcpPort();
    ServerProcess::Options options = CpuServerOptions();
    options.extra_args.insert(options.extra_args.end(), flags.begin(), flags.end());
    options.extra_args.push_back("--metrics_port=" + std::to_string(port));
    options.extra_args.push_back("--metrics_address=127.0.0.1");
    StartServer(options);
    return port;
  }

  // SIGTERMs the suite's server and expects a clean drain (exit code 0).
  static void StopServer() {
    if (server_ == nullptr) return;
    const int exit_code = server_->Stop();
    EXPECT_EQ(exit_code, 0) << "samplerd did not drain cleanly; its log:\n" << server_->Log();
    server_.reset();
  }

  void SetUp() override {
    ASSERT_NE(server_, nullptr) << "samplerd did not start: " << start_error_;
    client_ = std::make_unique<Client>(server_->target());
  }

  void TearDown() override {
    if (HasFailure() && server_ != nullptr) {
      std::cerr << "---- samplerd log ----\n" << server_->Log() << "----------------------\n";
    }
  }

  ServerProcess& server() { return *server_; }

  std::unique_ptr<Client> client_;

 private:
  inline static std::unique_ptr<ServerProcess> server_;
  inline static std::string start_error_;
};

// ---- Parameters --------------------------------------------------------------------------------

// Greedy: temperature 0 (argmax, lowest index among ties).
inline v1::SamplingParams Greedy() {
  v1::SamplingParams params;
  params.set_temperature(0.0f);
  return params;
}

// A random draw with an explicit seed and position (temperature 1, no filters unless set).
inline v1::SamplingParams Seeded(uint64_t seed, uint64_t position = 0) {
  v1::SamplingParams params;
  params.set_temperature(1.0f);
  params.set_seed(seed);
  params.set_position(position);
  return params;
}

// The benchmark setting of DESIGN.md: top-k 50 + top-p 0.9 at T = 0.8.
inline v1::SamplingParams TopKTopP(uint64_t seed) {
  v1::SamplingParams params;
  params.set_temperature(0.8f);
  params.set_top_k(50);
  params.set_top_p(0.9f);
  params.set_seed(seed);
  return params;
}

// ---- Logits ------------------------------------------------------------------------------------

// A [batch, vocab] fp32 batch, row-major.
struct Logits {
  int64_t batch = 0;
  int64_t vocab = 0;
  std::vector<float> values;

  float* row(int64_t r) { return values.data() + r * vocab; }
  v1::SampleRequest Request(const std::vector<v1::SamplingParams>& params = {}) const {
    return MakeFp32Request(values.data(), batch, vocab, params);
  }
};

// N(0, stddev^2) logits from a fixed seed.
inline Logits RandomLogits(int64_t batch, int64_t vocab, uint32_t seed, float stddev = 3.0f) {
  Logits logits{batch, vocab, std::vector<float>(static_cast<size_t>(batch * vocab))};
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, stddev);
  for (float& x : logits.values) x = normal(rng);
  return logits;
}

// Four rows of 8 small, exactly representable values (also in fp16 and bf16) with a known
// argmax each: a clear maximum, a maximum at index 0, a tie (the lowest index wins), and a row
// with -inf entries.
struct GreedyCase {
  Logits logits;
  std::vector<int32_t> expected;
};

inline GreedyCase KnownGreedyBatch() {
  const float inf = std::numeric_limits<float>::infinity();
  GreedyCase c;
  c.logits = {4,
              8,
              {
                  0.5f,  1.0f, -2.0f, 3.5f,  1.0f,  0.0f, -1.0f, 2.0f,   // max at 3
                  6.0f,  1.0f, 2.0f,  3.0f,  4.0f,  5.0f, 5.5f,  -6.0f,  // max at 0
                  -1.0f, 0.0f, 2.5f,  -3.0f, 1.0f,  2.5f, 0.25f, 2.5f,   // tie 2, 5, 7 -> 2
                  -inf,  -inf, -4.0f, -inf,  -8.0f, -inf, -2.0f, -inf,   // max at 6
              }};
  c.expected = {3, 0, 2, 6};
  return c;
}

// fp32 -> bf16 bits by truncation (exact for the values above).
inline std::string ToBf16Bytes(const std::vector<float>& values) {
  std::string out(values.size() * 2, '\0');
  for (size_t i = 0; i < values.size(); ++i) {
    uint32_t bits;
    std::memcpy(&bits, &values[i], 4);
    const uint16_t half = static_cast<uint16_t>(bits >> 16);
    std::memcpy(&out[2 * i], &half, 2);
  }
  return out;
}

// fp32 -> IEEE binary16 bits for values exactly representable as normal halves (or 0, +-inf).
inline std::string ToFp16Bytes(const std::vector<float>& values) {
  std::string out(values.size() * 2, '\0');
  for (size_t i = 0; i < values.size(); ++i) {
    uint32_t bits;
    std::memcpy(&bits, &values[i], 4);
    const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
    const int32_t exponent = static_cast<int32_t>((bits >> 23) & 0xffu);
    const uint32_t mantissa = bits & 0x7fffffu;
    uint16_t half;
    if (exponent == 0xff) {
      half = static_cast<uint16_t>(sign | 0x7c00u | (mantissa != 0 ? 0x200u : 0u));
    } else if (exponent == 0 && mantissa == 0) {
      half = sign;
    } else {
      half = static_cast<uint16_t>(sign | ((exponent - 127 + 15) << 10) | (mantissa >> 13));
    }
    std::memcpy(&out[2 * i], &half, 2);
  }
  return out;
}

// ---- Responses ---------------------------------------------------------------------------------

inline std::vector<int32_t> Tokens(const v1::SampleResponse& response) {
  return {response.token_ids().begin(), response.token_ids().end()};
}

inline std::vector<uint64_t> Seeds(const v1::SampleResponse& response) {
  return {response.seeds().begin(), response.seeds().end()};
}

// Success when `message` contains at least one of `keys`, ignoring case.
inline ::testing::AssertionResult MentionsAny(const std::string& message,
                                              const std::vector<std::string>& keys) {
  const auto lower = [](std::string text) {
    std::transform(text.begin(), text.end(), text.begin(),
                   [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
    return text;
  };
  const std::string haystack = lower(message);
  std::string wanted;
  for (const std::string& key : keys) {
    if (haystack.find(lower(key)) != std::string::npos) return ::testing::AssertionSuccess();
    wanted += (wanted.empty() ? "\"" : ", \"") + key + "\"";
  }
  return ::testing::AssertionFailure()
         << "message \"" << message << "\" mentions none of " << wanted;
}

}  // namespace samplerd::integration

#endif  // SAMPLERD_TESTS_INTEGRATION_INTEGRATION_FIXTURE_H_
