// Region RPCs through an in-process SamplerServer listening on a unix socket and on TCP: who may
// register (unix peers; TCP only with allow_remote_regions), and an unregister while a request
// is in flight, held inside the backend until the test lets it go.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "samplerd/client.h"
#include "samplerd/host_shm_buffer.h"
#include "service/core/backend/cpu_sampler.h"
#include "service/grpc/server.h"

namespace samplerd::grpc_transport {
namespace {

using ::testing::HasSubstr;

// The CPU backend, optionally held at the start of Sample until the test releases it.
class HeldCpuSampler : public core::Sampler {
 public:
  absl::Status Sample(const core::ValidatedBatch& batch, const core::SampleIo& io,
                      core::SampleResult* result) override {
    if (entered_ != nullptr) std::exchange(entered_, nullptr)->Notify();  // once
    if (hold_ != nullptr) hold_->WaitForNotification();
    return cpu_.Sample(batch, io, result);
  }
  core::BackendKind kind() const override { return cpu_.kind(); }
  const core::DeviceInfo& device() const override { return cpu_.device(); }

  absl::Notification* entered_ = nullptr;
  absl::Notification* hold_ = nullptr;

 private:
  core::CpuSampler cpu_{1};
};

std::string UniqueKey(const std::string& tag) {
  static int counter = 0;
  return "/samplerd-grpctest-" + std::to_string(getpid()) + "-" + std::to_string(counter++) + "-" +
         tag;
}

class RegionService : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    auto sampler = std::make_unique<HeldCpuSampler>();
    sampler_ = sampler.get();
    core_ = std::make_unique<core::SamplerCore>(core::CoreOptions{}, std::move(sampler), 5);
    std::string dir = std::filesystem::temp_directory_path().string() + "/samplerd-reg-XXXXXX";
    ASSERT_NE(mkdtemp(dir.data()), nullptr);
    dir_ = dir;
    ServerOptions options;
    options.listen = {"unix://" + dir_ + "/s.sock", "127.0.0.1:0"};
    options.allow_remote_regions = GetParam();
    absl::StatusOr<std::unique_ptr<SamplerServer>> server =
        SamplerServer::Start(options, core_.get());
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    unix_ = std::make_unique<Client>(server_->bound_addresses()[0]);
    tcp_ = std::make_unique<Client>(server_->bound_addresses()[1]);

    logits_.resize(2 * 300);
    std::mt19937 rng(3);
    std::normal_distribution<float> normal(0.0f, 2.0f);
    for (float& x : logits_) x = normal(rng);
    std::string error;
    shm_ = HostShmBuffer::Create(UniqueKey("logits"), logits_.size() * 4 + 64, &error);
    ASSERT_NE(shm_, nullptr) << error;
    std::memcpy(shm_->data(), logits_.data(), logits_.size() * 4);
  }

  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown(absl::Now());
    std::error_code ignored;
    if (!dir_.empty()) std::filesystem::remove_all(dir_, ignored);
  }

  v1::SampleRequest RegionRequest() const {
    v1::SamplingParams params;
    params.set_seed(9);
    params.set_top_k(20);
    return MakeRegionRequest("logits", 0, v1::DTYPE_FP32, 2, 300, {params});
  }

  std::vector<int32_t> InlineTokens() {
    v1::SampleRequest request = RegionRequest();
    request.mutable_logits()->set_inline_data(
        std::string(reinterpret_cast<const char*>(logits_.data()), logits_.size() * sizeof(float)));
    v1::SampleResponse response;
    EXPECT_TRUE(unix_->Sample(request, &response).ok());
    return {response.token_ids().begin(), response.token_ids().end()};
  }

  HeldCpuSampler* sampler_ = nullptr;
  std::unique_ptr<core::SamplerCore> core_;
  std::unique_ptr<SamplerServer> server_;
  std::string dir_;
  std::unique_ptr<Client> unix_;
  std::unique_ptr<Client> tcp_;
  std::vector<float> logits_;
  std::unique_ptr<HostShmBuffer> shm_;
};

TEST_P(RegionService, UnixClientsMayAlwaysRegisterTcpClientsOnlyWhenAllowed) {
  const bool allowed = GetParam();
  v1::RegionInfo info;
  ASSERT_TRUE(unix_->RegisterHostShm("logits", shm_->key(), 0, shm_->size(), &info).ok());
  EXPECT_EQ(info.kind(), v1::REGION_KIND_HOST_SHM);

  const grpc::StatusCode want =
      allowed ? grpc::StatusCode::OK : grpc::StatusCode::PERMISSION_DENIED;
  const grpc::Status registered = tcp_->RegisterHostShm("tcp", shm_->key(), 0, 64);
  EXPECT_EQ(registered.error_code(), want) << registered.error_message();
  if (!allowed) {
    EXPECT_THAT(registered.error_message(), HasSubstr("--allow_remote_regions"));
  }
  std::vector<v1::RegionInfo> regions;
  EXPECT_EQ(tcp_->ListRegions(&regions).error_code(), want);
  v1::SampleResponse response;
  EXPECT_EQ(tcp_->Sample(RegionRequest(), &response).error_code(), want);
  std::unique_ptr<SampleSession> session = tcp_->OpenStream();
  EXPECT_EQ(session->Step(RegionRequest(), &response).error_code(), want);
  EXPECT_TRUE(session->Close().ok());
  EXPECT_EQ(tcp_->Unregister("logits").error_code(), want);
  // Inline requests are everyone's.
  v1::SampleRequest inline_request = RegionRequest();
  inline_request.mutable_logits()->set_inline_data(std::string(2 * 300 * 4, '\0'));
  EXPECT_TRUE(tcp_->Sample(inline_request, &response).ok());
}

TEST_P(RegionService, UnregisterDuringFlightLetsTheRequestFinish) {
  const std::vector<int32_t> expected = InlineTokens();
  ASSERT_TRUE(unix_->RegisterHostShm("logits", shm_->key(), 0, shm_->size()).ok());
  absl::Notification entered, hold;
  sampler_->entered_ = &entered;
  sampler_->hold_ = &hold;
  v1::SampleResponse in_flight;
  grpc::Status in_flight_status;
  std::thread caller([&] { in_flight_status = unix_->Sample(RegionRequest(), &in_flight); });
  entered.WaitForNotification();  // the request holds its lease inside the backend

  EXPECT_TRUE(unix_->Unregister("logits").ok());
  std::vector<v1::RegionInfo> regions;
  ASSERT_TRUE(unix_->ListRegions(&regions).ok());
  EXPECT_TRUE(regions.empty());
  v1::SampleResponse later;
  EXPECT_EQ(unix_->Sample(RegionRequest(), &later).error_code(), grpc::StatusCode::NOT_FOUND);
  // The name is free again at once.
  EXPECT_TRUE(unix_->RegisterHostShm("logits", shm_->key(), 0, 64).ok());

  hold.Notify();
  caller.join();
  ASSERT_TRUE(in_flight_status.ok()) << in_flight_status.error_message();
  EXPECT_EQ(std::vector<int32_t>(in_flight.token_ids().begin(), in_flight.token_ids().end()),
            expected);
}

INSTANTIATE_TEST_SUITE_P(AllowRemote, RegionService, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "Allowed" : "Refused";
                         });

}  // namespace
}  // namespace samplerd::grpc_transport
