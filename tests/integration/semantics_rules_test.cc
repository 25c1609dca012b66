// The rules of issue 12, edge 4, end to end on the CPU server (docs/DESIGN.md "Sampling
// semantics" states them; the kernel tests in tests/kernels check the same on the sampler):
// - a row of +inf logits is sampled uniformly among its +inf tokens, with status OK; only a row
//   whose every logit is -inf is ROW_STATUS_INVALID_NO_FINITE (SampleOverUds,
//   RowWithoutFiniteLogitIsFlagged in sample_test.cc);
// - greedy iff the float32 temperature < float32(1e-5).
// (GPU IPC registration on a CPU server is FAILED_PRECONDITION: region_test.cc,
// BadRegistrationTable.)
#include <cmath>
#include <map>
#include <vector>

#include "tests/integration/integration_fixture.h"

namespace samplerd::integration {
namespace {

using SemanticsRules = ServerSuite;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr int kRows = 64;

// kRows copies of `row`, row i sampled with seed 1000 + i at temperature `temperature`.
v1::SampleResponse SampleCopies(Client* client, const std::vector<float>& row, float temperature) {
  Logits logits{kRows, static_cast<int64_t>(row.size()), {}};
  for (int i = 0; i < kRows; ++i) logits.values.insert(logits.values.end(), row.begin(), row.end());
  std::vector<v1::SamplingParams> params;
  for (int i = 0; i < kRows; ++i) {
    v1::SamplingParams p = Seeded(1000 + i);
    p.set_temperature(temperature);
    params.push_back(p);
  }
  v1::SampleResponse response;
  const grpc::Status status = client->Sample(logits.Request(params), &response);
  EXPECT_TRUE(status.ok()) << status.error_message();
  return response;
}

std::map<int32_t, int> Counts(const v1::SampleResponse& response) {
  std::map<int32_t, int> counts;
  for (int32_t token : response.token_ids()) ++counts[token];
  return counts;
}

TEST_F(SemanticsRules, AllPositiveInfinityRowIsSampledUniformlyWithStatusOk) {
  const v1::SampleResponse response = SampleCopies(client_.get(), {kInf, kInf, kInf, kInf}, 1.0f);
  ASSERT_EQ(response.row_status_size(), kRows);
  for (int i = 0; i < kRows; ++i) EXPECT_EQ(response.row_status(i), v1::ROW_STATUS_OK) << i;
  const std::map<int32_t, int> counts = Counts(response);
  ASSERT_EQ(counts.size(), 4u) << "every +inf token is drawn";
  for (const auto& [token, n] : counts) {
    EXPECT_GE(n, 6) << "token " << token << ": far from the uniform 16 of 64";
  }
}

TEST_F(SemanticsRules, PositiveInfinityTokensTakeAllTheMassAndGreedyTakesTheFirst) {
  const std::vector<float> row = {5.0f, kInf, -kInf, 7.0f, kInf, 1.0f};
  const std::map<int32_t, int> counts = Counts(SampleCopies(client_.get(), row, 1.0f));
  ASSERT_EQ(counts.size(), 2u);
  EXPECT_GE(counts.at(1), 16);
  EXPECT_GE(counts.at(4), 16);
  EXPECT_EQ(Counts(SampleCopies(client_.get(), row, 0.0f)), (std::map<int32_t, int>{{1, kRows}}));
}

// Two tied maxima tell greedy (always the lower index) from a draw (either, by seed).
TEST_F(SemanticsRules, GreedyComparesTheTemperatureInFloat32) {
  const std::vector<float> tied = {3.0f, 3.0f, -1.0f};
  const float threshold = 1e-5f;  // kernels::kGreedyTemperature
  const float below = std::nextafter(threshold, 0.0f);
  EXPECT_EQ(Counts(SampleCopies(client_.get(), tied, below)), (std::map<int32_t, int>{{0, kRows}}));
  const std::map<int32_t, int> at = Counts(SampleCopies(client_.get(), tied, threshold));
  ASSERT_EQ(at.size(), 2u) << "T = float32(1e-5) is not greedy: both tied tokens are drawn";
  EXPECT_GE(at.at(1), 16);
}

}  // namespace
}  // namespace samplerd::integration
