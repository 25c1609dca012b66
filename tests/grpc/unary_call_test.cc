// The unary methods served as gated streams (unary_call.h), through an in-process SamplerServer
// whose --max_receive_bytes lets one request in at a time: a call waits while another holds the
// share, leaves the queue at its deadline, and goes in once the holder is done; a holder whose
// request does not arrive is answered DEADLINE_EXCEEDED after --chunk_timeout_ms.
//
// The holder is a raw call to Sample that sends no message: it takes the share and keeps it, as
// a client stalling in the middle of a large request would.
#include <grpcpp/generic/generic_stub.h>
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "samplerd/v1/sampler.grpc.pb.h"
#include "service/core/backend/cpu_sampler.h"
#include "service/grpc/server.h"

namespace samplerd::grpc_transport {
namespace {

constexpr int kMessageBytes = 1 << 20;

class GatedUnary : public ::testing::Test {
 protected:
  void Start(absl::Duration chunk_timeout) {
    core_ = std::make_unique<core::SamplerCore>(
        core::CoreOptions{}, std::make_unique<core::CpuSampler>(1), /*seed_start=*/7);
    ServerOptions options;
    options.listen = {"127.0.0.1:0"};
    options.max_message_bytes = kMessageBytes;
    options.max_receive_bytes = kMessageBytes;  // one request received at a time
    options.chunk_timeout = chunk_timeout;
    absl::StatusOr<std::unique_ptr<SamplerServer>> server =
        SamplerServer::Start(options, core_.get());
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    channel_ =
        grpc::CreateChannel(server_->bound_addresses()[0], grpc::InsecureChannelCredentials());
    stub_ = v1::SamplerService::NewStub(channel_);
  }

  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown(absl::Now());
  }

  // Opens a Sample call that sends nothing, and waits until it holds the gate's share.
  void StartHolder() {
    generic_ = std::make_unique<grpc::GenericStub>(channel_);
    holder_ = generic_->PrepareCall(&holder_context_, "/samplerd.v1.SamplerService/Sample", &cq_);
    holder_->StartCall(this);
    void* tag;
    bool ok;
    ASSERT_TRUE(cq_.Next(&tag, &ok) && ok);
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

  std::unique_ptr<core::SamplerCore> core_;
  std::unique_ptr<SamplerServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::SamplerService::Stub> stub_;
  std::unique_ptr<grpc::GenericStub> generic_;
  grpc::CompletionQueue cq_;
  grpc::ClientContext holder_context_;
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> holder_;
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
  v1::SampleRequest request;
  request.mutable_logits()->set_dtype(v1::DTYPE_FP32);
  request.mutable_logits()->add_shape(1);
  request.mutable_logits()->add_shape(4);
  request.mutable_logits()->set_inline_data(std::string(16, '\0'));
  request.add_params()->set_temperature(0);
  grpc::ClientContext context;
  v1::SampleResponse response;
  const grpc::Status sampled = stub_->Sample(&context, request, &response);
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
