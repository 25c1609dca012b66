// Sample over a unix socket and TCP: known greedy answers, seeded reproducibility, server seeds,
// bad rows, logprobs and GetServerInfo. Regions: region_test.cc.
#include <cmath>
#include <string>
#include <vector>

#include "tests/integration/integration_fixture.h"

namespace samplerd::integration {
namespace {

using SampleOverUds = ServerSuite;

TEST_F(SampleOverUds, GreedyReturnsTheArgmaxWithLowestIndexOnTies) {
  const GreedyCase c = KnownGreedyBatch();
  v1::SampleRequest request = c.logits.Request({Greedy()});
  request.set_request_id("greedy-1");
  v1::SampleResponse response;
  const grpc::Status status = client_->Sample(request, &response);
  ASSERT_TRUE(status.ok()) << status.error_code() << ": " << status.error_message();
  EXPECT_EQ(response.request_id(), "greedy-1");
  EXPECT_EQ(Tokens(response), c.expected);
  ASSERT_EQ(response.row_status_size(), 4);
  for (int r = 0; r < 4; ++r) EXPECT_EQ(response.row_status(r), v1::ROW_STATUS_OK) << "row " << r;
  EXPECT_EQ(response.seeds_size(), 4);
}

TEST_F(SampleOverUds, GreedyAgreesAcrossDtypes) {
  const GreedyCase c = KnownGreedyBatch();
  for (const v1::DType dtype : {v1::DTYPE_FP16, v1::DTYPE_BF16}) {
    v1::SampleRequest request = c.logits.Request({Greedy()});
    request.mutable_logits()->set_dtype(dtype);
    request.mutable_logits()->set_inline_data(
        dtype == v1::DTYPE_FP16 ? ToFp16Bytes(c.logits.values) : ToBf16Bytes(c.logits.values));
    v1::SampleResponse response;
    const grpc::Status status = client_->Sample(request, &response);
    ASSERT_TRUE(status.ok()) << v1::DType_Name(dtype) << ": " << status.error_message();
    EXPECT_EQ(Tokens(response), c.expected) << v1::DType_Name(dtype);
  }
}

TEST_F(SampleOverUds, RowStrideSkipsPadding) {
  // The known batch padded to a stride of 11 elements with huge values that must not be read.
  const GreedyCase c = KnownGreedyBatch();
  const int64_t stride = 11;
  std::vector<float> padded(static_cast<size_t>(3 * stride + 8), 1e30f);
  for (int64_t r = 0; r < 4; ++r) {
    std::copy(c.logits.values.begin() + r * 8, c.logits.values.begin() + (r + 1) * 8,
              padded.begin() + r * stride);
  }
  v1::SampleRequest request = c.logits.Request({Greedy()});
  request.mutable_logits()->set_row_stride(stride);
  request.mutable_logits()->set_inline_data(
      std::string(reinterpret_cast<const char*>(padded.data()), padded.size() * sizeof(float)));
  v1::SampleResponse response;
  const grpc::Status status = client_->Sample(request, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(Tokens(response), c.expected);
}

TEST_F(SampleOverUds, SeededRequestIsReproducible) {
  const Logits logits = RandomLogits(16, 1000, /*seed=*/7, /*stddev=*/1.0f);
  const v1::SampleRequest request = logits.Request({TopKTopP(/*seed=*/1234)});
  v1::SampleResponse first, second;
  ASSERT_TRUE(client_->Sample(request, &first).ok());
  ASSERT_TRUE(client_->Sample(request, &second).ok());
  EXPECT_EQ(Tokens(first), Tokens(second));
  EXPECT_EQ(Seeds(first), std::vector<uint64_t>(16, 1234));
}

TEST_F(SampleOverUds, DifferentPositionsDrawDifferently) {
  // Flat-ish rows over 1000 tokens: 32 rows drawing the same token at two positions would be a
  // broken RNG (chance ~1e-90), not bad luck. Fixed data, so the outcome is deterministic.
  const Logits logits = RandomLogits(32, 1000, /*seed=*/8, /*stddev=*/0.5f);
  v1::SampleResponse at0, at1;
  ASSERT_TRUE(client_->Sample(logits.Request({Seeded(99, 0)}), &at0).ok());
  ASSERT_TRUE(client_->Sample(logits.Request({Seeded(99, 1)}), &at1).ok());
  EXPECT_NE(Tokens(at0), Tokens(at1));
}

TEST_F(SampleOverUds, ServerChosenSeedsAreReturnedAndReplay) {
  const Logits logits = RandomLogits(8, 1000, /*seed=*/9, /*stddev=*/1.0f);
  v1::SamplingParams unseeded;
  unseeded.set_temperature(1.0f);
  unseeded.set_position(5);
  v1::SampleResponse chosen;
  ASSERT_TRUE(client_->Sample(logits.Request({unseeded}), &chosen).ok());
  ASSERT_EQ(chosen.seeds_size(), 8);

  // Replay row by row with the returned seeds, at the same position.
  std::vector<v1::SamplingParams> replay_params;
  for (uint64_t seed : Seeds(chosen)) replay_params.push_back(Seeded(seed, 5));
  v1::SampleResponse replay;
  ASSERT_TRUE(client_->Sample(logits.Request(replay_params), &replay).ok());
  EXPECT_EQ(Tokens(replay), Tokens(chosen));
  EXPECT_EQ(Seeds(replay), Seeds(chosen));
}

TEST_F(SampleOverUds, RowSeedsAndPositionsDrawAsPerRowParamsDo) {
  const Logits logits = RandomLogits(12, 800, /*seed=*/12, /*stddev=*/1.0f);
  std::vector<v1::SamplingParams> per_row;
  v1::SampleRequest columnar = logits.Request({TopKTopP(/*seed=*/1)});
  for (int r = 0; r < 12; ++r) {
    v1::SamplingParams p = TopKTopP(/*seed=*/500 + 7 * r);
    p.set_position(3 * r + 1);
    per_row.push_back(p);
    columnar.add_row_seeds(500 + 7 * r);
    columnar.add_row_positions(3 * r + 1);
  }
  v1::SampleResponse expected, got;
  ASSERT_TRUE(client_->Sample(logits.Request(per_row), &expected).ok());
  const grpc::Status status = client_->Sample(columnar, &got);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(Tokens(got), Tokens(expected));
  EXPECT_EQ(Seeds(got), Seeds(expected));

  columnar.add_row_seeds(9);  // 13 seeds for 12 rows
  EXPECT_EQ(client_->Sample(columnar, &got).error_message(),
            "expected row_seeds with 0 entries or B = 12 entries, got 13 entries");
}

TEST_F(SampleOverUds, RowTokenDoesNotDependOnTheBatch) {
  const Logits batch = RandomLogits(6, 500, /*seed=*/10, /*stddev=*/1.0f);
  std::vector<v1::SamplingParams> params;
  for (int r = 0; r < 6; ++r) params.push_back(Seeded(1000 + r, 3));
  v1::SampleResponse together;
  ASSERT_TRUE(client_->Sample(batch.Request(params), &together).ok());
  for (int r = 0; r < 6; ++r) {
    Logits alone{
        1, 500,
        std::vector<float>(batch.values.begin() + r * 500, batch.values.begin() + (r + 1) * 500)};
    v1::SampleResponse single;
    ASSERT_TRUE(client_->Sample(alone.Request({params[r]}), &single).ok());
    EXPECT_EQ(single.token_ids(0), together.token_ids(r)) << "row " << r;
  }
}

TEST_F(SampleOverUds, NanRowIsFlaggedAndNeighboursAreSampled) {
  GreedyCase c = KnownGreedyBatch();
  c.logits.row(1)[4] = std::nanf("");
  v1::SampleResponse response;
  const grpc::Status status = client_->Sample(c.logits.Request({Greedy()}), &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(Tokens(response), (std::vector<int32_t>{3, -1, 2, 6}));
  ASSERT_EQ(response.row_status_size(), 4);
  EXPECT_EQ(response.row_status(0), v1::ROW_STATUS_OK);
  EXPECT_EQ(response.row_status(1), v1::ROW_STATUS_INVALID_NAN);
  EXPECT_EQ(response.row_status(2), v1::ROW_STATUS_OK);
  EXPECT_EQ(response.row_status(3), v1::ROW_STATUS_OK);
}

TEST_F(SampleOverUds, RowWithoutFiniteLogitIsFlagged) {
  GreedyCase c = KnownGreedyBatch();
  std::fill(c.logits.row(2), c.logits.row(2) + 8, -std::numeric_limits<float>::infinity());
  v1::SampleResponse response;
  ASSERT_TRUE(client_->Sample(c.logits.Request({Seeded(5)}), &response).ok());
  ASSERT_EQ(response.row_status_size(), 4);
  EXPECT_EQ(response.token_ids(2), -1);
  EXPECT_EQ(response.row_status(2), v1::ROW_STATUS_INVALID_NO_FINITE);
  EXPECT_EQ(response.row_status(0), v1::ROW_STATUS_OK);
  EXPECT_EQ(response.row_status(3), v1::ROW_STATUS_OK);
}

TEST_F(SampleOverUds, RawLogprobsMatchLogSoftmax) {
  const GreedyCase c = KnownGreedyBatch();
  v1::SampleRequest request = c.logits.Request({Greedy()});
  request.mutable_logprobs()->set_top_n(3);
  v1::SampleResponse response;
  const grpc::Status status = client_->Sample(request, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_EQ(response.logprobs_size(), 4);
  for (int r = 0; r < 4; ++r) {
    const float* row = c.logits.values.data() + r * 8;
    double max = -INFINITY, sum = 0;
    for (int j = 0; j < 8; ++j) max = std::max<double>(max, row[j]);
    for (int j = 0; j < 8; ++j) sum += std::exp(row[j] - max);
    const double expected = row[c.expected[r]] - max - std::log(sum);
    const v1::RowLogprobs& lp = response.logprobs(r);
    EXPECT_NEAR(lp.sampled_logprob(), expected, 1e-4) << "row " << r;
    EXPECT_EQ(lp.sampled_rank(), 1) << "row " << r;
    ASSERT_EQ(lp.top_token_ids_size(), 3) << "row " << r;
    ASSERT_EQ(lp.top_logprobs_size(), 3) << "row " << r;
    EXPECT_EQ(lp.top_token_ids(0), c.expected[r]) << "row " << r;
    EXPECT_NEAR(lp.top_logprobs(0), expected, 1e-4) << "row " << r;
  }
  // Ties are listed lowest id first: row 2 has 2.5 at ids 2, 5 and 7.
  EXPECT_EQ(std::vector<int32_t>(response.logprobs(2).top_token_ids().begin(),
                                 response.logprobs(2).top_token_ids().end()),
            (std::vector<int32_t>{2, 5, 7}));
}

TEST_F(SampleOverUds, LogprobsTopNAtTheServerLimitIsAccepted) {
  v1::GetServerInfoResponse info;
  ASSERT_TRUE(client_->GetServerInfo(&info).ok());
  const int32_t limit = info.limits().max_top_logprobs();
  const Logits logits = RandomLogits(2, 200, /*seed=*/11);
  v1::SampleRequest request = logits.Request({Seeded(3)});
  request.mutable_logprobs()->set_top_n(static_cast<uint32_t>(limit));
  v1::SampleResponse response;
  const grpc::Status status = client_->Sample(request, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_EQ(response.logprobs_size(), 2);
  EXPECT_EQ(response.logprobs(0).top_token_ids_size(), std::min<int32_t>(limit, 200));
}

TEST_F(SampleOverUds, GetServerInfoDescribesTheCpuBackend) {
  v1::GetServerInfoResponse info;
  const grpc::Status status = client_->GetServerInfo(&info);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_FALSE(info.version().empty());
  EXPECT_EQ(info.backend(), v1::BACKEND_CPU);
  ASSERT_GE(info.devices_size(), 1);
  EXPECT_EQ(info.devices(0).uuid(), "cpu");
  EXPECT_TRUE(info.devices(0).pci_bus_id().empty());
  EXPECT_FALSE(info.devices(0).ipc_memory());
  EXPECT_GE(info.limits().max_batch(), 128);
  EXPECT_GE(info.limits().max_vocab(), 151936);
  EXPECT_EQ(info.limits().max_message_bytes(), 256 << 20);  // the server's default
  EXPECT_GT(info.limits().max_top_logprobs(), 0);
  // The defaults of --max_inflight, --max_inflight_bytes and --max_receive_bytes (no limit) and
  // --chunk_timeout_ms.
  EXPECT_EQ(info.limits().max_inflight(), 256);
  EXPECT_EQ(info.limits().max_inflight_bytes(), 0);
  EXPECT_EQ(info.limits().max_receive_bytes(), 0);
  EXPECT_EQ(info.limits().chunk_timeout_ms(), 10000);
  EXPECT_EQ(info.limits().max_region_bytes(), int64_t{4} << 40);  // --max_region_bytes: 4 TiB
  EXPECT_EQ(info.limits().max_regions(), 4096);                   // --max_regions
  // --max_host_session_bytes: 8 GiB.
  EXPECT_EQ(info.limits().max_host_session_bytes(), int64_t{8} << 30);
}

// The same server behind TCP on a port picked here (bound to 0, released, passed on).
class SampleOverTcp : public ServerSuite {
 protected:
  static void SetUpTestSuite() {
    ServerProcess::Options options = CpuServerOptions();
    options.listen = "127.0.0.1:" + std::to_string(PickFreeTcpPort());
    StartServer(options);
  }
};

TEST_F(SampleOverTcp, GreedyReturnsTheKnownTokens) {
  EXPECT_EQ(server().target().rfind("127.0.0.1:", 0), 0u);
  const GreedyCase c = KnownGreedyBatch();
  v1::SampleResponse response;
  const grpc::Status status = client_->Sample(c.logits.Request({Greedy()}), &response);
  ASSERT_TRUE(status.ok()) << status.error_code() << ": " << status.error_message();
  EXPECT_EQ(Tokens(response), c.expected);
}

TEST_F(SampleOverTcp, SeededDrawMatchesTheSameDrawOverAnotherCall) {
  const Logits logits = RandomLogits(4, 32000, /*seed=*/12);
  const v1::SampleRequest request = logits.Request({TopKTopP(77)});
  v1::SampleResponse first, second;
  ASSERT_TRUE(client_->Sample(request, &first).ok());
  ASSERT_TRUE(client_->Sample(request, &second).ok());
  EXPECT_EQ(Tokens(first), Tokens(second));
}

TEST_F(SampleOverTcp, GetServerInfoAnswers) {
  v1::GetServerInfoResponse info;
  ASSERT_TRUE(client_->GetServerInfo(&info).ok());
  EXPECT_EQ(info.backend(), v1::BACKEND_CPU);
}

}  // namespace
}  // namespace samplerd::integration
