// DeviceSession against the real server (CPU backend, host plane) over the generated C++ stub:
// the call's lifetime (close, half-close, cancel, a second open, drain (SIGTERM)) and bad opens.
// The steps are in device_session_test.cc; the shared fixture in device_session_fixture.h.
#include <gtest/gtest.h>
#include <signal.h>

#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "tests/integration/device_session_fixture.h"

namespace samplerd::integration {
namespace {

TEST_F(DeviceSessions, ASecondOpenOnTheSameControlBlockIsAlreadyExists) {
  SessionBuffers buffers(client_.get(), "twice");
  ASSERT_TRUE(buffers.ok());
  std::unique_ptr<Call> first = OpenSession(client_.get(), buffers.Open());
  ASSERT_TRUE(first->is_open) << first->status.error_message();
  std::unique_ptr<Call> second = OpenSession(client_.get(), buffers.Open());
  ASSERT_FALSE(second->is_open);
  EXPECT_EQ(second->status.error_code(), grpc::StatusCode::ALREADY_EXISTS);
  EXPECT_TRUE(MentionsAny(second->status.error_message(), {"control block"}));
  grpc::Status status;
  EXPECT_EQ(CloseSession(first.get(), &status), 0);
  EXPECT_TRUE(status.ok());
}

TEST_F(DeviceSessions, OneOpenOverMaxDeviceSessionsIsResourceExhausted) {
  SessionBuffers a(client_.get(), "limit-a");
  SessionBuffers b(client_.get(), "limit-b");
  SessionBuffers c(client_.get(), "limit-c");
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  std::unique_ptr<Call> first = OpenSession(client_.get(), a.Open());
  std::unique_ptr<Call> second = OpenSession(client_.get(), b.Open());
  ASSERT_TRUE(first->is_open && second->is_open);
  std::unique_ptr<Call> third = OpenSession(client_.get(), c.Open());
  ASSERT_FALSE(third->is_open);
  EXPECT_EQ(third->status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_TRUE(MentionsAny(third->status.error_message(), {"--max_device_sessions"}));
  grpc::Status status;
  CloseSession(first.get(), &status);
  EXPECT_TRUE(status.ok());
  // A slot is free again.
  std::unique_ptr<Call> again = OpenSession(client_.get(), c.Open());
  EXPECT_TRUE(again->is_open) << again->status.error_message();
  if (again->is_open) CloseSession(again.get(), &status);
  CloseSession(second.get(), &status);
}

TEST_F(DeviceSessions, HalfClosingEndsTheSessionWithClosedAndOk) {
  SessionBuffers buffers(client_.get(), "halfclose");
  ASSERT_TRUE(buffers.ok());
  std::unique_ptr<Call> call = OpenSession(client_.get(), buffers.Open());
  ASSERT_TRUE(call->is_open) << call->status.error_message();
  ASSERT_EQ(buffers.Step(0), static_cast<int>(SAMPLERD_STEP_BAD_BATCH));  // one (empty) step
  call->stream->WritesDone();
  v1::DeviceSessionResponse response;
  ASSERT_TRUE(call->stream->Read(&response));
  ASSERT_TRUE(response.has_closed());
  EXPECT_EQ(response.closed().steps(), 1u);
  EXPECT_TRUE(call->stream->Finish().ok());
  EXPECT_EQ(buffers.StepStatus(), SAMPLERD_STEP_ABORTED);
}

TEST_F(DeviceSessions, CancellingTheCallEndsTheSessionAndReleasesTheEngineWait) {
  SessionBuffers buffers(client_.get(), "cancel");
  ASSERT_TRUE(buffers.ok());
  std::unique_ptr<Call> call = OpenSession(client_.get(), buffers.Open());
  ASSERT_TRUE(call->is_open) << call->status.error_message();
  ASSERT_EQ(OpenSessions(), 1);
  call->context.TryCancel();
  EXPECT_EQ(call->stream->Finish().error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_TRUE(WaitForNoSessions());
  // The wait an engine would have pending completes, with ABORTED.
  EXPECT_TRUE(buffers.WaitDone());
  EXPECT_EQ(buffers.StepStatus(), SAMPLERD_STEP_ABORTED);
}

TEST_F(DeviceSessions, ASecondOpenOnTheCallEndsItInvalidArgument) {
  SessionBuffers buffers(client_.get(), "reopen");
  ASSERT_TRUE(buffers.ok());
  std::unique_ptr<Call> call = OpenSession(client_.get(), buffers.Open());
  ASSERT_TRUE(call->is_open) << call->status.error_message();
  v1::DeviceSessionRequest request;
  *request.mutable_open() = buffers.Open();
  ASSERT_TRUE(call->stream->Write(request));
  v1::DeviceSessionResponse response;
  EXPECT_FALSE(call->stream->Read(&response));
  const grpc::Status status = call->stream->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(MentionsAny(status.error_message(), {"second open"}));
  EXPECT_EQ(OpenSessions(), 0);  // closed before the call ended
}

TEST_F(DeviceSessions, TheFirstMessageMustBeOpen) {
  grpc::ClientContext context;
  std::unique_ptr<Stream> stream = client_->stub()->DeviceSession(&context);
  v1::DeviceSessionRequest request;
  request.mutable_close();
  ASSERT_TRUE(stream->Write(request));
  v1::DeviceSessionResponse response;
  EXPECT_FALSE(stream->Read(&response));
  const grpc::Status status = stream->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(status.error_message(),
            "expected the first DeviceSession message to set open, got close");
}

TEST_F(DeviceSessions, TheGpuPlaneOnThisCpuServerIsFailedPrecondition) {
  SessionBuffers buffers(client_.get(), "gpuplane");
  ASSERT_TRUE(buffers.ok());
  v1::DeviceSessionOpen open = buffers.Open();
  open.set_plane(v1::DEVICE_PLANE_GPU);
  std::unique_ptr<Call> call = OpenSession(client_.get(), open);
  ASSERT_FALSE(call->is_open);
  EXPECT_EQ(call->status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_TRUE(MentionsAny(call->status.error_message(), {"samples on the CPU"}));
}

TEST_F(DeviceSessions, ASliceTooSmallIsOutOfRangeAndAnUnknownRegionNotFound) {
  SessionBuffers buffers(client_.get(), "small");
  ASSERT_TRUE(buffers.ok());
  v1::DeviceSessionOpen open = buffers.Open();
  open.set_max_batch(kM * 4);  // the logits slice is far too small now
  std::unique_ptr<Call> call = OpenSession(client_.get(), open);
  ASSERT_FALSE(call->is_open);
  EXPECT_EQ(call->status.error_code(), grpc::StatusCode::OUT_OF_RANGE);
  EXPECT_TRUE(MentionsAny(call->status.error_message(), {"DeviceSessionOpen.logits"}));
  open = buffers.Open();
  open.mutable_params()->set_region("unknown");
  call = OpenSession(client_.get(), open);
  ASSERT_FALSE(call->is_open);
  EXPECT_EQ(call->status.error_code(), grpc::StatusCode::NOT_FOUND);
}

// ---- With a server of their own --------------------------------------------------------------

TEST(DeviceSessionDrain, SigtermEndsAnOpenSessionUnavailableAndAbortsTheEngineWait) {
  std::string error;
  std::unique_ptr<ServerProcess> server = ServerProcess::Start(CpuServerOptions(), &error);
  ASSERT_NE(server, nullptr) << error;
  auto client = std::make_unique<Client>(server->target());
  SessionBuffers buffers(client.get(), "drain");
  ASSERT_TRUE(buffers.ok());
  std::unique_ptr<Call> call = OpenSession(client.get(), buffers.Open());
  ASSERT_TRUE(call->is_open) << call->status.error_message();
  ASSERT_EQ(buffers.Step(0), static_cast<int>(SAMPLERD_STEP_BAD_BATCH));  // done is 0 again

  ASSERT_EQ(kill(server->pid(), SIGTERM), 0);
  v1::DeviceSessionResponse response;
  EXPECT_FALSE(call->stream->Read(&response));  // the call ends: no `closed`
  const grpc::Status status = call->stream->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
  EXPECT_TRUE(buffers.WaitDone());
  EXPECT_EQ(buffers.StepStatus(), SAMPLERD_STEP_ABORTED);
  // The client goes first: a sync client notices the server's GOAWAY only within 5 s.
  call.reset();
  client.reset();
  EXPECT_EQ(server->Stop(), 0) << server->Log();
}

// Regression (redteam25 F2): a host-plane session copies its processors rows into server
// memory, and its capacities were allocated whole at open (100M history entries over a sparse
// shm object: 16 -> 876 MiB RSS). The processors buffer is bounded like one Sample request's
// lists, by --max_message_bytes; the refusal is precise and the server goes on serving.
TEST(DeviceSessionCapacities, AProcessorsBufferOverMaxMessageBytesIsResourceExhaustedAndServed) {
  constexpr int64_t kMaxMessage = 65536;
  ServerProcess::Options options = CpuServerOptions();
  options.extra_args = {"--max_message_bytes=" + std::to_string(kMaxMessage),
                        "--host_plane_threads=1"};
  std::string error;
  std::unique_ptr<ServerProcess> server = ServerProcess::Start(options, &error);
  ASSERT_NE(server, nullptr) << error;
  {
    Client client(server->target());
    SessionBuffers buffers(&client, "capacities");
    ASSERT_TRUE(buffers.ok());
    const uint32_t most = kM * kV;  // each capacity's own bound: max_batch * vocab
    const uint64_t too_big = samplerd_processors_bytes(kM, most, most);
    ASSERT_GT(too_big, static_cast<uint64_t>(kMaxMessage));
    core::TestShm processors(too_big, 0600, "capacities-procs");
    ASSERT_TRUE(processors.ok());
    ASSERT_TRUE(client.RegisterHostShm("capacities-procs", processors.key(), 0, too_big).ok());

    v1::DeviceSessionOpen open = buffers.Open();
    open.mutable_processors()->set_region("capacities-procs");
    open.set_logit_bias_capacity(most);
    open.set_token_history_capacity(most);
    std::unique_ptr<Call> call = OpenSession(&client, open);
    ASSERT_FALSE(call->is_open);
    EXPECT_EQ(call->status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
    EXPECT_EQ(
        call->status.error_message(),
        absl::StrCat("expected a DeviceSessionOpen.processors buffer of at most ", kMaxMessage,
                     " bytes (--max_message_bytes, as the same lists in one Sample "
                     "request), got ",
                     too_big, " bytes (samplerd_processors_bytes(max_batch 8, ",
                     "logit_bias_capacity 4096, token_history_capacity 4096)): open it "
                     "with smaller capacities"));

    // Half the capacities fit: the session opens and steps.
    open.set_logit_bias_capacity(most / 2);
    open.set_token_history_capacity(most / 2);
    ASSERT_LE(samplerd_processors_bytes(kM, most / 2, most / 2),
              static_cast<uint64_t>(kMaxMessage));
    call = OpenSession(&client, open);
    ASSERT_TRUE(call->is_open) << call->status.error_message();
    EXPECT_EQ(buffers.Step(1), static_cast<int>(SAMPLERD_STEP_OK));
    grpc::Status status;
    EXPECT_EQ(CloseSession(call.get(), &status), 1);
    EXPECT_TRUE(status.ok()) << status.error_message();
  }
  EXPECT_EQ(server->Stop(), 0) << server->Log();
}

// Each host-plane session reserves a host copy of a full step's logits (max_batch x V elements);
// --max_host_session_bytes bounds their sum, which GetServerInfo reports. An open past it is
// refused precisely, the server goes on serving, and a close makes room.
TEST(DeviceSessionHostBytes, AnOpenPastMaxHostSessionBytesIsResourceExhaustedUntilOneCloses) {
  constexpr int64_t kSessionBytes = int64_t{kM} * kV * 4;  // fp32
  ServerProcess::Options options = CpuServerOptions();
  options.extra_args = {"--max_host_session_bytes=" + std::to_string(kSessionBytes),
                        "--host_plane_threads=1"};
  std::string error;
  std::unique_ptr<ServerProcess> server = ServerProcess::Start(options, &error);
  ASSERT_NE(server, nullptr) << error;
  {
    Client client(server->target());
    v1::GetServerInfoResponse info;
    ASSERT_TRUE(client.GetServerInfo(&info).ok());
    EXPECT_EQ(info.limits().max_host_session_bytes(), kSessionBytes);
    SessionBuffers a(&client, "hostbytes-a");
    SessionBuffers b(&client, "hostbytes-b");
    ASSERT_TRUE(a.ok() && b.ok());
    std::unique_ptr<Call> first = OpenSession(&client, a.Open());
    ASSERT_TRUE(first->is_open) << first->status.error_message();
    std::unique_ptr<Call> second = OpenSession(&client, b.Open());
    ASSERT_FALSE(second->is_open);
    EXPECT_EQ(second->status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
    EXPECT_EQ(second->status.error_message(),
              absl::StrCat("expected host-plane device sessions reserving at most ", kSessionBytes,
                           " bytes in total for their copies of a step's logits "
                           "(--max_host_session_bytes), got ",
                           kSessionBytes, " bytes held by the open ones plus ", kSessionBytes,
                           " for this one (max_batch ", kM, " x vocab ", kV,
                           " x 4 bytes fp32): open it with a smaller max_batch, close a session, "
                           "or raise --max_host_session_bytes"));
    // The open session goes on stepping; closing it makes room for the other.
    EXPECT_EQ(a.Step(1), static_cast<int>(SAMPLERD_STEP_OK));
    grpc::Status status;
    EXPECT_EQ(CloseSession(first.get(), &status), 1);
    EXPECT_TRUE(status.ok()) << status.error_message();
    second = OpenSession(&client, b.Open());
    ASSERT_TRUE(second->is_open) << second->status.error_message();
    EXPECT_EQ(b.Step(1), static_cast<int>(SAMPLERD_STEP_OK));
    EXPECT_EQ(CloseSession(second.get(), &status), 1);
    EXPECT_TRUE(status.ok()) << status.error_message();
  }
  EXPECT_EQ(server->Stop(), 0) << server->Log();
}

TEST(DeviceSessionPeers, OverTcpWithoutAllowRemoteRegionsItIsPermissionDenied) {
  const int port = PickFreeTcpPort();
  ASSERT_GT(port, 0);
  ServerProcess::Options options = CpuServerOptions();
  options.listen = "127.0.0.1:" + std::to_string(port);
  std::string error;
  std::unique_ptr<ServerProcess> server = ServerProcess::Start(options, &error);
  ASSERT_NE(server, nullptr) << error;
  {
    Client client(server->target());
    v1::DeviceSessionOpen open;
    open.set_dtype(v1::DTYPE_FP32);
    std::unique_ptr<Call> call = OpenSession(&client, open);
    ASSERT_FALSE(call->is_open);
    EXPECT_EQ(call->status.error_code(), grpc::StatusCode::PERMISSION_DENIED);
    EXPECT_TRUE(MentionsAny(call->status.error_message(), {"allow_remote_regions"}));
  }
  EXPECT_EQ(server->Stop(), 0) << server->Log();
}

}  // namespace
}  // namespace samplerd::integration
