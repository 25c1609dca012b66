// The unary methods through an in-process SamplerServer, registered both ways
// (sampler_service.h): without --max_receive_bytes as plain unary methods, with it as gated
// streams (gated_unary_call.h). Both answer alike: a request is served, bytes that do not parse
// and a call without a message are INVALID_ARGUMENT naming the method's request type, and
// GetServerInfo reports the budget. Without a budget a call that sends nothing never reaches
// the service; with one whose --max_receive_bytes lets one request in at a time, such a call
// holds the share (as a client stalling in the middle of a large request would): another call
// waits, leaves the queue at its deadline, and goes in once the holder is done; a holder whose
// request does not arrive is answered DEADLINE_EXCEEDED after --chunk_timeout_ms.
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/impl/codegen/client_unary_call.h>
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include "samplerd/v1/sampler.grpc.pb.h"
#include "service/core/backend/cpu_sampler.h"
#include "service/grpc/server.h"

namespace samplerd::grpc_transport {
namespace {

constexpr int kMessageBytes = 1 << 20;
constexpr char kService[] = "/samplerd.v1.SamplerService/";

grpc::ByteBuffer Bytes(const std::string& bytes) {
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

class UnaryCalls : public ::testing::Test {
 protected:
  // Serves a CPU core on TCP with `max_receive_bytes` (0: no budget; kMessageBytes: one request
  // received at a time) and `chunk_timeout`.
  void Start(int64_t max_receive_bytes, absl::Duration chunk_timeout) {
    core_ = std::make_unique<core::SamplerCore>(
        core::CoreOptions{}, std::make_unique<core::CpuSampler>(1), /*seed_start=*/7);
    ServerOptions options;
    options.listen = {"127.0.0.1:0"};
    options.max_message_bytes = kMessageBytes;
    options.max_receive_bytes = max_receive_bytes;
    options.chunk_timeout = chunk_timeout;
    absl::StatusOr<std::unique_ptr<SamplerServer>> server =
        SamplerServer::Start(options, core_.get());
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    channel_ =
        grpc::CreateChannel(server_->bound_addresses()[0], grpc::InsecureChannelCredentials());
    stub_ = v1::SamplerService::NewStub(channel_);
    generic_ = std::make_unique<grpc::GenericStub>(channel_);
  }

  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown(absl::Now());
  }

  // Opens a Sample call that sends nothing (the holder), and waits until it has started.
  void OpenSilentCall() {
    holder_ = generic_->PrepareCall(&holder_context_, std::string(kService) + "Sample", &cq_);
    holder_->StartCall(this);
    void* tag;
    bool ok;
    ASSERT_TRUE(cq_.Next(&tag, &ok) && ok);
  }

  // Opens the holder and waits until it holds the gate's share.
  void StartHolder() {
    OpenSilentCall();
    ASSERT_TRUE(WaitFor([this] { return server_->receive_gate().held() == 1; }));
  }

  // The holder's final status.
  grpc::Status HolderStatus() {
    grpc::Status status;
    holder_->Finish(&status, this);
    void* tag;
    bool ok;
    EXPECT_TRUE(cq_.Next(&tag, &ok));
    return status;
  }

  // Polls `done` until it holds or 10 s passed.
  template <typename Predicate>
  static bool WaitFor(Predicate done) {
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (!done()) {
      if (absl::Now() > deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return true;
  }

  grpc::Status ServerInfo(std::chrono::milliseconds timeout, v1::GetServerInfoResponse* info) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + timeout);
    return stub_->GetServerInfo(&context, v1::GetServerInfoRequest(), info);
  }

  // Samples one row of logits [0.5, 1, 3, 2] greedily (token 2).
  grpc::Status SampleGreedy(v1::SampleResponse* response) {
    const float logits[4] = {0.5f, 1.0f, 3.0f, 2.0f};
    v1::SampleRequest request;
    request.mutable_logits()->set_dtype(v1::DTYPE_FP32);
    request.mutable_logits()->add_shape(1);
    request.mutable_logits()->add_shape(4);
    request.mutable_logits()->set_inline_data(reinterpret_cast<const char*>(logits),
                                              sizeof(logits));
    request.add_params()->set_temperature(0);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    return stub_->Sample(&context, request, response);
  }

  // One call to `method` with `bytes` as its request.
  grpc::Status RawUnary(const std::string& method, const std::string& bytes) {
    const std::string path = kService + method;
    const grpc::internal::RpcMethod rpc(path.c_str(), grpc::internal::RpcMethod::NORMAL_RPC);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    grpc::ByteBuffer response;
    return grpc::internal::BlockingUnaryCall<grpc::ByteBuffer, grpc::ByteBuffer>(
        channel_.get(), rpc, &context, Bytes(bytes), &response);
  }

  // One call to `method` that the client half-closes without sending a message.
  grpc::Status WithoutAMessage(const std::string& method) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    grpc::CompletionQueue cq;
    std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call =
        generic_->PrepareCall(&context, kService + method, &cq);
    grpc::Status status;
    void* tag;
    bool ok;
    call->StartCall(this);
    EXPECT_TRUE(cq.Next(&tag, &ok) && ok);
    call->WritesDone(this);
    EXPECT_TRUE(cq.Next(&tag, &ok) && ok);
    call->Finish(&status, this);
    EXPECT_TRUE(cq.Next(&tag, &ok) && ok);
    return status;
  }

  std::unique_ptr<core::SamplerCore> core_;
  std::unique_ptr<SamplerServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::SamplerService::Stub> stub_;
  std::unique_ptr<grpc::GenericStub> generic_;
  grpc::CompletionQueue cq_;
  grpc::ClientContext holder_context_;
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> holder_;
};

// Each unary method and its request type.
const std::vector<std::pair<std::string, std::string>>& Methods() {
  static const auto* methods = new std::vector<std::pair<std::string, std::string>>{
      {"Sample", "SampleRequest"},
      {"RegisterRegion", "RegisterRegionRequest"},
      {"UnregisterRegion", "UnregisterRegionRequest"},
      {"ListRegions", "ListRegionsRequest"},
      {"GetServerInfo", "GetServerInfoRequest"}};
  return *methods;
}

// Served alike without a receive budget (0) and with one.
class UnaryMethods : public UnaryCalls, public ::testing::WithParamInterface<int64_t> {
 protected:
  void SetUp() override { Start(/*max_receive_bytes=*/GetParam(), absl::Seconds(60)); }
};

INSTANTIATE_TEST_SUITE_P(ReceiveBudget, UnaryMethods, ::testing::Values(0, kMessageBytes),
                         [](const ::testing::TestParamInfo<int64_t>& info) {
                           return info.param == 0 ? std::string("Off") : std::string("On");
                         });

TEST_P(UnaryMethods, SampleAnswersAndGetServerInfoReportsTheBudget) {
  v1::SampleResponse response;
  const grpc::Status sampled = SampleGreedy(&response);
  ASSERT_TRUE(sampled.ok()) << sampled.error_message();
  ASSERT_EQ(response.token_ids_size(), 1);
  EXPECT_EQ(response.token_ids(0), 2);

  v1::GetServerInfoResponse info;
  const grpc::Status status = ServerInfo(std::chrono::seconds(30), &info);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(info.limits().max_receive_bytes(), GetParam());
  EXPECT_EQ(info.limits().max_message_bytes(), kMessageBytes);
  EXPECT_EQ(server_->receive_gate().held(), 0);
}

TEST_P(UnaryMethods, BytesThatDoNotParseAreInvalidArgumentNamingEachMethodsRequestType) {
  // A length-delimited field 1 that claims 16 bytes and has 2.
  const std::string garbage("\x0a\x10\x01\x02", 4);
  for (const auto& [method, type] : Methods()) {
    const grpc::Status status = RawUnary(method, garbage);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << method;
    EXPECT_EQ(status.error_message(), "expected a serialized samplerd.v1." + type +
                                          ", got 4 bytes that do not parse (malformed protobuf, "
                                          "or a string field that is not UTF-8)")
        << method;
  }
}

TEST_P(UnaryMethods, ACallHalfClosedWithoutAMessageIsInvalidArgument) {
  for (const auto& [method, type] : Methods()) {
    const grpc::Status status = WithoutAMessage(method);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << method;
    EXPECT_EQ(status.error_message(),
              "expected a serialized samplerd.v1." + type +
                  ", got no message (the client half-closed the call without sending one)")
        << method;
  }
}

TEST_F(UnaryCalls, WithoutABudgetACallThatSendsNothingNeverReachesTheService) {
  // A plain unary method: gRPC waits for the request before it runs the method, so no receive
  // deadline (--chunk_timeout_ms, 100 ms here) answers the call; the client's own does.
  Start(/*max_receive_bytes=*/0, absl::Milliseconds(100));
  holder_context_.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(1));
  OpenSilentCall();
  v1::GetServerInfoResponse info;
  ASSERT_TRUE(ServerInfo(std::chrono::seconds(30), &info).ok());
  EXPECT_EQ(server_->receive_gate().held(), 0);
  const grpc::Status held = HolderStatus();
  EXPECT_EQ(held.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_EQ(held.error_message().find("--chunk_timeout_ms"), std::string::npos)
      << held.error_message();
  EXPECT_EQ(server_->receive_gate().held(), 0);
  EXPECT_EQ(server_->receive_gate().waiting(), 0);
}

// With --max_receive_bytes of one message: one request is received at a time.
class GatedUnary : public UnaryCalls {
 protected:
  void Start(absl::Duration chunk_timeout) { UnaryCalls::Start(kMessageBytes, chunk_timeout); }
};

TEST_F(GatedUnary, ACallWaitsWhileAnotherHoldsTheBudgetAndGoesInOnceItIsFree) {
  Start(absl::Seconds(60));
  StartHolder();
  v1::GetServerInfoResponse info;
  // Behind the holder: it waits, and leaves the queue at its deadline.
  EXPECT_EQ(ServerInfo(std::chrono::milliseconds(200), &info).error_code(),
            grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_TRUE(WaitFor([this] { return server_->receive_gate().waiting() == 0; }));

  // One waits without a deadline of its own; the holder goes away and the share passes to it.
  grpc::Status waited;
  std::thread waiter([&] { waited = ServerInfo(std::chrono::seconds(30), &info); });
  ASSERT_TRUE(WaitFor([this] { return server_->receive_gate().waiting() == 1; }));
  holder_context_.TryCancel();
  waiter.join();
  ASSERT_TRUE(waited.ok()) << waited.error_message();
  EXPECT_EQ(info.limits().max_receive_bytes(), kMessageBytes);
  EXPECT_EQ(HolderStatus().error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_TRUE(WaitFor([this] { return server_->receive_gate().held() == 0; }));
}

TEST_F(GatedUnary, AHolderWhoseRequestDoesNotArriveIsAnsweredAtTheChunkTimeout) {
  Start(absl::Milliseconds(300));
  StartHolder();
  v1::GetServerInfoResponse info;
  const grpc::Status waited = ServerInfo(std::chrono::seconds(30), &info);
  ASSERT_TRUE(waited.ok()) << waited.error_message();
  const grpc::Status held = HolderStatus();
  EXPECT_EQ(held.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_EQ(held.error_message(),
            "expected the whole request within 300 ms of its turn to be received "
            "(--chunk_timeout_ms), got it still arriving; its share of --max_receive_bytes went "
            "to the next call");
  EXPECT_TRUE(WaitFor([this] { return server_->receive_gate().held() == 0; }));
}

TEST_F(GatedUnary, ARequestLeavesTheBudgetOnceParsedNotWhenItIsAnswered) {
  Start(absl::Seconds(60));
  // Unary calls in a row each take the share and give it back before their answer.
  for (int i = 0; i < 20; ++i) {
    v1::GetServerInfoResponse info;
    ASSERT_TRUE(ServerInfo(std::chrono::seconds(30), &info).ok());
  }
  v1::SampleResponse response;
  const grpc::Status sampled = SampleGreedy(&response);
  ASSERT_TRUE(sampled.ok()) << sampled.error_message();
  EXPECT_EQ(response.token_ids_size(), 1);
  EXPECT_EQ(server_->receive_gate().held(), 0);
  EXPECT_EQ(server_->receive_gate().waiting(), 0);
}

TEST_F(GatedUnary, ConcurrentCallsThroughOneShareAreEachAnsweredOnce) {
  // Grants pass from call to call on gRPC's threads while calls complete and are deleted on
  // others (a grant once touched a call that its read had completed and deleted meanwhile:
  // valgrind caught it in the chunk-timeout test above); some callers give up at a 1 ms
  // deadline while they wait. Run it under valgrind too.
  Start(absl::Seconds(60));
  constexpr int kThreads = 8;
  constexpr int kCallsEach = 25;
  std::vector<std::thread> threads;
  std::vector<int> ok(kThreads, 0), gave_up(kThreads, 0), other(kThreads, 0);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kCallsEach; ++i) {
        v1::GetServerInfoResponse info;
        const auto timeout = std::chrono::milliseconds(i % 5 == 0 ? 1 : 30000);
        const grpc::Status status = ServerInfo(timeout, &info);
        if (status.ok()) {
          ++ok[t];
        } else if (status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
          ++gave_up[t];
        } else {
          ++other[t];
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  int answered = 0;
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_EQ(other[t], 0);
    EXPECT_GE(ok[t], kCallsEach * 4 / 5);  // those with a 30 s deadline
    answered += ok[t] + gave_up[t];
  }
  EXPECT_EQ(answered, kThreads * kCallsEach);
  EXPECT_TRUE(WaitFor([this] {
    return server_->receive_gate().held() == 0 && server_->receive_gate().waiting() == 0;
  }));
}

}  // namespace
}  // namespace samplerd::grpc_transport
