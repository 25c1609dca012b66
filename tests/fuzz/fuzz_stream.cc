// Fuzz target: a SampleStream call, message by message, through the real SampleStreamReactor
// and a CPU core, without a network: a fake gRPC stream (FakeStream) hands the reactor each
// message when it asks to read, completes its writes, and records how it finishes.
//
// Input: a flags byte (bit 0: regions allowed from this peer), then messages, each a 2-byte
// little-endian length and that many bytes; the input's end is the client's half-close.
//
// Findings besides crashes and sanitizer reports: a step without exactly one answer, in order,
// with its request_id (a small model of the reactor's chunking rules says which messages start
// steps); a stream that ends OK after a message that does not parse, or not OK otherwise; an
// error without a message, or with a code a step cannot get; a row's token and status that
// disagree.
#include <google/protobuf/stubs/logging.h>
#include <grpc/grpc.h>

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "samplerd/v1/sampler.pb.h"
#include "service/grpc/raw_message.h"
#include "service/grpc/sample_stream_reactor.h"
#include "tests/fuzz/fuzz_util.h"

namespace samplerd::fuzz {
namespace {

using grpc_transport::ParseMessage;

// The server side of one bidi call, driven by Run().
class FakeStream final
    : public grpc::ServerCallbackReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  explicit FakeStream(grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* reactor)
      : reactor_(reactor) {
    BindReactor(reactor);
  }

  void Finish(grpc::Status s) override {
    std::lock_guard<std::mutex> lock(mu_);
    Check(!finished_, "Finish called twice");
    finished_ = true;
    status_ = std::move(s);
    cv_.notify_all();
  }
  void SendInitialMetadata() override {}
  void Read(grpc::ByteBuffer* msg) override {
    std::lock_guard<std::mutex> lock(mu_);
    Check(read_ == nullptr, "a read started while one is pending");
    Check(!finished_, "a read started after Finish");
    read_ = msg;
    cv_.notify_all();
  }
  void Write(const grpc::ByteBuffer* msg, grpc::WriteOptions options) override {
    std::lock_guard<std::mutex> lock(mu_);
    Check(write_ == nullptr, "a write started while one is pending");
    Check(!finished_, "a write started after Finish");
    write_ = msg;
    cv_.notify_all();
  }
  void WriteAndFinish(const grpc::ByteBuffer* msg, grpc::WriteOptions options,
                      grpc::Status s) override {
    Fail("WriteAndFinish is not used by the reactor");
  }

  // Plays `messages`, then the half-close; collects the responses. Returns the final status.
  grpc::Status Run(const std::vector<std::string>& messages,
                   std::vector<v1::SampleStreamResponse>* responses) {
    size_t next = 0;
    bool half_closed = false;
    for (;;) {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return finished_ || write_ != nullptr || read_ != nullptr; });
      if (write_ != nullptr) {
        grpc::ByteBuffer copy(*write_);
        write_ = nullptr;
        lock.unlock();
        responses->emplace_back();
        Check(ParseMessage(&copy, &responses->back()).ok(), "a response that does not parse");
        reactor_->OnWriteDone(true);
      } else if (read_ != nullptr) {
        grpc::ByteBuffer* read = read_;
        read_ = nullptr;
        lock.unlock();
        Check(!half_closed, "a read after the half-close");
        if (next < messages.size()) {
          const std::string& m = messages[next++];
          *read = BufferOf(reinterpret_cast<const uint8_t*>(m.data()), m.size());
          reactor_->OnReadDone(true);
        } else {
          half_closed = true;
          reactor_->OnReadDone(false);
        }
      } else {
        break;  // finished, nothing pending
      }
    }
    reactor_->OnDone();
    return status_;
  }

 private:
  grpc::internal::ServerReactor* reactor() override { return reactor_; }
  void CallOnDone() override {}

  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* const reactor_;
  std::mutex mu_;
  std::condition_variable cv_;
  grpc::ByteBuffer* read_ = nullptr;
  const grpc::ByteBuffer* write_ = nullptr;
  bool finished_ = false;
  grpc::Status status_;
};

// What the stream must answer: the request_id of each step, in order, and whether a message
// fails to parse (the stream then ends INVALID_ARGUMENT after it).
struct Expected {
  std::vector<std::string> request_ids;
  std::vector<bool> starts_without_request;  // the step is INVALID_ARGUMENT
  bool parse_error = false;
};

Expected Model(const std::vector<std::string>& messages) {
  Expected expected;
  bool assembling = false;
  bool skipping = false;  // the rest of a step cut short by the next `request`
  for (const std::string& m : messages) {
    v1::SampleStreamRequest message;
    if (!message.ParseFromString(m)) {
      expected.parse_error = true;
      break;
    }
    if (skipping) {
      if (!message.has_request()) {
        skipping = message.more_chunks();
        continue;
      }
      skipping = false;
    }
    if (assembling) {
      if (!message.has_request()) {
        assembling = message.more_chunks();
        continue;
      }
      // A `request` where a chunk was expected: the step in progress is answered (it failed),
      // and this message starts the next step; the cut step's chunks are skipped after it.
      assembling = false;
      skipping = !message.more_chunks();
    }
    expected.request_ids.push_back(message.request().request_id());
    expected.starts_without_request.push_back(!message.has_request());
    assembling = message.has_request() && message.more_chunks();
  }
  return expected;
}

void CheckStep(const v1::SampleStreamResponse& step, size_t i) {
  const int code = step.status().code();
  Trace(absl::StrCat("step ", i, " (", step.response().token_ids_size(), " tokens)"),
        absl::Status(static_cast<absl::StatusCode>(code), step.status().message()));
  if (code != 0) {
    CheckError(absl::Status(static_cast<absl::StatusCode>(code), step.status().message()),
               {absl::StatusCode::kInvalidArgument, absl::StatusCode::kResourceExhausted,
                absl::StatusCode::kNotFound, absl::StatusCode::kOutOfRange,
                absl::StatusCode::kFailedPrecondition, absl::StatusCode::kPermissionDenied},
               absl::StrCat("step ", i));
    return;
  }
  const v1::SampleResponse& r = step.response();
  if (r.token_ids_size() == 0) return;  // a done event: the tokens are in the output region
  Check(r.token_ids_size() == r.row_status_size(), "tokens and statuses differ in number");
  for (int row = 0; row < r.token_ids_size(); ++row) {
    const bool ok = r.row_status(row) == v1::ROW_STATUS_OK;
    Check(ok ? r.token_ids(row) >= 0 : r.token_ids(row) == -1,
          absl::StrCat("step ", i, " row ", row, ": token ", r.token_ids(row), " with status ",
                       r.row_status(row)));
  }
}

}  // namespace
}  // namespace samplerd::fuzz

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  google::protobuf::SetLogHandler(nullptr);
  samplerd::fuzz::Core();
  // gRPC stays initialized, as a server keeps it: else each chunked step's deadline alarm would
  // start gRPC up and shut it down again (its threads included), one input at a time.
  grpc_init();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace samplerd;  // NOLINT
  fuzz::Input input(data, size);
  const bool allow_remote_regions = input.Byte() & 1;
  std::vector<std::string> messages;
  while (!input.empty() && messages.size() < 256) messages.push_back(input.Message());
  const fuzz::Expected expected = fuzz::Model(messages);

  grpc::CallbackServerContext context;
  auto* reactor = new grpc_transport::SampleStreamReactor(&fuzz::Core(), &context,
                                                          allow_remote_regions, nullptr);
  fuzz::FakeStream stream(reactor);
  std::vector<v1::SampleStreamResponse> responses;
  const grpc::Status status = stream.Run(messages, &responses);

  fuzz::Check(
      responses.size() == expected.request_ids.size(),
      absl::StrCat("expected ", expected.request_ids.size(), " answers, got ", responses.size()));
  for (size_t i = 0; i < responses.size(); ++i) {
    fuzz::Check(responses[i].response().request_id() == expected.request_ids[i],
                absl::StrCat("answer ", i, " has another step's request_id"));
    if (expected.starts_without_request[i]) {
      fuzz::Check(responses[i].status().code() == grpc::StatusCode::INVALID_ARGUMENT,
                  absl::StrCat("step ", i, " has no request but was answered ",
                               responses[i].status().code()));
    }
    fuzz::CheckStep(responses[i], i);
  }
  fuzz::Trace("stream", absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                                     status.error_message()));
  if (expected.parse_error) {
    fuzz::Check(status.error_code() == grpc::StatusCode::INVALID_ARGUMENT &&
                    !status.error_message().empty(),
                absl::StrCat("a message did not parse, but the stream ended ", status.error_code(),
                             " ", status.error_message()));
  } else {
    fuzz::Check(status.ok(), absl::StrCat("the stream ended ", status.error_code(), " ",
                                          status.error_message()));
  }
  return 0;
}
