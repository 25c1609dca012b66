// CpuSampler (service/core/backend/cpu_sampler.h) with host shm logits: it copies them out a
// block of rows at a time, each row's V elements only, and samples each block through a view of
// the batch's per-row arrays. Every row must come out as it does from the same logits inline
// (sampled in one pass): tokens, statuses and logprobs, with per-row parameters, a bitmask, a
// logit bias and a NaN row, dense and strided.
#include "service/core/backend/cpu_sampler.h"

#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "service/core/sampler_core.h"
#include "tests/core/shm_test_util.h"
#include "tests/core/test_util.h"

namespace samplerd::core {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr int64_t kBatch = 5, kVocab = 300;

// What each row is asked: rows 0, 1 and 4 greedy, rows 2 and 3 sampled hot (T = 5, top-k 50)
// with their own seeds, so that a row given another row's parameters would mostly change; row r
// allows tokens [50 r, 50 r + 100) only; rows 1 and 4 are forced to 77 and 250, and row 3 may
// not take 160.
struct Case {
  std::vector<uint32_t> mask;
  SampleRequest request;
};

Case MakeCase() {
  Case c;
  const int64_t words = (kVocab + 31) / 32;
  c.mask.assign(kBatch * words, 0u);
  for (int64_t r = 0; r < kBatch; ++r) {
    for (int64_t t = 50 * r; t < 50 * r + 100 && t < kVocab; ++t) {
      c.mask[r * words + t / 32] |= 1u << (t % 32);
    }
  }
  SampleRequest& request = c.request;
  request.dtype = kernels::DType::kFp32;
  request.shape = {kBatch, kVocab};
  for (int64_t r = 0; r < kBatch; ++r) {
    ParamsSpec p;
    p.temperature = r == 2 || r == 3 ? 5.0f : 0.0f;
    p.top_k = 50;
    p.seed = 100 + static_cast<uint64_t>(r);
    request.params.push_back(p);
  }
  request.logprobs = LogprobSpec{3, kernels::LogprobSource::kRaw};
  TokenBitmaskSpec& bitmask = request.token_bitmask.emplace();
  bitmask.inline_words =
      std::string_view(reinterpret_cast<const char*>(c.mask.data()), c.mask.size() * 4);
  bitmask.has_inline_words = true;
  LogitBiasSpec& bias = request.logit_bias.emplace();
  bias.row_offsets = {0, 0, 1, 1, 2, 3};
  bias.token_ids = {77, 160, 250};
  bias.biases = {kInf, -kInf, kInf};
  return c;
}

// fp32 logits [kBatch, kVocab] from a fixed seed, with a NaN in row 2 (ROW_STATUS_NAN there).
std::vector<float> RandomLogits() {
  std::vector<float> v(kBatch * kVocab);
  std::mt19937 rng(21);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (float& x : v) x = normal(rng);
  v[2 * kVocab + 5] = std::numeric_limits<float>::quiet_NaN();
  return v;
}

void ExpectSameRows(const SampleResult& got, const SampleResult& want) {
  EXPECT_EQ(got.token_ids, want.token_ids);
  EXPECT_EQ(got.row_status, want.row_status);
  ASSERT_EQ(got.logprobs.size(), want.logprobs.size());
  for (size_t r = 0; r < want.logprobs.size(); ++r) {
    EXPECT_EQ(got.logprobs[r].sampled_logprob, want.logprobs[r].sampled_logprob) << r;
    EXPECT_EQ(got.logprobs[r].sampled_rank, want.logprobs[r].sampled_rank) << r;
    EXPECT_EQ(got.logprobs[r].top_ids, want.logprobs[r].top_ids) << r;
    EXPECT_EQ(got.logprobs[r].top_values, want.logprobs[r].top_values) << r;
  }
}

// Two threads and 1-byte blocks: blocks of two rows (one a thread), rows [0, 2), [2, 4), [4, 5).
TEST(CpuSamplerHostShm, RowsCopiedInBlocksComeOutAsTheSameLogitsInline) {
  SamplerCore core(CoreOptions{}, std::make_unique<CpuSampler>(2, /*shm_block_bytes=*/1),
                   /*seed_start=*/1);
  const std::vector<float> logits = RandomLogits();
  Case inline_case = MakeCase();
  inline_case.request.inline_data =
      std::string_view(reinterpret_cast<const char*>(logits.data()), logits.size() * 4);
  inline_case.request.has_inline_data = true;
  const absl::StatusOr<SampleResult> want = SampleAndWait(core, inline_case.request);
  ASSERT_TRUE(want.ok()) << want.status();
  EXPECT_EQ(want->token_ids[1], 77);
  EXPECT_EQ(want->row_status[2], kernels::RowStatus::kNan);
  EXPECT_EQ(want->token_ids[4], 250);
  for (const int64_t r : {0, 1, 3, 4}) {
    EXPECT_GE(want->token_ids[r], 50 * r) << r;
    EXPECT_LT(want->token_ids[r], 50 * r + 100) << r;
  }
  EXPECT_NE(want->token_ids[3], 160);

  for (const int64_t stride : {int64_t{0}, int64_t{333}}) {
    SCOPED_TRACE(stride);
    const int64_t row_stride = stride == 0 ? kVocab : stride;
    TestShm shm(static_cast<size_t>(kBatch * row_stride * 4));
    ASSERT_TRUE(shm.ok());
    for (int64_t r = 0; r < kBatch; ++r) {
      std::memcpy(shm.data() + r * row_stride * 4, logits.data() + r * kVocab, kVocab * 4);
    }
    const std::string name = "logits" + std::to_string(stride);
    ASSERT_TRUE(core.regions().RegisterHostShm(name, shm.key(), 0, shm.size()).ok());
    Case region_case = MakeCase();
    region_case.request.logits_region = RegionRef{name, 0};
    region_case.request.row_stride = stride;
    const absl::StatusOr<SampleResult> got = SampleAndWait(core, region_case.request);
    ASSERT_TRUE(got.ok()) << got.status();
    ExpectSameRows(*got, *want);
    ASSERT_TRUE(core.regions().Unregister(name).ok());
  }
}

}  // namespace
}  // namespace samplerd::core
