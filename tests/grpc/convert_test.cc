// Wire <-> core conversions: every field carried, defaults left unset, unknown enums refused.
#include "service/grpc/convert.h"

#include <gtest/gtest.h>

namespace samplerd::grpc_transport {
namespace {

v1::SampleRequest WireRequest() {
  v1::SampleRequest r;
  r.set_request_id("step-7");
  r.mutable_logits()->set_dtype(v1::DTYPE_BF16);
  r.mutable_logits()->add_shape(2);
  r.mutable_logits()->add_shape(3);
  r.mutable_logits()->set_row_stride(4);
  r.mutable_logits()->set_inline_data(std::string(14, 'x'));
  r.set_device("0000:00:06.0");
  return r;
}

TEST(FromProto, CarriesTensorAndViewsItsBytes) {
  v1::SampleRequest wire = WireRequest();
  core::SampleRequest out;
  ASSERT_TRUE(FromProto(wire, &out).ok());
  EXPECT_EQ(out.request_id, "step-7");
  EXPECT_EQ(out.dtype, kernels::DType::kBf16);
  EXPECT_EQ(out.shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(out.row_stride, 4);
  EXPECT_TRUE(out.has_inline_data);
  EXPECT_EQ(out.inline_data.data(), wire.logits().inline_data().data());  // no copy
  EXPECT_EQ(out.device, "0000:00:06.0");
  EXPECT_FALSE(out.logprobs.has_value());
}

TEST(FromProto, CarriesRowSeedsAndPositions) {
  v1::SampleRequest wire = WireRequest();
  wire.add_row_seeds(7);
  wire.add_row_seeds(UINT64_MAX);
  wire.add_row_positions(0);
  wire.add_row_positions(12345678901234ull);
  core::SampleRequest out;
  ASSERT_TRUE(FromProto(wire, &out).ok());
  EXPECT_EQ(out.row_seeds, (std::vector<uint64_t>{7, UINT64_MAX}));
  EXPECT_EQ(out.row_positions, (std::vector<uint64_t>{0, 12345678901234ull}));
  core::SampleRequest none;
  ASSERT_TRUE(FromProto(WireRequest(), &none).ok());
  EXPECT_TRUE(none.row_seeds.empty());
  EXPECT_TRUE(none.row_positions.empty());
}

TEST(FromProto, LeavesUnsetOptionalParamsUnset) {
  v1::SampleRequest wire = WireRequest();
  wire.add_params()->set_top_k(5);
  v1::SamplingParams* second = wire.add_params();
  second->set_temperature(0.0f);
  second->set_top_p(0.9f);
  second->set_seed(0);
  second->set_position(12);
  second->set_top_p_mode(v1::TOP_P_MODE_JOINT);
  second->set_min_p(0.1f);
  core::SampleRequest out;
  ASSERT_TRUE(FromProto(wire, &out).ok());
  ASSERT_EQ(out.params.size(), 2u);
  EXPECT_FALSE(out.params[0].temperature.has_value());
  EXPECT_FALSE(out.params[0].top_p.has_value());
  EXPECT_FALSE(out.params[0].seed.has_value());
  EXPECT_EQ(out.params[0].top_k, 5);
  EXPECT_EQ(out.params[0].top_p_mode, kernels::TopPMode::kTopKFirst);
  ASSERT_TRUE(out.params[1].temperature.has_value());
  EXPECT_EQ(*out.params[1].temperature, 0.0f);  // explicit 0 = greedy, not the default 1
  EXPECT_EQ(*out.params[1].top_p, 0.9f);
  ASSERT_TRUE(out.params[1].seed.has_value());
  EXPECT_EQ(*out.params[1].seed, 0u);  // seed 0 is a seed, not "unset"
  EXPECT_EQ(out.params[1].position, 12u);
  EXPECT_EQ(out.params[1].top_p_mode, kernels::TopPMode::kJoint);
  EXPECT_EQ(out.params[1].min_p, 0.1f);
}

TEST(FromProto, MapsLogprobOptions) {
  v1::SampleRequest wire = WireRequest();
  wire.mutable_logprobs()->set_top_n(3);
  wire.mutable_logprobs()->set_source(v1::LOGPROB_SOURCE_PROCESSED);
  core::SampleRequest out;
  ASSERT_TRUE(FromProto(wire, &out).ok());
  ASSERT_TRUE(out.logprobs.has_value());
  EXPECT_EQ(out.logprobs->top_n, 3);
  EXPECT_EQ(out.logprobs->source, kernels::LogprobSource::kProcessed);
}

TEST(FromProto, UnspecifiedDtypeIsLeftForValidation) {
  v1::SampleRequest wire = WireRequest();
  wire.mutable_logits()->set_dtype(v1::DTYPE_UNSPECIFIED);
  core::SampleRequest out;
  ASSERT_TRUE(FromProto(wire, &out).ok());
  EXPECT_FALSE(out.dtype.has_value());
}

TEST(FromProto, RefusesUnknownEnumValues) {
  v1::SampleRequest wire = WireRequest();
  wire.mutable_logits()->set_dtype(static_cast<v1::DType>(42));
  core::SampleRequest out;
  absl::Status status = FromProto(wire, &out);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("got 42"), absl::string_view::npos);

  wire = WireRequest();
  wire.add_params()->set_top_p_mode(static_cast<v1::TopPMode>(9));
  EXPECT_EQ(FromProto(wire, &out).code(), absl::StatusCode::kInvalidArgument);
}

TEST(FromProto, CarriesRegionSlicesAndEventHandles) {
  v1::SampleRequest wire = WireRequest();
  wire.mutable_logits()->mutable_region()->set_region("logits");
  wire.mutable_logits()->mutable_region()->set_offset(4096);
  wire.mutable_output()->set_region("tokens");
  wire.mutable_output()->set_offset(8);
  wire.set_ready_event(std::string(64, 'r'));
  wire.set_done_event(std::string(64, 'd'));
  core::SampleRequest out;
  ASSERT_TRUE(FromProto(wire, &out).ok());
  EXPECT_FALSE(out.has_inline_data);
  ASSERT_TRUE(out.logits_region.has_value());
  EXPECT_EQ(out.logits_region->region, "logits");
  EXPECT_EQ(out.logits_region->offset, 4096u);
  ASSERT_TRUE(out.output.has_value());
  EXPECT_EQ(out.output->region, "tokens");
  EXPECT_EQ(out.output->offset, 8u);
  EXPECT_EQ(out.ready_event, std::string(64, 'r'));
  EXPECT_EQ(out.done_event, std::string(64, 'd'));
  EXPECT_TRUE(UsesRegions(wire));
  EXPECT_FALSE(UsesRegions(WireRequest()));
}

TEST(FromProto, AnOutputAloneUsesRegions) {
  v1::SampleRequest wire = WireRequest();
  wire.mutable_output()->set_region("tokens");
  core::SampleRequest out;
  ASSERT_TRUE(FromProto(wire, &out).ok());
  EXPECT_TRUE(out.has_inline_data);
  EXPECT_FALSE(out.logits_region.has_value());
  EXPECT_TRUE(out.output.has_value());
  EXPECT_TRUE(UsesRegions(wire));
}

TEST(FromProto, MissingDataIsReported) {
  v1::SampleRequest wire = WireRequest();
  wire.mutable_logits()->clear_inline_data();
  core::SampleRequest out;
  ASSERT_TRUE(FromProto(wire, &out).ok());
  EXPECT_FALSE(out.has_inline_data);
}

TEST(ToProto, CarriesEveryResultField) {
  core::SampleResult result;
  result.request_id = "r";
  result.token_ids = {4, -1};
  result.row_status = {kernels::RowStatus::kOk, kernels::RowStatus::kNan};
  result.seeds = {1, 2};
  result.logprobs.resize(2);
  result.logprobs[0].sampled_logprob = -0.5f;
  result.logprobs[0].sampled_rank = 2;
  result.logprobs[0].top_ids = {3, 4};
  result.logprobs[0].top_values = {-0.1f, -0.5f};
  result.timings.queue = absl::Microseconds(3);
  result.timings.compute = absl::Microseconds(5);
  result.timings.total = absl::Microseconds(9);
  v1::SampleResponse out;
  ToProto(result, &out);
  EXPECT_EQ(out.request_id(), "r");
  ASSERT_EQ(out.token_ids_size(), 2);
  EXPECT_EQ(out.token_ids(1), -1);
  EXPECT_EQ(out.row_status(0), v1::ROW_STATUS_OK);
  EXPECT_EQ(out.row_status(1), v1::ROW_STATUS_INVALID_NAN);
  EXPECT_EQ(out.seeds(1), 2u);
  ASSERT_EQ(out.logprobs_size(), 2);
  EXPECT_EQ(out.logprobs(0).sampled_rank(), 2);
  EXPECT_EQ(out.logprobs(0).top_token_ids(1), 4);
  EXPECT_FLOAT_EQ(out.logprobs(0).top_logprobs(0), -0.1f);
  EXPECT_EQ(out.timings().queue_ns(), 3000);
  EXPECT_EQ(out.timings().compute_ns(), 5000);
  EXPECT_EQ(out.timings().total_ns(), 9000);
}

TEST(ToProto, DescribesARegion) {
  v1::RegionInfo out;
  ToProto(core::RegionInfo{"gpu0", core::RegionKind::kGpuIpc, 1 << 20, "0000:3b:00.0"}, &out);
  EXPECT_EQ(out.name(), "gpu0");
  EXPECT_EQ(out.kind(), v1::REGION_KIND_GPU_IPC);
  EXPECT_EQ(out.byte_size(), 1u << 20);
  EXPECT_EQ(out.device(), "0000:3b:00.0");
  ToProto(core::RegionInfo{"host", core::RegionKind::kHostShm, 4, ""}, &out);
  EXPECT_EQ(out.kind(), v1::REGION_KIND_HOST_SHM);
  EXPECT_TRUE(out.device().empty());
}

TEST(ToProto, DescribesTheServer) {
  core::ServerInfo info;
  info.version = "9.9";
  info.backend = core::BackendKind::kGpu;
  info.devices.push_back({1, "0000:00:06.0", "GPU-x", "NVIDIA H200", true, true});
  info.limits.max_inflight = 7;
  info.limits.max_inflight_bytes = 1 << 30;
  info.max_region_bytes = int64_t{3} << 40;
  info.max_regions = 17;
  v1::GetServerInfoResponse out;
  ToProto(info,
          TransportLimits{/*max_message_bytes=*/4 << 20, /*max_receive_bytes=*/12 << 20,
                          /*chunk_timeout=*/absl::Milliseconds(2500)},
          &out);
  EXPECT_EQ(out.version(), "9.9");
  EXPECT_EQ(out.backend(), v1::BACKEND_GPU);
  ASSERT_EQ(out.devices_size(), 1);
  EXPECT_EQ(out.devices(0).pci_bus_id(), "0000:00:06.0");
  EXPECT_TRUE(out.devices(0).ipc_events());
  EXPECT_EQ(out.limits().max_top_logprobs(), core::Limits{}.max_top_logprobs);
  EXPECT_EQ(out.limits().max_message_bytes(), 4 << 20);
  EXPECT_EQ(out.limits().max_receive_bytes(), 12 << 20);
  EXPECT_EQ(out.limits().max_inflight(), 7);
  EXPECT_EQ(out.limits().max_inflight_bytes(), 1 << 30);
  EXPECT_EQ(out.limits().chunk_timeout_ms(), 2500);
  EXPECT_EQ(out.limits().max_region_bytes(), int64_t{3} << 40);
  EXPECT_EQ(out.limits().max_regions(), 17);
}

TEST(ToProto, DescribesDeviceSessionSupport) {
  core::ServerInfo info;
  info.device_sessions = {/*max_sessions=*/5,
                          /*gpu_plane=*/true,
                          /*host_plane=*/true,
                          /*mps=*/true,
                          /*open_sessions=*/3,
                          /*processors=*/true,
                          /*max_host_session_bytes=*/int64_t{3} << 30};
  v1::GetServerInfoResponse out;
  ToProto(info, TransportLimits{}, &out);
  EXPECT_EQ(out.limits().max_device_sessions(), 5);
  EXPECT_EQ(out.limits().max_host_session_bytes(), int64_t{3} << 30);
  EXPECT_TRUE(out.device_sessions().gpu_plane());
  EXPECT_TRUE(out.device_sessions().host_plane());
  EXPECT_TRUE(out.device_sessions().mps());
  EXPECT_EQ(out.device_sessions().open_sessions(), 3);
  EXPECT_TRUE(out.device_sessions().processors());
}

TEST(FromProto, CarriesEveryDeviceSessionOpenField) {
  v1::DeviceSessionOpen wire;
  wire.set_device("GPU-x");
  wire.set_dtype(v1::DTYPE_FP16);
  wire.set_max_batch(32);
  wire.set_vocab(151936);
  wire.set_row_stride(152064);
  const auto slice = [](v1::RegionSlice* s, const char* region, uint64_t offset) {
    s->set_region(region);
    s->set_offset(offset);
  };
  slice(wire.mutable_control(), "c", 1);
  slice(wire.mutable_logits(), "l", 2);
  slice(wire.mutable_params(), "p", 3);
  slice(wire.mutable_token_ids(), "t", 4);
  slice(wire.mutable_row_status(), "s", 5);
  slice(wire.mutable_sampled_logprobs(), "g", 6);
  slice(wire.mutable_token_bitmask(), "b", 7);
  slice(wire.mutable_processors(), "q", 8);
  wire.set_logit_bias_capacity(9);
  wire.set_token_history_capacity(10);
  wire.set_logprob_source(v1::LOGPROB_SOURCE_PROCESSED);
  wire.set_plane(v1::DEVICE_PLANE_HOST);
  core::SessionOpen out;
  FromProto(wire, &out);
  EXPECT_EQ(out.device, "GPU-x");
  EXPECT_EQ(out.dtype, 2);
  EXPECT_EQ(out.max_batch, 32u);
  EXPECT_EQ(out.vocab, 151936u);
  EXPECT_EQ(out.row_stride, 152064u);
  EXPECT_EQ(out.control.region, "c");
  EXPECT_EQ(out.control.offset, 1u);
  EXPECT_EQ(out.logits.region, "l");
  EXPECT_EQ(out.params.offset, 3u);
  EXPECT_EQ(out.token_ids.region, "t");
  EXPECT_EQ(out.row_status.offset, 5u);
  EXPECT_EQ(out.sampled_logprobs.region, "g");
  EXPECT_EQ(out.sampled_logprobs.offset, 6u);
  EXPECT_EQ(out.token_bitmask.region, "b");
  EXPECT_EQ(out.token_bitmask.offset, 7u);
  EXPECT_EQ(out.processors.region, "q");
  EXPECT_EQ(out.processors.offset, 8u);
  EXPECT_EQ(out.logit_bias_capacity, 9u);
  EXPECT_EQ(out.token_history_capacity, 10u);
  EXPECT_EQ(out.logprob_source, 2);
  EXPECT_EQ(out.plane, 2);
}

TEST(FromProto, KeepsUnknownDeviceSessionEnumsForTheManagerToRefuse) {
  v1::DeviceSessionOpen wire;
  wire.set_dtype(static_cast<v1::DType>(42));
  wire.set_logprob_source(static_cast<v1::LogprobSource>(7));
  wire.set_plane(static_cast<v1::DevicePlane>(9));
  core::SessionOpen out;
  FromProto(wire, &out);
  EXPECT_EQ(out.dtype, 42);
  EXPECT_EQ(out.logprob_source, 7);
  EXPECT_EQ(out.plane, 9);
  EXPECT_TRUE(out.sampled_logprobs.region.empty());  // unset: none
  EXPECT_TRUE(out.token_bitmask.region.empty());
  EXPECT_TRUE(out.processors.region.empty());
}

TEST(ToProto, DescribesAnOpenedSession) {
  v1::DeviceSessionOpened out;
  ToProto(core::OpenedSession{"ds-7", core::SessionPlane::kGpu, "0000:3b:00.0"}, &out);
  EXPECT_EQ(out.session_id(), "ds-7");
  EXPECT_EQ(out.plane(), v1::DEVICE_PLANE_GPU);
  EXPECT_EQ(out.device(), "0000:3b:00.0");
  ToProto(core::OpenedSession{"ds-8", core::SessionPlane::kHost, ""}, &out);
  EXPECT_EQ(out.plane(), v1::DEVICE_PLANE_HOST);
}

}  // namespace
}  // namespace samplerd::grpc_transport
