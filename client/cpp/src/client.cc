// samplerd::Client: channel setup, unary calls and the fp32 request builder.
#include "samplerd/client.h"

#include <cstring>
#include <utility>

namespace samplerd {
namespace {

// The wire format of inline logits is little-endian; memcpy of host floats is only right on a
// little-endian host (every platform samplerd targets).
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "inline logits need a little-endian host");

}  // namespace

Client::Client(const std::string& target, const ClientOptions& options) : options_(options) {
  grpc::ChannelArguments args;
  args.SetMaxSendMessageSize(options_.max_message_bytes);
  args.SetMaxReceiveMessageSize(options_.max_message_bytes);
  channel_ = grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
  stub_ = v1::SamplerService::NewStub(channel_);
}

void Client::PrepareContext(grpc::ClientContext* context) const {
  if (options_.default_deadline.count() > 0) {
    context->set_deadline(std::chrono::system_clock::now() + options_.default_deadline);
  }
}

grpc::Status Client::Sample(const v1::SampleRequest& request, v1::SampleResponse* response) {
  grpc::ClientContext context;
  PrepareContext(&context);
  return stub_->Sample(&context, request, response);
}

grpc::Status Client::SampleFp32(const float* logits, int64_t batch, int64_t vocab,
                                const std::vector<v1::SamplingParams>& params,
                                v1::SampleResponse* response) {
  return Sample(MakeFp32Request(logits, batch, vocab, params), response);
}

grpc::Status Client::GetServerInfo(v1::GetServerInfoResponse* info) {
  grpc::ClientContext context;
  PrepareContext(&context);
  return stub_->GetServerInfo(&context, v1::GetServerInfoRequest(), info);
}

std::unique_ptr<SampleSession> Client::OpenStream() {
  return std::unique_ptr<SampleSession>(new SampleSession(
      channel_, stub_.get(), options_.stream_chunk_bytes, options_.max_message_bytes));
}

v1::SampleRequest MakeFp32Request(const float* logits, int64_t batch, int64_t vocab,
                                  const std::vector<v1::SamplingParams>& params) {
  v1::SampleRequest request;
  v1::Tensor* tensor = request.mutable_logits();
  tensor->set_dtype(v1::DTYPE_FP32);
  tensor->add_shape(batch);
  tensor->add_shape(vocab);
  if (batch > 0 && vocab > 0 && logits != nullptr) {
    const size_t bytes = static_cast<size_t>(batch) * static_cast<size_t>(vocab) * sizeof(float);
    std::string* data = tensor->mutable_inline_data();
    data->resize(bytes);
    std::memcpy(data->data(), logits, bytes);
  }
  for (const v1::SamplingParams& p : params) *request.add_params() = p;
  return request;
}

}  // namespace samplerd
