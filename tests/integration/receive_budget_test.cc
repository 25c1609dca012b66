// --max_receive_bytes on the real binary: a burst of large unary Sample requests from several
// connections is received a budget's worth at a time, so the server's peak RSS stays near
// what one received request, the admitted bytes and the idle server need together, however
// many arrive; every request is answered OK or with the documented admission status, none
// fails for the budget; an idle SampleStream opened before the burst (an engine's) is
// untouched by it; and the server serves as before afterwards.
//
// Without the budget the same burst is held whole before admission: 16 requests of 16 MiB took
// the server to 280 to 332 MiB over its idle RSS on the 2-core VM (5 runs), against the bound of
// 168 MiB here.
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "samplerd/v1/sampler.grpc.pb.h"
#include "tests/integration/integration_fixture.h"

namespace samplerd::integration {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;
constexpr int64_t kMessageBytes = 16 * kMiB;
constexpr int64_t kReceiveBytes = kMessageBytes;       // one request received at a time
constexpr int64_t kInflightBytes = 2 * kMessageBytes;  // two admitted at a time
constexpr int kRequests = 16;
constexpr int kChannels = 4;
// What the server may hold beyond its idle RSS: a received request at its parse peak (2.5x,
// deploy/README.md), the admitted bytes once (their received bytes are freed when parsed), and
// room for the sampler's buffers, gRPC's and the allocator's (measured with the budget: 88 to
// 108 MiB over idle in all, 121 with two runs at once beside two busy loops on 2 cores).
constexpr int64_t kMarginBytes = 96 * kMiB;
constexpr int64_t kBoundOverIdle = 5 * kReceiveBytes / 2 + kInflightBytes + kMarginBytes;

// VmRSS or VmHWM of process `pid`, bytes; -1 when unreadable.
int64_t ProcessMemory(pid_t pid, const std::string& field) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::stoll(line.substr(field.size() + 1)) * 1024;
  }
  return -1;
}

class ReceiveBudget : public ServerSuite {
 protected:
  static void SetUpTestSuite() {
    ServerProcess::Options options = CpuServerOptions();
    options.extra_args.push_back("--max_message_bytes=" + std::to_string(kMessageBytes));
    options.extra_args.push_back("--max_receive_bytes=" + std::to_string(kReceiveBytes));
    options.extra_args.push_back("--max_inflight_bytes=" + std::to_string(kInflightBytes));
    StartServer(options);
  }

  // A channel of its own (its own connection): channels with equal arguments share one.
  std::shared_ptr<grpc::Channel> NewChannel(int index) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    args.SetInt("samplerd.test.channel", index);
    args.SetMaxSendMessageSize(-1);
    return grpc::CreateCustomChannel(server().target(), grpc::InsecureChannelCredentials(), args);
  }
};

// A [4, V] fp32 request just under kMessageBytes whose greedy tokens are known.
v1::SampleRequest LargeRequest() {
  const int64_t vocab = (kMessageBytes - 4096) / 4 / 4;
  Logits logits{4, vocab, std::vector<float>(static_cast<size_t>(4 * vocab), 0.0f)};
  for (int64_t r = 0; r < 4; ++r) logits.row(r)[r * 1000 + 7] = 1.0f;
  return logits.Request({Greedy()});
}

TEST_F(ReceiveBudget, ABurstOfLargeRequestsIsReceivedWithinTheBudgetAndEveryOneIsAnswered) {
  const pid_t pid = server().pid();
  // The idle server, warmed by one call (its gRPC threads and buffers exist).
  const GreedyCase c = KnownGreedyBatch();
  v1::SampleResponse warm;
  ASSERT_TRUE(client_->Sample(c.logits.Request({Greedy()}), &warm).ok());
  const int64_t idle = ProcessMemory(pid, "VmRSS");
  ASSERT_GT(idle, 0);

  // An engine's idle stream, open before the burst.
  std::shared_ptr<grpc::Channel> stream_channel = NewChannel(kChannels);
  std::unique_ptr<v1::SamplerService::Stub> stream_stub =
      v1::SamplerService::NewStub(stream_channel);
  grpc::ClientContext stream_context;
  auto stream = stream_stub->SampleStream(&stream_context);
  v1::SampleStreamRequest step;
  *step.mutable_request() = c.logits.Request({Greedy()});
  v1::SampleStreamResponse answer;
  ASSERT_TRUE(stream->Write(step) && stream->Read(&answer));
  EXPECT_EQ(Tokens(answer.response()), c.expected);

  const v1::SampleRequest request = LargeRequest();
  ASSERT_LT(request.ByteSizeLong(), static_cast<size_t>(kMessageBytes));
  std::vector<std::unique_ptr<v1::SamplerService::Stub>> stubs;
  for (int i = 0; i < kChannels; ++i) stubs.push_back(v1::SamplerService::NewStub(NewChannel(i)));
  std::vector<grpc::Status> statuses(kRequests);
  std::vector<v1::SampleResponse> responses(kRequests);
  absl::Notification go;
  std::vector<std::thread> senders;
  for (int i = 0; i < kRequests; ++i) {
    senders.emplace_back([&, i] {
      grpc::ClientContext context;
      context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
      go.WaitForNotification();
      statuses[i] = stubs[i % kChannels]->Sample(&context, request, &responses[i]);
    });
  }
  go.Notify();
  for (std::thread& sender : senders) sender.join();

  int ok = 0;
  for (int i = 0; i < kRequests; ++i) {
    if (statuses[i].ok()) {
      ++ok;
      EXPECT_EQ(Tokens(responses[i]), (std::vector<int32_t>{7, 1007, 2007, 3007}));
      continue;
    }
    // Admission may refuse what does not fit beside the admitted requests, as it always did;
    // the receive budget itself refuses nothing.
    EXPECT_EQ(statuses[i].error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
        << statuses[i].error_message();
    EXPECT_TRUE(MentionsAny(statuses[i].error_message(), {"--max_inflight_bytes"}));
  }
  EXPECT_GE(ok, 1);
  // Not under ASan (kAddressSanitizer): its quarantine keeps every received byte (479 MiB peak
  // over 67 idle there); the rest of the test runs.
  const int64_t peak = ProcessMemory(pid, "VmHWM");
  if (!kAddressSanitizer) {
    EXPECT_LE(peak - idle, kBoundOverIdle)
        << "peak RSS " << peak / kMiB << " MiB, idle " << idle / kMiB << " MiB, " << ok << " of "
        << kRequests << " requests OK";
  }

  // The engine's stream, and the server, serve as before.
  ASSERT_TRUE(stream->Write(step) && stream->Read(&answer));
  EXPECT_EQ(Tokens(answer.response()), c.expected);
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
  v1::SampleResponse after;
  ASSERT_TRUE(client_->Sample(c.logits.Request({Greedy()}), &after).ok());
  EXPECT_EQ(Tokens(after), c.expected);
}

TEST_F(ReceiveBudget, GetServerInfoReportsTheBudget) {
  v1::GetServerInfoResponse info;
  ASSERT_TRUE(client_->GetServerInfo(&info).ok());
  EXPECT_EQ(info.limits().max_receive_bytes(), kReceiveBytes);
  EXPECT_EQ(info.limits().max_message_bytes(), kMessageBytes);
}

}  // namespace
}  // namespace samplerd::integration
