// The one-launch greedy path (kernels/gpu/greedy_pass.h) against the CPU reference and against
// the general kernels: the same token and status on every row, at span edges and in degenerate
// rows, in every dtype and on unaligned rows; and one workspace serving launches of every shape
// in turn, which shows that each launch leaves its tickets zeroed for the next. Skips without a
// GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/gpu/runtime.h"
#include "kernels/gpu/sample.h"
#include "tests/gpu/gpu_test_util.h"

namespace samplerd::kernels::testing {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
const DType kDTypes[] = {DType::kFp32, DType::kBf16, DType::kFp16};

class GpuGreedyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!HaveGpu(&why)) GTEST_SKIP() << "no GPU: " << why;
  }
};

Batch Shaped(DType dtype, int64_t batch, int64_t vocab, int64_t stride) {
  Batch b;
  b.dtype = dtype;
  b.batch = batch;
  b.vocab = vocab;
  b.row_stride = stride;
  b.bytes.assign(batch * stride * DTypeSize(dtype), 0);
  b.params.assign(1, Params(0.0f, 0, 1.0f, 0.0f));
  return b;
}

void Set(Batch& b, int64_t row, int64_t j, float v) {
  StoreValue(b.dtype, v, &b.bytes[(row * b.row_stride + j) * DTypeSize(b.dtype)]);
}

// Expects the one-launch path, the general kernels and the CPU to agree on every row.
void ExpectAllAgree(const Batch& batch, const std::string& what) {
  Batch general = batch;
  general.greedy_hint = false;
  const Outputs cpu = RunCpu(batch);
  const Outputs one = RunGpu(batch);
  const Outputs two = RunGpu(general);
  for (int64_t r = 0; r < batch.batch; ++r) {
    SCOPED_TRACE(what + ", row " + std::to_string(r));
    EXPECT_EQ(one.tokens[r], cpu.tokens[r]);
    EXPECT_EQ(static_cast<int>(one.status[r]), static_cast<int>(cpu.status[r]));
    EXPECT_EQ(two.tokens[r], cpu.tokens[r]);
    EXPECT_EQ(static_cast<int>(two.status[r]), static_cast<int>(cpu.status[r]));
  }
}

// Rows built to catch an argmax that is wrong at a span's edge or on a degenerate row. Spans are
// 1,024 fp32 or 2,048 16-bit tokens on short launches, 4x that on long ones (sample.hip).
Batch EdgeRows(DType dtype, int64_t stride_pad) {
  constexpr int64_t kVocab = 20000;
  Batch b = Shaped(dtype, 12, kVocab, kVocab + stride_pad);
  std::mt19937_64 rng(5);
  FillLogits(b, "randn3", rng);  // row 0 stays random
  auto fill_row = [&](int64_t r, float v) {
    for (int64_t j = 0; j < kVocab; ++j) Set(b, r, j, v);
  };
  fill_row(1, 0.5f);  // flat: token 0
  fill_row(2, -1.0f);
  Set(b, 2, 1023, 4.0f);  // tied across the first fp32 span edge: 1023
  Set(b, 2, 1024, 4.0f);
  fill_row(3, -1.0f);
  Set(b, 3, 16384, 4.0f);  // tied across long spans: 8191 wins over 8192 and 16384
  Set(b, 3, 8192, 4.0f);
  Set(b, 3, 8191, 4.0f);
  Set(b, 4, kVocab - 1, std::nanf(""));  // NaN in the last token: status NaN
  fill_row(5, -kInf);                    // nothing above -inf
  Set(b, 6, 3000, kInf);                 // the first +inf: 3000
  Set(b, 6, 19000, kInf);
  fill_row(7, -kInf);
  Set(b, 7, kVocab - 1, -50.0f);  // the only finite token is the last one
  fill_row(8, -1.0f);
  Set(b, 8, 7, -0.0f);  // -0 and +0 tie (the CPU compares floats): 7
  Set(b, 8, 20, 0.0f);
  fill_row(9, -2.0f);
  Set(b, 9, 0, -1.0f);  // the max at token 0
  fill_row(10, 1.0f);
  Set(b, 10, kVocab - 1, 1.5f);  // the max at the last token (a partial span)
  fill_row(11, -kInf);
  Set(b, 11, 4096, std::nanf(""));  // NaN among -inf: status NaN
  return b;
}

TEST_F(GpuGreedyTest, EdgeAndDegenerateRowsMatchTheCpuAndTheGeneralKernels) {
  for (DType dtype : kDTypes) {
    for (int64_t pad : {0, 3}) {  // 3: rows that start off the 16-byte vector alignment
      ExpectAllAgree(EdgeRows(dtype, pad),
                     std::string("dtype ") + DTypeName(dtype) + ", pad " + std::to_string(pad));
    }
  }
}

TEST_F(GpuGreedyTest, TheBitmaskAndBiasesApplyAsOnTheCpu) {
  for (DType dtype : kDTypes) {
    Batch b = EdgeRows(dtype, 0);
    const int64_t words = (b.vocab + 31) / 32;
    b.bitmask.assign(b.batch * words, 0xffffffffu);
    for (int64_t w = 0; w < words; ++w) {
      b.bitmask[0 * words + w] = 0xaaaaaaaau;  // row 0: odd tokens only
      b.bitmask[9 * words + w] = 0;            // row 9: nothing allowed, so NoAllowed
      b.bitmask[6 * words + w] = w == 3000 / 32 ? 0u : 0xffffffffu;  // row 6: 3000 masked
    }
    // Biases: row 2's token 5 wins; row 1's token 19999 wins (a flat row otherwise).
    b.adjust_offsets.assign(b.batch + 1, 0);
    TokenAdjust lift;
    lift.token = 5;
    lift.bias = 100.0f;
    TokenAdjust last;
    last.token = 19999;
    last.bias = 0.25f;
    b.adjusts = {last, lift};
    for (int64_t r = 0; r <= b.batch; ++r) b.adjust_offsets[r] = r <= 1 ? 0 : (r == 2 ? 1 : 2);
    ExpectAllAgree(b, std::string("dtype ") + DTypeName(dtype));
  }
}

// v40: the greedy pass leaves tokens with a bias or penalty out of its unrolled loop and takes
// them one at a time afterwards, with the lowest-index tie-break written out. Rows where a
// marked token ties an unmarked neighbour on either side, two marked tokens of one group tie, a
// marked NaN, a marked token biased to +inf or to -inf, and marked ties across a span edge.
TEST_F(GpuGreedyTest, MarkedTokensTieAndFlagAsOnTheCpu) {
  constexpr int64_t kVocab = 20000;
  const float nan = std::nanf("");
  for (DType dtype : kDTypes) {
    Batch b = Shaped(dtype, 9, kVocab, kVocab);
    for (int64_t r = 0; r < b.batch; ++r) {
      for (int64_t j = 0; j < kVocab; ++j) Set(b, r, j, r == 4 || r == 5 ? -kInf : -1.0f);
    }
    std::vector<std::vector<TokenAdjust>> rows(b.batch);
    auto bias = [&](int64_t r, int32_t token, float raw, float add) {
      Set(b, r, token, raw);
      TokenAdjust a;
      a.token = token;
      a.bias = add;
      rows[r].push_back(a);
    };
    // Rows 0 and 1: the tied tokens are neighbours, so one thread holds both (a thread's tokens
    // are consecutive groups of 4 or 8): the explicit tie-break decides, not the reductions.
    Set(b, 0, 101, 3.0f);
    bias(0, 100, 2.0f, 1.0f);  // marked 100 ties unmarked 101 at 3: 100
    Set(b, 1, 100, 3.0f);
    bias(1, 101, 2.0f, 1.0f);  // unmarked 100 ties marked 101: 100
    bias(2, 8, 0.0f, 5.0f);    // two marked tokens of one group tie at 5: 8
    bias(2, 9, 0.0f, 5.0f);
    Set(b, 2, 10, 4.0f);
    bias(3, 70, nan, 1.0f);  // a marked NaN: status NaN
    Set(b, 4, 3, kInf);
    bias(4, 7, -kInf, kInf);    // a marked +inf after an unmarked one: 3
    bias(5, 11, 2.0f, -kInf);   // the only finite token biased away
    bias(6, 1023, 1.0f, 2.0f);  // marked ties across the first fp32 span edge: 1023
    bias(6, 1024, 1.0f, 2.0f);
    Set(b, 6, 5000, 2.5f);
    bias(7, 30, -0.5f, 0.0f);  // a repetition penalty on a negative logit: 30 at -0.25
    rows[7].back().repetition = 0.5f;
    Set(b, 8, 4096, 2.0f);  // row 8 has no adjusts: its marks are all clear
    b.adjust_offsets.assign(b.batch + 1, 0);
    for (int64_t r = 0; r < b.batch; ++r) {
      b.adjusts.insert(b.adjusts.end(), rows[r].begin(), rows[r].end());
      b.adjust_offsets[r + 1] = static_cast<uint32_t>(b.adjusts.size());
    }
    ExpectAllAgree(b, std::string("dtype ") + DTypeName(dtype));
    const Outputs one = RunGpu(b);
    const int32_t want[] = {100, 100, 8, -1, 3, -1, 1023, 30, 4096};
    for (int64_t r = 0; r < b.batch; ++r) {
      EXPECT_EQ(one.tokens[r], want[r]) << DTypeName(dtype) << ", row " << r;
    }
  }
}

TEST_F(GpuGreedyTest, ShortAndLongSpansMatchTheCpuOnRandomRows) {
  struct Shape {
    int64_t batch, vocab, stride;
  };
  // B = 1-3: short spans; the others long (more than 4 x 132 short-span blocks).
  const Shape shapes[] = {{1, 151936, 151936},  {3, 1, 1},
                          {2, 1025, 1030},      {64, 32000, 32000},
                          {40, 151936, 151937}, {600, 4097, 4097}};
  std::mt19937_64 rng(9);
  for (DType dtype : kDTypes) {
    for (const Shape& s : shapes) {
      for (const char* dist : {"randn3", "zipf", "flat", "peaked"}) {
        Batch b = Shaped(dtype, s.batch, s.vocab, s.stride);
        FillLogits(b, dist, rng);
        ExpectAllAgree(b, std::string(DTypeName(dtype)) + " " + dist + " B " +
                              std::to_string(s.batch) + " V " + std::to_string(s.vocab));
      }
    }
  }
}

// One workspace, zeroed once, serves greedy launches of several shapes and dtypes between
// launches that take the general kernels (their top-p path also counts on tickets). A ticket
// left nonzero would make a later greedy row miss its finish and leave its token unwritten.
TEST_F(GpuGreedyTest, AWorkspaceServesLaunchesOfEveryShapeInTurn) {
  struct Launch {
    DType dtype;
    int64_t batch, vocab;
    RowParams params;
  };
  const RowParams greedy = Params(0.0f, 0, 1.0f, 0.0f);
  const Launch launches[] = {
      {DType::kFp32, 4, 1000, greedy},
      {DType::kFp32, 128, 151936, Params(1.0f, 50, 1.0f, 0.0f)},
      {DType::kBf16, 128, 151936, greedy},
      {DType::kFp32, 1, 151936, greedy},
      {DType::kFp32, 32, 151936, Params(1.0f, 0, 0.9f, 0.0f)},
      {DType::kFp16, 300, 32000, greedy},
      {DType::kFp32, 128, 151936, greedy},
      {DType::kFp32, 128, 151936, greedy},
      {DType::kBf16, 2, 262147, greedy},
      {DType::kFp32, 7, 151936, greedy},
  };
  size_t bytes = 0;
  for (const Launch& l : launches) {
    bytes = std::max(bytes, gpu::SampleWorkspaceBytes(l.batch, l.vocab, -1));
  }
  void* workspace = nullptr;
  ASSERT_EQ(gpu::DeviceMalloc(&workspace, bytes), 0);
  ASSERT_EQ(gpu::ZeroDevice(workspace, bytes, nullptr), 0);
  ASSERT_EQ(gpu::StreamSynchronize(nullptr), 0);
  std::mt19937_64 rng(21);
  for (int round = 0; round < 2; ++round) {
    for (const Launch& l : launches) {
      Batch b = Shaped(l.dtype, l.batch, l.vocab, l.vocab);
      FillLogits(b, "randn3", rng);
      SetParams(b, l.params, rng);
      const Outputs shared = RunGpuIn(b, workspace, bytes);
      const Outputs fresh = RunGpu(b);  // a new zeroed workspace
      const Outputs cpu = RunCpu(b);
      const bool is_greedy = l.params.temperature == 0.0f;
      for (int64_t r = 0; r < b.batch; ++r) {
        SCOPED_TRACE(std::string(DTypeName(l.dtype)) + " B " + std::to_string(l.batch) + " V " +
                     std::to_string(l.vocab) + " round " + std::to_string(round) + " row " +
                     std::to_string(r));
        ASSERT_EQ(shared.tokens[r], fresh.tokens[r]);
        ASSERT_EQ(static_cast<int>(shared.status[r]), static_cast<int>(fresh.status[r]));
        if (is_greedy) {
          ASSERT_EQ(shared.tokens[r], cpu.tokens[r]);
        }
      }
    }
  }
  ASSERT_EQ(gpu::DeviceFree(workspace), 0);
}

}  // namespace
}  // namespace samplerd::kernels::testing
