// Samples a random fp32 batch once per iteration and prints the tokens and the round-trip time.
//
//   samplerd_example_sample_random --target=unix:///run/samplerd/samplerd.sock --batch=4
//       --vocab=32000 --iters=3
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "samplerd/client.h"

namespace {

struct Flags {
  std::string target = "unix:///run/samplerd/samplerd.sock";
  int64_t batch = 4;
  int64_t vocab = 32000;
  int iters = 3;
};

// Reads "--name=value" into *value; returns false when `arg` is another flag.
bool ParseFlag(const char* arg, const char* name, std::string* value) {
  const size_t len = std::strlen(name);
  if (std::strncmp(arg, name, len) != 0 || arg[len] != '=') return false;
  *value = arg + len + 1;
  return true;
}

// Parses a positive integer flag value; exits with a message when it is not one.
int64_t PositiveInt(const std::string& value, const char* name) {
  char* end = nullptr;
  const long long parsed = std::strtoll(value.c_str(), &end, 10);
  if (value.empty() || *end != '\0' || parsed <= 0) {
    std::fprintf(stderr, "%s: expected a positive integer, got \"%s\"\n", name, value.c_str());
    std::exit(2);
  }
  return parsed;
}

Flags ParseFlags(int argc, char** argv) {
  Flags flags;
  for (int i = 1; i < argc; ++i) {
    std::string value;
    if (ParseFlag(argv[i], "--target", &value)) {
      flags.target = value;
    } else if (ParseFlag(argv[i], "--batch", &value)) {
      flags.batch = PositiveInt(value, "--batch");
    } else if (ParseFlag(argv[i], "--vocab", &value)) {
      flags.vocab = PositiveInt(value, "--vocab");
    } else if (ParseFlag(argv[i], "--iters", &value)) {
      flags.iters = static_cast<int>(PositiveInt(value, "--iters"));
    } else {
      std::fprintf(stderr,
                   "usage: %s [--target=unix:///path.sock|host:port] [--batch=N] [--vocab=N] "
                   "[--iters=N]\n",
                   argv[0]);
      std::exit(2);
    }
  }
  return flags;
}

}  // namespace

int main(int argc, char** argv) {
  const Flags flags = ParseFlags(argc, argv);

  // Logits ~ N(0, 3^2) from a fixed seed, so two runs send the same batch.
  std::mt19937 rng(1234);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> logits(static_cast<size_t>(flags.batch * flags.vocab));
  for (float& x : logits) x = normal(rng);

  // One parameter set for every row: top-k 50, top-p 0.9, T = 0.8, fixed seed.
  samplerd::v1::SamplingParams params;
  params.set_temperature(0.8f);
  params.set_top_k(50);
  params.set_top_p(0.9f);
  params.set_seed(42);

  samplerd::Client client(flags.target);
  const samplerd::v1::SampleRequest request =
      samplerd::MakeFp32Request(logits.data(), flags.batch, flags.vocab, {params});
  for (int iter = 0; iter < flags.iters; ++iter) {
    samplerd::v1::SampleResponse response;
    const auto start = std::chrono::steady_clock::now();
    const grpc::Status status = client.Sample(request, &response);
    const auto elapsed = std::chrono::steady_clock::now() - start;
    if (!status.ok()) {
      std::fprintf(stderr, "Sample failed: code %d: %s\n", static_cast<int>(status.error_code()),
                   status.error_message().c_str());
      return 1;
    }
    std::printf("iter %d: round trip %.3f ms (server compute %.3f ms), tokens:", iter,
                std::chrono::duration<double, std::milli>(elapsed).count(),
                static_cast<double>(response.timings().compute_ns()) / 1e6);
    for (int32_t token : response.token_ids()) std::printf(" %d", token);
    std::printf("\n");
  }
  return 0;
}
