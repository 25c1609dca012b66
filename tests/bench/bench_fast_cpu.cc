// FastCpuSampler (kernels/cpu_fast, the host plane's sampler) against the CPU oracle.
//
// V = 151,936 fp32 logits from a fixed seed; B in {1, 4, 32}; settings (arg S):
// 0 top-k 50 + top-p 0.9 at T 0.8, 1 top-p 0.95, 2 top-k 50, 3 greedy, 4 temperature 0.8.
// Distributions (arg D): 0 randn * 3; 1 flat, N(0, 0.05) (a random-weight model: top-p keeps
// most of the row); 2 Zipf-like, x = -1.1 * ln(rank) over a random permutation of ranks (a
// peaked, heavy-tailed row like a trained model's).
// BM_Oracle runs CpuSampleRows over the rows with `threads` std::threads (rows split evenly, as
// the server's pool would); BM_Fast runs FastCpuSampler::Sample with `threads` threads (the
// caller included; workers spin between iterations, as in a busy session). Per-iteration time
// is one whole batch. Results: HOST_PLANE_RESULTS.md.
//
//   bench_fast_cpu --benchmark_min_time=0.2
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <thread>
#include <vector>

#include "kernels/common/sampling_types.h"
#include "kernels/cpu/cpu_sampler.h"
#include "kernels/cpu_fast/fast_cpu_sampler.h"

namespace samplerd::kernels {
namespace {

constexpr int64_t kVocab = 151936;

std::vector<float> RandomLogits(int64_t batch, int64_t distribution, uint32_t seed) {
  std::vector<float> logits(static_cast<size_t>(batch * kVocab));
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  if (distribution == 2) {
    std::vector<int64_t> rank(kVocab);
    for (int64_t j = 0; j < kVocab; ++j) rank[j] = j + 1;
    for (int64_t row = 0; row < batch; ++row) {
      std::shuffle(rank.begin(), rank.end(), rng);
      for (int64_t j = 0; j < kVocab; ++j) {
        logits[row * kVocab + j] = -1.1f * std::log(static_cast<float>(rank[j]));
      }
    }
    return logits;
  }
  const float sigma = distribution == 1 ? 0.05f : 3.0f;
  for (float& x : logits) x = sigma * normal(rng);
  return logits;
}

RowParams Setting(int64_t s) {
  RowParams p;
  p.seed = 42;
  p.position = 7;
  switch (s) {
    case 0:
      p.temperature = 0.8f;
      p.top_k = 50;
      p.top_p = 0.9f;
      break;
    case 1:
      p.top_p = 0.95f;
      break;
    case 2:
      p.top_k = 50;
      break;
    case 3:
      p.temperature = 0.0f;
      break;
    default:
      p.temperature = 0.8f;
      break;
  }
  return p;
}

struct Fixture {
  explicit Fixture(benchmark::State& state)
      : batch(state.range(0)),
        threads(static_cast<int>(state.range(2))),
        logits(RandomLogits(batch, state.range(3), 2024)),
        params(1, Setting(state.range(1))),
        tokens(batch),
        status(batch) {
    args.logits = logits.data();
    args.dtype = DType::kFp32;
    args.batch = batch;
    args.vocab = kVocab;
    args.row_stride = kVocab;
    args.params = params.data();
    args.params_count = 1;
    args.token_ids = tokens.data();
    args.status = status.data();
  }
  void Report(benchmark::State& state) const {
    const double rows = static_cast<double>(state.iterations() * batch);
    state.counters["rows/s"] = benchmark::Counter(rows, benchmark::Counter::kIsRate);
  }

  int64_t batch;
  int threads;
  std::vector<float> logits;
  std::vector<RowParams> params;
  std::vector<int32_t> tokens;
  std::vector<RowStatus> status;
  SampleArgs args;
};

void BM_Oracle(benchmark::State& state) {
  Fixture f(state);
  const int workers = static_cast<int>(std::min<int64_t>(f.threads, f.batch));
  for (auto _ : state) {
    std::vector<std::thread> pool;
    for (int w = 1; w < workers; ++w) {
      pool.emplace_back(
          [&, w] { CpuSampleRows(f.args, f.batch * w / workers, f.batch * (w + 1) / workers); });
    }
    CpuSampleRows(f.args, 0, f.batch / workers);
    for (std::thread& t : pool) t.join();
    benchmark::DoNotOptimize(f.tokens.data());
  }
  f.Report(state);
}

void BM_Fast(benchmark::State& state) {
  Fixture f(state);
  FastCpuSampler::Options options;
  options.threads = f.threads;
  options.spin_us = 100000;
  FastCpuSampler sampler(options);
  for (auto _ : state) {
    sampler.Sample(f.args);
    benchmark::DoNotOptimize(f.tokens.data());
  }
  f.Report(state);
}

void Args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"B", "S", "threads", "D"});
  for (int64_t d : {0, 1, 2}) {
    for (int64_t batch : {1, 4, 32}) {
      for (int64_t s : {0, 1, 2, 3, 4}) {
        for (int64_t threads : {1, 2, 8}) b->Args({batch, s, threads, d});
      }
    }
  }
  b->Unit(benchmark::kMicrosecond)->UseRealTime();
}

BENCHMARK(BM_Oracle)->Apply(Args);
BENCHMARK(BM_Fast)->Apply(Args);

}  // namespace
}  // namespace samplerd::kernels

BENCHMARK_MAIN();
