// GPU kernels against the CPU reference: same tokens (identical for greedy, >= 99.9% elsewhere,
// disagreements printed with the gap that explains them), degenerate rows, logprobs, batch
// invariance and repeatability. Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "kernels/common/inverse_cdf.h"
#include "kernels/common/philox.h"
#include "tests/gpu/gpu_test_util.h"

namespace samplerd::kernels::testing {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

class GpuSamplerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!HaveGpu(&why)) GTEST_SKIP() << "no GPU: " << why;
  }
};

struct Setting {
  const char* name;
  RowParams params;
};

const Setting kSettings[] = {
    {"greedy", Params(0.0f, 0, 1.0f, 0.0f)},
    {"temperature_0.8", Params(0.8f, 0, 1.0f, 0.0f)},
    {"top_k_50", Params(1.0f, 50, 1.0f, 0.0f)},
    {"top_p_0.95", Params(1.0f, 0, 0.95f, 0.0f)},
    {"top_k_50_top_p_0.9", Params(1.0f, 50, 0.9f, 0.0f)},
    {"joint_top_k_50_top_p_0.9", Params(1.0f, 50, 0.9f, 0.0f, TopPMode::kJoint)},
    {"min_p_0.1", Params(1.0f, 0, 1.0f, 0.1f)},
    {"top_k_1", Params(1.0f, 1, 1.0f, 0.0f)},
    {"top_k_1000", Params(0.9f, 1000, 1.0f, 0.0f)},
    {"top_k_1000_top_p_0.8", Params(0.9f, 1000, 0.8f, 0.0f)},
    {"top_p_0.1", Params(1.0f, 0, 0.1f, 0.0f)},
    {"joint_top_p_0.7", Params(1.3f, 0, 0.7f, 0.0f, TopPMode::kJoint)},
    {"combined", Params(0.7f, 40, 0.8f, 0.05f)},
    // The candidate finish's other branches (candidate_finish.h): more than kRankSortCap items
    // to sort (bitonic), nearly that many (by rank), and min-p leaving fewer than k.
    {"top_k_256", Params(1.0f, 256, 1.0f, 0.0f)},
    {"top_k_200_top_p_0.95", Params(0.8f, 200, 0.95f, 0.0f)},
    {"min_p_0.2_top_k_100", Params(1.0f, 100, 1.0f, 0.2f)},
};

struct Shape {
  int64_t batch, vocab, stride;
};

const Shape kShapes[] = {{8, 32000, 0}, {3, 151936, 0}, {16, 111, 0},
                         {5, 1, 0},     {4, 8193, 0},   {2, 20000, 20011}};

const DType kDTypes[] = {DType::kFp32, DType::kBf16, DType::kFp16};

// A batch of `shape` in `dtype` with logits of `kind` (FillLogits), parameters still to set.
Batch RandomBatch(DType dtype, const Shape& shape, const char* kind, std::mt19937_64& rng) {
  Batch b;
  b.dtype = dtype;
  b.batch = shape.batch;
  b.vocab = shape.vocab;
  b.row_stride = shape.stride;
  FillLogits(b, kind, rng);
  return b;
}

// The Gumbel-perturbed score the CPU would give token j of row r (for diagnosing mismatches).
double Score(const Batch& b, int64_t r, int64_t j) {
  const RowParams& p = b.params[b.params.size() == 1 ? 0 : r];
  const float x = LoadValue(b.dtype, &b.bytes[r * b.row_stride * DTypeSize(b.dtype)], j);
  return static_cast<double>(x / p.temperature) + GumbelNoise(p.seed, p.position, j);
}

// v47 diagnostics: for a top-p-alone row, how close its level-0, 1 and 2 targets lie to a
// unit boundary, relative to the level's total (the oracle's exact sums; a mismatch of the
// near-boundary kind has one of them within ~1e-6).
std::string ChunkedDrawMargins(const Batch& b, int64_t r) {
  const RowParams& p = b.params[b.params.size() == 1 ? 0 : r];
  if (!IsTopPAlone(p, b.vocab)) return "";
  const int64_t n = b.vocab;
  std::vector<float> z(n);
  for (int64_t j = 0; j < n; ++j) {
    z[j] = LoadValue(b.dtype, &b.bytes[r * b.row_stride * DTypeSize(b.dtype)], j) / p.temperature;
  }
  const float mx = *std::max_element(z.begin(), z.end());
  std::vector<int64_t> order(n);
  for (int64_t j = 0; j < n; ++j) order[j] = j;
  std::sort(order.begin(), order.end(),
            [&](int64_t a, int64_t c) { return z[a] > z[c] || (z[a] == z[c] && a < c); });
  double total = 0.0;
  for (int64_t j : order) total += std::exp(double{z[j]} - mx);
  std::vector<double> m(n, 0.0);
  double prefix = 0.0, above = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t j = order[i];
    if (i == 0 || z[j] != z[order[i - 1]]) above = prefix;
    prefix += std::exp(double{z[j]} - mx);
    if (above < p.top_p * total) m[j] = std::exp(double{z[j]} - mx);
  }
  const ChunkedUniforms u = RowChunkedUniforms(p.seed, p.position);
  // Level 0: the head (kept tokens above the bin of the lowest kept z) or the tail.
  float z_low = INFINITY;
  for (int64_t j = 0; j < n; ++j) {
    if (m[j] > 0.0) z_low = std::min(z_low, z[j]);
  }
  double w_head = 0.0, w_tail = 0.0;
  for (int64_t j = 0; j < n; ++j) (DrawBin(z[j]) > DrawBin(z_low) ? w_head : w_tail) += m[j];
  const bool head = HeadIsDrawn(w_head, w_tail, u.u0);
  const double m0 = std::fabs(u.u0 * (w_head + w_tail) - w_head) / (w_head + w_tail);
  for (int64_t j = 0; j < n; ++j) {
    if ((DrawBin(z[j]) > DrawBin(z_low)) != head) m[j] = 0.0;
  }
  auto margin = [&](int64_t begin, int64_t end, int64_t unit, double uniform, int64_t* chosen) {
    std::vector<double> w;
    for (int64_t f = begin; f < end; f += unit) {
      double s = 0.0;
      for (int64_t j = f; j < std::min(end, f + unit); ++j) s += m[j];
      w.push_back(s);
    }
    double t = 0.0;
    for (double x : w) t += x;
    const double target = uniform * t;
    double run = 0.0, best = 1.0;
    *chosen = -1;
    for (size_t k = 0; k < w.size(); ++k) {
      run += w[k];
      best = std::min(best, std::fabs(run - target) / t);
      if (*chosen < 0 && w[k] > 0.0 && run > target)
        *chosen = begin + static_cast<int64_t>(k) * unit;
    }
    return best;
  };
  int64_t chunk = 0, segment = 0;
  const double m1 = margin(0, n, kDrawChunk, u.u1, &chunk);
  const double m2 = margin(chunk, std::min(n, chunk + kDrawChunk), kDrawSegment, u.u2, &segment);
  char out[200];
  std::snprintf(out, sizeof(out),
                " [chunked draw: %s margin %.2e, chunk %ld margin %.2e, segment %ld margin %.2e]",
                head ? "head" : "tail", m0, static_cast<long>(chunk / kDrawChunk), m1,
                static_cast<long>((segment - chunk) / kDrawSegment), m2);
  return out;
}

TEST_F(GpuSamplerTest, TokensMatchTheCpuReference) {
  std::mt19937_64 rng(1234);
  int64_t rows = 0, mismatches = 0, greedy_mismatches = 0;
  for (const Setting& setting : kSettings) {
    for (const Shape& shape : kShapes) {
      for (DType dtype : kDTypes) {
        for (const char* kind : {"randn3", "peaked", "zipf", "flat", "engine"}) {
          Batch b = RandomBatch(dtype, shape, kind, rng);
          SetParams(b, setting.params, rng);
          const Outputs cpu = RunCpu(b);
          const Outputs gpu = RunGpu(b);
          for (int64_t r = 0; r < b.batch; ++r) {
            ++rows;
            ASSERT_EQ(gpu.status[r], cpu.status[r]);
            ASSERT_GE(gpu.tokens[r], 0) << setting.name;
            ASSERT_LT(gpu.tokens[r], b.vocab) << setting.name;
            if (gpu.tokens[r] == cpu.tokens[r]) continue;
            ++mismatches;
            if (setting.params.temperature == 0.0f) ++greedy_mismatches;
            std::printf(
                "mismatch %s %s %s B=%ld V=%ld row %ld: cpu %d (score %.7f) gpu %d "
                "(score %.7f)%s\n",
                setting.name, DTypeName(dtype), kind, static_cast<long>(b.batch),
                static_cast<long>(b.vocab), static_cast<long>(r), cpu.tokens[r],
                Score(b, r, cpu.tokens[r]), gpu.tokens[r], Score(b, r, gpu.tokens[r]),
                ChunkedDrawMargins(b, r).c_str());
          }
        }
      }
    }
  }
  std::printf("GPU vs CPU: %ld rows, %ld mismatches (%.4f%%)\n", static_cast<long>(rows),
              static_cast<long>(mismatches), 100.0 * mismatches / rows);
  EXPECT_EQ(greedy_mismatches, 0);
  EXPECT_LE(mismatches * 1000, rows) << "more than 0.1% of rows disagree";
}

// Rows whose value is the same in every dtype.
Batch DegenerateBatch(DType dtype) {
  Batch b;
  b.dtype = dtype;
  b.batch = 9;
  b.vocab = 1000;
  b.row_stride = b.vocab;
  const int64_t elem = DTypeSize(dtype);
  b.bytes.assign(b.batch * b.vocab * elem, 0);
  auto set = [&](int64_t r, int64_t j, float v) {
    StoreValue(dtype, v, &b.bytes[(r * b.vocab + j) * elem]);
  };
  std::mt19937_64 rng(99);
  for (int64_t j = 0; j < b.vocab; ++j) {
    set(0, j, -kInf);                                              // no finite logit
    set(1, j, static_cast<float>(j % 7));                          // NaN below
    set(2, j, static_cast<float>(j % 5));                          // +inf below
    set(3, j, 1.5f);                                               // all tied
    set(4, j, j % 10 == 0 ? static_cast<float>(j % 13) : -kInf);   // 90% masked
    set(5, j, static_cast<float>(j % 3));                          // heavy ties
    set(6, j, j == 999 ? 2.0f : -kInf);                            // one finite token, last
    set(7, j, 2097152.0f + static_cast<float>(j % 3) * 16384.0f);  // past 2^20 (fp16: +inf)
    set(8, j, -static_cast<float>(j % 41));                        // over 32 logits below the max
  }
  set(1, 500, std::numeric_limits<float>::quiet_NaN());
  set(2, 10, kInf);
  set(2, 20, kInf);
  set(2, 990, kInf);
  return b;
}

// Runs `make(dtype)` under every setting, dtype and logprob mode (none, or top_n from the raw or
// the processed distribution) on both backends: statuses, tokens and logprobs must be equal.
void ExpectEverySettingMatchesTheCpu(Batch (*make)(DType), uint64_t seed, int32_t top_n) {
  for (DType dtype : kDTypes) {
    for (const Setting& setting : kSettings) {
      Batch b = make(dtype);
      std::mt19937_64 rng(seed);
      SetParams(b, setting.params, rng);
      for (int32_t n : {-1, top_n}) {
        for (LogprobSource source : {LogprobSource::kRaw, LogprobSource::kProcessed}) {
          b.top_logprobs = n;
          b.source = source;
          const Outputs cpu = RunCpu(b);
          const Outputs gpu = RunGpu(b);
          SCOPED_TRACE(std::string(setting.name) + " " + DTypeName(dtype));
          EXPECT_EQ(gpu.status, cpu.status);
          EXPECT_EQ(gpu.tokens, cpu.tokens);
          ExpectLogprobsMatch(gpu, cpu);
        }
      }
    }
  }
}

TEST_F(GpuSamplerTest, DegenerateRowsMatchTheCpuReference) {
  ExpectEverySettingMatchesTheCpu(DegenerateBatch, 7, 3);
}

// Rows whose max x / T overflows to +inf or underflows to -inf at the fp32 limits (issue 12,
// item 3): uniform over the tokens at the max x, drawn from G alone, so GPU = CPU exactly.
Batch LimitBatch(DType dtype) {
  Batch b;
  b.dtype = dtype;
  b.batch = 6;
  b.vocab = 20000;  // three chunks
  b.row_stride = b.vocab;
  const int64_t elem = DTypeSize(dtype);
  b.bytes.assign(b.batch * b.vocab * elem, 0);
  const float top = std::numeric_limits<float>::max();
  for (int64_t j = 0; j < b.vocab; ++j) {
    const float spread = 1e37f * static_cast<float>(j % 23 - 11);  // +-1.1e38
    const float values[] = {
        j == 15000 ? 3e38f : spread,      // one max, overflows
        j % 9000 == 17 ? 2e38f : spread,  // three tied, overflow
        j == 333 || j == 19999 ? top : (j % 2 ? std::nextafter(top, 0.0f) : spread),
        j % 7000 == 5 ? -1e38f : -3e38f + 0.1f * spread,  // all underflow at T 0.25
        j == 8192 ? 3e38f : (j % 3 ? 2.9e38f : -kInf),    // issue 12's row, wide
        spread * 1e-20f,  // +-1.1e18: z stays finite, an ordinary (if very peaked) row
    };
    for (int64_t r = 0; r < b.batch; ++r) {
      StoreValue(dtype, values[r], &b.bytes[(r * b.vocab + j) * elem]);
    }
  }
  return b;
}

TEST_F(GpuSamplerTest, RowsAtTheFp32LimitsMatchTheCpuReference) {
  for (DType dtype : {DType::kFp32, DType::kBf16}) {
    for (const Setting& setting : kSettings) {
      for (float temperature : {0.05f, 0.25f}) {
        Batch b = LimitBatch(dtype);
        std::mt19937_64 rng(11);
        RowParams params = setting.params;
        if (params.temperature != 0.0f) params.temperature = temperature;
        SetParams(b, params, rng);
        for (int32_t top_n : {-1, 3}) {
          b.top_logprobs = top_n;
          b.source = LogprobSource::kProcessed;
          const Outputs cpu = RunCpu(b);
          const Outputs gpu = RunGpu(b);
          SCOPED_TRACE(std::string(setting.name) + " " + DTypeName(dtype) + " T " +
                       std::to_string(temperature));
          EXPECT_EQ(gpu.status, cpu.status);
          EXPECT_EQ(gpu.tokens, cpu.tokens);
          ExpectLogprobsMatch(gpu, cpu);
          for (int64_t r = 0; r + 1 < b.batch; ++r) {  // the last row is an ordinary one
            float row_max = -kInf;
            const uint8_t* row = &b.bytes[r * b.vocab * DTypeSize(dtype)];
            for (int64_t j = 0; j < b.vocab; ++j)
              row_max = std::max(row_max, LoadValue(dtype, row, j));
            EXPECT_EQ(LoadValue(dtype, row, gpu.tokens[r]), row_max) << "row " << r;
          }
        }
      }
    }
  }
}

// Flat rows: every finite logit equal, so a top-k row's chunks overflow their candidate lists
// and the row is finished from pass 1's tied best (v11). Also rows that look flat but are not.
Batch FlatBatch(DType dtype) {
  Batch b;
  b.dtype = dtype;
  b.batch = 6;
  b.vocab = 20000;  // chunks of 8192, 8192 and 3616 tokens
  b.row_stride = b.vocab;
  const int64_t elem = DTypeSize(dtype);
  b.bytes.assign(b.batch * b.vocab * elem, 0);
  for (int64_t j = 0; j < b.vocab; ++j) {
    const float values[] = {
        1.5f,                             // flat
        j % 2 ? -kInf : -2.0f,            // flat, half masked: every chunk still overflows
        j % 40 ? -kInf : 0.25f,           // flat, sparse: no chunk overflows
        j == 12345 ? 1.5f + 0.5f : 1.5f,  // one token above the rest: not tied
        j == 19000 ? 1.5f - 0.5f : 1.5f,  // one token below, in the last chunk: not tied
        j < 8192 ? -kInf : 3.0f,          // flat, first chunk all -inf
    };
    for (int64_t r = 0; r < b.batch; ++r) {
      StoreValue(dtype, values[r], &b.bytes[(r * b.vocab + j) * elem]);
    }
  }
  return b;
}

TEST_F(GpuSamplerTest, FlatRowsUnderEveryFilterMatchTheCpuReference) {
  ExpectEverySettingMatchesTheCpu(FlatBatch, 13, 2);
}

TEST_F(GpuSamplerTest, LogprobsMatchTheCpuReference) {
  std::mt19937_64 rng(5);
  for (const Setting& setting : kSettings) {
    for (LogprobSource source : {LogprobSource::kRaw, LogprobSource::kProcessed}) {
      for (int32_t top_n : {0, 1, 5, 20}) {
        Batch b;
        b.dtype = DType::kFp32;
        b.batch = 6;
        b.vocab = 32000;
        FillLogits(b, "randn3", rng);
        SetParams(b, setting.params, rng);
        b.top_logprobs = top_n;
        b.source = source;
        const Outputs cpu = RunCpu(b);
        const Outputs gpu = RunGpu(b);
        SCOPED_TRACE(std::string(setting.name) +
                     (source == LogprobSource::kRaw ? " raw" : " processed") +
                     " N=" + std::to_string(top_n));
        if (gpu.tokens != cpu.tokens) continue;  // a near-tie draw; counted by the test above
        ExpectLogprobsMatch(gpu, cpu);
      }
    }
  }
}

TEST_F(GpuSamplerTest, ARowsTokenDoesNotDependOnTheBatchAroundIt) {
  std::mt19937_64 rng(11);
  for (const Setting& setting : kSettings) {
    Batch alone;
    alone.dtype = DType::kBf16;
    alone.batch = 1;
    alone.vocab = 151936;
    FillLogits(alone, "randn3", rng);
    SetParams(alone, setting.params, rng);
    const int32_t token = RunGpu(alone).tokens[0];
    for (int64_t place : {0, 5, 36}) {
      Batch big;
      big.dtype = alone.dtype;
      big.batch = 37;
      big.vocab = alone.vocab;
      FillLogits(big, "randn3", rng);
      SetParams(big, setting.params, rng);
      const int64_t row_bytes = alone.vocab * 2;
      std::copy(alone.bytes.begin(), alone.bytes.end(), big.bytes.begin() + place * row_bytes);
      big.params[place] = alone.params[0];
      EXPECT_EQ(RunGpu(big).tokens[place], token) << setting.name << " at row " << place;
    }
  }
}

// Top-p rows without logprobs take the two-pass mass path (kernels/gpu/mass_plan.h): its
// atomics run in any order, its sums must not.
TEST_F(GpuSamplerTest, TopPTokensAreTheSameOnEveryRun) {
  std::mt19937_64 rng(23);
  for (const char* kind : {"randn3", "zipf"}) {
    Batch b;
    b.dtype = DType::kBf16;
    b.batch = 64;
    b.vocab = 151936;
    FillLogits(b, kind, rng);
    SetParams(b, Params(1.0f, 0, 0.95f, 0.0f), rng);
    const Outputs first = RunGpu(b);
    for (int i = 0; i < 5; ++i) EXPECT_EQ(RunGpu(b).tokens, first.tokens) << kind;
  }
}

// A small launch splits each pass-1 chunk over several MassDrawKernel blocks (kernels/gpu/
// mass_draw.h, v34); SAMPLERD_MASS_DRAW_SPLIT forces either form. Which block reads which tokens
// must not change a token: the same tokens and statuses both ways, bit for bit, on rows whose
// kept set is sparse (zipf, randn x 3), dense (engine-like, flat), wide (peaked: the boundary bin
// split into sub-bins) or holds NaN, and on vocabularies whose last chunk is partial (8,193:
// three of its four spans are empty; 20,000 with a row stride).
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) { setenv(name, value, 1); }
  ~ScopedEnv() { unsetenv(name_); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
};

TEST_F(GpuSamplerTest, TopPTokensDoNotDependOnHowPassTwoSplitsTheChunks) {
  std::mt19937_64 rng(31);
  int64_t rows = 0;
  for (const char* kind : {"zipf", "randn3", "engine", "flat", "peaked"}) {
    for (const Shape shape :
         {Shape{3, 151936, 0}, Shape{5, 32000, 0}, Shape{4, 8193, 0}, Shape{2, 20000, 20011}}) {
      for (DType dtype : {DType::kFp32, DType::kBf16}) {
        Batch b = RandomBatch(dtype, shape, kind, rng);
        const float top_p = std::array<float, 4>{0.5f, 0.9f, 0.95f, 0.99f}[rng() % 4];
        SetParams(b, Params(rng() % 2 == 0 ? 1.0f : 0.7f, 0, top_p, 0.0f), rng);
        if (std::string(kind) == "randn3") {  // a NaN row: the plan's fallback, in both forms
          StoreValue(dtype, std::nanf(""),
                     b.bytes.data() + (b.batch - 1) * b.row_stride * DTypeSize(dtype));
        }
        Outputs whole, split;
        {
          const ScopedEnv env("SAMPLERD_MASS_DRAW_SPLIT", "0");
          whole = RunGpu(b);
        }
        {
          const ScopedEnv env("SAMPLERD_MASS_DRAW_SPLIT", "1");
          split = RunGpu(b);
        }
        const std::string where = std::string(kind) + " " + DTypeName(dtype) +
                                  " V=" + std::to_string(b.vocab) +
                                  " top_p=" + std::to_string(top_p);
        EXPECT_EQ(split.tokens, whole.tokens) << where;
        EXPECT_EQ(split.status, whole.status) << where;
        rows += b.batch;
      }
    }
  }
  std::printf("pass 2 split or whole: %ld rows compared\n", static_cast<long>(rows));
}

// Peaked rows (one token 12 above N(0, 1) noise) at top-p 0.95 put 4,000-6,000 noise tokens in
// the mass path's boundary bin, more than one on-chip sort takes: the bin is split into sub-bins
// first (CutAndAttribute, kernels/gpu/chunked_draw.h; the sub-bins summed in pass 2). Same
// tokens as the CPU, on every run, and alone or in a batch, small or large.
TEST_F(GpuSamplerTest, WideBoundaryBinsMatchTheCpuOnEveryRunAndInAnyBatch) {
  std::mt19937_64 rng(29);
  int64_t rows = 0, mismatches = 0;
  for (DType dtype : {DType::kFp32, DType::kBf16}) {
    for (int64_t vocab : {int64_t{151936}, int64_t{262144}}) {
      for (float top_p : {0.95f, 0.9f, 0.8f}) {
        auto peaked = [&](int64_t batch) {
          Batch out;
          out.dtype = dtype;
          out.batch = batch;
          out.vocab = vocab;
          FillLogits(out, "peaked", rng);
          SetParams(out, Params(1.0f, 0, top_p, 0.0f), rng);
          return out;
        };
        const Batch b = peaked(6);
        const Outputs cpu = RunCpu(b);
        const Outputs gpu = RunGpu(b);
        for (int64_t r = 0; r < b.batch; ++r) {
          ++rows;
          ASSERT_EQ(gpu.status[r], cpu.status[r]);
          if (gpu.tokens[r] != cpu.tokens[r]) {
            ++mismatches;
            std::printf(
                "mismatch %s V=%ld top_p %.2f row %ld: cpu %d (score %.7f) gpu %d (score %.7f)\n",
                DTypeName(dtype), static_cast<long>(vocab), top_p, static_cast<long>(r),
                cpu.tokens[r], Score(b, r, cpu.tokens[r]), gpu.tokens[r],
                Score(b, r, gpu.tokens[r]));
          }
        }
        EXPECT_EQ(RunGpu(b).tokens, gpu.tokens) << "a second run";
        Batch alone = b;
        alone.batch = 1;
        const int64_t row_bytes = vocab * DTypeSize(dtype);
        alone.bytes.assign(b.bytes.begin() + 4 * row_bytes, b.bytes.begin() + 5 * row_bytes);
        alone.params = {b.params[4]};
        EXPECT_EQ(RunGpu(alone).tokens[0], gpu.tokens[4]) << "row 4 alone";
        // The same tokens at either end of a larger launch (until v51 a launch of more than 800
        // pass-2 blocks weighed the sub-bins of its first rows in their last blocks, of its
        // last rows in pass 2).
        Batch big = peaked(48);
        const int64_t tail = big.batch - b.batch;  // b's rows again at the end
        std::copy(b.bytes.begin(), b.bytes.end(), big.bytes.begin());
        std::copy(b.bytes.begin(), b.bytes.end(), big.bytes.begin() + tail * row_bytes);
        std::copy(b.params.begin(), b.params.end(), big.params.begin());
        std::copy(b.params.begin(), b.params.end(), big.params.begin() + tail);
        const Outputs in_big = RunGpu(big);
        for (int64_t r = 0; r < b.batch; ++r) {
          EXPECT_EQ(in_big.tokens[r], gpu.tokens[r]) << "row " << r << " in a batch of 48";
          EXPECT_EQ(in_big.tokens[tail + r], gpu.tokens[r])
              << "row " << r << " as row " << tail + r << " of a batch of 48";
        }
      }
    }
  }
  std::printf("wide boundary bins, GPU vs CPU: %ld rows, %ld mismatches\n", static_cast<long>(rows),
              static_cast<long>(mismatches));
  EXPECT_LE(mismatches * 100, rows) << "more than 1% of rows disagree";
}

// Level 0 of the top-p draw (kernels/common/inverse_cdf.h, kernels v48) on rows whose cut falls
// inside a boundary bin that holds ~40% of the kept mass: a third of the tokens at z = 1 (the
// head), a third in [0.5, 0.6) (the bin the cut falls in), the rest at -5. At top-p 0.9 the plan
// takes the head for certain on ~61% of the rows (kHeadDraw, no pass 2); the others run pass 2
// and draw the head (~17% of them) or the tail. Every token must be the CPU's, and both parts
// must be drawn.
TEST_F(GpuSamplerTest, TopPHeadsAndTailsMatchTheCpu) {
  std::mt19937_64 rng(31);
  std::uniform_real_distribution<float> in_bin(0.5f, 0.6f);
  int64_t rows = 0, tails = 0;
  for (DType dtype : {DType::kFp32, DType::kBf16}) {
    for (int64_t vocab : {int64_t{151936}, int64_t{40000}}) {
      Batch b;
      b.dtype = dtype;
      b.batch = 64;
      b.vocab = vocab;
      b.row_stride = vocab;
      b.bytes.resize(static_cast<size_t>(b.batch * vocab * DTypeSize(dtype)));
      for (int64_t r = 0; r < b.batch; ++r) {
        uint8_t* row = b.bytes.data() + r * vocab * DTypeSize(dtype);
        for (int64_t j = 0; j < vocab; ++j) {
          const float v = j % 3 == 0 ? 1.0f : (j % 3 == 1 ? in_bin(rng) : -5.0f);
          StoreValue(dtype, v, row + j * DTypeSize(dtype));
        }
      }
      SetParams(b, Params(1.0f, 0, 0.9f, 0.0f), rng);
      const Outputs cpu = RunCpu(b);
      const Outputs gpu = RunGpu(b);
      for (int64_t r = 0; r < b.batch; ++r) {
        ++rows;
        const uint8_t* row = b.bytes.data() + r * vocab * DTypeSize(dtype);
        ASSERT_EQ(gpu.tokens[r], cpu.tokens[r]) << DTypeName(dtype) << " V=" << vocab << " row "
                                                << r << ":" << ChunkedDrawMargins(b, r);
        const float v = LoadValue(dtype, row, cpu.tokens[r]);
        ASSERT_NE(v, -5.0f) << "row " << r;
        tails += v < 1.0f;
      }
    }
  }
  std::printf("level 0: %ld rows, %ld drew the tail\n", static_cast<long>(rows),
              static_cast<long>(tails));
  EXPECT_GT(tails, rows / 8);
  EXPECT_LT(tails, rows - rows / 8);
}

TEST_F(GpuSamplerTest, RepeatedRunsAreBitwiseIdentical) {
  std::mt19937_64 rng(21);
  Batch b;
  b.dtype = DType::kFp32;
  b.batch = 32;
  b.vocab = 151936;
  FillLogits(b, "randn3", rng);
  SetParams(b, Params(1.0f, 0, 0.95f, 0.0f), rng);
  b.top_logprobs = 5;
  b.source = LogprobSource::kProcessed;
  const Outputs first = RunGpu(b);
  for (int i = 0; i < 3; ++i) {
    const Outputs again = RunGpu(b);
    EXPECT_EQ(again.tokens, first.tokens);
    EXPECT_EQ(again.top_ids, first.top_ids);
    EXPECT_EQ(0, std::memcmp(again.top_values.data(), first.top_values.data(),
                             first.top_values.size() * 4));
    EXPECT_EQ(0, std::memcmp(again.sampled_logprob.data(), first.sampled_logprob.data(),
                             first.sampled_logprob.size() * 4));
  }
}

}  // namespace
}  // namespace samplerd::kernels::testing
