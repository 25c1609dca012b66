// SampleStream through samplerd::SampleSession: order, request ids, a bad step in the middle,
// chunked steps, and agreement with unary Sample.
#include <string>
#include <vector>

#include "tests/integration/integration_fixture.h"

namespace samplerd::integration {
namespace {

using SampleStream = ServerSuite;

// Step i samples the known batch with its rows rotated left by i, so each step has its own answer.
v1::SampleRequest RotatedGreedyStep(int step, std::vector<int32_t>* expected) {
  const GreedyCase c = KnownGreedyBatch();
  Logits rotated{4, 8, {}};
  expected->clear();
  for (int r = 0; r < 4; ++r) {
    const int source = (r + step) % 4;
    rotated.values.insert(rotated.values.end(), c.logits.values.begin() + source * 8,
                          c.logits.values.begin() + (source + 1) * 8);
    expected->push_back(c.expected[source]);
  }
  v1::SampleRequest request = rotated.Request({Greedy()});
  request.set_request_id("step-" + std::to_string(step));
  return request;
}

TEST_F(SampleStream, StepsAreAnsweredInOrderWithTheirRequestIds) {
  std::unique_ptr<SampleSession> session = client_->OpenStream();
  for (int step = 0; step < 6; ++step) {
    std::vector<int32_t> expected;
    const v1::SampleRequest request = RotatedGreedyStep(step, &expected);
    v1::SampleResponse response;
    const grpc::Status status = session->Step(request, &response);
    ASSERT_TRUE(status.ok()) << "step " << step << ": " << status.error_message();
    EXPECT_EQ(response.request_id(), request.request_id());
    EXPECT_EQ(Tokens(response), expected) << "step " << step;
  }
  EXPECT_TRUE(session->Close().ok());
  EXPECT_FALSE(session->open());
}

TEST_F(SampleStream, BadStepFailsAloneAndLaterStepsStillWork) {
  std::unique_ptr<SampleSession> session = client_->OpenStream();
  for (int step = 0; step < 5; ++step) {
    std::vector<int32_t> expected;
    v1::SampleRequest request = RotatedGreedyStep(step, &expected);
    if (step == 2) request.mutable_params(0)->set_top_p(1.5f);
    v1::SampleResponse response;
    const grpc::Status status = session->Step(request, &response);
    EXPECT_EQ(response.request_id(), request.request_id()) << "step " << step;
    if (step == 2) {
      EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
      EXPECT_TRUE(MentionsAny(status.error_message(), {"top_p"}));
      EXPECT_EQ(response.token_ids_size(), 0);
      EXPECT_TRUE(session->open());
    } else {
      ASSERT_TRUE(status.ok()) << "step " << step << ": " << status.error_message();
      EXPECT_EQ(Tokens(response), expected) << "step " << step;
    }
  }
  EXPECT_TRUE(session->Close().ok());
}

TEST_F(SampleStream, SeededStepsMatchUnarySample) {
  const Logits logits = RandomLogits(8, 5000, /*seed=*/21);
  std::unique_ptr<SampleSession> session = client_->OpenStream();
  for (uint64_t position = 0; position < 4; ++position) {
    v1::SamplingParams params = TopKTopP(555);
    params.set_position(position);
    const v1::SampleRequest request = logits.Request({params});
    v1::SampleResponse streamed, unary;
    ASSERT_TRUE(session->Step(request, &streamed).ok());
    ASSERT_TRUE(client_->Sample(request, &unary).ok());
    EXPECT_EQ(Tokens(streamed), Tokens(unary)) << "position " << position;
  }
  EXPECT_TRUE(session->Close().ok());
}

TEST_F(SampleStream, ChunkedStepIsReassembled) {
  ClientOptions options;
  options.stream_chunk_bytes = 1000;  // 3 x 700 x 4 bytes -> 9 messages
  Client chunking_client(server().target(), options);
  const Logits logits = RandomLogits(3, 700, /*seed=*/22);
  const v1::SampleRequest request = logits.Request({TopKTopP(8)});
  v1::SampleResponse chunked, unary;
  std::unique_ptr<SampleSession> session = chunking_client.OpenStream();
  const grpc::Status status = session->Step(request, &chunked);
  ASSERT_TRUE(status.ok()) << status.error_code() << ": " << status.error_message();
  ASSERT_TRUE(client_->Sample(request, &unary).ok());
  EXPECT_EQ(Tokens(chunked), Tokens(unary));
  EXPECT_TRUE(session->Close().ok());
}

TEST_F(SampleStream, StepAfterCloseFailsWithoutSending) {
  std::unique_ptr<SampleSession> session = client_->OpenStream();
  ASSERT_TRUE(session->Close().ok());
  std::vector<int32_t> expected;
  v1::SampleResponse response;
  EXPECT_EQ(session->Step(RotatedGreedyStep(0, &expected), &response).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_TRUE(session->Close().ok());  // idempotent
}

}  // namespace
}  // namespace samplerd::integration
