// Service round trip: inline-logits Sample calls to a real samplerd (CPU backend) on a unix
// socket, timed at the client (serialise, send, sample, reply, parse).
//
// Same shapes and setting as bench_cpu_sampler (top-k 50 + top-p 0.9, T = 0.8, fp32 logits ~
// 3 * N(0, 1), fixed seed), plus a greedy variant whose O(V) argmax leaves mostly the transport.
// Each call is timed by hand; the counters give the p50 and p99 round trip and the server's own
// p50 compute time (SampleResponse.timings), whose difference is the transport and
// (de)serialisation overhead. The server gets --threads=2 (the cores of this machine), so client
// and server share them.
//
//   bench_service_roundtrip [--benchmark_filter=...]
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "samplerd/client.h"
#include "tests/integration/server_process.h"

#ifndef SAMPLERD_BINARY
#error "SAMPLERD_BINARY must name the samplerd binary (see tests/bench/CMakeLists.txt)"
#endif

namespace samplerd::bench {
namespace {

std::unique_ptr<Client> g_client;  // connected to the server started in main()

double Percentile(std::vector<double> values, double q) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const size_t index = static_cast<size_t>(q * static_cast<double>(values.size() - 1) + 0.5);
  return values[std::min(index, values.size() - 1)];
}

v1::SampleRequest MakeRequest(int64_t batch, int64_t vocab, bool greedy) {
  std::vector<float> logits(static_cast<size_t>(batch * vocab));
  std::mt19937 rng(2024);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& x : logits) x = 3.0f * normal(rng);
  v1::SamplingParams params;
  if (greedy) {
    params.set_temperature(0.0f);
  } else {
    params.set_temperature(0.8f);
    params.set_top_k(50);
    params.set_top_p(0.9f);
    params.set_seed(42);
  }
  return MakeFp32Request(logits.data(), batch, vocab, {params});
}

// Arguments: B, V, greedy (0: top-k 50 + top-p 0.9 at T = 0.8; 1: T = 0).
void BM_SampleRoundTripUds(benchmark::State& state) {
  const int64_t batch = state.range(0);
  const int64_t vocab = state.range(1);
  const v1::SampleRequest request = MakeRequest(batch, vocab, state.range(2) != 0);
  v1::SampleResponse response;
  // Warm-up call, untimed: connection, server allocations.
  if (grpc::Status status = g_client->Sample(request, &response); !status.ok()) {
    state.SkipWithError(("warm-up Sample failed: " + status.error_message()).c_str());
    return;
  }

  std::vector<double> round_trip_ms, compute_ms;
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    const grpc::Status status = g_client->Sample(request, &response);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (!status.ok()) {
      state.SkipWithError(("Sample failed: " + status.error_message()).c_str());
      return;
    }
    state.SetIterationTime(seconds);
    round_trip_ms.push_back(seconds * 1e3);
    compute_ms.push_back(static_cast<double>(response.timings().compute_ns()) / 1e6);
  }
  state.SetItemsProcessed(state.iterations() * batch);
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) *
                          static_cast<int64_t>(request.logits().inline_data().size()));
  state.counters["p50_ms"] = Percentile(round_trip_ms, 0.50);
  state.counters["p99_ms"] = Percentile(round_trip_ms, 0.99);
  state.counters["server_compute_p50_ms"] = Percentile(compute_ms, 0.50);
  state.counters["calls"] = static_cast<double>(round_trip_ms.size());
}

// Iterations are fixed per shape so that a run stays short on 2 cores (~1 min) while the
// percentiles get enough samples where calls are cheap (p99 of 10 calls is their maximum).
void Shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"B", "V", "greedy"})->UseManualTime()->Unit(benchmark::kMillisecond);
}

BENCHMARK(BM_SampleRoundTripUds)->Apply(Shapes)->Args({1, 32000, 0})->Iterations(300);
BENCHMARK(BM_SampleRoundTripUds)->Apply(Shapes)->Args({32, 32000, 0})->Iterations(40);
BENCHMARK(BM_SampleRoundTripUds)->Apply(Shapes)->Args({128, 32000, 0})->Iterations(15);
BENCHMARK(BM_SampleRoundTripUds)->Apply(Shapes)->Args({1, 151936, 0})->Iterations(100);
BENCHMARK(BM_SampleRoundTripUds)->Apply(Shapes)->Args({32, 151936, 0})->Iterations(10);
BENCHMARK(BM_SampleRoundTripUds)->Apply(Shapes)->Args({128, 151936, 0})->Iterations(5);
BENCHMARK(BM_SampleRoundTripUds)->Apply(Shapes)->Args({1, 32000, 1})->Iterations(1000);
BENCHMARK(BM_SampleRoundTripUds)->Apply(Shapes)->Args({32, 32000, 1})->Iterations(200);
BENCHMARK(BM_SampleRoundTripUds)->Apply(Shapes)->Args({128, 32000, 1})->Iterations(100);
BENCHMARK(BM_SampleRoundTripUds)->Apply(Shapes)->Args({1, 151936, 1})->Iterations(500);
BENCHMARK(BM_SampleRoundTripUds)->Apply(Shapes)->Args({32, 151936, 1})->Iterations(100);
BENCHMARK(BM_SampleRoundTripUds)->Apply(Shapes)->Args({128, 151936, 1})->Iterations(30);

}  // namespace
}  // namespace samplerd::bench

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;

  samplerd::integration::ServerProcess::Options options;
  options.binary = SAMPLERD_BINARY;
  options.backend = "cpu";
  options.extra_args = {"--threads=2"};
  std::string error;
  std::unique_ptr<samplerd::integration::ServerProcess> server =
      samplerd::integration::ServerProcess::Start(options, &error);
  if (server == nullptr) {
    std::fprintf(stderr, "cannot start samplerd: %s\n", error.c_str());
    return 1;
  }
  samplerd::ClientOptions client_options;
  client_options.default_deadline = std::chrono::minutes(2);
  samplerd::bench::g_client = std::make_unique<samplerd::Client>(server->target(), client_options);

  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();

  samplerd::bench::g_client.reset();
  const int exit_code = server->Stop();
  if (exit_code != 0) {
    std::fprintf(stderr, "samplerd exited with %d; its log:\n%s\n", exit_code,
                 server->Log().c_str());
    return 1;
  }
  return 0;
}
