// Validation rules of service/core/validation.h: every malformed request is refused with the
// right code and an "expected X, got Y" message; valid ones get their defaults and seeds.
#include "service/core/validation.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

namespace samplerd::core {
namespace {

using ::testing::HasSubstr;

// A valid fp32 [batch, vocab] request whose bytes live in `storage`.
SampleRequest MakeRequest(int64_t batch, int64_t vocab, std::string* storage) {
  storage->assign(batch * vocab * 4, '\0');
  SampleRequest r;
  r.dtype = kernels::DType::kFp32;
  r.shape = {batch, vocab};
  r.inline_data = *storage;
  r.has_inline_data = true;
  return r;
}

class ValidationTest : public ::testing::Test {
 protected:
  absl::StatusOr<ValidatedBatch> Validate(const SampleRequest& r) {
    return ValidateSampleRequest(r, limits_, [this] { return ++next_seed_; });
  }
  // Expects `r` to be refused with `code` and a message holding "expected" and `needle`.
  void ExpectRefused(const SampleRequest& r, absl::StatusCode code, const std::string& needle) {
    absl::StatusOr<ValidatedBatch> got = Validate(r);
    ASSERT_FALSE(got.ok()) << "accepted a request that should fail on " << needle;
    EXPECT_EQ(got.status().code(), code) << got.status();
    EXPECT_THAT(std::string(got.status().message()), HasSubstr("expected"));
    EXPECT_THAT(std::string(got.status().message()), HasSubstr(needle));
  }

  Limits limits_;
  uint64_t next_seed_ = 1000;
  std::string bytes_;
};

TEST_F(ValidationTest, AcceptsAMinimalRequestWithDefaults) {
  SampleRequest r = MakeRequest(2, 5, &bytes_);
  absl::StatusOr<ValidatedBatch> got = Validate(r);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->batch, 2);
  EXPECT_EQ(got->vocab, 5);
  EXPECT_EQ(got->row_stride, 5);
  EXPECT_EQ(got->top_logprobs, -1);
  // No params: each row gets temperature 1, no filters, and its own server seed.
  ASSERT_EQ(got->params.size(), 2u);
  for (const kernels::RowParams& p : got->params) {
    EXPECT_EQ(p.temperature, 1.0f);
    EXPECT_EQ(p.top_k, 0);
    EXPECT_EQ(p.top_p, 1.0f);
    EXPECT_EQ(p.min_p, 0.0f);
  }
  EXPECT_EQ(got->seeds, (std::vector<uint64_t>{1001, 1002}));
  EXPECT_EQ(got->params[0].seed, 1001u);
  EXPECT_EQ(got->params[1].seed, 1002u);
}

TEST_F(ValidationTest, BroadcastWithSeedStaysBroadcast) {
  SampleRequest r = MakeRequest(3, 4, &bytes_);
  ParamsSpec p;
  p.seed = 77;
  p.temperature = 0.5f;
  p.position = 9;
  r.params = {p};
  absl::StatusOr<ValidatedBatch> got = Validate(r);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->params.size(), 1u);
  EXPECT_EQ(got->params[0].seed, 77u);
  EXPECT_EQ(got->params[0].position, 9u);
  EXPECT_EQ(got->params[0].temperature, 0.5f);
  EXPECT_EQ(got->seeds, (std::vector<uint64_t>{77, 77, 77}));
}

TEST_F(ValidationTest, PerRowParamsKeepTheirOwnSeedsAndGetServerSeedsWhenUnset) {
  SampleRequest r = MakeRequest(2, 4, &bytes_);
  ParamsSpec a;
  a.seed = 5;
  ParamsSpec b;  // no seed
  b.top_k = 3;
  r.params = {a, b};
  absl::StatusOr<ValidatedBatch> got = Validate(r);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->params.size(), 2u);
  EXPECT_EQ(got->seeds, (std::vector<uint64_t>{5, 1001}));
  EXPECT_EQ(got->params[1].top_k, 3);
}

TEST_F(ValidationTest, RefusesUnspecifiedDtype) {
  SampleRequest r = MakeRequest(1, 4, &bytes_);
  r.dtype.reset();
  ExpectRefused(r, absl::StatusCode::kInvalidArgument, "DTYPE_UNSPECIFIED");
}

TEST_F(ValidationTest, RefusesShapesThatAreNotTwoDimensional) {
  SampleRequest r = MakeRequest(1, 4, &bytes_);
  r.shape = {4};
  ExpectRefused(r, absl::StatusCode::kInvalidArgument, "[B, V]");
  r.shape = {1, 2, 2};
  ExpectRefused(r, absl::StatusCode::kInvalidArgument, "got [1, 2, 2]");
  r.shape = {};
  ExpectRefused(r, absl::StatusCode::kInvalidArgument, "0 dimensions");
  // A long shape is not echoed whole: the message travels in a header, and 3,000 dimensions
  // passed the client's header limit (it then reported RESOURCE_EXHAUSTED, not this error).
  r.shape.assign(3000, 7);
  absl::StatusOr<ValidatedBatch> got = Validate(r);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(got.status().message()),
              ::testing::EndsWith("got [7, 7, 7, 7, ...] (3000 dimensions)"));
  EXPECT_LT(got.status().message().size(), 200u);
}

TEST_F(ValidationTest, RefusesEmptyBatchOrVocab) {
  SampleRequest r = MakeRequest(1, 4, &bytes_);
  r.shape = {0, 4};
  ExpectRefused(r, absl::StatusCode::kInvalidArgument, "B >= 1, got 0");
  r.shape = {1, 0};
  ExpectRefused(r, absl::StatusCode::kInvalidArgument, "V >= 1, got 0");
  r.shape = {-3, 4};
  ExpectRefused(r, absl::StatusCode::kInvalidArgument, "got -3");
}

TEST_F(ValidationTest, RefusesWrongByteCount) {
  SampleRequest r = MakeRequest(2, 4, &bytes_);
  r.inline_data = r.inline_data.substr(0, 31);
  ExpectRefused(r, absl::StatusCode::kInvalidArgument, "expected 32 bytes");
  std::string bf16(16, '\0');
  r.inline_data = bf16;
  r.dtype = kernels::DType::kBf16;
  EXPECT_TRUE(Validate(r).ok());  // 2 * 4 * 2 bytes
  r.dtype = kernels::DType::kFp32;
  ExpectRefused(r, absl::StatusCode::kInvalidArgument, "got 16 bytes");
}

TEST_F(ValidationTest, RefusesMissingData) {
  SampleRequest r = MakeRequest(1, 4, &bytes_);
  r.has_inline_data = false;
  ExpectRefused(r, absl::StatusCode::kInvalidArgument, "inline_data");
}

TEST_F(ValidationTest, AcceptsARegionSliceWithoutInlineBytes) {
  SampleRequest r = MakeRequest(2, 4, &bytes_);
  r.has_inline_data = false;
  r.inline_data = {};
  r.logits_region = RegionRef{"logits", 128};
  r.output = RegionRef{"tokens", 0};
  EXPECT_TRUE(Validate(r).ok());  // the slice's size is checked when the region is leased
}

TEST_F(ValidationTest, RefusesTwoLogitsSources) {
  SampleRequest r = MakeRequest(1, 4, &bytes_);
  r.logits_region = RegionRef{"logits", 0};
  ExpectRefused(r, absl::StatusCode::kInvalidArgument, "got both");
}

TEST_F(ValidationTest, EventHandlesAre64BytesAndDoneNeedsAnOutput) {
  SampleRequest r = MakeRequest(1, 4, &bytes_);
  r.ready_event = std::string(63, 'e');
  ExpectRefused(r, absl::StatusCode::kInvalidArgument, "ready_event, got 63 bytes");
  r.ready_event = std::string(64, 'e');
  EXPECT_TRUE(Validate(r).ok());  // whether the server can use it is checked later
  r.done_event = std::string(65, 'e');
  ExpectRefused(r, absl::StatusCode::kInvalidArgument, "done_event, got 65 bytes");
  r.done_event = std::string(64, 'e');
  ExpectRefused(r, absl::StatusCode::kInvalidArgument, "output");
  r.output = RegionRef{"tokens", 0};
  EXPECT_TRUE(Validate(r).ok());
}

TEST_F(ValidationTest, RowStrideSetsTheByteCount) {
  std::string bytes((2 * 6 - 6 + 4) * 4, '\0');  // (B - 1) * stride + V elements
  SampleRequest r = MakeRequest(2, 4, &bytes_);
  r.row_stride = 6;
  r.inline_data = bytes;
  absl::StatusOr<ValidatedBatch> got = Validate(r);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->row_stride, 6);
  r.row_stride = 3;  // < V
  ExpectRefused(r, absl::StatusCode::kInvalidArgument, "row_stride");
}

TEST_F(ValidationTest, RowSeedsAndPositionsOverrideEachRow) {
  SampleRequest r = MakeRequest(3, 4, &bytes_);
  ParamsSpec p;
  p.seed = 77;  // overridden by row_seeds
  p.position = 9;
  p.top_k = 2;
  r.params = {p};
  r.row_seeds = {10, 11, 12};
  r.row_positions = {3, 4, 5};
  absl::StatusOr<ValidatedBatch> got = Validate(r);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->params.size(), 3u);
  EXPECT_EQ(got->seeds, (std::vector<uint64_t>{10, 11, 12}));
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(got->params[i].seed, 10u + i);
    EXPECT_EQ(got->params[i].position, 3u + i);
    EXPECT_EQ(got->params[i].top_k, 2);
  }
  // Positions alone: each row keeps the params' seed (or gets a server seed) and its position.
  r.row_seeds.clear();
  got = Validate(r);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->seeds, (std::vector<uint64_t>{77, 77, 77}));
  EXPECT_EQ(got->params[2].position, 5u);
  r.params[0].seed.reset();
  got = Validate(r);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->seeds, (std::vector<uint64_t>{1001, 1002, 1003}));
}

TEST_F(ValidationTest, RefusesRowSeedsOrPositionsNeitherEmptyNorB) {
  SampleRequest r = MakeRequest(3, 4, &bytes_);
  r.row_seeds = {1, 2};
  ExpectRefused(r, absl::StatusCode::kInvalidArgument, "row_seeds with 0 entries or B = 3");
  r.row_seeds = {1, 2, 3};
  r.row_positions = {1, 2, 3, 4};
  ExpectRefused(r, absl::StatusCode::kInvalidArgument, "row_positions with 0 entries or B = 3");
  const absl::StatusOr<ValidatedBatch> got = Validate(r);
  EXPECT_EQ(got.status().message(),
            "expected row_positions with 0 entries or B = 3 entries, got 4 entries");
}

TEST_F(ValidationTest, RefusesParamListsNeitherOneNorB) {
  SampleRequest r = MakeRequest(3, 4, &bytes_);
  r.params.resize(2);
  ExpectRefused(r, absl::StatusCode::kInvalidArgument, "got 2 entries");
  r.params.resize(4);
  ExpectRefused(r, absl::StatusCode::kInvalidArgument, "B = 3");
  r.params.resize(3);
  EXPECT_TRUE(Validate(r).ok());
}

TEST_F(ValidationTest, RefusesOutOfRangeParameters) {
  struct Case {
    const char* name;
    void (*set)(ParamsSpec*);
    const char* needle;
  };
  const Case cases[] = {
      {"negative temperature", [](ParamsSpec* p) { p->temperature = -0.1f; }, "temperature"},
      {"NaN temperature", [](ParamsSpec* p) { p->temperature = std::nanf(""); }, "got NaN"},
      {"infinite temperature",
       [](ParamsSpec* p) { p->temperature = std::numeric_limits<float>::infinity(); },
       "temperature"},
      {"top_p zero", [](ParamsSpec* p) { p->top_p = 0.0f; }, "top_p in (0, 1]"},
      {"top_p negative", [](ParamsSpec* p) { p->top_p = -0.5f; }, "top_p"},
      {"top_p above one", [](ParamsSpec* p) { p->top_p = 1.01f; }, "top_p"},
      {"top_p NaN", [](ParamsSpec* p) { p->top_p = std::nanf(""); }, "top_p"},
      {"top_k -2", [](ParamsSpec* p) { p->top_k = -2; }, "top_k >= -1"},
      {"min_p negative", [](ParamsSpec* p) { p->min_p = -0.01f; }, "min_p in [0, 1]"},
      {"min_p above one", [](ParamsSpec* p) { p->min_p = 1.5f; }, "min_p"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    SampleRequest r = MakeRequest(2, 4, &bytes_);
    r.params.resize(2);
    c.set(&r.params[1]);
    ExpectRefused(r, absl::StatusCode::kInvalidArgument, c.needle);
    ExpectRefused(r, absl::StatusCode::kInvalidArgument, "params[1]");
  }
}

// A value just past a bound is printed with the digits that tell it from the bound (it printed
// with 6 digits: "expected params[0].top_p in (0, 1], got 1").
TEST_F(ValidationTest, AValueJustPastABoundIsNotPrintedAsTheBound) {
  const float above_one = std::nextafter(1.0f, 2.0f);
  const float above_two = std::nextafter(2.0f, 3.0f);
  const struct {
    void (*set)(ParamsSpec*, float);
    float value;
    const char* message;
  } cases[] = {
      {[](ParamsSpec* p, float v) { p->top_p = v; }, above_one,
       "expected params[0].top_p in (0, 1], got 1.0000001"},
      {[](ParamsSpec* p, float v) { p->min_p = v; }, above_one,
       "expected params[0].min_p in [0, 1], got 1.0000001"},
      {[](ParamsSpec* p, float v) { p->presence_penalty = v; }, above_two,
       "expected params[0].presence_penalty in [-2, 2], got 2.0000002"},
      {[](ParamsSpec* p, float v) { p->frequency_penalty = v; }, -above_two,
       "expected params[0].frequency_penalty in [-2, 2], got -2.0000002"},
      {[](ParamsSpec* p, float v) { p->top_p = v; }, 1.5f,
       "expected params[0].top_p in (0, 1], got 1.5"},  // short values stay short
      {[](ParamsSpec* p, float v) { p->temperature = v; }, -0.1f,
       "expected params[0].temperature finite and >= 0, got -0.1"},
  };
  for (const auto& c : cases) {
    SampleRequest r = MakeRequest(1, 4, &bytes_);
    r.params.resize(1);
    c.set(&r.params[0], c.value);
    const absl::Status status = Validate(r).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(std::string(status.message()), std::string(c.message));
  }
}

TEST_F(ValidationTest, AcceptsBoundaryParameters) {
  SampleRequest r = MakeRequest(1, 4, &bytes_);
  ParamsSpec p;
  p.temperature = 0.0f;
  p.top_k = -1;
  p.top_p = 1.0f;
  p.min_p = 1.0f;
  r.params = {p};
  EXPECT_TRUE(Validate(r).ok());
  r.params[0].min_p = 0.0f;
  r.params[0].top_k = 1000;  // k >= V disables
  r.params[0].top_p = 1e-9f;
  EXPECT_TRUE(Validate(r).ok());
}

TEST_F(ValidationTest, RefusesTooManyTopLogprobs) {
  SampleRequest r = MakeRequest(1, 4, &bytes_);
  r.logprobs = LogprobSpec{limits_.max_top_logprobs + 1, kernels::LogprobSource::kRaw};
  ExpectRefused(r, absl::StatusCode::kInvalidArgument, "logprobs.top_n in [0, 64]");
  r.logprobs->top_n = limits_.max_top_logprobs;
  absl::StatusOr<ValidatedBatch> got = Validate(r);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->top_logprobs, limits_.max_top_logprobs);
}

TEST_F(ValidationTest, LimitsAreResourceExhausted) {
  limits_.max_batch = 2;
  limits_.max_vocab = 8;
  SampleRequest r = MakeRequest(3, 4, &bytes_);
  ExpectRefused(r, absl::StatusCode::kResourceExhausted, "B <= 2");
  r = MakeRequest(1, 9, &bytes_);
  ExpectRefused(r, absl::StatusCode::kResourceExhausted, "V <= 8");
}

TEST_F(ValidationTest, RefusesLongRequestIds) {
  SampleRequest r = MakeRequest(1, 4, &bytes_);
  r.request_id.assign(limits_.max_request_id_bytes + 1, 'x');
  ExpectRefused(r, absl::StatusCode::kInvalidArgument, "request_id");
}

TEST(InlineBytes, CountsStridedRows) {
  EXPECT_EQ(InlineBytes(kernels::DType::kFp32, 1, 10, 0), 40);
  EXPECT_EQ(InlineBytes(kernels::DType::kFp16, 3, 10, 16), (2 * 16 + 10) * 2);
}

}  // namespace
}  // namespace samplerd::core
