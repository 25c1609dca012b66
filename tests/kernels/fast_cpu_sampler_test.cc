// FastCpuSampler (kernels/cpu_fast) against the kernels/cpu oracle: thousands of random rows over
// dtypes, vocabulary sizes, batch sizes and every filter, plus degenerate rows, thread-count and
// batch invariance, the logprobs path and the task guard. Greedy and plain-temperature tokens
// (the inverse-CDF draw, with its fallback to the oracle's) must be identical; other sampled
// tokens equal except at a float near-tie of the two best perturbed scores.
#include "kernels/cpu_fast/fast_cpu_sampler.h"

#include <setjmp.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/common/inverse_cdf.h"
#include "kernels/common/philox.h"
#include "kernels/cpu/cpu_sampler.h"
#include "kernels/cpu/half_float.h"
#include "kernels/cpu_fast/cpu_features.h"
#include "kernels/cpu_fast/float_mass.h"
#include "kernels/cpu_fast/quantised_mass.h"

namespace samplerd::kernels {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// fp32 -> fp16 / bf16 bits by truncation (any bits will do: both samplers read the same ones).
uint16_t ToBf16(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  if (std::isnan(v)) return 0x7FC0;
  return static_cast<uint16_t>(bits >> 16);
}

uint16_t ToHalf(float v) {
  if (std::isnan(v)) return 0x7E00;
  if (v == kInf) return 0x7C00;
  if (v == -kInf) return 0xFC00;
  const uint16_t sign = v < 0 ? 0x8000 : 0;
  float a = std::fabs(v);
  if (a >= 65504.0f) return sign | 0x7BFF;
  if (a < 6.1035156e-05f) return sign | static_cast<uint16_t>(a / 5.9604645e-08f);
  int e;
  const float m = std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  const uint16_t mant = static_cast<uint16_t>((m * 2.0f - 1.0f) * 1024.0f);
  return sign | static_cast<uint16_t>((e - 1 + 15) << 10) | mant;
}

struct Batch {
  DType dtype = DType::kFp32;
  int64_t batch = 0;
  int64_t vocab = 0;
  std::vector<float> values;         // [batch, vocab], before conversion
  std::vector<unsigned char> bytes;  // the logits as the sampler reads them
  std::vector<RowParams> params;
  int32_t top_logprobs = -1;

  // The value the samplers see for (row, j).
  float At(int64_t row, int64_t j) const {
    const int64_t i = row * vocab + j;
    if (dtype == DType::kFp32) return values[i];
    uint16_t bits;
    std::memcpy(&bits, &bytes[i * 2], 2);
    return dtype == DType::kBf16 ? Bf16BitsToFloat(bits) : HalfBitsToFloat(bits);
  }

  void Encode() {
    const int64_t n = batch * vocab;
    bytes.assign(n * DTypeSize(dtype), 0);
    for (int64_t i = 0; i < n; ++i) {
      if (dtype == DType::kFp32) {
        std::memcpy(&bytes[i * 4], &values[i], 4);
      } else {
        const uint16_t b = dtype == DType::kBf16 ? ToBf16(values[i]) : ToHalf(values[i]);
        std::memcpy(&bytes[i * 2], &b, 2);
      }
    }
  }
};

struct Outputs {
  std::vector<int32_t> tokens;
  std::vector<RowStatus> status;
  std::vector<float> logprob;
  std::vector<int64_t> rank;
  std::vector<int32_t> top_ids;
  std::vector<float> top_values;
};

SampleArgs ArgsFor(const Batch& b, Outputs& out) {
  out.tokens.assign(b.batch, -2);
  out.status.assign(b.batch, static_cast<RowStatus>(99));
  const int64_t top_n = b.top_logprobs > 0 ? b.top_logprobs : 0;
  out.logprob.assign(b.batch, 99.0f);
  out.rank.assign(b.batch, -99);
  out.top_ids.assign(b.batch * top_n + 1, -99);
  out.top_values.assign(b.batch * top_n + 1, 99.0f);
  SampleArgs args;
  args.logits = b.bytes.data();
  args.dtype = b.dtype;
  args.batch = b.batch;
  args.vocab = b.vocab;
  args.row_stride = b.vocab;
  args.params = b.params.data();
  args.params_count = static_cast<int64_t>(b.params.size());
  args.top_logprobs = b.top_logprobs;
  args.token_ids = out.tokens.data();
  args.status = out.status.data();
  args.sampled_logprob = out.logprob.data();
  args.sampled_rank = out.rank.data();
  args.top_ids = out.top_ids.data();
  args.top_values = out.top_values.data();
  return args;
}

Outputs RunOracle(const Batch& b) {
  Outputs out;
  CpuSampleRows(ArgsFor(b, out), 0, b.batch);
  return out;
}

Outputs RunFast(const Batch& b, FastCpuSampler& sampler) {
  Outputs out;
  EXPECT_TRUE(sampler.Sample(ArgsFor(b, out)));
  return out;
}

// Perturbed score of token j of row `row` (the +inf case scores G alone).
float Score(const Batch& b, int64_t row, int32_t j) {
  const RowParams& p = b.params[b.params.size() == 1 ? 0 : row];
  const float z = b.At(row, j) / p.temperature;
  const float g = GumbelNoise(p.seed, p.position, static_cast<uint64_t>(j));
  return z == kInf ? g : z + g;
}

// Checks `fast` against `oracle`; returns how many sampled tokens differ (each a near-tie).
int Compare(const Batch& b, const Outputs& fast, const Outputs& oracle, const std::string& what) {
  int differences = 0;
  for (int64_t row = 0; row < b.batch; ++row) {
    const RowParams& p = b.params[b.params.size() == 1 ? 0 : row];
    EXPECT_EQ(fast.status[row], oracle.status[row]) << what << " row " << row;
    const int32_t f = fast.tokens[row];
    const int32_t o = oracle.tokens[row];
    if (f == o) continue;
    if (p.temperature < kGreedyTemperature || o < 0 || f < 0 || IsPlainTemperature(p, b.vocab)) {
      ADD_FAILURE() << what << " row " << row << ": expected token " << o << ", got " << f;
      continue;
    }
    ++differences;
    const float sf = Score(b, row, f);
    const float so = Score(b, row, o);
    EXPECT_LE(std::fabs(sf - so), 1e-5f * std::fmax(1.0f, std::fabs(so)))
        << what << " row " << row << ": tokens " << f << " / " << o << " are no near-tie";
  }
  return differences;
}

struct Setting {
  const char* name;
  RowParams params;
};

RowParams P(float t, int32_t k = 0, float top_p = 1.0f, float min_p = 0.0f,
            TopPMode mode = TopPMode::kTopKFirst) {
  RowParams p;
  p.temperature = t;
  p.top_k = k;
  p.top_p = top_p;
  p.min_p = min_p;
  p.top_p_mode = mode;
  return p;
}

const Setting kSettings[] = {
    {"greedy", P(0.0f)},
    {"temperature 0.8", P(0.8f)},
    {"temperature 1.3", P(1.3f)},
    {"top-k 1", P(1.0f, 1)},
    {"top-k 50", P(1.0f, 50)},
    {"top-k >= V", P(1.0f, 1 << 30)},
    {"top-p 0.5", P(1.0f, 0, 0.5f)},
    {"top-p 0.95", P(0.9f, 0, 0.95f)},
    {"top-p 1", P(1.0f, 0, 1.0f)},
    {"min-p 0.1", P(1.0f, 0, 1.0f, 0.1f)},
    {"top-k 50 + top-p 0.9 T 0.8", P(0.8f, 50, 0.9f)},
    {"min-p + top-k + top-p", P(1.0f, 100, 0.8f, 0.02f)},
    {"joint top-k 20 top-p 0.7", P(1.0f, 20, 0.7f, 0.0f, TopPMode::kJoint)},
    {"joint top-p 0.9", P(1.0f, 0, 0.9f, 0.0f, TopPMode::kJoint)},
    {"joint min-p top-p", P(0.7f, 0, 0.6f, 0.05f, TopPMode::kJoint)},
};

// B rows of randn * 3 with every setting assigned in turn and random seeds / positions; some
// rows get ties (values rounded to a grid), NaN, all -inf, +inf tokens or -inf tokens.
Batch RandomBatch(DType dtype, int64_t batch, int64_t vocab, std::mt19937_64& rng,
                  bool degenerate) {
  Batch b;
  b.dtype = dtype;
  b.batch = batch;
  b.vocab = vocab;
  std::normal_distribution<float> normal(0.0f, 3.0f);
  b.values.resize(batch * vocab);
  for (float& v : b.values) v = normal(rng);
  for (int64_t row = 0; row < batch; ++row) {
    RowParams p = kSettings[rng() % std::size(kSettings)].params;
    p.seed = rng();
    p.position = rng() % 100000;
    b.params.push_back(p);
    float* x = &b.values[row * vocab];
    if (!degenerate) continue;
    switch (rng() % 8) {
      case 0:  // heavy ties
        for (int64_t j = 0; j < vocab; ++j) x[j] = std::round(x[j]);
        break;
      case 1:
        x[rng() % vocab] = kNaN;
        break;
      case 2:
        for (int64_t j = 0; j < vocab; ++j) x[j] = -kInf;
        break;
      case 3:
        x[rng() % vocab] = kInf;
        x[rng() % vocab] = kInf;
        break;
      case 4:
        for (int64_t j = 0; j < vocab; j += 2) x[j] = -kInf;
        break;
      case 5:  // all tied
        for (int64_t j = 0; j < vocab; ++j) x[j] = 1.5f;
        break;
      default:
        break;
    }
  }
  b.Encode();
  return b;
}

FastCpuSampler::Options Threads(int threads) {
  FastCpuSampler::Options options;
  options.threads = threads;
  options.spin_us = 50;
  return options;
}

TEST(FastCpuSamplerTest, RandomRowsMatchTheOracle) {
  std::mt19937_64 rng(1234);
  FastCpuSampler sampler(Threads(3));
  int rows = 0;
  int differences = 0;
  for (DType dtype : {DType::kFp32, DType::kBf16, DType::kFp16}) {
    for (int64_t vocab : {1, 111, 1000, 32000}) {
      for (int64_t batch : {1, 3, 64}) {
        const int repeats = vocab >= 32000 ? 1 : 6;
        for (int rep = 0; rep < repeats; ++rep) {
          const Batch b = RandomBatch(dtype, batch, vocab, rng, rep % 2 == 1);
          const std::string what = "dtype " + std::to_string(static_cast<int>(dtype)) + " V " +
                                   std::to_string(vocab) + " B " + std::to_string(batch);
          differences += Compare(b, RunFast(b, sampler), RunOracle(b), what);
          rows += static_cast<int>(batch);
        }
      }
    }
  }
  EXPECT_GT(rows, 2000);
  EXPECT_LE(differences, rows / 1000 + 2);
}

TEST(FastCpuSamplerTest, AQwenSizedVocabularyMatchesTheOracle) {
  std::mt19937_64 rng(99);
  FastCpuSampler sampler(Threads(4));
  for (DType dtype : {DType::kFp32, DType::kBf16}) {
    for (bool degenerate : {false, true}) {
      const Batch b = RandomBatch(dtype, 6, 151936, rng, degenerate);
      Compare(b, RunFast(b, sampler), RunOracle(b), "V 151936");
    }
  }
}

TEST(FastCpuSamplerTest, EverySettingOnTheSameRowsMatchesTheOracle) {
  std::mt19937_64 rng(5);
  FastCpuSampler sampler(Threads(2));
  for (const Setting& setting : kSettings) {
    Batch b = RandomBatch(DType::kFp32, 16, 5000, rng, false);
    for (RowParams& p : b.params) {
      const uint64_t seed = p.seed;
      p = setting.params;
      p.seed = seed;
    }
    Compare(b, RunFast(b, sampler), RunOracle(b), setting.name);
  }
}

// B rows of N(0, sigma) logits (sigma 0.05: the near-flat rows of a random-weight model, where
// top-p keeps most of the row), every row with `params` and its own seed and position. With
// `grid` > 0 the values are rounded to multiples of it (huge tie groups).
Batch FlatBatch(int64_t batch, int64_t vocab, float sigma, float grid, const RowParams& params,
                std::mt19937_64& rng) {
  Batch b;
  b.batch = batch;
  b.vocab = vocab;
  std::normal_distribution<float> normal(0.0f, sigma);
  b.values.resize(batch * vocab);
  for (float& v : b.values) v = grid > 0.0f ? std::round(normal(rng) / grid) * grid : normal(rng);
  for (int64_t row = 0; row < batch; ++row) {
    RowParams p = params;
    p.seed = rng();
    p.position = rng() % 100000;
    b.params.push_back(p);
  }
  b.Encode();
  return b;
}

TEST(FastCpuSamplerTest, FlatRowsUnderTopPMatchTheOracle) {
  std::mt19937_64 rng(2025);
  FastCpuSampler sampler(Threads(3));
  int rows = 0;
  int differences = 0;
  for (float top_p : {0.95f, 0.5f}) {
    for (int64_t batch : {1, 32}) {
      const Batch b = FlatBatch(batch, 151936, 0.05f, 0.0f, P(1.0f, 0, top_p), rng);
      differences += Compare(b, RunFast(b, sampler), RunOracle(b),
                             "flat top-p " + std::to_string(top_p) + " B " + std::to_string(batch));
      rows += static_cast<int>(batch);
    }
  }
  EXPECT_EQ(rows, 66);
  EXPECT_LE(differences, 1);
}

TEST(FastCpuSamplerTest, FlatAndTiedRowsUnderEveryFilterMatchTheOracle) {
  // Large top-k, ties on a coarse grid and JOINT mode drive the selection through refinement
  // passes, single-value boundary bins and gathers of every size.
  std::mt19937_64 rng(31);
  FastCpuSampler sampler(Threads(2));
  const RowParams settings[] = {
      P(1.0f, 5000),
      P(1.0f, 20, 0.9f),
      P(0.7f, 3000, 0.8f),
      P(1.0f, 0, 0.6f, 0.9f),
      P(1.0f, 40000, 0.7f, 0.0f, TopPMode::kJoint),
      P(1.0f, 0, 0.3f, 0.95f, TopPMode::kJoint),
      P(1.0f, 0, 0.99f),
  };
  int differences = 0;
  for (const RowParams& params : settings) {
    for (float grid : {0.0f, 0.01f}) {
      const Batch b = FlatBatch(4, 60000, 0.05f, grid, params, rng);
      differences += Compare(b, RunFast(b, sampler), RunOracle(b),
                             "k " + std::to_string(params.top_k) + " p " +
                                 std::to_string(params.top_p) + " grid " + std::to_string(grid));
    }
  }
  EXPECT_LE(differences, 1);
}

TEST(FastCpuSamplerTest, RowsAtTheFp32LimitsMatchTheOracleExactly) {
  // Rows whose max x / T overflows to +inf or underflows to -inf: uniform over the tokens at the
  // max x (DESIGN.md, "Arithmetic"). The tokens are drawn from G alone, so the fast sampler and
  // the oracle must agree exactly, over several chunks and under every filter.
  std::mt19937_64 rng(77);
  FastCpuSampler sampler(Threads(2));
  const int64_t vocab = 50000;
  std::normal_distribution<float> normal(0.0f, 3.0f);
  const float top = std::numeric_limits<float>::max();
  Batch b;
  b.dtype = DType::kFp32;
  b.batch = 48;
  b.vocab = vocab;
  b.values.resize(b.batch * vocab);
  for (int64_t row = 0; row < b.batch; ++row) {
    float* x = &b.values[row * vocab];
    const int kind = static_cast<int>(row % 4);
    for (int64_t j = 0; j < vocab; ++j) {
      const float base = 1e37f * normal(rng);  // |x| / T overflows for many tokens at T <= 0.1
      x[j] = kind == 3 ? -3e38f + std::fabs(base) : base;
    }
    // kind 0: one max; 1: three tokens tied at a max that overflows; 2: at FLT_MAX, with the
    // next float below it elsewhere; 3: every x / T underflows, two tied at the max.
    if (kind == 0) x[rng() % vocab] = 3e38f;
    if (kind == 1) {
      for (int t = 0; t < 3; ++t) x[rng() % vocab] = 2e38f;
    }
    if (kind == 2) {
      for (int t = 0; t < 2; ++t) x[rng() % vocab] = top;
      for (int t = 0; t < 5; ++t) x[rng() % vocab] = std::nextafter(top, 0.0f);
    }
    if (kind == 3) {
      x[rng() % vocab] = -1e38f;
      x[rng() % vocab] = -1e38f;
    }
    RowParams p = kSettings[rng() % std::size(kSettings)].params;
    p.temperature = kind == 3 ? 0.25f : 0.05f;
    p.seed = rng();
    p.position = rng() % 1000;
    b.params.push_back(p);
  }
  b.Encode();
  const Outputs fast = RunFast(b, sampler);
  const Outputs oracle = RunOracle(b);
  EXPECT_EQ(fast.status, oracle.status);
  EXPECT_EQ(fast.tokens, oracle.tokens);
  for (int64_t row = 0; row < b.batch; ++row) {
    float row_max = -kInf;
    for (int64_t j = 0; j < vocab; ++j) row_max = std::max(row_max, b.At(row, j));
    EXPECT_EQ(b.At(row, oracle.tokens[row]), row_max) << "row " << row;
  }
}

TEST(FastCpuSamplerTest, EverySelectionPathMatchesTheOracle) {
  // A tiny gather cap makes small rows take the refinement passes, single-value boundaries and
  // the parallel draw after top-k / top-p, where a boundary off by one token shows.
  std::mt19937_64 rng(606);
  int rows = 0;
  int differences = 0;
  for (int cap : {0, 1, 7}) {
    FastCpuSampler::Options options = Threads(2);
    options.gather_cap = cap;
    FastCpuSampler sampler(options);
    for (int64_t vocab : {5, 111, 3000}) {
      for (int rep = 0; rep < 40; ++rep) {
        Batch b = rep % 4 == 3 ? FlatBatch(8, vocab, 0.05f, rep % 8 == 7 ? 0.02f : 0.0f,
                                           kSettings[rep % std::size(kSettings)].params, rng)
                               : RandomBatch(DType::kFp32, 8, vocab, rng, rep % 2 == 1);
        for (RowParams& p : b.params) {
          if (p.top_k > 3) p.top_k = 1 + static_cast<int32_t>(rng() % 4);
        }
        differences += Compare(b, RunFast(b, sampler), RunOracle(b),
                               "cap " + std::to_string(cap) + " V " + std::to_string(vocab));
        rows += 8;
      }
    }
  }
  EXPECT_EQ(rows, 2880);
  EXPECT_LE(differences, 3);
}

TEST(FastCpuSamplerTest, ResultsDoNotDependOnThreadsOrBatch) {
  std::mt19937_64 rng(77);
  FastCpuSampler one(Threads(1));
  FastCpuSampler eight(Threads(8));
  for (int64_t vocab : {1000, 40000}) {
    const Batch b = RandomBatch(DType::kFp32, 24, vocab, rng, true);
    const Outputs a = RunFast(b, one);
    const Outputs c = RunFast(b, eight);
    EXPECT_EQ(a.tokens, c.tokens);
    EXPECT_EQ(a.status, c.status);
    for (int64_t row = 0; row < b.batch; ++row) {  // each row alone
      Batch single;
      single.dtype = b.dtype;
      single.batch = 1;
      single.vocab = vocab;
      single.values.assign(b.values.begin() + row * vocab, b.values.begin() + (row + 1) * vocab);
      single.params = {b.params[row]};
      single.Encode();
      EXPECT_EQ(RunFast(single, eight).tokens[0], a.tokens[row]) << "row " << row;
    }
  }
}

TEST(FastCpuSamplerTest, LogprobRowsAreTheOraclesOwn) {
  std::mt19937_64 rng(8);
  FastCpuSampler sampler(Threads(2));
  Batch b = RandomBatch(DType::kFp32, 8, 3000, rng, true);
  b.top_logprobs = 3;
  const Outputs f = RunFast(b, sampler);
  const Outputs o = RunOracle(b);
  EXPECT_EQ(f.tokens, o.tokens);
  EXPECT_EQ(f.rank, o.rank);
  EXPECT_EQ(f.top_ids, o.top_ids);
  for (size_t i = 0; i < o.logprob.size(); ++i) {
    EXPECT_TRUE(f.logprob[i] == o.logprob[i] ||
                (std::isnan(f.logprob[i]) && std::isnan(o.logprob[i])));
  }
}

TEST(FastCpuSamplerTest, AFaultingTaskMakesSampleReportFailure) {
  std::mt19937_64 rng(4);
  FastCpuSampler::Options options = Threads(2);
  int calls = 0;
  options.guard = [&calls](const std::function<void()>& task) {
    if (__atomic_fetch_add(&calls, 1, __ATOMIC_RELAXED) == 3) return false;  // the 4th faults
    task();
    return true;
  };
  FastCpuSampler sampler(options);
  const Batch b = RandomBatch(DType::kFp32, 4, 20000, rng, false);
  Outputs out;
  EXPECT_FALSE(sampler.Sample(ArgsFor(b, out)));
  calls = 1000;  // no further faults: the sampler recovers
  EXPECT_TRUE(sampler.Sample(ArgsFor(b, out)));
  Compare(b, out, RunOracle(b), "after a fault");
}

// A device session's engine can write its logits while a step runs (host shm). With
// snapshot_logits every pass after the first reads the sampler's own copy, so logits rewritten
// after the first pass change no token. (Read in place, a value raised above the row's max
// between passes indexed a histogram past its last bin and crashed the server.)
TEST(FastCpuSamplerTest, LogitsRewrittenAfterTheFirstPassChangeNoTokenWithASnapshot) {
  std::mt19937_64 rng(31);
  for (DType dtype : {DType::kFp32, DType::kBf16}) {
    Batch b = RandomBatch(dtype, 2 * static_cast<int64_t>(std::size(kSettings)), 20000, rng, false);
    for (size_t i = 0; i < b.params.size(); ++i) {  // every setting, twice
      const RowParams& setting = kSettings[i % std::size(kSettings)].params;
      b.params[i].temperature = setting.temperature;
      b.params[i].top_k = setting.top_k;
      b.params[i].top_p = setting.top_p;
      b.params[i].min_p = setting.min_p;
      b.params[i].top_p_mode = setting.top_p_mode;
    }
    FastCpuSampler plain(Threads(1));
    const Outputs expected = RunFast(b, plain);
    const int64_t first_pass_tasks = b.batch * ((b.vocab + 8191) / 8192);
    FastCpuSampler::Options options = Threads(1);
    options.snapshot_logits = true;
    int64_t calls = 0;
    const std::vector<unsigned char> original = b.bytes;
    options.guard = [&](const std::function<void()>& task) {
      if (calls++ == first_pass_tasks) {  // the first pass is done: rewrite every logit
        for (int64_t i = 0; i < b.batch * b.vocab; ++i) {
          const int64_t size = DTypeSize(b.dtype);
          b.bytes[i * size + size - 1] ^= 0x80;  // the sign bit, in fp32 and bf16
        }
        b.bytes[DTypeSize(b.dtype) - 1] = 0x7f;  // and token 0 of row 0 near the top of the range
      }
      task();
      return true;
    };
    FastCpuSampler snapshot(options);
    for (int round = 0; round < 2; ++round) {  // the snapshot's memory is reused
      b.bytes = original;
      calls = 0;
      const Outputs got = RunFast(b, snapshot);
      EXPECT_GT(calls, first_pass_tasks) << "no pass after the first: nothing was checked";
      for (int64_t row = 0; row < b.batch; ++row) {
        EXPECT_EQ(got.tokens[row], expected.tokens[row])
            << DTypeName(dtype) << " round " << round << " row " << row << " ("
            << kSettings[row % std::size(kSettings)].name << ")";
        EXPECT_EQ(got.status[row], expected.status[row]) << "row " << row;
      }
    }
  }
}

// B rows of V logits drawn as `kind` says, every row with `params` and its own seed.
// 0: randn * 3; 1: randn * 20 (rows spanning far more than the grid's 44 logits); 2: Zipf-like
// -1.1 ln(rank); 3: randn * 1e6 (every token but the top far below the grid); 4: randn * 3 on a
// 1/64 grid (ties at the grid's bin edges, every 1/32).
Batch ShapedBatch(int kind, int64_t batch, int64_t vocab, const RowParams& params,
                  std::mt19937_64& rng) {
  Batch b;
  b.batch = batch;
  b.vocab = vocab;
  b.values.resize(batch * vocab);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t row = 0; row < batch; ++row) {
    float* x = &b.values[row * vocab];
    std::vector<int64_t> rank(vocab);
    for (int64_t j = 0; j < vocab; ++j) rank[j] = j + 1;
    std::shuffle(rank.begin(), rank.end(), rng);
    for (int64_t j = 0; j < vocab; ++j) {
      switch (kind) {
        case 0:
          x[j] = 3.0f * normal(rng);
          break;
        case 1:
          x[j] = 20.0f * normal(rng);
          break;
        case 2:
          x[j] = -1.1f * std::log(static_cast<float>(rank[j]));
          break;
        case 3:
          x[j] = 1e6f * normal(rng);
          break;
        default:
          x[j] = std::round(3.0f * normal(rng) * 64.0f) / 64.0f;
          break;
      }
    }
    RowParams p = params;
    p.seed = rng();
    p.position = rng() % 100000;
    b.params.push_back(p);
  }
  b.Encode();
  return b;
}

TEST(FastCpuSamplerTest, GridBoundaryBinsMatchTheOracle) {
  // The first pass of a top-k / top-p stage bins z on a 1/32-logit grid below the max; the
  // boundary bin is then gathered whole, gathered alone (tokens above it > gather_cap) or
  // refined by radix passes (the bin itself > gather_cap, or the bin below the grid). These
  // shapes and caps reach each of those with the boundary high and low in the row.
  std::mt19937_64 rng(4242);
  const RowParams settings[] = {
      P(1.0f, 0, 0.95f),
      P(1.0f, 0, 0.5f),
      P(0.8f, 0, 0.99f),
      P(1.0f, 50),
      P(1.0f, 3000),
      P(1.0f, 30000),
      P(0.8f, 50, 0.9f),
      P(1.0f, 5000, 0.95f, 0.0f, TopPMode::kJoint),
      P(1.0f, 0, 0.9f, 0.001f),
  };
  int rows = 0;
  int differences = 0;
  for (int cap : {16, 200, 1024}) {
    FastCpuSampler::Options options = Threads(3);
    options.gather_cap = cap;
    FastCpuSampler sampler(options);
    for (int kind = 0; kind < 5; ++kind) {
      for (const RowParams& params : settings) {
        const Batch b = ShapedBatch(kind, 2, 40000, params, rng);
        differences +=
            Compare(b, RunFast(b, sampler), RunOracle(b),
                    "cap " + std::to_string(cap) + " kind " + std::to_string(kind) + " k " +
                        std::to_string(params.top_k) + " p " + std::to_string(params.top_p));
        rows += 2;
      }
    }
  }
  EXPECT_EQ(rows, 270);
  EXPECT_LE(differences, 1);
}

TEST(FastCpuSamplerTest, ScalarAndVectorPathsGiveTheSameTokens) {
  // The AVX2 paths (cpu_features.h) must compute exactly what the scalar ones do.
  if (!cpu_fast_internal::UseAvx2()) GTEST_SKIP() << "no AVX2 on this CPU";
  std::mt19937_64 rng(11);
  FastCpuSampler::Options options = Threads(2);
  options.gather_cap = 64;
  FastCpuSampler sampler(options);
  for (DType dtype : {DType::kFp32, DType::kBf16, DType::kFp16}) {
    for (int64_t vocab : {7, 1001, 40000}) {
      for (bool degenerate : {false, true}) {
        const Batch b = RandomBatch(dtype, 12, vocab, rng, degenerate);
        const Outputs vector_out = RunFast(b, sampler);
        cpu_fast_internal::Avx2Allowed().store(false);
        const Outputs scalar_out = RunFast(b, sampler);
        cpu_fast_internal::Avx2Allowed().store(true);
        EXPECT_EQ(vector_out.tokens, scalar_out.tokens) << "V " << vocab;
        EXPECT_EQ(vector_out.status, scalar_out.status) << "V " << vocab;
      }
    }
  }
  for (int kind = 0; kind < 5; ++kind) {
    const Batch b = ShapedBatch(kind, 4, 30000, P(1.0f, 0, 0.9f), rng);
    const Outputs vector_out = RunFast(b, sampler);
    cpu_fast_internal::Avx2Allowed().store(false);
    const Outputs scalar_out = RunFast(b, sampler);
    cpu_fast_internal::Avx2Allowed().store(true);
    EXPECT_EQ(vector_out.tokens, scalar_out.tokens) << "kind " << kind;
  }
}

#if SAMPLERD_CPU_FAST_X86
SAMPLERD_AVX2 void VectorMasses(const double* x, uint64_t* out) {
  const __m256i m = cpu_fast_internal::QuantisedMass4(_mm256_loadu_pd(x));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), m);
}

SAMPLERD_AVX2 void VectorExp(const double* x, double* out) {
  _mm256_storeu_pd(out, cpu_fast_internal::ExpNonPositive4(_mm256_loadu_pd(x)));
}

SAMPLERD_AVX512_WARNINGS_OFF
SAMPLERD_AVX512 void VectorMasses8(const double* x, uint64_t* out) {
  const cpu_fast_internal::ExpTable512 table;
  _mm512_storeu_si512(out, cpu_fast_internal::QuantisedMass8(_mm512_loadu_pd(x), table));
}
SAMPLERD_AVX512_WARNINGS_ON

TEST(FastCpuSamplerTest, VectorQuantisedMassesAreTheScalarOnes) {
  if (!cpu_fast_internal::UseAvx2()) GTEST_SKIP() << "no AVX2 on this CPU";
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<float> below(-50.0f, 0.0f);
  std::vector<float> z = {0.0f,
                          -0.0f,
                          -1e-30f,
                          -1e-7f,
                          -44.0f,
                          std::nextafter(-44.0f, 0.0f),
                          std::nextafter(-44.0f, -100.0f),
                          -kInf,
                          -43.99999f,
                          -0.5f,
                          -1.0f};
  for (int i = 0; i < 200000; ++i) z.push_back(below(rng));
  const float mxs[] = {0.0f, 1.5f, -7.25f, 13.21906f, 1000.0f};
  for (float mx : mxs) {
    for (size_t i = 0; i + 4 <= z.size(); i += 4) {
      double x[4];
      uint64_t out[4];
      for (int l = 0; l < 4; ++l) x[l] = static_cast<double>(z[i + l] + mx) - mx;
      VectorMasses(x, out);
      for (int l = 0; l < 4; ++l) {
        ASSERT_EQ(out[l], cpu_fast_internal::QuantisedMass(z[i + l] + mx, mx))
            << "z " << z[i + l] + mx << " mx " << mx;
      }
    }
    if (!cpu_fast_internal::UseAvx512()) continue;
    for (size_t i = 0; i + 8 <= z.size(); i += 8) {
      double x[8];
      uint64_t out[8];
      for (int l = 0; l < 8; ++l) x[l] = static_cast<double>(z[i + l] + mx) - mx;
      VectorMasses8(x, out);
      for (int l = 0; l < 8; ++l) {
        ASSERT_EQ(out[l], cpu_fast_internal::QuantisedMass(z[i + l] + mx, mx))
            << "AVX-512: z " << z[i + l] + mx << " mx " << mx;
      }
    }
  }
}
#endif

// The inverse-CDF pass sums masses by ExpNonPositive and allows them 2^-40 of std::exp's
// (inverse_cdf_pass.cc); its analysis says 2^-47.
TEST(FastCpuSamplerTest, TableExpIsWithinTwoToTheMinus47OfStdExp) {
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<double> below(-44.0, 0.0);
  std::vector<double> x = {0.0, -0.0, -1e-300, -1e-17, -0x1.62e42fefa39efp-8, -28.0, -44.0};
  for (int i = 0; i < 1000000; ++i) x.push_back(below(rng));
  double worst = 0.0;
  for (double v : x) {
    const double exact = std::exp(v);
    worst = std::max(worst, std::fabs(cpu_fast_internal::ExpNonPositive(v) - exact) / exact);
  }
  EXPECT_LT(worst, 0x1.0p-47);
#if SAMPLERD_CPU_FAST_X86
  if (cpu_fast_internal::UseAvx2()) {
    for (size_t i = 0; i + 4 <= x.size(); i += 4) {
      double out[4];
      VectorExp(&x[i], out);
      for (int l = 0; l < 4; ++l) {
        ASSERT_EQ(out[l], cpu_fast_internal::ExpNonPositive(x[i + l])) << x[i + l];
      }
    }
  }
#endif
}

#if SAMPLERD_CPU_FAST_X86
SAMPLERD_AVX2_FMA void VectorFloatMasses8(const float* z, float mx, float* out) {
  const __m256 lo = _mm256_loadu_ps(cpu_fast_internal::kExp2Sixteenths);
  const __m256 hi = _mm256_loadu_ps(cpu_fast_internal::kExp2Sixteenths + 8);
  _mm256_storeu_ps(
      out, cpu_fast_internal::FloatKeptMass8(_mm256_loadu_ps(z), _mm256_set1_ps(mx), lo, hi));
}

SAMPLERD_AVX512_WARNINGS_OFF
SAMPLERD_AVX512 void VectorFloatMasses16(const float* z, float mx, float* out) {
  const __m512 table = _mm512_loadu_ps(cpu_fast_internal::kExp2Sixteenths);
  _mm512_storeu_ps(
      out, cpu_fast_internal::FloatKeptMass16(_mm512_loadu_ps(z), _mm512_set1_ps(mx), table));
}
SAMPLERD_AVX512_WARNINGS_ON
#endif

// The chunked draw's level 1 sums float masses and allows them kFloatMassError (2^-22) of the
// oracle's double exp (chunked_draw.cc); float_mass.h's analysis says 2.3 x 2^-24 for z - z_max
// in [-40, 0]. Swept over row maxima of every size and sign (z - z_max then rounds in float, and
// TwoSum must recover the error), arguments near 0, at the range reduction's rounding points
// (multiples of ln 2 / 32) and at the domain's ends, with and without the fused multiply-adds;
// the AVX2 and AVX-512 forms give FloatKeptMassFma's bits.
TEST(FastCpuSamplerTest, FloatMassesAreWithinTheirProvenBoundOfStdExp) {
  std::mt19937_64 rng(17);
  std::uniform_real_distribution<double> below(-40.0, 0.0);
  std::uniform_real_distribution<float> near_zero(-1.0f, 1.0f);
  const float mxs[] = {0.0f,  -0.0f,   1.0f,  1.5f,    -7.25f,  13.21906f, 1000.0f,
                       0.03f, -0.001f, 3e-5f, 39.999f, -100.0f, 2.5e5f,    -37.0f};
  double worst = 0.0;
  int64_t checked = 0;
  for (float mx : mxs) {
    std::vector<float> z;
    z.push_back(mx);
    z.push_back(std::nextafter(mx, -kInf));
    for (int i = 0; i < 200000; ++i) z.push_back(static_cast<float>(mx + below(rng)));
    for (int i = 0; i < 50000; ++i) z.push_back(near_zero(rng) * (i % 2 == 0 ? 1e-3f : 40.0f));
    for (int k = 0; k <= 1848; ++k) {  // (k + 1/2) ln 2 / 16: kd's rounding points
      const float d = static_cast<float>(-(k + 0.5) * 0.69314718055994530942 / 16.0);
      for (float v : {mx + d, std::nextafter(mx + d, kInf), std::nextafter(mx + d, -kInf)}) {
        z.push_back(v);
      }
    }
    z.push_back(static_cast<float>(mx - 40.0));
    z.resize(z.size() - z.size() % 16, mx);
    for (float& v : z) {
      const double d = static_cast<double>(v) - mx;
      if (!(d <= 0.0 && d >= -40.0)) v = mx;  // the domain: kept tokens are within 36 of mx
    }
    for (float v : z) {
      const double exact = std::exp(static_cast<double>(v) - mx);
      const double got = cpu_fast_internal::FloatKeptMass(v, mx);
      const double fused = cpu_fast_internal::FloatKeptMassFma(v, mx);
      worst = std::max(worst, std::fabs(got - exact) / exact);
      worst = std::max(worst, std::fabs(fused - exact) / exact);
      ++checked;
    }
#if SAMPLERD_CPU_FAST_X86
    for (size_t i = 0; cpu_fast_internal::UseAvx2Fma() && i < z.size(); i += 8) {
      float out[8];
      VectorFloatMasses8(&z[i], mx, out);
      for (int l = 0; l < 8; ++l) {
        ASSERT_EQ(out[l], cpu_fast_internal::FloatKeptMassFma(z[i + l], mx))
            << "AVX2: z " << z[i + l] << " mx " << mx;
      }
    }
    for (size_t i = 0; cpu_fast_internal::UseAvx512() && i < z.size(); i += 16) {
      float out[16];
      VectorFloatMasses16(&z[i], mx, out);
      for (int l = 0; l < 16; ++l) {
        ASSERT_EQ(out[l], cpu_fast_internal::FloatKeptMassFma(z[i + l], mx))
            << "AVX-512: z " << z[i + l] << " mx " << mx;
      }
    }
#endif
  }
  EXPECT_GT(checked, 3000000);
  EXPECT_LT(worst, 2.3 * 0x1.0p-24);
  EXPECT_LT(2.3 * 0x1.0p-24, cpu_fast_internal::kFloatMassError);
}

TEST(FastCpuSamplerTest, AQwenSizedRowGivesTheSameTokenOnAnyThreadCount) {
  // One to seven rows of 19 chunks on 1 to 16 threads: tasks of one chunk, of several
  // consecutive chunks and of whole rows must all give the same tokens.
  std::mt19937_64 rng(12);
  std::vector<std::unique_ptr<FastCpuSampler>> samplers;
  for (int threads : {1, 2, 5, 8, 16}) {
    samplers.push_back(std::make_unique<FastCpuSampler>(Threads(threads)));
  }
  for (int64_t batch : {1, 3, 7}) {
    const Batch b = RandomBatch(DType::kFp32, batch, 151936, rng, batch == 7);
    const Outputs first = RunFast(b, *samplers[0]);
    for (size_t s = 1; s < samplers.size(); ++s) {
      const Outputs other = RunFast(b, *samplers[s]);
      EXPECT_EQ(other.tokens, first.tokens) << "B " << batch << " sampler " << s;
      EXPECT_EQ(other.status, first.status) << "B " << batch << " sampler " << s;
    }
    Compare(b, first, RunOracle(b), "B " + std::to_string(batch));
  }
}

// B plain-temperature rows (temperature alone) of V logits: row r takes shape r % 6 (randn * 3,
// all equal, one token far above the rest, randn * 3 with a third at -inf, randn * 20 with
// ties, a single finite token) and a temperature from 0.05 to 5.
Batch PlainBatch(DType dtype, int64_t batch, int64_t vocab, std::mt19937_64& rng) {
  Batch b;
  b.dtype = dtype;
  b.batch = batch;
  b.vocab = vocab;
  b.values.resize(batch * vocab);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const float temperatures[] = {0.05f, 0.3f, 0.8f, 1.0f, 1.7f, 5.0f};
  for (int64_t row = 0; row < batch; ++row) {
    float* x = &b.values[row * vocab];
    const int shape = static_cast<int>(row % 6);
    for (int64_t j = 0; j < vocab; ++j) {
      switch (shape) {
        case 0:
        case 3:
          x[j] = 3.0f * normal(rng);
          break;
        case 1:
          x[j] = 0.75f;
          break;
        case 2:
          x[j] = normal(rng) - 12.0f;
          break;
        case 4:
          x[j] = std::round(20.0f * normal(rng));
          break;
        default:
          x[j] = -kInf;
          break;
      }
    }
    if (shape == 2 || shape == 5) x[rng() % vocab] = 2.0f;
    if (shape == 3) {
      for (int64_t j = static_cast<int64_t>(rng() % 3); j < vocab; j += 3) x[j] = -kInf;
    }
    RowParams p = P(temperatures[rng() % std::size(temperatures)]);
    if (rng() % 4 == 0) p.top_k = static_cast<int32_t>(vocab);  // top-k >= V: still plain
    p.seed = rng();
    p.position = rng() % 100000;
    b.params.push_back(p);
  }
  b.Encode();
  return b;
}

TEST(FastCpuSamplerTest, PlainTemperatureRowsMatchTheOracleExactly) {
  std::mt19937_64 rng(8080);
  int rows = 0;
  for (int threads : {1, 2, 8}) {
    FastCpuSampler sampler(Threads(threads));
    for (int64_t batch : {1, 32}) {
      for (int64_t vocab : {1, 5, 1000, 1025, 32000}) {
        for (DType dtype : {DType::kFp32, DType::kBf16}) {
          const int repeats = batch == 1 ? 12 : 1;
          for (int rep = 0; rep < repeats; ++rep) {
            const Batch b = PlainBatch(dtype, batch, vocab, rng);
            const std::string what = "threads " + std::to_string(threads) + " B " +
                                     std::to_string(batch) + " V " + std::to_string(vocab);
            EXPECT_EQ(Compare(b, RunFast(b, sampler), RunOracle(b), what), 0);
            rows += static_cast<int>(batch);
          }
        }
      }
    }
    // The proven margin is ~1e-10 of a row's mass: the oracle's own draw is a rarity.
    EXPECT_LE(sampler.inverse_cdf_fallbacks(), 1) << "threads " << threads;
  }
  EXPECT_EQ(rows, 3 * 5 * 2 * (12 + 32));
}

TEST(FastCpuSamplerTest, PlainTemperatureRowsOfAQwenSizedVocabularyMatchTheOracle) {
  std::mt19937_64 rng(8081);
  for (int threads : {1, 2, 8}) {
    FastCpuSampler sampler(Threads(threads));
    for (int64_t batch : {1, 6}) {
      const Batch b = PlainBatch(DType::kFp32, batch, 151936, rng);
      EXPECT_EQ(Compare(b, RunFast(b, sampler), RunOracle(b),
                        "V 151936 threads " + std::to_string(threads)),
                0);
    }
    EXPECT_EQ(sampler.inverse_cdf_fallbacks(), 0);
  }
}

TEST(FastCpuSamplerTest, PlainTemperatureRowsFallBackToTheOracleWithinTheMargin) {
  // A margin of 2 x the row's mass covers every boundary: every plain row takes the oracle's
  // InverseCdfDraw. A margin of 1e-3 sends only the rows whose target lies within 1e-3 of the
  // total from their token's boundaries (many of the flat rows, few of the others).
  std::mt19937_64 rng(8082);
  for (double extra : {2.0, 1e-3}) {
    for (int threads : {1, 2, 8}) {
      FastCpuSampler::Options options = Threads(threads);
      options.inverse_cdf_extra_margin = extra;
      FastCpuSampler sampler(options);
      int rows = 0;
      for (int64_t batch : {1, 32}) {
        for (int64_t vocab : {7, 3000, 20000}) {
          Batch b = PlainBatch(DType::kFp32, batch, vocab, rng);
          EXPECT_EQ(Compare(b, RunFast(b, sampler), RunOracle(b), "extra " + std::to_string(extra)),
                    0);
          rows += static_cast<int>(batch);
        }
      }
      if (extra >= 1.0) {
        EXPECT_EQ(sampler.inverse_cdf_fallbacks(), rows);
      } else {
        EXPECT_GT(sampler.inverse_cdf_fallbacks(), 0);
        EXPECT_LT(sampler.inverse_cdf_fallbacks(), rows);
      }
    }
  }
}

TEST(FastCpuSamplerTest, PlainTemperatureRowsInAMixedBatchMatchTheOracle) {
  // Plain rows next to greedy, filtered and invalid rows, on unaligned fp32 logits, and on the
  // scalar path.
  std::mt19937_64 rng(8083);
  FastCpuSampler sampler(Threads(2));
  Batch b = RandomBatch(DType::kFp32, 48, 9000, rng, true);
  for (size_t r = 0; r < b.params.size(); r += 2) {
    b.params[r] = P(0.9f);
    b.params[r].seed = r;
  }
  Compare(b, RunFast(b, sampler), RunOracle(b), "mixed");
  std::vector<unsigned char> shifted(b.bytes.size() + 1);
  std::memcpy(shifted.data() + 1, b.bytes.data(), b.bytes.size());
  Outputs fast, oracle;
  SampleArgs args = ArgsFor(b, fast);
  args.logits = shifted.data() + 1;
  ASSERT_TRUE(sampler.Sample(args));
  SampleArgs oracle_args = ArgsFor(b, oracle);
  oracle_args.logits = shifted.data() + 1;
  CpuSampleRows(oracle_args, 0, b.batch);
  EXPECT_EQ(fast.tokens, oracle.tokens);
  // The AVX2 mass sums (no AVX-512) and the scalar ones (no AVX2) reach the same tokens.
  const Batch plain = PlainBatch(DType::kFp32, 32, 9000, rng);
  cpu_fast_internal::Avx512Allowed().store(false);
  EXPECT_EQ(Compare(plain, RunFast(plain, sampler), RunOracle(plain), "avx2"), 0);
  cpu_fast_internal::Avx2Allowed().store(false);
  EXPECT_EQ(Compare(plain, RunFast(plain, sampler), RunOracle(plain), "scalar"), 0);
  cpu_fast_internal::Avx2Allowed().store(true);
  cpu_fast_internal::Avx512Allowed().store(true);
}

thread_local sigjmp_buf* fault_jump = nullptr;

void JumpOnFault(int) {
  if (fault_jump != nullptr) siglongjmp(*fault_jump, 1);
  std::abort();
}

TEST(FastCpuSamplerTest, ATaskAbandonedMidPassLeavesNoPartialHistogram) {
  // As in the host plane: a guard that turns a fault reading the logits into a failed task
  // (siglongjmp out of it). The fault here hits the top-p row's first histogram pass after
  // part of the row was binned; the next call must not see those partial sums.
  const int64_t vocab = 40000;
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t bytes = (vocab * 4 + page - 1) / page * page;
  void* memory = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(memory, MAP_FAILED);
  std::mt19937_64 rng(21);
  // A flat row under top-p 0.3: partial sums left in the bins would move the boundary far
  // down the row, and the near-uniform draw would then often pick a token past it.
  Batch b = FlatBatch(1, vocab, 0.05f, 0.0f, P(1.0f, 0, 0.3f), rng);
  std::memcpy(memory, b.bytes.data(), vocab * 4);
  unsigned char* last_page = static_cast<unsigned char*>(memory) + bytes - page;

  struct sigaction action = {};
  struct sigaction old_segv = {}, old_bus = {};
  action.sa_handler = JumpOnFault;
  sigemptyset(&action.sa_mask);
  sigaction(SIGSEGV, &action, &old_segv);
  sigaction(SIGBUS, &action, &old_bus);
  int calls = 0;
  int fault_at = -1;  // the guard call that revokes the last page first
  FastCpuSampler::Options options = Threads(1);
  options.guard = [&](const std::function<void()>& task) {
    const bool fault = ++calls == fault_at;
    if (fault) mprotect(last_page, page, PROT_NONE);
    sigjmp_buf jump;
    bool ok = true;
    if (sigsetjmp(jump, 1) == 0) {
      fault_jump = &jump;
      task();
    } else {
      ok = false;
    }
    fault_jump = nullptr;
    if (fault) mprotect(last_page, page, PROT_READ | PROT_WRITE);
    return ok;
  };
  FastCpuSampler sampler(options);
  Outputs out;
  SampleArgs args = ArgsFor(b, out);
  args.logits = memory;
  for (uint64_t position = 0; position < 12; ++position) {
    b.params[0].position = position;
    ASSERT_TRUE(sampler.Sample(args));
    const int32_t token = out.tokens[0];
    const int stats_tasks = static_cast<int>((vocab + 8191) / 8192);
    // The grid pass: one whole-row task on 1 thread, after the task that narrows its window.
    fault_at = calls + stats_tasks + 2;
    EXPECT_FALSE(sampler.Sample(args));
    fault_at = -1;
    ASSERT_TRUE(sampler.Sample(args));
    EXPECT_EQ(out.tokens[0], token) << "position " << position;
  }
  Compare(b, out, RunOracle(b), "after an abandoned pass");
  sigaction(SIGSEGV, &old_segv, nullptr);
  sigaction(SIGBUS, &old_bus, nullptr);
  munmap(memory, bytes);
}

}  // namespace
}  // namespace samplerd::kernels
