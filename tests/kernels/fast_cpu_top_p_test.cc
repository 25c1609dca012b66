// FastCpuSampler's top-p fast paths (kernels/cpu_fast, HOST_PLANE_RESULTS.md "Run 5") against
// the kernels/cpu oracle, token for token: the grid spread over a near-flat row's span, the
// window a sample puts around the boundary (and the second grid pass when the sample misses),
// and the draw's noise-bucket filter. Rows of the shapes the host plane sees (flat, bf16-rounded
// with many ties, Zipf, randn * 3) and vocabularies with a partial last chunk, every row
// sampled on the AVX-512, AVX2 and scalar paths, on 1 and 3 threads, and with a gather cap of
// 16 (short rows then take the row-wide draw). These rows were checked to give the oracle's
// tokens before the fast paths existed (commit 655724e), so any token the fast paths changed
// fails here.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_sampler.h"
#include "kernels/cpu/half_float.h"
#include "kernels/cpu_fast/cpu_features.h"
#include "kernels/cpu_fast/fast_cpu_sampler.h"
#include "kernels/cpu_fast/radix_select.h"
#include "kernels/cpu_fast/row_state.h"

namespace samplerd::kernels {
namespace {

enum class Shape { kFlat, kBf16Rounded, kZipf, kRandn, kMisleadingSample };

const char* Name(Shape shape) {
  switch (shape) {
    case Shape::kFlat:
      return "flat";
    case Shape::kBf16Rounded:
      return "bf16-rounded";
    case Shape::kZipf:
      return "zipf";
    case Shape::kRandn:
      return "randn";
    case Shape::kMisleadingSample:
      return "misleading sample";
  }
  return "?";
}

// One row of `shape`. kMisleadingSample: a flat row whose tokens at the positions
// NarrowMassWindow samples (every vocab / 512-th, from the middle of the first stride) sit
// 0.5 logits above the rest, so that its window misses the boundary.
void FillRow(Shape shape, int64_t vocab, std::mt19937_64& rng, float* x) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  switch (shape) {
    case Shape::kFlat:
    case Shape::kMisleadingSample:
      for (int64_t j = 0; j < vocab; ++j) x[j] = 0.05f * normal(rng);
      break;
    case Shape::kBf16Rounded:
      for (int64_t j = 0; j < vocab; ++j) x[j] = RoundToBf16(0.6f * normal(rng));
      break;
    case Shape::kZipf: {
      std::vector<int64_t> rank(vocab);
      for (int64_t j = 0; j < vocab; ++j) rank[j] = j + 1;
      std::shuffle(rank.begin(), rank.end(), rng);
      for (int64_t j = 0; j < vocab; ++j) x[j] = -1.1f * std::log(static_cast<float>(rank[j]));
      break;
    }
    case Shape::kRandn:
      for (int64_t j = 0; j < vocab; ++j) x[j] = 3.0f * normal(rng);
      break;
  }
  if (shape == Shape::kMisleadingSample) {
    const int64_t stride = vocab / 512;
    for (int64_t k = 0; stride > 0 && k < 512; ++k) x[k * stride + stride / 2] += 0.5f;
  }
}

RowParams Params(float temperature, int32_t top_k, float top_p, float min_p) {
  RowParams p;
  p.temperature = temperature;
  p.top_k = top_k;
  p.top_p = top_p;
  p.min_p = min_p;
  return p;
}

// Top-p alone at the host plane's values, with a temperature, after top-k and min-p.
const RowParams kSettings[] = {
    Params(1.0f, 0, 0.95f, 0.0f), Params(0.8f, 0, 0.9f, 0.0f),  Params(1.0f, 0, 0.5f, 0.0f),
    Params(1.0f, 0, 0.99f, 0.0f), Params(0.8f, 50, 0.9f, 0.0f), Params(1.0f, 0, 0.9f, 0.05f),
};

struct Rows {
  DType dtype = DType::kFp32;
  int64_t batch = 0;
  int64_t vocab = 0;
  std::vector<unsigned char> bytes;
  std::vector<RowParams> params;

  SampleArgs Args(std::vector<int32_t>& tokens, std::vector<RowStatus>& status) const {
    tokens.assign(batch, -2);
    status.assign(batch, RowStatus::kOk);
    SampleArgs args;
    args.logits = bytes.data();
    args.dtype = dtype;
    args.batch = batch;
    args.vocab = vocab;
    args.row_stride = vocab;
    args.params = params.data();
    args.params_count = batch;
    args.token_ids = tokens.data();
    args.status = status.data();
    return args;
  }
};

// Every setting twice (two seeds) on rows of `shape`, as fp32 or (bf16) truncated to bf16.
Rows MakeRows(Shape shape, int64_t vocab, DType dtype, std::mt19937_64& rng) {
  Rows rows;
  rows.dtype = dtype;
  rows.batch = 2 * static_cast<int64_t>(std::size(kSettings));
  rows.vocab = vocab;
  std::vector<float> x(vocab);
  const int64_t size = DTypeSize(dtype);
  rows.bytes.resize(rows.batch * vocab * size);
  for (int64_t row = 0; row < rows.batch; ++row) {
    FillRow(shape, vocab, rng, x.data());
    unsigned char* out = rows.bytes.data() + row * vocab * size;
    for (int64_t j = 0; j < vocab; ++j) {
      uint32_t bits;
      std::memcpy(&bits, &x[j], 4);
      if (dtype == DType::kBf16) {
        const auto half = static_cast<uint16_t>(bits >> 16);
        std::memcpy(out + j * 2, &half, 2);
      } else {
        std::memcpy(out + j * 4, &bits, 4);
      }
    }
    RowParams p = kSettings[row % std::size(kSettings)];
    p.seed = rng();
    p.position = rng() % 100000;
    rows.params.push_back(p);
  }
  return rows;
}

// The vector paths a sampler may take (cpu_features.h), set for one scope.
class Paths {
 public:
  Paths(bool avx2, bool avx512) {
    cpu_fast_internal::Avx2Allowed().store(avx2);
    cpu_fast_internal::Avx512Allowed().store(avx512);
  }
  ~Paths() {
    cpu_fast_internal::Avx2Allowed().store(true);
    cpu_fast_internal::Avx512Allowed().store(true);
  }
};

TEST(FastCpuTopPTest, NearFlatAndPeakedRowsGiveTheOraclesTokensOnEveryPath) {
  std::mt19937_64 rng(20261205);
  FastCpuSampler::Options one;
  one.threads = 1;
  FastCpuSampler::Options three = one;
  three.threads = 3;
  three.spin_us = 50;
  // A small gather cap sends short rows through the histogram passes and the row-wide draw.
  FastCpuSampler::Options small_cap = three;
  small_cap.threads = 2;
  small_cap.gather_cap = 16;
  FastCpuSampler samplers[] = {FastCpuSampler(one), FastCpuSampler(three),
                               FastCpuSampler(small_cap)};
  int rows_checked = 0;
  // 151,936 and 50,000: a partial last chunk of 8,192; 24,576: whole chunks; 9,001: a sample
  // stride of 17; 4,099: too short for a window; 1,001 and 111: 8-token vector steps and a
  // scalar tail in the draw.
  for (int64_t vocab : {151936, 50000, 24576, 9001, 4099, 1001, 111}) {
    for (Shape shape : {Shape::kFlat, Shape::kBf16Rounded, Shape::kZipf, Shape::kRandn,
                        Shape::kMisleadingSample}) {
      const DType dtype =
          shape == Shape::kBf16Rounded && vocab == 50000 ? DType::kBf16 : DType::kFp32;
      const Rows rows = MakeRows(shape, vocab, dtype, rng);
      std::vector<int32_t> oracle, fast;
      std::vector<RowStatus> oracle_status, fast_status;
      CpuSampleRows(rows.Args(oracle, oracle_status), 0, rows.batch);
      for (FastCpuSampler& sampler : samplers) {
        for (int path = 0; path < 3; ++path) {
          const Paths paths(/*avx2=*/path < 2, /*avx512=*/path == 0);
          ASSERT_TRUE(sampler.Sample(rows.Args(fast, fast_status)));
          EXPECT_EQ(fast_status, oracle_status);
          EXPECT_EQ(fast, oracle) << Name(shape) << " V " << vocab << " threads "
                                  << sampler.threads() << " path " << path;
        }
      }
      rows_checked += static_cast<int>(rows.batch);
    }
  }
  EXPECT_EQ(rows_checked, 420);
}

// NarrowMassWindow's sample comes from the stats pass (SampleForWindow, one call per task's
// piece of the row): whatever the pieces, entry k is the row's token k * (V / 512) + (V / 512) / 2,
// in fp32 and widened from bf16.
TEST(FastCpuTopPTest, TheStatsPassesSampleIsTheRowsTokensAtTheSampleIndices) {
  using cpu_fast_internal::kWindowSample;
  std::mt19937_64 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (const int64_t vocab : {int64_t{8192}, int64_t{100003}, int64_t{151936}}) {
    std::vector<float> x(static_cast<size_t>(2 * vocab));
    for (float& v : x) v = normal(rng);
    std::vector<uint16_t> bf16(x.size());
    for (size_t j = 0; j < x.size(); ++j) {
      const float rounded = RoundToBf16(x[j]);
      uint32_t bits;
      std::memcpy(&bits, &rounded, sizeof(bits));
      bf16[j] = static_cast<uint16_t>(bits >> 16);
    }
    for (const DType dtype : {DType::kFp32, DType::kBf16}) {
      SampleArgs args;
      args.logits = dtype == DType::kFp32 ? static_cast<const void*>(x.data()) : bf16.data();
      args.dtype = dtype;
      args.batch = 2;
      args.vocab = vocab;
      args.row_stride = vocab;
      for (const int64_t piece : {int64_t{777}, int64_t{2048}, int64_t{8192}, vocab}) {
        cpu_fast_internal::RowState r;
        r.window_sample.assign(kWindowSample, std::nanf(""));
        const int64_t row = 1;
        for (int64_t begin = 0; begin < vocab; begin += piece) {
          cpu_fast_internal::SampleForWindow(args, row, begin, std::min(piece, vocab - begin), r);
        }
        const int64_t stride = vocab / kWindowSample;
        for (int64_t k = 0; k < kWindowSample; ++k) {
          const int64_t j = row * vocab + k * stride + stride / 2;
          const float want = dtype == DType::kFp32 ? x[j] : Bf16BitsToFloat(bf16[j]);
          ASSERT_EQ(r.window_sample[k], want)
              << "V " << vocab << " dtype " << static_cast<int>(dtype) << " piece " << piece
              << " k " << k;
        }
      }
    }
  }
}

}  // namespace
}  // namespace samplerd::kernels
