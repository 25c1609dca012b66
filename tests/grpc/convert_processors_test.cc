// Wire <-> core conversions of the logits processors (processors.proto): penalties, logit
// bias, token history (inline or a region slice), the bitmask's two sources (inline words
// viewed, not copied), and the row status of a row left with no allowed token.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "service/grpc/convert.h"

namespace samplerd::grpc_transport {
namespace {

v1::SampleRequest WireRequest() {
  v1::SampleRequest r;
  r.mutable_logits()->set_dtype(v1::DTYPE_FP32);
  r.mutable_logits()->add_shape(2);
  r.mutable_logits()->add_shape(40);
  r.mutable_logits()->set_inline_data(std::string(320, '\0'));
  return r;
}

TEST(FromProtoProcessors, LeavesAbsentProcessorsAbsent) {
  core::SampleRequest out;
  ASSERT_TRUE(FromProto(WireRequest(), &out).ok());
  EXPECT_FALSE(out.logit_bias.has_value());
  EXPECT_FALSE(out.token_history.has_value());
  EXPECT_FALSE(out.token_bitmask.has_value());
}

TEST(FromProtoProcessors, CarriesThePenaltiesAndLeavesAnUnsetRepetitionUnset) {
  v1::SampleRequest wire = WireRequest();
  v1::SamplingParams* p = wire.add_params();
  p->set_repetition_penalty(1.2f);
  p->set_presence_penalty(-0.5f);
  p->set_frequency_penalty(0.25f);
  wire.add_params();
  core::SampleRequest out;
  ASSERT_TRUE(FromProto(wire, &out).ok());
  ASSERT_EQ(out.params.size(), 2u);
  EXPECT_EQ(out.params[0].repetition_penalty, 1.2f);
  EXPECT_EQ(out.params[0].presence_penalty, -0.5f);
  EXPECT_EQ(out.params[0].frequency_penalty, 0.25f);
  EXPECT_FALSE(out.params[1].repetition_penalty.has_value());
  EXPECT_EQ(out.params[1].presence_penalty, 0.0f);
}

TEST(FromProtoProcessors, CarriesTheBiasListAndTheTokenHistory) {
  v1::SampleRequest wire = WireRequest();
  v1::LogitBias* bias = wire.mutable_logit_bias();
  for (uint32_t o : {0u, 1u, 2u}) bias->add_row_offsets(o);
  bias->add_token_ids(7);
  bias->add_token_ids(39);
  bias->add_biases(-100.0f);
  bias->add_biases(2.5f);
  v1::TokenHistory* history = wire.mutable_token_history();
  for (uint32_t o : {0u, 0u, 1u}) history->add_row_offsets(o);
  history->add_token_ids(3);
  history->add_output_counts(4);
  history->add_in_prompt(true);
  core::SampleRequest out;
  ASSERT_TRUE(FromProto(wire, &out).ok());
  ASSERT_TRUE(out.logit_bias.has_value());
  EXPECT_EQ(out.logit_bias->row_offsets, (std::vector<uint32_t>{0, 1, 2}));
  EXPECT_EQ(out.logit_bias->token_ids, (std::vector<int32_t>{7, 39}));
  EXPECT_EQ(out.logit_bias->biases, (std::vector<float>{-100.0f, 2.5f}));
  ASSERT_TRUE(out.token_history.has_value());
  EXPECT_EQ(out.token_history->row_offsets, (std::vector<uint32_t>{0, 0, 1}));
  EXPECT_EQ(out.token_history->token_ids, (std::vector<int32_t>{3}));
  EXPECT_EQ(out.token_history->output_counts, (std::vector<uint32_t>{4}));
  EXPECT_EQ(out.token_history->in_prompt, (std::vector<uint8_t>{1}));
  EXPECT_FALSE(UsesRegions(wire));
}

TEST(FromProtoProcessors, ViewsInlineBitmaskWordsAndCarriesARegionSlice) {
  v1::SampleRequest wire = WireRequest();
  wire.mutable_token_bitmask()->set_inline_words(std::string(16, '\xff'));
  core::SampleRequest out;
  ASSERT_TRUE(FromProto(wire, &out).ok());
  ASSERT_TRUE(out.token_bitmask.has_value());
  EXPECT_TRUE(out.token_bitmask->has_inline_words);
  EXPECT_EQ(out.token_bitmask->inline_words.data(),
            wire.token_bitmask().inline_words().data());  // no copy
  EXPECT_FALSE(out.token_bitmask->region.has_value());
  EXPECT_FALSE(UsesRegions(wire));

  v1::RegionSlice* slice = wire.mutable_token_bitmask()->mutable_region();
  slice->set_region("masks");
  slice->set_offset(64);
  core::SampleRequest from_region;
  ASSERT_TRUE(FromProto(wire, &from_region).ok());
  EXPECT_FALSE(from_region.token_bitmask->has_inline_words);
  ASSERT_TRUE(from_region.token_bitmask->region.has_value());
  EXPECT_EQ(from_region.token_bitmask->region->region, "masks");
  EXPECT_EQ(from_region.token_bitmask->region->offset, 64u);
  EXPECT_TRUE(UsesRegions(wire));  // the region peer rules apply to it too
}

TEST(FromProtoProcessors, CarriesBiasAndHistoryRegionSlicesUnderThePeerRules) {
  v1::SampleRequest wire = WireRequest();
  wire.mutable_logit_bias()->mutable_region()->set_region("bias");
  wire.mutable_logit_bias()->mutable_region()->set_offset(8);
  core::SampleRequest out;
  ASSERT_TRUE(FromProto(wire, &out).ok());
  ASSERT_TRUE(out.logit_bias->region.has_value());
  EXPECT_EQ(out.logit_bias->region->region, "bias");
  EXPECT_EQ(out.logit_bias->region->offset, 8u);
  EXPECT_FALSE(out.logit_bias->region_read);
  EXPECT_TRUE(out.logit_bias->token_ids.empty());
  EXPECT_TRUE(UsesRegions(wire));

  v1::SampleRequest history = WireRequest();
  history.mutable_token_history()->mutable_region()->set_region("history");
  history.mutable_token_history()->add_in_prompt(true);  // kept: validation refuses both
  core::SampleRequest out_history;
  ASSERT_TRUE(FromProto(history, &out_history).ok());
  ASSERT_TRUE(out_history.token_history->region.has_value());
  EXPECT_EQ(out_history.token_history->region->region, "history");
  EXPECT_EQ(out_history.token_history->in_prompt, (std::vector<uint8_t>{1}));
  EXPECT_TRUE(UsesRegions(history));
}

TEST(FromProtoProcessors, AnEmptyBitmaskMessageIsLeftForValidation) {
  v1::SampleRequest wire = WireRequest();
  wire.mutable_token_bitmask();
  core::SampleRequest out;
  ASSERT_TRUE(FromProto(wire, &out).ok());
  ASSERT_TRUE(out.token_bitmask.has_value());
  EXPECT_FALSE(out.token_bitmask->has_inline_words);
  EXPECT_FALSE(out.token_bitmask->region.has_value());
}

TEST(ToProtoProcessors, MapsEveryRowStatus) {
  core::SampleResult result;
  result.token_ids = {1, -1, -1, -1, -1};
  result.row_status = {kernels::RowStatus::kOk, kernels::RowStatus::kNan,
                       kernels::RowStatus::kNoFinite, kernels::RowStatus::kInvalidParams,
                       kernels::RowStatus::kNoAllowed};
  v1::SampleResponse out;
  ToProto(result, &out);
  ASSERT_EQ(out.row_status_size(), 5);
  EXPECT_EQ(out.row_status(0), v1::ROW_STATUS_OK);
  EXPECT_EQ(out.row_status(1), v1::ROW_STATUS_INVALID_NAN);
  EXPECT_EQ(out.row_status(2), v1::ROW_STATUS_INVALID_NO_FINITE);
  EXPECT_EQ(out.row_status(3), v1::ROW_STATUS_INVALID_PARAMS);
  EXPECT_EQ(out.row_status(4), v1::ROW_STATUS_INVALID_NO_ALLOWED);
}

}  // namespace
}  // namespace samplerd::grpc_transport
