// The GPU's draws follow the exact renormalised distribution (chi-square, fixed seeds), never
// leave the allowed set, and 64-bit indexing holds past 2^31 elements.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "tests/gpu/gpu_test_util.h"

namespace samplerd::kernels::testing {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

class GpuStatisticsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!HaveGpu(&why)) GTEST_SKIP() << "no GPU: " << why;
  }
};

// Upper 1e-6 quantile of chi-square with `df` degrees of freedom (Wilson-Hilferty).
double ChiSquareCritical(int df) {
  const double z = 4.753424;  // standard normal upper 1e-6 quantile
  const double a = 2.0 / (9.0 * df);
  return df * std::pow(1.0 - a + z * std::sqrt(a), 3.0);
}

// The exact distribution of the semantics for one row, written independently of both samplers:
// temperature, top-k (ties kept), top-p over the renormalised survivors.
std::vector<double> ExactDistribution(const std::vector<float>& x, float t, int k, double p) {
  const int n = static_cast<int>(x.size());
  std::vector<double> z(n);
  for (int j = 0; j < n; ++j) z[j] = static_cast<double>(x[j] / t);
  std::vector<double> sorted;
  for (double v : z) {
    if (v > -INFINITY) sorted.push_back(v);
  }
  std::sort(sorted.rbegin(), sorted.rend());
  const double kth = k > 0 && k < static_cast<int>(sorted.size()) ? sorted[k - 1] : -INFINITY;
  std::vector<bool> keep(n);
  double total = 0.0;
  for (int j = 0; j < n; ++j) {
    keep[j] = z[j] > -INFINITY && z[j] >= kth;
    if (keep[j]) total += std::exp(z[j] - sorted[0]);
  }
  std::vector<double> prob(n, 0.0);
  for (int j = 0; j < n; ++j) {
    if (!keep[j]) continue;
    double above = 0.0;
    for (int i = 0; i < n; ++i) {
      if (keep[i] && z[i] > z[j]) above += std::exp(z[i] - sorted[0]) / total;
    }
    if (above < p) prob[j] = std::exp(z[j] - sorted[0]);
  }
  double kept = 0.0;
  for (double v : prob) kept += v;
  for (double& v : prob) v /= kept;
  return prob;
}

TEST_F(GpuStatisticsTest, DrawsFollowTheExactDistribution) {
  const std::vector<float> logits = {2.0f, 1.5f,  1.4f,  1.0f,  0.7f,  0.5f,
                                     0.1f, -0.3f, -1.0f, -2.0f, -kInf, 3.0f};
  struct Case {
    float t;
    int k;
    float p;
  };
  for (const Case& c :
       {Case{1.0f, 0, 1.0f}, Case{0.9f, 8, 0.9f}, Case{1.5f, 0, 0.8f}, Case{0.7f, 5, 1.0f}}) {
    const std::vector<double> expected = ExactDistribution(logits, c.t, c.k, c.p);
    Batch b;
    b.dtype = DType::kFp32;
    b.vocab = static_cast<int64_t>(logits.size());
    b.batch = 40000;
    b.row_stride = b.vocab;
    b.bytes.resize(b.batch * b.vocab * 4);
    for (int64_t r = 0; r < b.batch; ++r) {
      std::memcpy(&b.bytes[r * b.vocab * 4], logits.data(), b.vocab * 4);
    }
    RowParams params;
    params.temperature = c.t;
    params.top_k = c.k;
    params.top_p = c.p;
    params.seed = 424242;
    b.params.assign(b.batch, params);
    for (int64_t r = 0; r < b.batch; ++r) b.params[r].position = static_cast<uint64_t>(r);
    const Outputs gpu = RunGpu(b);

    std::vector<int64_t> counts(b.vocab, 0);
    for (int32_t token : gpu.tokens) {
      ASSERT_GE(token, 0);
      ASSERT_LT(token, b.vocab);
      ASSERT_GT(expected[token], 0.0) << "drew token " << token << " outside the allowed set";
      ++counts[token];
    }
    // Merge cells with fewer than 5 expected draws into one.
    double chi2 = 0.0, merged_expected = 0.0, merged_observed = 0.0;
    int cells = 0;
    for (int64_t j = 0; j < b.vocab; ++j) {
      const double e = expected[j] * b.batch;
      if (e == 0.0) continue;
      if (e < 5.0) {
        merged_expected += e;
        merged_observed += static_cast<double>(counts[j]);
        continue;
      }
      chi2 += (counts[j] - e) * (counts[j] - e) / e;
      ++cells;
    }
    if (merged_expected > 0.0) {
      chi2 += (merged_observed - merged_expected) * (merged_observed - merged_expected) /
              merged_expected;
      ++cells;
    }
    ASSERT_GE(cells, 2);
    EXPECT_LT(chi2, ChiSquareCritical(cells - 1))
        << "T=" << c.t << " k=" << c.k << " p=" << c.p << " cells=" << cells;
  }
}

TEST_F(GpuStatisticsTest, IndexesPastTwoToThe31Elements) {
  // 16,400 rows x 131,072 bf16 = 2.15e9 elements (4.3 GB): rows repeat 16 patterns, so every
  // row's token must equal its pattern's token from a small batch.
  constexpr int64_t kPatterns = 16;
  Batch small;
  small.dtype = DType::kBf16;
  small.batch = kPatterns;
  small.vocab = 131072;
  std::mt19937_64 rng(3);
  FillLogits(small, "randn3", rng);
  small.params.resize(kPatterns);
  for (int64_t r = 0; r < kPatterns; ++r) {
    small.params[r].temperature = r % 2 == 0 ? 0.0f : 1.0f;
    small.params[r].top_k = r % 4 == 1 ? 50 : 0;
    small.params[r].top_p = r % 4 == 3 ? 0.9f : 1.0f;
    small.params[r].seed = rng();
  }
  const Outputs expected = RunGpu(small);
  const Outputs cpu = RunCpu(small);
  for (int64_t r = 0; r < kPatterns; r += 2) EXPECT_EQ(expected.tokens[r], cpu.tokens[r]);

  Batch big = small;
  big.batch = 16400;
  ASSERT_GT(big.batch * big.vocab, int64_t{1} << 31);
  const size_t pattern_bytes = small.bytes.size();
  big.bytes.resize(big.batch * big.vocab * 2);
  for (int64_t r = kPatterns; r < big.batch; r += kPatterns) {
    std::memcpy(&big.bytes[r * big.vocab * 2], small.bytes.data(),
                std::min<size_t>(pattern_bytes, (big.batch - r) * big.vocab * 2));
  }
  big.params.resize(big.batch);
  for (int64_t r = 0; r < big.batch; ++r) big.params[r] = small.params[r % kPatterns];
  const Outputs got = RunGpu(big);
  int64_t wrong = 0;
  for (int64_t r = 0; r < big.batch; ++r) wrong += got.tokens[r] != expected.tokens[r % kPatterns];
  EXPECT_EQ(wrong, 0);
  EXPECT_EQ(got.tokens[big.batch - 1], expected.tokens[(big.batch - 1) % kPatterns]);
}

}  // namespace
}  // namespace samplerd::kernels::testing
