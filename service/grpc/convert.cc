#include "service/grpc/convert.h"

#include "absl/strings/str_cat.h"

namespace samplerd::grpc_transport {
namespace {

absl::Status UnknownEnum(absl::string_view field, int value) {
  return absl::InvalidArgumentError(
      absl::StrCat("expected a known ", field, " value, got ", value));
}

absl::Status ConvertParams(const v1::SamplingParams& in, core::ParamsSpec* out) {
  if (in.has_temperature()) out->temperature = in.temperature();
  out->top_k = in.top_k();
  if (in.has_top_p()) out->top_p = in.top_p();
  out->min_p = in.min_p();
  switch (in.top_p_mode()) {
    case v1::TOP_P_MODE_UNSPECIFIED:
    case v1::TOP_P_MODE_TOP_K_FIRST:
      out->top_p_mode = kernels::TopPMode::kTopKFirst;
      break;
    case v1::TOP_P_MODE_JOINT:
      out->top_p_mode = kernels::TopPMode::kJoint;
      break;
    default:
      return UnknownEnum("params.top_p_mode", in.top_p_mode());
  }
  if (in.has_seed()) out->seed = in.seed();
  out->position = in.position();
  if (in.has_repetition_penalty()) out->repetition_penalty = in.repetition_penalty();
  out->presence_penalty = in.presence_penalty();
  out->frequency_penalty = in.frequency_penalty();
  return absl::OkStatus();
}

// The logits processors (processors.proto); the core validates them.
void ConvertProcessors(const v1::SampleRequest& in, core::SampleRequest* out) {
  if (in.has_logit_bias()) {
    const v1::LogitBias& bias = in.logit_bias();
    core::LogitBiasSpec& spec = out->logit_bias.emplace();
    spec.row_offsets.assign(bias.row_offsets().begin(), bias.row_offsets().end());
    spec.token_ids.assign(bias.token_ids().begin(), bias.token_ids().end());
    spec.biases.assign(bias.biases().begin(), bias.biases().end());
    if (bias.has_region())
      spec.region = core::RegionRef{bias.region().region(), bias.region().offset()};
  }
  if (in.has_token_history()) {
    const v1::TokenHistory& history = in.token_history();
    core::TokenHistorySpec& spec = out->token_history.emplace();
    spec.row_offsets.assign(history.row_offsets().begin(), history.row_offsets().end());
    spec.token_ids.assign(history.token_ids().begin(), history.token_ids().end());
    spec.output_counts.assign(history.output_counts().begin(), history.output_counts().end());
    spec.in_prompt.assign(history.in_prompt().begin(), history.in_prompt().end());
    if (history.has_region()) {
      spec.region = core::RegionRef{history.region().region(), history.region().offset()};
    }
  }
  if (in.has_token_bitmask()) {
    const v1::TokenBitmask& mask = in.token_bitmask();
    core::TokenBitmaskSpec& spec = out->token_bitmask.emplace();
    spec.has_inline_words = mask.data_case() == v1::TokenBitmask::kInlineWords;
    spec.inline_words = mask.inline_words();
    if (mask.data_case() == v1::TokenBitmask::kRegion) {
      spec.region = core::RegionRef{mask.region().region(), mask.region().offset()};
    }
  }
}

v1::RowStatus ToProto(kernels::RowStatus status) {
  switch (status) {
    case kernels::RowStatus::kOk:
      return v1::ROW_STATUS_OK;
    case kernels::RowStatus::kNan:
      return v1::ROW_STATUS_INVALID_NAN;
    case kernels::RowStatus::kNoFinite:
      return v1::ROW_STATUS_INVALID_NO_FINITE;
    case kernels::RowStatus::kInvalidParams:
      return v1::ROW_STATUS_INVALID_PARAMS;
    case kernels::RowStatus::kNoAllowed:
      return v1::ROW_STATUS_INVALID_NO_ALLOWED;
  }
  return v1::ROW_STATUS_UNSPECIFIED;
}

}  // namespace

absl::Time DeadlineOf(const grpc::ServerContextBase& context) {
  const std::chrono::system_clock::time_point deadline = context.deadline();
  if (deadline == std::chrono::system_clock::time_point::max()) return absl::InfiniteFuture();
  return absl::FromChrono(deadline);
}

absl::Status FromProto(const v1::SampleRequest& in, core::SampleRequest* out) {
  out->request_id = in.request_id();
  const v1::Tensor& logits = in.logits();
  switch (logits.dtype()) {
    case v1::DTYPE_UNSPECIFIED:
      out->dtype.reset();
      break;
    case v1::DTYPE_FP32:
      out->dtype = kernels::DType::kFp32;
      break;
    case v1::DTYPE_FP16:
      out->dtype = kernels::DType::kFp16;
      break;
    case v1::DTYPE_BF16:
      out->dtype = kernels::DType::kBf16;
      break;
    default:
      return UnknownEnum("logits.dtype", logits.dtype());
  }
  out->shape.assign(logits.shape().begin(), logits.shape().end());
  out->row_stride = logits.row_stride();
  out->has_inline_data = logits.data_case() == v1::Tensor::kInlineData;
  out->inline_data = logits.inline_data();
  if (logits.data_case() == v1::Tensor::kRegion) {
    out->logits_region = core::RegionRef{logits.region().region(), logits.region().offset()};
  }
  if (in.has_output()) out->output = core::RegionRef{in.output().region(), in.output().offset()};
  out->ready_event = in.ready_event();
  out->done_event = in.done_event();
  out->params.resize(in.params_size());
  for (int i = 0; i < in.params_size(); ++i) {
    absl::Status status = ConvertParams(in.params(i), &out->params[i]);
    if (!status.ok()) return status;
  }
  out->row_seeds.assign(in.row_seeds().begin(), in.row_seeds().end());
  out->row_positions.assign(in.row_positions().begin(), in.row_positions().end());
  out->device = in.device();
  if (in.has_logprobs()) {
    core::LogprobSpec spec;
    spec.top_n = in.logprobs().top_n();
    switch (in.logprobs().source()) {
      case v1::LOGPROB_SOURCE_UNSPECIFIED:
      case v1::LOGPROB_SOURCE_RAW:
        spec.source = kernels::LogprobSource::kRaw;
        break;
      case v1::LOGPROB_SOURCE_PROCESSED:
        spec.source = kernels::LogprobSource::kProcessed;
        break;
      default:
        return UnknownEnum("logprobs.source", in.logprobs().source());
    }
    out->logprobs = spec;
  }
  ConvertProcessors(in, out);
  return absl::OkStatus();
}

void ToProto(const core::SampleResult& in, v1::SampleResponse* out) {
  out->set_request_id(in.request_id);
  out->mutable_token_ids()->Assign(in.token_ids.begin(), in.token_ids.end());
  out->mutable_row_status()->Reserve(static_cast<int>(in.row_status.size()));
  for (kernels::RowStatus s : in.row_status) out->add_row_status(ToProto(s));
  out->mutable_seeds()->Assign(in.seeds.begin(), in.seeds.end());
  for (const core::RowLogprobs& row : in.logprobs) {
    v1::RowLogprobs* lp = out->add_logprobs();
    lp->set_sampled_logprob(row.sampled_logprob);
    lp->set_sampled_rank(row.sampled_rank);
    lp->mutable_top_token_ids()->Assign(row.top_ids.begin(), row.top_ids.end());
    lp->mutable_top_logprobs()->Assign(row.top_values.begin(), row.top_values.end());
  }
  v1::Timings* t = out->mutable_timings();
  t->set_queue_ns(absl::ToInt64Nanoseconds(in.timings.queue));
  t->set_compute_ns(absl::ToInt64Nanoseconds(in.timings.compute));
  t->set_total_ns(absl::ToInt64Nanoseconds(in.timings.total));
}

bool UsesRegions(const v1::SampleRequest& in) {
  return in.logits().data_case() == v1::Tensor::kRegion || in.has_output() ||
         in.token_bitmask().data_case() == v1::TokenBitmask::kRegion ||
         in.logit_bias().has_region() || in.token_history().has_region();
}

void ToProto(const core::RegionInfo& in, v1::RegionInfo* out) {
  out->set_name(in.name);
  out->set_kind(in.kind == core::RegionKind::kGpuIpc ? v1::REGION_KIND_GPU_IPC
                                                     : v1::REGION_KIND_HOST_SHM);
  out->set_byte_size(in.byte_size);
  out->set_device(in.device);
  out->set_owner_pid(in.owner_pid);
  out->set_owner_watched(in.owner_watched);
}

void ToProto(const core::ServerInfo& in, const TransportLimits& transport,
             v1::GetServerInfoResponse* out) {
  out->set_version(in.version);
  out->set_backend(in.backend == core::BackendKind::kGpu ? v1::BACKEND_GPU : v1::BACKEND_CPU);
  for (const core::DeviceInfo& d : in.devices) {
    v1::Device* dev = out->add_devices();
    dev->set_ordinal(d.ordinal);
    dev->set_pci_bus_id(d.pci_bus_id);
    dev->set_uuid(d.uuid);
    dev->set_name(d.name);
    dev->set_ipc_memory(d.ipc_memory);
    dev->set_ipc_events(d.ipc_events);
  }
  v1::Limits* limits = out->mutable_limits();
  limits->set_max_batch(in.limits.max_batch);
  limits->set_max_vocab(in.limits.max_vocab);
  limits->set_max_message_bytes(transport.max_message_bytes);
  limits->set_max_receive_bytes(transport.max_receive_bytes);
  limits->set_max_top_logprobs(in.limits.max_top_logprobs);
  limits->set_max_device_sessions(in.device_sessions.max_sessions);
  limits->set_max_host_session_bytes(in.device_sessions.max_host_session_bytes);
  limits->set_max_inflight(in.limits.max_inflight);
  limits->set_max_inflight_bytes(in.limits.max_inflight_bytes);
  limits->set_chunk_timeout_ms(absl::ToInt64Milliseconds(transport.chunk_timeout));
  limits->set_max_region_bytes(in.max_region_bytes);
  limits->set_max_regions(in.max_regions);
  v1::DeviceSessionSupport* sessions = out->mutable_device_sessions();
  sessions->set_gpu_plane(in.device_sessions.gpu_plane);
  sessions->set_host_plane(in.device_sessions.host_plane);
  sessions->set_mps(in.device_sessions.mps);
  sessions->set_open_sessions(in.device_sessions.open_sessions);
  sessions->set_processors(in.device_sessions.processors);
}

namespace {

core::SessionSlice FromProto(const v1::RegionSlice& in) { return {in.region(), in.offset()}; }

}  // namespace

void FromProto(const v1::DeviceSessionOpen& in, core::SessionOpen* out) {
  out->device = in.device();
  out->dtype = static_cast<int32_t>(in.dtype());
  out->max_batch = in.max_batch();
  out->vocab = in.vocab();
  out->row_stride = in.row_stride();
  out->control = FromProto(in.control());
  out->logits = FromProto(in.logits());
  out->params = FromProto(in.params());
  out->token_ids = FromProto(in.token_ids());
  out->row_status = FromProto(in.row_status());
  out->sampled_logprobs =
      in.has_sampled_logprobs() ? FromProto(in.sampled_logprobs()) : core::SessionSlice{};
  out->token_bitmask =
      in.has_token_bitmask() ? FromProto(in.token_bitmask()) : core::SessionSlice{};
  out->processors = in.has_processors() ? FromProto(in.processors()) : core::SessionSlice{};
  out->logit_bias_capacity = in.logit_bias_capacity();
  out->token_history_capacity = in.token_history_capacity();
  out->logprob_source = static_cast<int32_t>(in.logprob_source());
  out->plane = static_cast<int32_t>(in.plane());
  out->unregister_regions_on_end = in.unregister_regions_on_end();
}

void ToProto(const core::OpenedSession& in, v1::DeviceSessionOpened* out) {
  out->set_session_id(in.id);
  out->set_plane(in.plane == core::SessionPlane::kGpu ? v1::DEVICE_PLANE_GPU
                                                      : v1::DEVICE_PLANE_HOST);
  out->set_device(in.device);
}

}  // namespace samplerd::grpc_transport
