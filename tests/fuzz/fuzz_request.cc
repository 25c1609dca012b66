// Fuzz target: request bytes -> parse -> convert -> validate (-> sample), for every message the
// service parses. The first byte picks the message; the rest are its serialized bytes.
//
//   0 SampleRequest: ParseMessage, FromProto, ValidateSampleRequest; a valid request is then
//     sampled by a CPU core (regions bound, logits processors applied) and its answer checked.
//   1 SampleStreamRequest: parse; its `request` converted and validated.
//   2 RegisterRegionRequest: parse; registered (host shm under the fuzz prefix, which a key
//     starting with '%' stands for; GPU IPC on a server without it) in a registry of its own,
//     then unregistered.
//   3 UnregisterRegionRequest: parse; unregistered from that registry.
//   4 DeviceSessionRequest: parse; an `open` converted and opened on the core's session
//     manager (host plane; regions "ctl" and "buf" exist), closed again when it opens.
//   5 GetServerInfoRequest and ListRegionsRequest: parse.
//
// Findings besides crashes and sanitizer reports: an error without a message, an error code
// the method does not document, a sampled token outside [0, V) or disallowed by the request's
// bitmask or a -inf bias, answers of the wrong length.
#include <google/protobuf/stubs/logging.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "samplerd/v1/sampler.pb.h"
#include "service/core/validation.h"
#include "service/grpc/convert.h"
#include "service/grpc/raw_message.h"
#include "tests/fuzz/fuzz_util.h"

namespace samplerd::fuzz {
namespace {

using absl::StatusCode;
using grpc_transport::FromProto;
using grpc_transport::ParseMessage;

// Parses `bytes` as `message`; false (after checking the error) when they do not parse.
bool Parse(const std::string& bytes, google::protobuf::MessageLite* message) {
  grpc::ByteBuffer buffer = BufferOf(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  const absl::Status status = ParseMessage(&buffer, message);
  Trace("ParseMessage", status);
  CheckError(status, {StatusCode::kInvalidArgument}, "ParseMessage");
  return status.ok();
}

absl::StatusOr<core::SampleResult> SampleAndWait(core::SampleRequest request) {
  absl::Notification done;
  absl::StatusOr<core::SampleResult> result;
  const absl::Status queued =
      Core().SampleAsync(std::move(request), [&](absl::StatusOr<core::SampleResult> r) {
        result = std::move(r);
        done.Notify();
      });
  if (!queued.ok()) return queued;
  done.WaitForNotification();
  return result;
}

// The answer to a valid request: one token per row, in range and allowed.
void CheckAnswer(const v1::SampleRequest& proto, const core::ValidatedBatch& batch,
                 const core::SampleResult& result) {
  const size_t rows = static_cast<size_t>(batch.batch);
  if (!proto.done_event().empty()) return;  // the tokens are in the output region
  Check(result.token_ids.size() == rows && result.row_status.size() == rows,
        absl::StrCat("expected ", rows, " tokens and statuses, got ", result.token_ids.size(),
                     " and ", result.row_status.size()));
  const std::string& words = proto.token_bitmask().inline_words();
  const int64_t words_per_row = (batch.vocab + 31) / 32;
  for (size_t r = 0; r < rows; ++r) {
    const int32_t token = result.token_ids[r];
    if (result.row_status[r] != kernels::RowStatus::kOk) {
      Check(token == -1, absl::StrCat("row ", r, ": a failed row's token is ", token));
      continue;
    }
    Check(token >= 0 && token < batch.vocab,
          absl::StrCat("row ", r, ": token ", token, " outside [0, ", batch.vocab, ")"));
    if (proto.token_bitmask().data_case() == v1::TokenBitmask::kInlineWords &&
        words.size() == 4 * rows * static_cast<size_t>(words_per_row)) {
      uint32_t word;
      std::memcpy(&word, words.data() + 4 * (r * words_per_row + token / 32), 4);
      Check((word >> (token % 32)) & 1u,
            absl::StrCat("row ", r, ": token ", token, " is not allowed by the bitmask"));
    }
    const v1::LogitBias& bias = proto.logit_bias();
    if (static_cast<size_t>(bias.row_offsets_size()) == rows + 1) {
      for (uint32_t i = bias.row_offsets(r); i < bias.row_offsets(r + 1); ++i) {
        Check(!(bias.token_ids(i) == token &&
                bias.biases(i) == -std::numeric_limits<float>::infinity()),
              absl::StrCat("row ", r, ": token ", token, " has a -inf bias"));
      }
    }
  }
  // Top logprobs: real ids for a valid row, padded with -1 past V; all -1 for an invalid row.
  if (result.logprobs.empty()) return;
  Check(result.logprobs.size() == rows, "expected logprobs for every row");
  const int64_t top_n = proto.logprobs().top_n();
  for (size_t r = 0; r < rows; ++r) {
    const std::vector<int32_t>& ids = result.logprobs[r].top_ids;
    Check(static_cast<int64_t>(ids.size()) == top_n,
          absl::StrCat("row ", r, ": ", ids.size(), " top logprobs, expected ", top_n));
    const bool valid = result.row_status[r] == kernels::RowStatus::kOk;
    for (int64_t i = 0; i < top_n; ++i) {
      const bool real = valid && i < batch.vocab;
      Check(real ? ids[i] >= 0 && ids[i] < batch.vocab : ids[i] == -1,
            absl::StrCat("row ", r, " (status ", static_cast<int>(result.row_status[r]),
                         "): top logprob id ", ids[i], " at ", i, ", V = ", batch.vocab));
    }
  }
}

// Converts and validates `proto`; samples it when `sample` and valid.
void Request(const v1::SampleRequest& proto, bool sample) {
  core::SampleRequest request;
  const absl::Status converted = FromProto(proto, &request);
  Trace("FromProto", converted);
  CheckError(converted, {StatusCode::kInvalidArgument}, "FromProto(SampleRequest)");
  if (!converted.ok()) return;
  uint64_t seed = 1;
  absl::StatusOr<core::ValidatedBatch> batch =
      core::ValidateSampleRequest(request, Core().limits(), [&] { return seed++; });
  Trace("ValidateSampleRequest", batch.status());
  CheckError(batch.status(), {StatusCode::kInvalidArgument, StatusCode::kResourceExhausted},
             "ValidateSampleRequest");
  if (!batch.ok() || !sample) return;
  absl::StatusOr<core::SampleResult> result = SampleAndWait(std::move(request));
  Trace("SampleAsync", result.status());
  CheckError(result.status(),
             {StatusCode::kInvalidArgument, StatusCode::kNotFound, StatusCode::kOutOfRange,
              StatusCode::kFailedPrecondition},
             "SampleAsync");
  if (result.ok()) CheckAnswer(proto, *batch, *result);
}

core::RegionRegistry& Registry() {
  static core::RegionRegistry registry(core::RegionOptions{Prefix()}, nullptr, {});
  return registry;
}

// The fuzz prefix holds the process id: a key "%objN" in the input stands for ObjectKey(N),
// that is "%" for Prefix(), so that the corpus can name the real objects.
std::string Key(const std::string& key) {
  if (key.empty() || key[0] != '%') return key;
  return Prefix() + key.substr(1);
}

void RegisterRegion(const v1::RegisterRegionRequest& proto) {
  absl::StatusOr<core::RegionInfo> info;
  switch (proto.kind_case()) {
    case v1::RegisterRegionRequest::kHostShm:
      info = Registry().RegisterHostShm(proto.name(), Key(proto.host_shm().key()),
                                        proto.host_shm().offset(), proto.host_shm().byte_size());
      break;
    case v1::RegisterRegionRequest::kGpuIpc:
      info = Registry().RegisterGpuIpc(proto.name(), proto.gpu_ipc().memory_handle(),
                                       proto.gpu_ipc().offset(), proto.gpu_ipc().byte_size(),
                                       proto.gpu_ipc().device());
      Check(!info.ok(), "a GPU IPC region registered on a server without GPU IPC");
      break;
    case v1::RegisterRegionRequest::KIND_NOT_SET:
      return;
  }
  Trace("RegisterRegion", info.status());
  CheckError(info.status(),
             {StatusCode::kInvalidArgument, StatusCode::kNotFound, StatusCode::kOutOfRange,
              StatusCode::kPermissionDenied, StatusCode::kFailedPrecondition,
              StatusCode::kAlreadyExists, StatusCode::kResourceExhausted},
             "RegisterRegion");
  if (!info.ok()) return;
  Check(info->byte_size == proto.host_shm().byte_size(), "registered size differs");
  Check(Registry().List().size() == 1, "expected one registered region");
  Check(Registry().Unregister(proto.name()).ok(), "cannot unregister a registered region");
}

void OpenSession(const v1::DeviceSessionRequest& proto) {
  if (!proto.has_open()) return;
  core::SessionOpen open;
  grpc_transport::FromProto(proto.open(), &open);
  absl::StatusOr<core::OpenedSession> opened = Core().sessions().Open(open, nullptr);
  Trace("SessionManager::Open", opened.status());
  CheckError(opened.status(),
             {StatusCode::kInvalidArgument, StatusCode::kResourceExhausted, StatusCode::kNotFound,
              StatusCode::kOutOfRange, StatusCode::kFailedPrecondition, StatusCode::kAlreadyExists},
             "SessionManager::Open");
  if (!opened.ok()) return;
  Check(Core().sessions().Close(opened->id).ok(), "cannot close an open session");
}

}  // namespace
}  // namespace samplerd::fuzz

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  google::protobuf::SetLogHandler(nullptr);  // a parse failure would log a line each time
  samplerd::fuzz::Core();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace samplerd;  // NOLINT
  fuzz::Input input(data, size);
  const uint8_t kind = input.Byte() % 6;
  const std::string bytes = input.Rest();
  switch (kind) {
    case 0: {
      v1::SampleRequest message;
      if (fuzz::Parse(bytes, &message)) fuzz::Request(message, /*sample=*/true);
      break;
    }
    case 1: {
      v1::SampleStreamRequest message;
      if (fuzz::Parse(bytes, &message) && message.has_request()) {
        fuzz::Request(message.request(), /*sample=*/false);
      }
      break;
    }
    case 2: {
      v1::RegisterRegionRequest message;
      if (fuzz::Parse(bytes, &message)) fuzz::RegisterRegion(message);
      break;
    }
    case 3: {
      v1::UnregisterRegionRequest message;
      if (fuzz::Parse(bytes, &message)) {
        fuzz::CheckError(fuzz::Registry().Unregister(message.name()),
                         {absl::StatusCode::kInvalidArgument, absl::StatusCode::kNotFound},
                         "UnregisterRegion");
      }
      break;
    }
    case 4: {
      v1::DeviceSessionRequest message;
      if (fuzz::Parse(bytes, &message)) fuzz::OpenSession(message);
      break;
    }
    default: {
      v1::GetServerInfoRequest info;
      v1::ListRegionsRequest list;
      fuzz::Parse(bytes, &info);
      fuzz::Parse(bytes, &list);
      break;
    }
  }
  return 0;
}
