// The error table: every malformed request gets its exact gRPC code and a message that says what
// was expected ("expected X, got Y"), and the server keeps serving afterwards.
//
// Codes are asserted exactly; messages loosely (a key word, plus "expected"), so the wording may
// evolve. Adding a case: one row in BadInputs(), or in SurvivableInputs() when the API does not
// pin the code down.
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "tests/integration/integration_fixture.h"

namespace samplerd::integration {
namespace {

// A valid request: fp32 [2, 16], one seeded parameter set. Every case breaks one thing of it.
v1::SampleRequest GoodRequest() { return RandomLogits(2, 16, /*seed=*/31).Request({Seeded(1)}); }

// Replaces the inline data by `bytes` zero bytes.
void SetInlineBytes(v1::SampleRequest* request, size_t bytes) {
  request->mutable_logits()->set_inline_data(std::string(bytes, '\0'));
}

void SetShape(v1::SampleRequest* request, std::vector<int64_t> shape) {
  request->mutable_logits()->clear_shape();
  for (int64_t d : shape) request->mutable_logits()->add_shape(d);
}

struct BadInput {
  std::string name;
  grpc::StatusCode code;
  // The message must mention one of these (case-insensitive).
  std::vector<std::string> keys;
  // Breaks a GoodRequest(); `limits` are the server's (GetServerInfo).
  void (*mutate)(v1::SampleRequest* request, const v1::Limits& limits);
};

// Names the case in test output and ctest names (instead of a byte dump).
void PrintTo(const BadInput& input, std::ostream* os) { *os << input.name; }

constexpr float kNan = std::numeric_limits<float>::quiet_NaN();

const std::vector<BadInput>& BadInputs() {
  using C = grpc::StatusCode;
  static const std::vector<BadInput> cases = {
      {"UnspecifiedDtype",
       C::INVALID_ARGUMENT,
       {"dtype"},
       [](v1::SampleRequest* r, const v1::Limits&) {
         r->mutable_logits()->set_dtype(v1::DTYPE_UNSPECIFIED);
       }},
      {"ShapeWithOneDim",
       C::INVALID_ARGUMENT,
       {"shape"},
       [](v1::SampleRequest* r, const v1::Limits&) { SetShape(r, {32}); }},
      {"ShapeWithThreeDims",
       C::INVALID_ARGUMENT,
       {"shape"},
       [](v1::SampleRequest* r, const v1::Limits&) {
         SetShape(r, {1, 2, 16});
       }},
      {"BatchZero",
       C::INVALID_ARGUMENT,
       {"batch", "shape"},
       [](v1::SampleRequest* r, const v1::Limits&) {
         SetShape(r, {0, 16});
         SetInlineBytes(r, 0);
       }},
      {"VocabZero",
       C::INVALID_ARGUMENT,
       {"vocab", "shape"},
       [](v1::SampleRequest* r, const v1::Limits&) {
         SetShape(r, {2, 0});
         SetInlineBytes(r, 0);
       }},
      {"NegativeBatch",
       C::INVALID_ARGUMENT,
       {"batch", "shape"},
       [](v1::SampleRequest* r, const v1::Limits&) {
         SetShape(r, {-1, 16});
       }},
      {"ByteCountOneElementShort",
       C::INVALID_ARGUMENT,
       {"bytes"},
       [](v1::SampleRequest* r, const v1::Limits&) { SetInlineBytes(r, 2 * 16 * 4 - 4); }},
      {"ByteCountOneByteLong",
       C::INVALID_ARGUMENT,
       {"bytes"},
       [](v1::SampleRequest* r, const v1::Limits&) { SetInlineBytes(r, 2 * 16 * 4 + 1); }},
      {"ByteCountOfAnotherDtype",
       C::INVALID_ARGUMENT,
       {"bytes"},
       [](v1::SampleRequest* r, const v1::Limits&) {
         r->mutable_logits()->set_dtype(v1::DTYPE_BF16);  // fp32 bytes: twice too many
       }},
      {"NoLogitsData",
       C::INVALID_ARGUMENT,
       {"data"},
       [](v1::SampleRequest* r, const v1::Limits&) { r->mutable_logits()->clear_inline_data(); }},
      {"RowStrideBelowVocab",
       C::INVALID_ARGUMENT,
       {"row_stride"},
       [](v1::SampleRequest* r, const v1::Limits&) { r->mutable_logits()->set_row_stride(8); }},
      {"ParamsNeitherOneNorB",
       C::INVALID_ARGUMENT,
       {"params"},
       [](v1::SampleRequest* r, const v1::Limits&) {
         *r->add_params() = Seeded(2);
         *r->add_params() = Seeded(3);  // 3 entries for B = 2
       }},
      {"NegativeTemperature",
       C::INVALID_ARGUMENT,
       {"temperature"},
       [](v1::SampleRequest* r, const v1::Limits&) {
         r->mutable_params(0)->set_temperature(-0.5f);
       }},
      {"NanTemperature",
       C::INVALID_ARGUMENT,
       {"temperature"},
       [](v1::SampleRequest* r, const v1::Limits&) {
         r->mutable_params(0)->set_temperature(kNan);
       }},
      {"TopPZero",
       C::INVALID_ARGUMENT,
       {"top_p"},
       [](v1::SampleRequest* r, const v1::Limits&) { r->mutable_params(0)->set_top_p(0.0f); }},
      {"TopPNegative",
       C::INVALID_ARGUMENT,
       {"top_p"},
       [](v1::SampleRequest* r, const v1::Limits&) { r->mutable_params(0)->set_top_p(-0.1f); }},
      {"TopPAboveOne",
       C::INVALID_ARGUMENT,
       {"top_p"},
       [](v1::SampleRequest* r, const v1::Limits&) { r->mutable_params(0)->set_top_p(1.5f); }},
      {"TopPNan",
       C::INVALID_ARGUMENT,
       {"top_p"},
       [](v1::SampleRequest* r, const v1::Limits&) { r->mutable_params(0)->set_top_p(kNan); }},
      {"TopKMinusTwo",
       C::INVALID_ARGUMENT,
       {"top_k"},
       [](v1::SampleRequest* r, const v1::Limits&) { r->mutable_params(0)->set_top_k(-2); }},
      {"TopKMostNegative",
       C::INVALID_ARGUMENT,
       {"top_k"},
       [](v1::SampleRequest* r, const v1::Limits&) {
         r->mutable_params(0)->set_top_k(std::numeric_limits<int32_t>::min());
       }},
      {"MinPNegative",
       C::INVALID_ARGUMENT,
       {"min_p"},
       [](v1::SampleRequest* r, const v1::Limits&) { r->mutable_params(0)->set_min_p(-0.1f); }},
      {"MinPAboveOne",
       C::INVALID_ARGUMENT,
       {"min_p"},
       [](v1::SampleRequest* r, const v1::Limits&) { r->mutable_params(0)->set_min_p(1.5f); }},
      {"MinPNan",
       C::INVALID_ARGUMENT,
       {"min_p"},
       [](v1::SampleRequest* r, const v1::Limits&) { r->mutable_params(0)->set_min_p(kNan); }},
      {"BadParamsInSecondRowOfPerRowParams",
       C::INVALID_ARGUMENT,
       {"top_p"},
       [](v1::SampleRequest* r, const v1::Limits&) {
         v1::SamplingParams bad = Seeded(2);
         bad.set_top_p(2.0f);
         *r->add_params() = bad;  // 2 entries for B = 2, the second one invalid
       }},
      {"LogprobsTopNAboveLimit",
       C::INVALID_ARGUMENT,
       {"top_n"},
       [](v1::SampleRequest* r, const v1::Limits& limits) {
         r->mutable_logprobs()->set_top_n(static_cast<uint32_t>(limits.max_top_logprobs()) + 1);
       }},
      // Over the server's size limits (GetServerInfo.limits): RESOURCE_EXHAUSTED, checked before
      // the byte count (a client need not send the bytes to learn the limit).
      {"BatchAboveLimit",
       C::RESOURCE_EXHAUSTED,
       {"batch"},
       [](v1::SampleRequest* r, const v1::Limits& limits) {
         SetShape(r, {limits.max_batch() + 1, 16});
       }},
      {"VocabAboveLimit",
       C::RESOURCE_EXHAUSTED,
       {"vocabulary"},
       [](v1::SampleRequest* r, const v1::Limits& limits) {
         SetShape(r, {2, limits.max_vocab() + 1});
       }},
      {"RequestIdOver256Bytes",
       C::INVALID_ARGUMENT,
       {"request_id"},
       [](v1::SampleRequest* r, const v1::Limits&) { r->set_request_id(std::string(257, 'x')); }},
      {"UnregisteredRegion",
       C::NOT_FOUND,
       {"region"},
       [](v1::SampleRequest* r, const v1::Limits&) {
         r->mutable_logits()->mutable_region()->set_region("nope");
       }},
      // Wrong system state, not a malformed request: the device is not this server's.
      {"UnknownDevice",
       C::FAILED_PRECONDITION,
       {"device"},
       [](v1::SampleRequest* r, const v1::Limits&) { r->set_device("GPU-not-a-device"); }},
  };
  return cases;
}

// Inputs whose code the API does not pin down: any answer will do, as long as the server
// survives them (checked by ServerStillServesAfterEveryBadInput). Their code (UNKNOWN) and keys
// are placeholders, never checked.
const std::vector<BadInput>& SurvivableInputs() {
  using C = grpc::StatusCode;
  static const std::vector<BadInput> cases = {
      {"HugeShapeWhoseByteCountOverflows",
       C::UNKNOWN,
       {},
       [](v1::SampleRequest* r, const v1::Limits&) {
         SetShape(r, {int64_t{1} << 40, int64_t{1} << 40});
       }},
      {"HugeRowStride",
       C::UNKNOWN,
       {},
       [](v1::SampleRequest* r, const v1::Limits&) {
         r->mutable_logits()->set_row_stride(int64_t{1} << 62);
       }},
      {"NegativeRowStride",
       C::UNKNOWN,
       {},
       [](v1::SampleRequest* r, const v1::Limits&) { r->mutable_logits()->set_row_stride(-16); }},
      {"UnknownDtypeValue",
       C::UNKNOWN,
       {},
       [](v1::SampleRequest* r, const v1::Limits&) {
         r->mutable_logits()->set_dtype(static_cast<v1::DType>(99));
       }},
      {"UnknownTopPModeValue",
       C::UNKNOWN,
       {},
       [](v1::SampleRequest* r, const v1::Limits&) {
         r->mutable_params(0)->set_top_p_mode(static_cast<v1::TopPMode>(99));
       }},
      {"UnknownLogprobSourceValue",
       C::UNKNOWN,
       {},
       [](v1::SampleRequest* r, const v1::Limits&) {
         r->mutable_logprobs()->set_source(static_cast<v1::LogprobSource>(99));
       }},
      {"InfiniteTemperature",
       C::UNKNOWN,
       {},
       [](v1::SampleRequest* r, const v1::Limits&) {
         r->mutable_params(0)->set_temperature(std::numeric_limits<float>::infinity());
       }},
      {"ExtremeSeedAndPosition",
       C::UNKNOWN,
       {},
       [](v1::SampleRequest* r, const v1::Limits&) {
         r->mutable_params(0)->set_seed(std::numeric_limits<uint64_t>::max());
         r->mutable_params(0)->set_position(std::numeric_limits<uint64_t>::max());
       }},
      {"TopKAboveVocab",
       C::UNKNOWN,
       {},
       [](v1::SampleRequest* r, const v1::Limits&) {
         r->mutable_params(0)->set_top_k(std::numeric_limits<int32_t>::max());
       }},
  };
  return cases;
}

class ErrorTable : public ServerSuite, public ::testing::WithParamInterface<BadInput> {
 protected:
  void SetUp() override {
    ServerSuite::SetUp();
    ASSERT_TRUE(client_->GetServerInfo(&info_).ok());
  }

  // Expects `client_` still to sample a good request correctly.
  void ExpectStillServes() {
    const GreedyCase c = KnownGreedyBatch();
    v1::SampleResponse response;
    const grpc::Status status = client_->Sample(c.logits.Request({Greedy()}), &response);
    ASSERT_TRUE(status.ok()) << status.error_code() << ": " << status.error_message();
    EXPECT_EQ(Tokens(response), c.expected);
  }

  v1::GetServerInfoResponse info_;
};

TEST_P(ErrorTable, AnswersTheExactCodeAndSaysWhatWasExpected) {
  const BadInput& input = GetParam();
  v1::SampleRequest request = GoodRequest();
  input.mutate(&request, info_.limits());
  v1::SampleResponse response;
  const grpc::Status status = client_->Sample(request, &response);
  EXPECT_EQ(status.error_code(), input.code) << "message: " << status.error_message();
  EXPECT_TRUE(MentionsAny(status.error_message(), input.keys));
  EXPECT_TRUE(MentionsAny(status.error_message(), {"expected"}));
  ExpectStillServes();
}

INSTANTIATE_TEST_SUITE_P(BadInputs, ErrorTable, ::testing::ValuesIn(BadInputs()),
                         [](const ::testing::TestParamInfo<BadInput>& info) {
                           return info.param.name;
                         });

TEST_F(ErrorTable, GoodRequestIsAccepted) {
  v1::SampleResponse response;
  const grpc::Status status = client_->Sample(GoodRequest(), &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(response.token_ids_size(), 2);
}

TEST_F(ErrorTable, ServerStillServesAfterEveryBadInput) {
  std::vector<BadInput> all = BadInputs();
  all.insert(all.end(), SurvivableInputs().begin(), SurvivableInputs().end());
  for (const BadInput& input : all) {
    v1::SampleRequest request = GoodRequest();
    input.mutate(&request, info_.limits());
    v1::SampleResponse response;
    const grpc::Status status = client_->Sample(request, &response);
    // Anything but a transport failure: the server answered.
    EXPECT_NE(status.error_code(), grpc::StatusCode::UNAVAILABLE) << input.name;
    EXPECT_NE(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << input.name;
    // Over a stream too: a bad step is answered on the stream, which stays open.
    std::unique_ptr<SampleSession> session = client_->OpenStream();
    const grpc::Status step = session->Step(request, &response);
    EXPECT_EQ(step.error_code(), status.error_code()) << input.name << ": " << step.error_message();
    EXPECT_TRUE(session->open()) << input.name;
    EXPECT_TRUE(session->Close().ok()) << input.name;
  }
  ExpectStillServes();
  v1::GetServerInfoResponse info;
  EXPECT_TRUE(client_->GetServerInfo(&info).ok());
}

// A server with a 64 KiB message limit: larger messages are refused by gRPC itself.
class MessageLimit : public ServerSuite {
 protected:
  static constexpr int kLimit = 64 << 10;

  static void SetUpTestSuite() {
    ServerProcess::Options options = CpuServerOptions();
    options.extra_args.push_back("--max_message_bytes=" + std::to_string(kLimit));
    StartServer(options);
  }
};

TEST_F(MessageLimit, IsReportedByGetServerInfo) {
  v1::GetServerInfoResponse info;
  ASSERT_TRUE(client_->GetServerInfo(&info).ok());
  EXPECT_EQ(info.limits().max_message_bytes(), kLimit);
}

TEST_F(MessageLimit, LargerRequestIsResourceExhaustedAndServerStillServes) {
  const Logits big = RandomLogits(1, 32768, /*seed=*/32);  // 128 KiB of logits
  v1::SampleResponse response;
  const grpc::Status status = client_->Sample(big.Request({Seeded(1)}), &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << status.error_message();
  EXPECT_TRUE(MentionsAny(status.error_message(), {"max", "limit", "large"}));

  const Logits small = RandomLogits(1, 8000, /*seed=*/33);  // 32,000 bytes: fits
  const grpc::Status ok = client_->Sample(small.Request({Seeded(1)}), &response);
  EXPECT_TRUE(ok.ok()) << ok.error_code() << ": " << ok.error_message();
}

TEST_F(MessageLimit, ChunkedStreamStepMayExceedTheMessageLimit) {
  ClientOptions options;
  options.stream_chunk_bytes = 32 << 10;
  Client chunking_client(server().target(), options);
  const Logits big = RandomLogits(2, 32768, /*seed=*/34);  // 256 KiB in 8 chunks
  v1::SampleResponse streamed;
  std::unique_ptr<SampleSession> session = chunking_client.OpenStream();
  const grpc::Status status = session->Step(big.Request({TopKTopP(5)}), &streamed);
  ASSERT_TRUE(status.ok()) << status.error_code() << ": " << status.error_message();
  EXPECT_EQ(streamed.token_ids_size(), 2);
  EXPECT_TRUE(session->Close().ok());
}

}  // namespace
}  // namespace samplerd::integration
