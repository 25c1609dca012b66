// samplerd::SampleSession: one SampleStream call driven synchronously, step by step.
#include <algorithm>
#include <string>
#include <utility>

#include "samplerd/client.h"

namespace samplerd {

SampleSession::SampleSession(std::shared_ptr<grpc::Channel> channel, v1::SamplerService::Stub* stub,
                             size_t chunk_bytes, int max_message_bytes)
    : channel_(std::move(channel)),
      chunk_bytes_(chunk_bytes),
      max_message_bytes_(max_message_bytes) {
  stream_ = stub->SampleStream(&context_);
}

SampleSession::~SampleSession() {
  if (done_) return;
  // Not closed by the caller: cancel rather than wait for a server that may be slow to end it.
  context_.TryCancel();
  stream_->Finish().ok();
}

SampleSession::Written SampleSession::WriteStep(const v1::SampleRequest& request, size_t* bytes) {
  // The first message is measured before it is written: the chunk messages after it are no
  // larger.
  const auto too_large = [this, bytes](const v1::SampleStreamRequest& message) {
    *bytes = message.ByteSizeLong();
    return max_message_bytes_ > 0 && *bytes > static_cast<size_t>(max_message_bytes_);
  };
  const bool inline_data = request.logits().data_case() == v1::Tensor::kInlineData;
  if (chunk_bytes_ == 0 || !inline_data || request.logits().inline_data().size() <= chunk_bytes_) {
    v1::SampleStreamRequest message;
    *message.mutable_request() = request;
    if (too_large(message)) return Written::kTooLarge;
    return stream_->Write(message) ? Written::kSent : Written::kBroken;
  }
  // First message: the request with the first chunk of its bytes; then chunk-only messages.
  v1::SampleStreamRequest message;
  *message.mutable_request() = request;
  std::string data = std::move(*message.mutable_request()->mutable_logits()->mutable_inline_data());
  message.mutable_request()->mutable_logits()->set_inline_data(data.substr(0, chunk_bytes_));
  message.set_more_chunks(true);
  if (too_large(message)) return Written::kTooLarge;
  if (!stream_->Write(message)) return Written::kBroken;
  for (size_t offset = chunk_bytes_; offset < data.size(); offset += chunk_bytes_) {
    v1::SampleStreamRequest chunk;
    chunk.set_chunk(data.substr(offset, chunk_bytes_));
    chunk.set_more_chunks(offset + chunk_bytes_ < data.size());
    if (!stream_->Write(chunk)) return Written::kBroken;
  }
  return Written::kSent;
}

grpc::Status SampleSession::Fail() {
  done_ = true;
  final_status_ = stream_->Finish();
  if (final_status_.ok()) {
    // The server ended the call cleanly with a step unanswered: still a failure for this step.
    final_status_ = grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                 "expected a response to the step, got the end of the stream");
  }
  return final_status_;
}

grpc::Status SampleSession::Step(const v1::SampleRequest& request, v1::SampleResponse* response) {
  if (done_) {
    return final_status_.ok() ? grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                                             "expected an open session, got a closed one")
                              : final_status_;
  }
  size_t bytes = 0;
  switch (WriteStep(request, &bytes)) {
    case Written::kSent:
      break;
    case Written::kTooLarge:  // nothing was sent: the stream is intact
      return grpc::Status(
          grpc::StatusCode::RESOURCE_EXHAUSTED,
          "expected a step message of at most " + std::to_string(max_message_bytes_) +
              " bytes (ClientOptions::max_message_bytes), got " + std::to_string(bytes) +
              " bytes (ClientOptions::stream_chunk_bytes splits large steps)");
    case Written::kBroken:
      return Fail();
  }
  v1::SampleStreamResponse answer;
  if (!stream_->Read(&answer)) return Fail();
  *response = std::move(*answer.mutable_response());
  if (answer.status().code() != grpc::StatusCode::OK) {
    return grpc::Status(static_cast<grpc::StatusCode>(answer.status().code()),
                        answer.status().message());
  }
  return grpc::Status::OK;
}

grpc::Status SampleSession::Close() {
  if (done_) return final_status_;
  done_ = true;
  stream_->WritesDone();
  final_status_ = stream_->Finish();
  return final_status_;
}

}  // namespace samplerd
