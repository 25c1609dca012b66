// CPU reference sampler throughput: rows/s of samplerd::kernels::CpuSampleRows.
//
// Setting (DESIGN.md's benchmark row): top-k 50 + top-p 0.9 at T = 0.8, fp32 logits ~ 3 * N(0, 1)
// from a fixed seed, B in {1, 32, 128} x V in {32000, 151936}. All rows run on ONE thread (one
// CpuSampleRows call over [0, B)); the server spreads rows over its pool, so its throughput is
// up to `threads` times this.
//
//   bench_cpu_sampler --benchmark_min_time=0.5
#include <benchmark/benchmark.h>

#include <cstdint>
#include <random>
#include <vector>

#include "kernels/common/sampling_types.h"
#include "kernels/cpu/cpu_sampler.h"

namespace samplerd::kernels {
namespace {

std::vector<float> RandomLogits(int64_t batch, int64_t vocab, uint32_t seed) {
  std::vector<float> logits(static_cast<size_t>(batch * vocab));
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& x : logits) x = 3.0f * normal(rng);
  return logits;
}

void BM_CpuSampleRowsTopKTopP(benchmark::State& state) {
  const int64_t batch = state.range(0);
  const int64_t vocab = state.range(1);
  const std::vector<float> logits = RandomLogits(batch, vocab, /*seed=*/2024);

  RowParams params;
  params.temperature = 0.8f;
  params.top_k = 50;
  params.top_p = 0.9f;
  params.seed = 42;
  std::vector<int32_t> tokens(static_cast<size_t>(batch));
  std::vector<RowStatus> status(static_cast<size_t>(batch));

  SampleArgs args;
  args.logits = logits.data();
  args.dtype = DType::kFp32;
  args.batch = batch;
  args.vocab = vocab;
  args.row_stride = vocab;
  args.params = &params;
  args.params_count = 1;
  args.token_ids = tokens.data();
  args.status = status.data();

  for (auto _ : state) {
    CpuSampleRows(args, 0, batch);
    benchmark::DoNotOptimize(tokens.data());
    benchmark::ClobberMemory();
  }
  const double rows = static_cast<double>(state.iterations() * batch);
  state.SetItemsProcessed(static_cast<int64_t>(rows));
  state.SetBytesProcessed(static_cast<int64_t>(rows * vocab * sizeof(float)));
  state.counters["rows/s"] = benchmark::Counter(rows, benchmark::Counter::kIsRate);
}

BENCHMARK(BM_CpuSampleRowsTopKTopP)
    ->ArgNames({"B", "V"})
    ->ArgsProduct({{1, 32, 128}, {32000, 151936}})
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace samplerd::kernels

BENCHMARK_MAIN();
