// FastCpuSampler's top-p fast paths (kernels/cpu_fast, HOST_PLANE_RESULTS.md "Run 5") against
// the kernels/cpu oracle, token for token: the grid spread over a near-flat row's span, the
// window a sample puts around the boundary (and the second grid pass when the sample misses),
// and the draw's noise-bucket filter. Rows of the shapes the host plane sees (flat, bf16-rounded
// with many ties, Zipf, randn * 3) and vocabularies with a partial last chunk, every row
// sampled on the AVX-512, AVX2 and scalar paths, on 1 and 3 threads, and with a gather cap of
// 16 (short rows then take the row-wide draw). These rows were checked to give the oracle's
// tokens before the fast paths existed (commit 655724e), so any token the fast paths changed
// fails here. Top-p-alone rows (the chunked inverse-CDF draw): its paths told apart by the
// fallback count, targets crafted within each level's margin of a unit boundary (level 0's
// head and tail included), both of level 0's parts drawn over many positions, and the
// fallback rate measured over many seeds.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <iterator>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/common/inverse_cdf.h"
#include "kernels/cpu/cpu_sampler.h"
#include "kernels/cpu/half_float.h"
#include "kernels/cpu/inverse_cdf_draw.h"
#include "kernels/cpu_fast/chunked_draw.h"
#include "kernels/cpu_fast/cpu_features.h"
#include "kernels/cpu_fast/fast_cpu_sampler.h"
#include "kernels/cpu_fast/order_keys.h"
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

// Top-p alone: the chunked inverse-CDF draw (kernels/cpu_fast/chunked_draw.h), token for token
// against the oracle on each of its paths (AVX-512, AVX2, scalar), told apart by the fallback
// count. A margin of 2 x the
// mass sends every row drawn from the piece sums to the oracle's ChunkedInverseCdfDraw, and no
// row whose kept tokens were all gathered (those use the oracle's own sums): a gather cap of 16
// puts every row here on the first path (fallbacks == rows), an unbounded one every row on the
// second (fallbacks == 0). A margin of 1e-3 of the mass sends some rows (a target within 1e-3
// of a chunk or segment boundary) and not others; none at 0.
TEST(FastCpuTopPTest, TopPAloneRowsTakeTheOraclesTokenOnEveryPathOfTheChunkedDraw) {
  const RowParams settings[] = {Params(1.0f, 0, 0.95f, 0.0f), Params(0.8f, 0, 0.9f, 0.0f),
                                Params(1.3f, 0, 0.5f, 0.0f), Params(1.0f, 0, 0.999f, 0.0f)};
  struct Case {
    const char* name;
    int gather_cap;
    double extra;
  };
  const Case cases[] = {{"pieces, every row to the oracle", 16, 2.0},
                        {"gathered, no margin used", 1 << 30, 2.0},
                        {"pieces, a margin of 1e-3", 16, 1e-3},
                        {"default", 1024, 0.0}};
  std::mt19937_64 rng(20261207);
  for (const Case& c : cases) {
    FastCpuSampler::Options options;
    options.threads = 3;
    options.spin_us = 50;
    options.gather_cap = c.gather_cap;
    options.inverse_cdf_extra_margin = c.extra;
    FastCpuSampler sampler(options);
    int64_t rows = 0;
    for (int64_t vocab : {151936, 20000, 1001}) {
      for (Shape shape : {Shape::kFlat, Shape::kRandn, Shape::kZipf}) {
        Rows batch = MakeRows(shape, vocab, DType::kFp32, rng);
        for (int64_t row = 0; row < batch.batch; ++row) {
          const uint64_t seed = batch.params[row].seed;
          const uint64_t position = batch.params[row].position;
          batch.params[row] = settings[row % std::size(settings)];
          batch.params[row].seed = seed;
          batch.params[row].position = position;
        }
        std::vector<int32_t> oracle, fast;
        std::vector<RowStatus> oracle_status, fast_status;
        CpuSampleRows(batch.Args(oracle, oracle_status), 0, batch.batch);
        for (int path = 0; path < 3; ++path) {
          const Paths paths(/*avx2=*/path < 2, /*avx512=*/path == 0);
          const int64_t before = sampler.inverse_cdf_fallbacks();
          ASSERT_TRUE(sampler.Sample(batch.Args(fast, fast_status)));
          const std::string what = std::string(c.name) + ": " + Name(shape) + " V " +
                                   std::to_string(vocab) + " path " + std::to_string(path);
          EXPECT_EQ(fast_status, oracle_status);
          EXPECT_EQ(fast, oracle) << what;
          // Flat rows keep hundreds of tokens at least; a Zipf or randn x 3 row at p = 0.5 may
          // keep 16 or fewer, gathered even at a cap of 16.
          const int64_t fallbacks = sampler.inverse_cdf_fallbacks() - before;
          if (c.extra >= 1.0 && c.gather_cap == 16 && shape == Shape::kFlat) {
            EXPECT_EQ(fallbacks, batch.batch) << what;
          } else if (c.extra >= 1.0 && c.gather_cap != 16) {
            EXPECT_EQ(fallbacks, 0) << what;
          }
          rows += batch.batch;
        }
      }
    }
    ASSERT_EQ(rows, 3 * 3 * 3 * 2 * static_cast<int64_t>(std::size(kSettings)));
    if (c.extra >= 1.0) {
      continue;  // checked batch by batch above
    } else if (c.extra > 0.0) {
      EXPECT_GT(sampler.inverse_cdf_fallbacks(), 0) << c.name;
      EXPECT_LT(sampler.inverse_cdf_fallbacks(), rows) << c.name;
    } else {
      EXPECT_EQ(sampler.inverse_cdf_fallbacks(), 0) << c.name;
    }
  }
}

// Rows of V = 2 x `unit` tokens, tokens [0, unit) at logit a and the rest at 0 (T = 1, top-p
// 0.999: every token kept), for kSweepSeeds seeds whose level uniform u (`level` of their
// ChunkedUniforms) lies in [u_lo, u_hi] and that `accept` takes: a swept across a0 = log(u /
// (1 - u)), where the first unit's share of the mass is u, in kSweepSteps steps of ~0.15 x the
// level's margin at u (`margin`, a fraction of the mass) and the kSweepUlps floats on either
// side of a0. Level 0 splits such a row (the units' logits a bin apart or more) into a head and
// a tail; with `low_token`, one more token at -3 (V = 2 x unit + 1, top-p 1 - 2^-21 keeps it:
// its share of the mass is above 1e-6) is the whole tail instead, both units the head, and
// only seeds whose u0 draws the head (< 0.99) are taken.
constexpr int kSweepSeeds = 8;
constexpr int kSweepSteps = 41;
constexpr int kSweepUlps = 16;
struct Sweep {
  int64_t unit;
  uint64_t position;
  double (*level)(const ChunkedUniforms&);
  double u_lo = 0.2, u_hi = 0.8;  // a0 in [-1.4, 1.4]
  double (*margin)(double u) = [](double) { return 3.0 * 0x1.0p-22; };
  bool (*accept)(const ChunkedUniforms&) = [](const ChunkedUniforms&) { return true; };
  bool low_token = true;
};
Rows SweepAcrossAUnitBoundary(const Sweep& sweep) {
  const int64_t unit = sweep.unit;
  const int64_t vocab = 2 * unit + (sweep.low_token ? 1 : 0);
  Rows rows;
  rows.vocab = vocab;
  RowParams p = Params(1.0f, 0, sweep.low_token ? 1.0f - 0x1.0p-21f : 0.999f, 0.0f);
  p.position = sweep.position;
  for (int found = 0; found < kSweepSeeds; ++p.seed) {
    const ChunkedUniforms uniforms = RowChunkedUniforms(p.seed, p.position);
    const double u = sweep.level(uniforms);
    if (!(u > sweep.u_lo && u < sweep.u_hi) || !sweep.accept(uniforms)) continue;
    if (sweep.low_token && !(uniforms.u0 < 0.99)) continue;
    ++found;
    const double a0 = std::log(u / (1.0 - u));
    // The boundary moves by sigmoid'(a) x da of the mass: steps of ~0.15 x the margin.
    const double step = 0.15 * sweep.margin(u) / (u * (1.0 - u));
    std::vector<float> a;
    for (int k = -kSweepSteps / 2; k <= kSweepSteps / 2; ++k) {
      a.push_back(static_cast<float>(a0 + static_cast<double>(k) * step));
    }
    float nearest = static_cast<float>(a0);
    for (int k = 0; k < kSweepUlps; ++k) nearest = std::nextafter(nearest, -1e9f);
    for (int k = -kSweepUlps; k <= kSweepUlps; ++k, nearest = std::nextafter(nearest, 1e9f)) {
      a.push_back(nearest);
    }
    for (float v : a) {
      for (int64_t j = 0; j < vocab; ++j) {
        const float x = j < unit ? v : j < 2 * unit ? 0.0f : -3.0f;
        const auto* bytes = reinterpret_cast<const unsigned char*>(&x);
        rows.bytes.insert(rows.bytes.end(), bytes, bytes + 4);
      }
      rows.params.push_back(p);
    }
  }
  rows.batch = static_cast<int64_t>(rows.params.size());
  return rows;
}

// The fast sampler on a sweep's rows, on every path: the oracle's tokens and statuses, and the
// fallbacks of a sweep whose ~13 of each seed's 41 steps and all its 33 floats near a0 lie
// within the margin.
void ExpectTheOraclesTokensAndSweepFallbacks(Rows& rows, const std::vector<int32_t>& oracle,
                                             const std::vector<RowStatus>& oracle_status,
                                             int seeds) {
  std::vector<int32_t> fast;
  std::vector<RowStatus> fast_status;
  FastCpuSampler::Options options;
  options.threads = 2;
  options.spin_us = 50;
  FastCpuSampler sampler(options);
  for (int path = 0; path < 3; ++path) {
    const Paths paths(/*avx2=*/path < 2, /*avx512=*/path == 0);
    const int64_t before = sampler.inverse_cdf_fallbacks();
    ASSERT_TRUE(sampler.Sample(rows.Args(fast, fast_status)));
    EXPECT_EQ(fast_status, oracle_status);
    EXPECT_EQ(fast, oracle) << "path " << path;
    const int64_t fallbacks = sampler.inverse_cdf_fallbacks() - before;
    EXPECT_GE(fallbacks, seeds * (33 + 9)) << "path " << path;
    EXPECT_LE(fallbacks, seeds * (33 + 17)) << "path " << path;
  }
}

// Level 1's margin on a real boundary (no extra margin): two chunks of tied tokens, chunk 0 at
// logit a and chunk 1 at 0, both level 0's head (a third chunk holds the tail, one token far
// below), so that chunk 0 holds a fraction sigmoid(a) of the head's mass; a swept
// across the value a0 where that fraction is the row's u1 puts the target on either side of the
// chunks' boundary: 41 steps of ~0.15 x the margin (3 x 2^-22 of the mass), out to ~3 x the
// margin, and the 33 floats nearest a0 (~1e-8 of the mass apart, the float masses' own error:
// with no margin, some of them take the wrong chunk for some of the 8 seeds). Rows within the
// margin go to the oracle, the others not, and every token is the oracle's, on every path.
TEST(FastCpuTopPTest, ATargetNearAChunkBoundaryFallsBackToTheOracleAndKeepsItsToken) {
  constexpr int kSeeds = kSweepSeeds;
  Rows rows =
      SweepAcrossAUnitBoundary({kDrawChunk, 3, [](const ChunkedUniforms& u) { return u.u1; }});
  std::vector<int32_t> oracle;
  std::vector<RowStatus> oracle_status;
  CpuSampleRows(rows.Args(oracle, oracle_status), 0, rows.batch);
  ASSERT_NE(std::count_if(oracle.begin(), oracle.end(), [](int32_t t) { return t < kDrawChunk; }),
            0);
  ASSERT_NE(std::count_if(oracle.begin(), oracle.end(),
                          [](int32_t t) { return t >= kDrawChunk && t < 2 * kDrawChunk; }),
            0);
  ExpectTheOraclesTokensAndSweepFallbacks(rows, oracle, oracle_status, kSeeds);
}

// Level 0's margin on a real boundary: two chunks of tied tokens, chunk 0 at logit a (the
// head: a >= 0.4, bins above chunk 1's) and chunk 1 at 0 (the tail: K's lowest z), so that the
// head holds a fraction sigmoid(a) of the mass; a swept across the value a0 where that fraction
// is the row's u0 puts the target on either side of the head's boundary, in steps of ~0.15 x
// level 0's final margin (3 x 2^-22 of the mass), and the 33 floats nearest a0 (all within
// it). Targets within the pieces' margin (that plus 3 x (2^-19 - 2^-22) of the tail's mass, for
// the tail's dense float sums: out to ~3x, 20 steps) take the tail's chunk weights again
// (TailChunkWeights); only those within the final margin go to the oracle, and every token is
// the oracle's (the head's and the tail's both drawn), on every path.
TEST(FastCpuTopPTest, ATargetNearTheHeadsBoundaryFallsBackToTheOracleAndKeepsItsToken) {
  constexpr int kSeeds = kSweepSeeds;
  Sweep sweep{kDrawChunk, 13, [](const ChunkedUniforms& u) { return u.u0; }};
  sweep.u_lo = 0.6;  // a0 in [0.4, 1.4]
  sweep.u_hi = 0.8;
  // Levels 1 and 2 well inside their units (one chunk of weight; 256 tied segments).
  sweep.accept = [](const ChunkedUniforms& u) { return u.u1 > 0.01 && u.u1 < 0.99; };
  sweep.low_token = false;
  Rows rows = SweepAcrossAUnitBoundary(sweep);
  std::vector<int32_t> oracle;
  std::vector<RowStatus> oracle_status;
  CpuSampleRows(rows.Args(oracle, oracle_status), 0, rows.batch);
  ASSERT_NE(std::count_if(oracle.begin(), oracle.end(), [](int32_t t) { return t < kDrawChunk; }),
            0);
  ASSERT_NE(std::count_if(oracle.begin(), oracle.end(), [](int32_t t) { return t >= kDrawChunk; }),
            0);
  ExpectTheOraclesTokensAndSweepFallbacks(rows, oracle, oracle_status, kSeeds);
}

// Level 2's two margins: one chunk of two segments of tied tokens, segment 0 at logit a and
// segment 1 at 0 (level 0's head; a third segment holds the tail, one token), a swept across the
// value where segment 0's fraction of the mass is the row's u2 (as the test above does for level
// 1). Targets within the float masses' margin of the boundary take the double masses (PieceMass,
// within 2^-47) instead, whose margin none is within: no row falls back to the oracle, and every
// token is the oracle's. A gather cap of 16 keeps the 64 tokens from being drawn as gathered
// candidates.
TEST(FastCpuTopPTest, ATargetNearASegmentBoundaryTakesTheDoubleMassesAndKeepsTheOraclesToken) {
  Rows rows =
      SweepAcrossAUnitBoundary({kDrawSegment, 5, [](const ChunkedUniforms& u) { return u.u2; }});
  std::vector<int32_t> oracle, fast;
  std::vector<RowStatus> oracle_status, fast_status;
  CpuSampleRows(rows.Args(oracle, oracle_status), 0, rows.batch);
  ASSERT_NE(std::count_if(oracle.begin(), oracle.end(), [](int32_t t) { return t < kDrawSegment; }),
            0);
  ASSERT_NE(std::count_if(oracle.begin(), oracle.end(),
                          [](int32_t t) { return t >= kDrawSegment && t < 2 * kDrawSegment; }),
            0);
  FastCpuSampler::Options options;
  options.threads = 2;
  options.spin_us = 50;
  options.gather_cap = 16;
  FastCpuSampler sampler(options);
  for (int path = 0; path < 3; ++path) {
    const Paths paths(/*avx2=*/path < 2, /*avx512=*/path == 0);
    const int64_t before = sampler.inverse_cdf_fallbacks();
    ASSERT_TRUE(sampler.Sample(rows.Args(fast, fast_status)));
    EXPECT_EQ(fast_status, oracle_status);
    EXPECT_EQ(fast, oracle) << "path " << path;
    EXPECT_EQ(sampler.inverse_cdf_fallbacks() - before, 0) << "path " << path;
  }
}

// A top-p-alone row z[0, V) (T = 1) with kept set z >= threshold, ready for FinishChunkedDraw:
// its float piece sums taken once (ChunkedMassPieces over the whole row, one task).
struct ChunkedRow {
  ChunkedRow(std::vector<float> values, float threshold) : z(std::move(values)), keep(z.size()) {
    const auto vocab = static_cast<int64_t>(z.size());
    for (int64_t j = 0; j < vocab; ++j) keep[j] = z[j] >= threshold;
    args.logits = z.data();
    args.dtype = DType::kFp32;
    args.batch = 1;
    args.vocab = vocab;
    args.row_stride = vocab;
    r.plan = cpu_fast_internal::Plan::kChunkedDraw;
    r.p = Params(1.0f, 0, 0.95f, 0.0f);
    r.p.position = 11;
    r.mx = *std::max_element(z.begin(), z.end());
    r.top_p_alone = true;
    r.draw_key = cpu_fast_internal::KeyOf(threshold);
    cpu_fast_internal::StartChunkedDraw(r);
    EXPECT_TRUE(cpu_fast_internal::ChunkedMassPieces(args, 0, 0, vocab, r));
  }

  // Draws with `seed`; true when the oracle's draw decided. The token is r.token.
  bool Draw(uint64_t seed) {
    r.p.seed = seed;
    return cpu_fast_internal::FinishChunkedDraw(args, 0, 0.0, r);
  }

  int32_t OracleToken() const {
    return ChunkedInverseCdfDraw(z.data(), keep.data(), args.vocab, r.mx, r.p);
  }

  std::vector<float> z;
  std::vector<uint8_t> keep;
  SampleArgs args;
  cpu_fast_internal::RowState r;
};

// The top-p `p` threshold of z (T = 1): the largest z whose mass above it (itself included)
// reaches p of the row's (a token's value: the kept set's lowest z, as the selection's).
float TopPThreshold(const std::vector<float>& z, double p) {
  const float mx = *std::max_element(z.begin(), z.end());
  std::vector<float> sorted = z;
  std::sort(sorted.begin(), sorted.end(), std::greater<float>());
  double total = 0.0;
  for (float v : sorted) total += std::exp(static_cast<double>(v) - mx);
  double above = 0.0;
  for (float v : sorted) {
    above += std::exp(static_cast<double>(v) - mx);
    if (above >= p * total) return v;
  }
  return sorted.back();
}

// The share of the kept set's mass (z >= threshold) in level 0's tail (z below the bin above
// the threshold's).
double TailShare(const std::vector<float>& z, float threshold) {
  const float mx = *std::max_element(z.begin(), z.end());
  const float bin = std::floor(threshold * 8.0f);
  double head = 0.0, tail = 0.0;
  for (float v : z) {
    if (v >= threshold) (std::floor(v * 8.0f) > bin ? head : tail) += std::exp(double{v} - mx);
  }
  return tail / (head + tail);
}

// How often the chunked draw falls back to the oracle's, measured on its own code: one row of
// V = 151,936 of each shape at top-p 0.95, its float piece sums taken once, then
// FinishChunkedDraw for 20,000 seeds (20,000 uniform u0, u1 and u2). Level 1's margin (3 x
// 2^-22 of the part's mass on each side of ~19 boundaries; 3 x 2^-19 for the tail's dense float
// sums) predicts ~3e-5 of the rows that draw the head and ~2e-4 of those that draw the tail
// (~45% of a flat row's draws, ~0.2% of the others'); level 0's ~1.4e-6 + 1.1e-5 x the tail's
// share; level 2's ~1e-9. The first 200 seeds' tokens are checked against the oracle's
// ChunkedInverseCdfDraw. Recorded: the fallbacks and the tail's draws, by shape.
TEST(FastCpuTopPTest, TheChunkedDrawFallsBackOnFewRows) {
  constexpr int64_t kVocab = 151936;
  constexpr int kSeeds = 20000;
  std::mt19937_64 rng(20261208);
  int64_t fallbacks = 0;
  int64_t draws = 0;
  for (Shape shape : {Shape::kFlat, Shape::kBf16Rounded, Shape::kRandn}) {
    std::vector<float> z(kVocab);
    FillRow(shape, kVocab, rng, z.data());
    const float threshold = TopPThreshold(z, 0.95);
    const double tail_share = TailShare(z, threshold);
    ChunkedRow row(std::move(z), threshold);
    int64_t shape_fallbacks = 0, tail_draws = 0;
    for (int seed = 0; seed < kSeeds; ++seed) {
      shape_fallbacks += row.Draw(static_cast<uint64_t>(seed) * 0x9E3779B97F4A7C15u) ? 1 : 0;
      tail_draws += row.z[row.r.token] < row.r.head_from ? 1 : 0;
      ++draws;
      if (seed < 200) {
        ASSERT_EQ(row.r.token, row.OracleToken()) << Name(shape) << " seed " << seed;
      }
    }
    fallbacks += shape_fallbacks;
    const std::string name = Name(shape);
    RecordProperty(name + " fallbacks", static_cast<int>(shape_fallbacks));
    RecordProperty(name + " tail draws", static_cast<int>(tail_draws));
    RecordProperty(name + " tail share x 1e6", static_cast<int>(tail_share * 1e6));
    // The tail is drawn about as often as its share of the mass.
    EXPECT_NEAR(static_cast<double>(tail_draws) / kSeeds, tail_share,
                5.0 * std::sqrt(tail_share / kSeeds) + 1e-3)
        << name;
  }
  RecordProperty("fallbacks", static_cast<int>(fallbacks));
  RecordProperty("draws", static_cast<int>(draws));
  EXPECT_LT(fallbacks, draws / 2000) << "fallbacks " << fallbacks << " of " << draws;
}

// Level 0 in FinishChunkedDraw: rows whose tail holds a large share of the mass (flat rows at
// top-p 0.95, ~45%) or a few percent (bf16-rounded and randn x 3 rows cut at the lowest token of
// the bin of a top-p threshold, so that the tail is that whole bin: the first p of 0.95, 0.9,
// 0.8, ... whose tail holds 2% or more), V = 20,000 (a partial chunk), each drawn at 600
// positions on every path: both parts drawn, every token the oracle's ChunkedInverseCdfDraw's.
TEST(FastCpuTopPTest, BothPartsOfLevelZeroAreDrawnWithTheOraclesTokensOnEveryPath) {
  constexpr int64_t kVocab = 20000;
  constexpr int kPositions = 600;
  std::mt19937_64 rng(20261209);
  for (Shape shape : {Shape::kFlat, Shape::kBf16Rounded, Shape::kRandn}) {
    std::vector<float> z(kVocab);
    FillRow(shape, kVocab, rng, z.data());
    float threshold = TopPThreshold(z, 0.95);
    for (double p = 0.95; shape != Shape::kFlat && p > 0.1; p -= 0.1) {
      threshold = TopPThreshold(z, p);
      const float edge = std::floor(threshold * 8.0f) / 8.0f;  // the bin's lowest token
      for (float v : z) {
        if (v >= edge && v < threshold) threshold = v;
      }
      if (TailShare(z, threshold) >= 0.02) break;
    }
    const double tail_share = TailShare(z, threshold);
    ASSERT_GE(tail_share, 0.02) << Name(shape);
    ASSERT_LE(tail_share, shape == Shape::kFlat ? 0.6 : 0.2) << Name(shape);
    std::vector<int32_t> oracle(kPositions);
    {
      ChunkedRow row(z, threshold);
      for (int position = 0; position < kPositions; ++position) {
        row.r.p.position = static_cast<uint64_t>(position);
        row.r.p.seed = 77;
        oracle[position] = row.OracleToken();
      }
    }
    for (int path = 0; path < 3; ++path) {
      const Paths paths(/*avx2=*/path < 2, /*avx512=*/path == 0);
      ChunkedRow row(z, threshold);
      int64_t tail_draws = 0, fallbacks = 0;
      for (int position = 0; position < kPositions; ++position) {
        row.r.p.position = static_cast<uint64_t>(position);
        fallbacks += row.Draw(77) ? 1 : 0;
        ASSERT_EQ(row.r.token, oracle[position])
            << Name(shape) << " path " << path << " position " << position;
        tail_draws += z[row.r.token] < row.r.head_from ? 1 : 0;
      }
      EXPECT_GT(tail_draws, 0) << Name(shape) << " path " << path;
      EXPECT_LT(tail_draws, kPositions) << Name(shape) << " path " << path;
      EXPECT_NEAR(static_cast<double>(tail_draws) / kPositions, tail_share,
                  5.0 * std::sqrt(tail_share / kPositions))
          << Name(shape) << " path " << path;
      EXPECT_LE(fallbacks, 1) << Name(shape) << " path " << path;
    }
  }
}

// Level 0 through FastCpuSampler (pieces from 3 threads' task ranges, and rows whose kept
// tokens were all gathered, DrawChunkedGathered): flat rows (the tail ~45% of the mass) at
// 200 positions each, V = 20,000 and 1001, top-p 0.95 and 0.9, and rows of logits near +-2^22
// (ulp 0.5: there (b + 1) / 8 rounds and HeadFrom steps to the head's first float; 4 values
// 0.5 apart, every token kept, the tail the tokens at the lowest: ~12% of the mass), on every
// path with gather caps 16 (pieces) and 2^30
// (gathered): every token the oracle's, and both parts drawn.
TEST(FastCpuTopPTest, BothPartsOfLevelZeroAreDrawnByTheSamplerWithTheOraclesTokens) {
  std::mt19937_64 rng(20261210);
  struct Case {
    const char* name;
    int64_t vocab;
    float top_p;
    float base;  // 0: a flat row; else base + 0.5 x k, k in [0, 4)
  };
  const Case cases[] = {{"flat V 20000", 20000, 0.95f, 0.0f},
                        {"flat V 1001", 1001, 0.9f, 0.0f},
                        {"near 2^22", 3000, 0.999f, 4194304.0f},
                        {"near -2^22", 3000, 0.999f, -4194304.0f - 2.0f}};
  constexpr int kPositions = 200;
  for (const Case& c : cases) {
    std::vector<float> x(c.vocab);
    if (c.base == 0.0f) {
      FillRow(Shape::kFlat, c.vocab, rng, x.data());
    } else {
      for (float& v : x) v = c.base + 0.5f * static_cast<float>(rng() % 4);
    }
    Rows rows;
    rows.vocab = c.vocab;
    rows.batch = kPositions;
    for (int position = 0; position < kPositions; ++position) {
      const auto* bytes = reinterpret_cast<const unsigned char*>(x.data());
      rows.bytes.insert(rows.bytes.end(), bytes, bytes + 4 * c.vocab);
      RowParams p = Params(1.0f, 0, c.top_p, 0.0f);
      p.seed = 5;
      p.position = static_cast<uint64_t>(position);
      rows.params.push_back(p);
    }
    std::vector<int32_t> oracle, fast;
    std::vector<RowStatus> oracle_status, fast_status;
    CpuSampleRows(rows.Args(oracle, oracle_status), 0, rows.batch);
    // The parts by the test's own top-p rule (exact sums: the selection's agrees on these rows).
    const float threshold = TopPThreshold(x, c.top_p);
    const float bin = std::floor(threshold * 8.0f);
    const auto tail_draws = std::count_if(oracle.begin(), oracle.end(), [&](int32_t t) {
      return t >= 0 && std::floor(x[t] * 8.0f) == bin;
    });
    EXPECT_GT(tail_draws, kPositions / 20) << c.name;
    EXPECT_LT(tail_draws, kPositions - kPositions / 20) << c.name;
    for (int gather_cap : {16, 1 << 30}) {
      FastCpuSampler::Options options;
      options.threads = 3;
      options.spin_us = 50;
      options.gather_cap = gather_cap;
      FastCpuSampler sampler(options);
      for (int path = 0; path < 3; ++path) {
        const Paths paths(/*avx2=*/path < 2, /*avx512=*/path == 0);
        ASSERT_TRUE(sampler.Sample(rows.Args(fast, fast_status)));
        EXPECT_EQ(fast_status, oracle_status);
        EXPECT_EQ(fast, oracle) << c.name << " gather cap " << gather_cap << " path " << path;
      }
      if (gather_cap > kPositions * c.vocab) {
        EXPECT_EQ(sampler.inverse_cdf_fallbacks(), 0);
      }
    }
  }
}

// Kept tokens more than 36 below the max (which top-p alone, p < 1, never keeps: their mass is
// below 1 - p of the row's) are left out of the float sums and counted, their possible mass in
// the margin: a row spread evenly over 50 logits with every token kept, V = 20,000 (a partial
// chunk, a partial segment), on every path, gives the oracle's token.
TEST(FastCpuTopPTest, KeptTokensFarBelowTheMaxAreLeftOutOfTheSumsWithinTheMargin) {
  constexpr int64_t kVocab = 20000;
  std::mt19937_64 rng(9);
  std::uniform_real_distribution<float> spread(-50.0f, 0.0f);
  std::vector<float> z(kVocab);
  for (float& v : z) v = spread(rng);
  const float lowest = *std::min_element(z.begin(), z.end());
  for (int path = 0; path < 3; ++path) {
    const Paths paths(/*avx2=*/path < 2, /*avx512=*/path == 0);
    ChunkedRow row(z, lowest);
    int64_t left_out = 0;
    for (const cpu_fast_internal::MassPiece& piece : row.r.pieces) left_out += piece.left_out;
    EXPECT_EQ(left_out,
              std::count_if(z.begin(), z.end(), [&](float v) { return v < row.r.skip_below; }));
    EXPECT_GT(left_out, kVocab / 5);
    int64_t fallbacks = 0;
    for (uint64_t seed = 0; seed < 300; ++seed) {
      fallbacks += row.Draw(seed * 0x9E3779B97F4A7C15u) ? 1 : 0;
      ASSERT_EQ(row.r.token, row.OracleToken()) << "path " << path << " seed " << seed;
    }
    EXPECT_EQ(fallbacks, 0) << "path " << path;
  }
}

}  // namespace
}  // namespace samplerd::kernels
