// FastCpuSampler (kernels/cpu_fast, the host plane's sampler) against the CPU oracle.
//
// V = 151,936 fp32 logits from a fixed seed; B in {1, 4, 32}; settings (arg S):
// 0 top-k 50 + top-p 0.9 at T 0.8, 1 top-p 0.95, 2 top-k 50, 3 greedy, 4 temperature 0.8.
// Distributions (arg D): 0 randn * 3; 1 flat, N(0, 0.05) (a random-weight model: top-p keeps
// most of the row); 2 Zipf-like, x = -1.1 * ln(rank) over a random permutation of ranks (a
// peaked, heavy-tailed row like a trained model's); 3 engine-like, N(0, 0.6) rounded to bf16
// (tests/bench/engine/decode_loop.py's random-weight model: bf16 logits handed over as fp32,
// so many tokens tie).
// BM_Oracle runs CpuSampleRows over the rows with `threads` std::threads (rows split evenly, as
// the server's pool would); BM_Fast runs FastCpuSampler::Sample with `threads` threads (the
// caller included; workers spin between iterations, as in a busy session). Per-iteration time
// is one whole batch. BM_FastSnapshot: BM_Fast as the host plane runs it (snapshot_logits: each
// non-greedy row copied by the first pass, later passes on the copy). BM_OracleTemperature /
// BM_FastTemperature: temperature 0.8 alone (plain rows: the inverse-CDF draw) at V = 151,936 and
// 32,000, B in {1, 32}, threads 1 and 2. BM_FastPhases: BM_FastSnapshot at B = 1 with each
// phase's wall µs per call and the pool loops per call as counters; BM_PoolLoop: one pool loop
// of near-empty tasks (a barrier's fixed cost). Results: HOST_PLANE_RESULTS.md.
//
//   bench_fast_cpu --benchmark_min_time=0.2
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <thread>
#include <vector>

#include "kernels/common/sampling_types.h"
#include "kernels/cpu/cpu_sampler.h"
#include "kernels/cpu/half_float.h"
#include "kernels/cpu_fast/fast_cpu_sampler.h"
#include "kernels/cpu_fast/worker_pool.h"

namespace samplerd::kernels {
namespace {

constexpr int64_t kVocab = 151936;

std::vector<float> RandomLogits(int64_t batch, int64_t vocab, int64_t distribution, uint32_t seed) {
  std::vector<float> logits(static_cast<size_t>(batch * vocab));
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  if (distribution == 2) {
    std::vector<int64_t> rank(vocab);
    for (int64_t j = 0; j < vocab; ++j) rank[j] = j + 1;
    for (int64_t row = 0; row < batch; ++row) {
      std::shuffle(rank.begin(), rank.end(), rng);
      for (int64_t j = 0; j < vocab; ++j) {
        logits[row * vocab + j] = -1.1f * std::log(static_cast<float>(rank[j]));
      }
    }
    return logits;
  }
  const float sigma = distribution == 1 ? 0.05f : distribution == 3 ? 0.6f : 3.0f;
  for (float& x : logits) x = sigma * normal(rng);
  if (distribution == 3) {
    for (float& x : logits) x = RoundToBf16(x);
  }
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
  // Args B, S, threads, D at V = 151,936.
  explicit Fixture(benchmark::State& state)
      : Fixture(state.range(0), kVocab, Setting(state.range(1)), static_cast<int>(state.range(2)),
                state.range(3)) {}
  Fixture(int64_t batch_size, int64_t vocab_size, const RowParams& p, int thread_count,
          int64_t distribution)
      : batch(batch_size),
        vocab(vocab_size),
        threads(thread_count),
        logits(RandomLogits(batch, vocab, distribution, 2024)),
        params(1, p),
        tokens(batch),
        status(batch) {
    args.logits = logits.data();
    args.dtype = DType::kFp32;
    args.batch = batch;
    args.vocab = vocab;
    args.row_stride = vocab;
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
  int64_t vocab;
  int threads;
  std::vector<float> logits;
  std::vector<RowParams> params;
  std::vector<int32_t> tokens;
  std::vector<RowStatus> status;
  SampleArgs args;
};

void RunOracle(benchmark::State& state, Fixture& f) {
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

void RunFast(benchmark::State& state, Fixture& f, bool snapshot_logits = false) {
  FastCpuSampler::Options options;
  options.threads = f.threads;
  options.spin_us = 100000;
  options.snapshot_logits = snapshot_logits;
  FastCpuSampler sampler(options);
  for (auto _ : state) {
    sampler.Sample(f.args);
    benchmark::DoNotOptimize(f.tokens.data());
  }
  f.Report(state);
}

// As BM_FastSnapshot, with each phase's wall time per call reported as a counter (µs):
// where a step's time goes at each thread count, and how many pool loops (barriers) it took.
void BM_FastPhases(benchmark::State& state) {
  Fixture f(state);
  PhaseTimes times;
  FastCpuSampler::Options options;
  options.threads = f.threads;
  options.spin_us = 100000;
  options.snapshot_logits = true;
  options.phase_times = &times;
  FastCpuSampler sampler(options);
  for (auto _ : state) {
    sampler.Sample(f.args);
    benchmark::DoNotOptimize(f.tokens.data());
  }
  const double calls = static_cast<double>(std::max<int64_t>(times.calls, 1));
  state.counters["stats_us"] = static_cast<double>(times.stats_ns) / calls / 1e3;
  state.counters["select_us"] = static_cast<double>(times.select_ns) / calls / 1e3;
  state.counters["window_us"] = static_cast<double>(times.window_ns) / calls / 1e3;
  state.counters["histogram_us"] = static_cast<double>(times.histogram_ns) / calls / 1e3;
  state.counters["gather_us"] = static_cast<double>(times.gather_ns) / calls / 1e3;
  state.counters["advance_us"] = static_cast<double>(times.advance_ns) / calls / 1e3;
  state.counters["draw_us"] = static_cast<double>(times.draw_ns) / calls / 1e3;
  state.counters["output_us"] = static_cast<double>(times.output_ns) / calls / 1e3;
  state.counters["loops"] = static_cast<double>(times.loops) / calls;
  f.Report(state);
}

// One WorkerPool loop of `tasks` near-empty tasks at `threads` (the caller included), workers
// spinning between loops as the sampler's do: the fixed cost of each barrier a step pays.
void BM_PoolLoop(benchmark::State& state) {
  WorkerPool pool(static_cast<int>(state.range(0)), 100000);
  const int64_t tasks = state.range(1);
  std::vector<int64_t> sink(static_cast<size_t>(tasks) * 16);  // a cache line a task
  const std::function<void(int64_t)> fn = [&](int64_t i) { sink[static_cast<size_t>(i) * 16]++; };
  for (auto _ : state) pool.Run(tasks, fn);
  benchmark::DoNotOptimize(sink.data());
}

void BM_Oracle(benchmark::State& state) {
  Fixture f(state);
  RunOracle(state, f);
}

void BM_Fast(benchmark::State& state) {
  Fixture f(state);
  RunFast(state, f);
}

// As the host plane runs it: non-greedy rows copied by the first pass, later passes on the copy.
void BM_FastSnapshot(benchmark::State& state) {
  Fixture f(state);
  RunFast(state, f, /*snapshot_logits=*/true);
}

// Plain-temperature rows (T 0.8, no filter) at a chosen vocabulary: args B, V, threads, D.
void BM_OracleTemperature(benchmark::State& state) {
  Fixture f(state.range(0), state.range(1), Setting(4), static_cast<int>(state.range(2)),
            state.range(3));
  RunOracle(state, f);
}

void BM_FastTemperature(benchmark::State& state) {
  Fixture f(state.range(0), state.range(1), Setting(4), static_cast<int>(state.range(2)),
            state.range(3));
  RunFast(state, f);
}

void Args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"B", "S", "threads", "D"});
  for (int64_t d : {0, 1, 2, 3}) {
    for (int64_t batch : {1, 4, 32}) {
      for (int64_t s : {0, 1, 2, 3, 4}) {
        for (int64_t threads : {1, 2, 8}) b->Args({batch, s, threads, d});
        // More threads at B = 1, where the host plane serves (issue 10: is 8 the best default?).
        if (batch == 1) {
          for (int64_t threads : {12, 15}) b->Args({batch, s, threads, d});
        }
      }
    }
  }
  b->Unit(benchmark::kMicrosecond)->UseRealTime();
}

void TemperatureArgs(benchmark::internal::Benchmark* b) {
  b->ArgNames({"B", "V", "threads", "D"});
  for (int64_t d : {0, 1, 2}) {
    for (int64_t batch : {1, 32}) {
      for (int64_t vocab : {kVocab, int64_t{32000}}) {
        for (int64_t threads : {1, 2}) b->Args({batch, vocab, threads, d});
      }
    }
  }
  b->Unit(benchmark::kMicrosecond)->UseRealTime();
}

BENCHMARK(BM_Oracle)->Apply(Args);
BENCHMARK(BM_Fast)->Apply(Args);
BENCHMARK(BM_FastSnapshot)->Apply(Args);
BENCHMARK(BM_FastPhases)
    ->ArgNames({"B", "S", "threads", "D"})
    ->ArgsProduct({{1}, {0, 1, 2, 4}, {1, 2, 8, 12}, {0, 1, 3}})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();
BENCHMARK(BM_PoolLoop)
    ->ArgNames({"threads", "tasks"})
    ->ArgsProduct({{2, 8, 12}, {24, 75}})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();
BENCHMARK(BM_OracleTemperature)->Apply(TemperatureArgs);
BENCHMARK(BM_FastTemperature)->Apply(TemperatureArgs);

}  // namespace
}  // namespace samplerd::kernels

BENCHMARK_MAIN();
