// Regions end to end through the real samplerd (CPU backend) and the C++ client: host shm over
// a unix socket (register, sample at an offset, output region, list, unregister, re-register),
// the tables of bad registrations and bad region requests with their exact codes, messages that
// never echo keys or handles, and registration over TCP with and without
// --allow_remote_regions. (An unregister while a request is in flight is tested in
// tests/grpc/region_service_test.cc, where the backend can hold the request.)
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "samplerd/host_shm_buffer.h"
#include "tests/integration/integration_fixture.h"

namespace samplerd::integration {
namespace {

using C = grpc::StatusCode;

constexpr char kSecret[] = "s3cr3t";
constexpr int64_t kBatch = 3;
constexpr int64_t kVocab = 2000;
constexpr uint64_t kLogitsBytes = kBatch * kVocab * sizeof(float);
constexpr uint64_t kRegionOffset = 100;   // where the region starts in the object
constexpr uint64_t kLogitsOffset = 4000;  // where the logits start in the region (unaligned)
constexpr uint64_t kOutputOffset = kLogitsOffset + kLogitsBytes;  // token ids after them
constexpr uint64_t kObjectBytes = kRegionOffset + kOutputOffset + 64;

std::string UniqueKey(const std::string& tag) {
  static int counter = 0;
  return "/samplerd-it-" + std::to_string(getpid()) + "-" + std::to_string(counter++) + "-" + tag;
}

// Starts a CPU server with `flag` added, which must fail; returns what ServerProcess::Start
// said.
std::string StartupErrorWith(const std::string& flag) {
  ServerProcess::Options options = CpuServerOptions();
  options.extra_args.push_back(flag);
  std::string error;
  EXPECT_EQ(ServerProcess::Start(options, &error), nullptr) << flag;
  return error;
}

class Regions : public ServerSuite {
 protected:
  void SetUp() override {
    ServerSuite::SetUp();
    logits_ = RandomLogits(kBatch, kVocab, /*seed=*/41);
    std::string error;
    shm_ = HostShmBuffer::Create(UniqueKey(kSecret), kObjectBytes, &error);
    ASSERT_NE(shm_, nullptr) << error;
    std::memcpy(Object() + kRegionOffset + kLogitsOffset, logits_.values.data(), kLogitsBytes);
  }

  void TearDown() override {
    std::vector<v1::RegionInfo> regions;
    if (client_->ListRegions(&regions).ok()) {
      for (const v1::RegionInfo& r : regions) client_->Unregister(r.name()).ok();
    }
    ServerSuite::TearDown();
  }

  uint8_t* Object() const { return static_cast<uint8_t*>(shm_->data()); }

  grpc::Status RegisterLogits(const std::string& name = "logits") {
    return client_->RegisterHostShm(name, shm_->key(), kRegionOffset, kObjectBytes - kRegionOffset);
  }

  static std::vector<v1::SamplingParams> Params() { return {TopKTopP(17)}; }

  // Starts the suite's CPU server with `flag` added (from a subclass's SetUpTestSuite).
  static void StartWithFlag(const std::string& flag) {
    ServerProcess::Options options = CpuServerOptions();
    options.extra_args.push_back(flag);
    StartServer(options);
  }

  Logits logits_;
  std::unique_ptr<HostShmBuffer> shm_;
};

TEST_F(Regions, HostShmEndToEnd) {
  v1::SampleResponse inline_response;
  ASSERT_TRUE(client_->Sample(logits_.Request(Params()), &inline_response).ok());

  v1::RegionInfo info;
  const grpc::Status registered = client_->RegisterHostShm("logits", shm_->key(), kRegionOffset,
                                                           kObjectBytes - kRegionOffset, &info);
  ASSERT_TRUE(registered.ok()) << registered.error_message();
  EXPECT_EQ(info.name(), "logits");
  EXPECT_EQ(info.kind(), v1::REGION_KIND_HOST_SHM);
  EXPECT_EQ(info.byte_size(), kObjectBytes - kRegionOffset);
  EXPECT_TRUE(info.device().empty());

  v1::SampleRequest request =
      MakeRegionRequest("logits", kLogitsOffset, v1::DTYPE_FP32, kBatch, kVocab, Params());
  request.mutable_output()->set_region("logits");
  request.mutable_output()->set_offset(kOutputOffset);
  v1::SampleResponse response;
  const grpc::Status sampled = client_->Sample(request, &response);
  ASSERT_TRUE(sampled.ok()) << sampled.error_message();
  EXPECT_EQ(Tokens(response), Tokens(inline_response));
  std::vector<int32_t> written(kBatch);
  std::memcpy(written.data(), Object() + kRegionOffset + kOutputOffset, kBatch * 4);
  EXPECT_EQ(written, Tokens(inline_response));

  // The same through a stream step.
  std::unique_ptr<SampleSession> session = client_->OpenStream();
  v1::SampleResponse streamed;
  ASSERT_TRUE(session->Step(request, &streamed).ok());
  EXPECT_EQ(Tokens(streamed), Tokens(inline_response));
  EXPECT_TRUE(session->Close().ok());

  std::vector<v1::RegionInfo> regions;
  ASSERT_TRUE(client_->ListRegions(&regions).ok());
  ASSERT_EQ(regions.size(), 1u);
  EXPECT_EQ(regions[0].name(), "logits");

  ASSERT_TRUE(client_->Unregister("logits").ok());
  ASSERT_TRUE(client_->ListRegions(&regions).ok());
  EXPECT_TRUE(regions.empty());
  EXPECT_EQ(client_->Sample(request, &response).error_code(), C::NOT_FOUND);
  EXPECT_EQ(client_->Unregister("logits").error_code(), C::NOT_FOUND);

  // The name can be registered again, here over the logits alone (region offset = their start).
  ASSERT_TRUE(
      client_->RegisterHostShm("logits", shm_->key(), kRegionOffset + kLogitsOffset, kLogitsBytes)
          .ok());
  ASSERT_TRUE(client_
                  ->Sample(MakeRegionRequest("logits", 0, v1::DTYPE_FP32, kBatch, kVocab, Params()),
                           &response)
                  .ok());
  EXPECT_EQ(Tokens(response), Tokens(inline_response));
}

// Resizes the shm object `key` (as a client might, by mistake or not).
void ResizeObject(const std::string& key, off_t bytes) {
  const int fd = shm_open(key.c_str(), O_RDWR, 0);
  ASSERT_GE(fd, 0) << std::strerror(errno);
  ASSERT_EQ(ftruncate(fd, bytes), 0) << std::strerror(errno);
  close(fd);
}

TEST_F(Regions, TruncatedObjectIsFailedPreconditionAndTheServerKeepsServing) {
  ASSERT_TRUE(RegisterLogits().ok());
  const v1::SampleRequest request =
      MakeRegionRequest("logits", kLogitsOffset, v1::DTYPE_FP32, kBatch, kVocab, Params());
  v1::SampleResponse response;
  ASSERT_TRUE(client_->Sample(request, &response).ok());  // the pages are mapped and touched

  ResizeObject(shm_->key(), 0);  // every page of the region is now past the object's end
  grpc::Status status = client_->Sample(request, &response);
  EXPECT_EQ(status.error_code(), C::FAILED_PRECONDITION) << status.error_message();
  EXPECT_NE(status.error_message().find("the logits region"), std::string::npos);
  EXPECT_NE(status.error_message().find("truncated after RegisterRegion"), std::string::npos)
      << status.error_message();
  // Twice: the guard is armed again after a fault.
  EXPECT_EQ(client_->Sample(request, &response).error_code(), C::FAILED_PRECONDITION);
  // A stream step fails alone; the stream stays open.
  std::unique_ptr<SampleSession> session = client_->OpenStream();
  EXPECT_EQ(session->Step(request, &response).error_code(), C::FAILED_PRECONDITION);
  EXPECT_TRUE(session->Step(logits_.Request(Params()), &response).ok());
  EXPECT_TRUE(session->Close().ok());

  // The output region in a truncated object: the tokens cannot be written.
  v1::SampleRequest with_output = logits_.Request(Params());
  with_output.mutable_output()->set_region("logits");
  with_output.mutable_output()->set_offset(kOutputOffset);
  status = client_->Sample(with_output, &response);
  EXPECT_EQ(status.error_code(), C::FAILED_PRECONDITION) << status.error_message();
  EXPECT_NE(status.error_message().find("the output region"), std::string::npos);

  // The server kept serving, and the region works again once the object is its size again.
  v1::SampleResponse inline_response;
  ASSERT_TRUE(client_->Sample(logits_.Request(Params()), &inline_response).ok());
  ResizeObject(shm_->key(), static_cast<off_t>(kObjectBytes));
  std::memcpy(Object() + kRegionOffset + kLogitsOffset, logits_.values.data(), kLogitsBytes);
  status = client_->Sample(request, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(Tokens(response), Tokens(inline_response));
}

// "Two buffers on one key share the object": a second, smaller buffer must not shrink it under
// the first buffer and the server's registered region (their accesses past the new end would
// fault).
TEST_F(Regions, ASmallerSecondBufferOnTheKeyDoesNotShrinkTheObject) {
  ASSERT_TRUE(RegisterLogits().ok());
  const v1::SampleRequest request =
      MakeRegionRequest("logits", kLogitsOffset, v1::DTYPE_FP32, kBatch, kVocab, Params());
  v1::SampleResponse before;
  ASSERT_TRUE(client_->Sample(request, &before).ok());

  std::string error;
  std::unique_ptr<HostShmBuffer> second = HostShmBuffer::Create(shm_->key(), 8, &error);
  ASSERT_NE(second, nullptr) << error;
  EXPECT_EQ(second->size(), 8u);
  const int fd = shm_open(shm_->key().c_str(), O_RDONLY, 0);
  ASSERT_GE(fd, 0) << std::strerror(errno);
  struct stat st;
  ASSERT_EQ(fstat(fd, &st), 0) << std::strerror(errno);
  close(fd);
  ASSERT_EQ(static_cast<uint64_t>(st.st_size), kObjectBytes);

  Object()[kObjectBytes - 1] = 7;  // the first buffer's last page is still there
  v1::SampleResponse after;
  const grpc::Status status = client_->Sample(request, &after);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(Tokens(after), Tokens(before));
}

TEST_F(Regions, GetServerInfoReportsNoIpcOnTheCpuBackend) {
  v1::GetServerInfoResponse info;
  ASSERT_TRUE(client_->GetServerInfo(&info).ok());
  for (const v1::Device& d : info.devices()) EXPECT_FALSE(d.ipc_memory() || d.ipc_events());
}

// ---- Bad registrations -------------------------------------------------------------------------

struct BadRegistration {
  std::string name;
  grpc::StatusCode code;
  // Breaks a valid registration of `key` (an object of kObjectBytes bytes) as "r".
  void (*mutate)(v1::RegisterRegionRequest* request);
};

void PrintTo(const BadRegistration& input, std::ostream* os) { *os << input.name; }

v1::HostShmRegion* Shm(v1::RegisterRegionRequest* r) { return r->mutable_host_shm(); }

v1::GpuIpcRegion* Ipc(v1::RegisterRegionRequest* r, size_t handle_bytes) {
  v1::GpuIpcRegion* ipc = r->mutable_gpu_ipc();
  ipc->set_memory_handle(std::string(handle_bytes, 'S'));
  ipc->set_byte_size(1024);
  ipc->set_device("0000:3b:00.0");
  return ipc;
}

const std::vector<BadRegistration>& BadRegistrations() {
  constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();
  static const std::vector<BadRegistration> cases = {
      {"WrongPrefix", C::INVALID_ARGUMENT,
       [](v1::RegisterRegionRequest* r) { Shm(r)->set_key(std::string("/other-") + kSecret); }},
      {"DotDotInKey", C::INVALID_ARGUMENT,
       [](v1::RegisterRegionRequest* r) {
         Shm(r)->set_key(std::string("/samplerd-..") + kSecret);
       }},
      {"ExtraSlashInKey", C::INVALID_ARGUMENT,
       [](v1::RegisterRegionRequest* r) {
         Shm(r)->set_key(std::string("/samplerd-") + kSecret + "/x");
       }},
      {"MissingKey", C::NOT_FOUND,
       [](v1::RegisterRegionRequest* r) { Shm(r)->set_key(UniqueKey(kSecret) + "-missing"); }},
      {"OffsetPastTheEnd", C::OUT_OF_RANGE,
       [](v1::RegisterRegionRequest* r) {
         Shm(r)->set_offset(kObjectBytes);
         Shm(r)->set_byte_size(1);
       }},
      {"SizePastTheEnd", C::OUT_OF_RANGE,
       [](v1::RegisterRegionRequest* r) { Shm(r)->set_byte_size(kObjectBytes + 1); }},
      {"OffsetPlusSizeWraps", C::OUT_OF_RANGE,
       [](v1::RegisterRegionRequest* r) {
         Shm(r)->set_offset(kMax - 7);
         Shm(r)->set_byte_size(16);
       }},
      {"ZeroSize", C::INVALID_ARGUMENT,
       [](v1::RegisterRegionRequest* r) { Shm(r)->set_byte_size(0); }},
      {"BadName", C::INVALID_ARGUMENT, [](v1::RegisterRegionRequest* r) { r->set_name("a/b"); }},
      {"LongName", C::INVALID_ARGUMENT,
       [](v1::RegisterRegionRequest* r) { r->set_name(std::string(129, 'n')); }},
      {"EmptyName", C::INVALID_ARGUMENT, [](v1::RegisterRegionRequest* r) { r->set_name(""); }},
      {"DuplicateName", C::ALREADY_EXISTS,
       [](v1::RegisterRegionRequest* r) { r->set_name("taken"); }},
      {"NoKind", C::INVALID_ARGUMENT, [](v1::RegisterRegionRequest* r) { r->clear_kind(); }},
      {"Handle63Bytes", C::INVALID_ARGUMENT, [](v1::RegisterRegionRequest* r) { Ipc(r, 63); }},
      {"Handle65Bytes", C::INVALID_ARGUMENT, [](v1::RegisterRegionRequest* r) { Ipc(r, 65); }},
      {"PyTorchExpandableSegments", C::FAILED_PRECONDITION,
       [](v1::RegisterRegionRequest* r) {
         Ipc(r, 66)->set_memory_handle(std::string("\x01") + "e" + std::string(64, 'S'));
       }},
      {"GpuIpcOnACpuServer", C::FAILED_PRECONDITION,
       [](v1::RegisterRegionRequest* r) { Ipc(r, 64); }},
      // The server's lack of GPU IPC is checked before the device (service/README.md).
      {"GpuIpcWithoutDeviceOnACpuServer", C::FAILED_PRECONDITION,
       [](v1::RegisterRegionRequest* r) { Ipc(r, 64)->clear_device(); }},
      {"GpuIpcOnAnUnknownDevice", C::FAILED_PRECONDITION,
       [](v1::RegisterRegionRequest* r) { Ipc(r, 64)->set_device("GPU-not-a-device"); }},
  };
  return cases;
}

class BadRegistrationTable : public Regions,
                             public ::testing::WithParamInterface<BadRegistration> {};

TEST_P(BadRegistrationTable, AnswersTheExactCodeWithoutEchoingTheKey) {
  ASSERT_TRUE(client_->RegisterHostShm("taken", shm_->key(), 0, 16).ok());
  v1::RegisterRegionRequest request;
  request.set_name("r");
  Shm(&request)->set_key(shm_->key());
  Shm(&request)->set_byte_size(kObjectBytes);
  GetParam().mutate(&request);
  v1::RegisterRegionResponse response;
  grpc::ClientContext context;
  const grpc::Status status = client_->stub()->RegisterRegion(&context, request, &response);
  EXPECT_EQ(status.error_code(), GetParam().code) << status.error_message();
  EXPECT_TRUE(MentionsAny(status.error_message(), {"expected"}));
  EXPECT_EQ(status.error_message().find(kSecret), std::string::npos) << status.error_message();
  EXPECT_EQ(status.error_message().find("SSSS"), std::string::npos) << status.error_message();
  std::vector<v1::RegionInfo> regions;
  ASSERT_TRUE(client_->ListRegions(&regions).ok());
  EXPECT_EQ(regions.size(), 1u);  // only "taken"
}

INSTANTIATE_TEST_SUITE_P(Cases, BadRegistrationTable, ::testing::ValuesIn(BadRegistrations()),
                         [](const ::testing::TestParamInfo<BadRegistration>& info) {
                           return info.param.name;
                         });

// ---- Bad requests that name regions ------------------------------------------------------------

struct BadRegionRequest {
  std::string name;
  grpc::StatusCode code;
  std::vector<std::string> keys;  // one must appear in the message
  void (*mutate)(v1::SampleRequest* request);
};

void PrintTo(const BadRegionRequest& input, std::ostream* os) { *os << input.name; }

const std::vector<BadRegionRequest>& BadRegionRequests() {
  static const std::vector<BadRegionRequest> cases = {
      {"UnknownRegion",
       C::NOT_FOUND,
       {"region"},
       [](v1::SampleRequest* r) { r->mutable_logits()->mutable_region()->set_region("nope"); }},
      {"MalformedRegionName",
       C::INVALID_ARGUMENT,
       {"name"},
       [](v1::SampleRequest* r) { r->mutable_logits()->mutable_region()->set_region("a b"); }},
      {"RegionTooSmallForTheBatch",
       C::OUT_OF_RANGE,
       {"bytes at offset"},
       [](v1::SampleRequest* r) {
         // Two more rows than the region holds after the logits' offset.
         r->mutable_logits()->set_shape(0, kBatch + 2);
       }},
      {"OffsetPastTheRegion",
       C::OUT_OF_RANGE,
       {"bytes at offset"},
       [](v1::SampleRequest* r) {
         r->mutable_logits()->mutable_region()->set_offset(std::numeric_limits<uint64_t>::max());
       }},
      {"OutputTooSmall",
       C::OUT_OF_RANGE,
       {"output"},
       [](v1::SampleRequest* r) {
         r->mutable_output()->set_region("logits");
         r->mutable_output()->set_offset(kOutputOffset + 64 - 8);  // 12 bytes needed
       }},
      {"UnknownOutputRegion",
       C::NOT_FOUND,
       {"output"},
       [](v1::SampleRequest* r) { r->mutable_output()->set_region("nope"); }},
      {"ReadyEventOf63Bytes",
       C::INVALID_ARGUMENT,
       {"ready_event"},
       [](v1::SampleRequest* r) { r->set_ready_event(std::string(63, 'E')); }},
      {"ReadyEventOnACpuServer",
       C::FAILED_PRECONDITION,
       {"ipc"},
       [](v1::SampleRequest* r) { r->set_ready_event(std::string(64, 'E')); }},
      {"DoneEventWithoutOutput",
       C::INVALID_ARGUMENT,
       {"output"},
       [](v1::SampleRequest* r) { r->set_done_event(std::string(64, 'E')); }},
      {"DoneEventOnACpuServer",
       C::FAILED_PRECONDITION,
       {"ipc"},
       [](v1::SampleRequest* r) {
         r->set_done_event(std::string(64, 'E'));
         r->mutable_output()->set_region("logits");
         r->mutable_output()->set_offset(kOutputOffset);
       }},
  };
  return cases;
}

class BadRegionRequestTable : public Regions,
                              public ::testing::WithParamInterface<BadRegionRequest> {};

TEST_P(BadRegionRequestTable, AnswersTheExactCodeAndTheServerKeepsServing) {
  ASSERT_TRUE(RegisterLogits().ok());
  v1::SampleRequest request =
      MakeRegionRequest("logits", kLogitsOffset, v1::DTYPE_FP32, kBatch, kVocab, Params());
  GetParam().mutate(&request);
  v1::SampleResponse response;
  const grpc::Status status = client_->Sample(request, &response);
  EXPECT_EQ(status.error_code(), GetParam().code) << status.error_message();
  EXPECT_TRUE(MentionsAny(status.error_message(), GetParam().keys));
  EXPECT_TRUE(MentionsAny(status.error_message(), {"expected"}));
  EXPECT_EQ(status.error_message().find("EEEE"), std::string::npos);
  // Over a stream: the same code on the step, and the stream stays open.
  std::unique_ptr<SampleSession> session = client_->OpenStream();
  EXPECT_EQ(session->Step(request, &response).error_code(), GetParam().code);
  EXPECT_TRUE(session->Close().ok());
  // A good region request still works.
  const grpc::Status good = client_->Sample(
      MakeRegionRequest("logits", kLogitsOffset, v1::DTYPE_FP32, kBatch, kVocab, Params()),
      &response);
  EXPECT_TRUE(good.ok()) << good.error_message();
}

INSTANTIATE_TEST_SUITE_P(Cases, BadRegionRequestTable, ::testing::ValuesIn(BadRegionRequests()),
                         [](const ::testing::TestParamInfo<BadRegionRequest>& info) {
                           return info.param.name;
                         });

// ---- TCP ---------------------------------------------------------------------------------------

// A server on TCP only; `allow` adds --allow_remote_regions.
template <bool allow>
class RegionsOverTcp : public Regions {
 protected:
  static void SetUpTestSuite() {
    ServerProcess::Options options = CpuServerOptions();
    options.listen = "127.0.0.1:" + std::to_string(PickFreeTcpPort());
    if (allow) options.extra_args.push_back("--allow_remote_regions");
    StartServer(options);
  }
};

using RegionsOverTcpRefused = RegionsOverTcp<false>;
using RegionsOverTcpAllowed = RegionsOverTcp<true>;

TEST_F(RegionsOverTcpRefused, RegistrationIsPermissionDeniedWithHowToAllowIt) {
  const grpc::Status status = RegisterLogits();
  EXPECT_EQ(status.error_code(), C::PERMISSION_DENIED) << status.error_message();
  EXPECT_TRUE(MentionsAny(status.error_message(), {"--allow_remote_regions"}));
  EXPECT_EQ(status.error_message().find(kSecret), std::string::npos);
  v1::SampleResponse response;
  EXPECT_EQ(
      client_->Sample(MakeRegionRequest("logits", 0, v1::DTYPE_FP32, 1, 4), &response).error_code(),
      C::PERMISSION_DENIED);
  EXPECT_TRUE(client_->Sample(logits_.Request(Params()), &response).ok());  // inline is fine
}

TEST_F(RegionsOverTcpAllowed, RegistrationAndSamplingWork) {
  const grpc::Status status = RegisterLogits();
  ASSERT_TRUE(status.ok()) << status.error_message();
  v1::SampleResponse inline_response, response;
  ASSERT_TRUE(client_->Sample(logits_.Request(Params()), &inline_response).ok());
  ASSERT_TRUE(client_
                  ->Sample(MakeRegionRequest("logits", kLogitsOffset, v1::DTYPE_FP32, kBatch,
                                             kVocab, Params()),
                           &response)
                  .ok());
  EXPECT_EQ(Tokens(response), Tokens(inline_response));
}

// ---- --max_region_bytes ------------------------------------------------------------------------

// Regression (redteam25 F6): ~100 regions of one sparse 4 TiB object (within the default
// --max_regions) filled the server's 128 TiB address space, and the next 4 MiB Sample aborted
// it with std::bad_alloc. With the default --max_region_bytes (4 TiB) the second such region is
// refused, and the server keeps serving.
TEST_F(Regions, ASecondSparse4TiBRegionIsResourceExhaustedAndTheServerKeepsServing) {
  constexpr uint64_t k4TiB = uint64_t{4} << 40;
  const std::string key = UniqueKey("sparse");
  const int fd = shm_open(key.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  ASSERT_GE(fd, 0) << std::strerror(errno);
  const bool sized = ftruncate(fd, static_cast<off_t>(k4TiB)) == 0;  // no pages: sparse
  close(fd);
  if (!sized) {
    shm_unlink(key.c_str());
    GTEST_SKIP() << "this /dev/shm cannot hold a sparse 4 TiB object";
  }
  v1::GetServerInfoResponse info;
  ASSERT_TRUE(client_->GetServerInfo(&info).ok());
  EXPECT_EQ(info.limits().max_region_bytes(), static_cast<int64_t>(k4TiB));  // the default

  const grpc::Status first = client_->RegisterHostShm("sparse0", key, 0, k4TiB);
  EXPECT_TRUE(first.ok()) << first.error_message();
  const grpc::Status second = client_->RegisterHostShm("sparse1", key, 0, k4TiB);
  EXPECT_EQ(second.error_code(), C::RESOURCE_EXHAUSTED);
  EXPECT_EQ(second.error_message(),
            "expected the registered regions to total at most 4398046511104 bytes "
            "(--max_region_bytes), got 8796093022208 bytes with this region of 4398046511104: "
            "unregister regions that are no longer used (one unregistered while a request or "
            "device session uses it counts until that ends)");
  // What aborted the server: a 4 MiB inline Sample (16 x 65,536 fp32).
  v1::SampleResponse response;
  const grpc::Status sampled =
      client_->Sample(RandomLogits(16, 65536, /*seed=*/43).Request({TopKTopP(5)}), &response);
  EXPECT_TRUE(sampled.ok()) << sampled.error_message();
  EXPECT_EQ(response.token_ids_size(), 16);
  ASSERT_TRUE(client_->Unregister("sparse0").ok());
  const grpc::Status again = client_->RegisterHostShm("sparse1", key, 0, k4TiB);
  EXPECT_TRUE(again.ok()) << again.error_message();
  ASSERT_TRUE(client_->Unregister("sparse1").ok());
  shm_unlink(key.c_str());
}

// A server whose regions may total two logits regions.
class RegionsWithMaxBytes : public Regions {
 protected:
  static constexpr int64_t kMaxBytes = 2 * (kObjectBytes - kRegionOffset);
  static void SetUpTestSuite() { StartWithFlag("--max_region_bytes=" + std::to_string(kMaxBytes)); }
};

TEST_F(RegionsWithMaxBytes, OneRegionPastTheTotalIsResourceExhaustedUntilOneIsUnregistered) {
  v1::GetServerInfoResponse info;
  ASSERT_TRUE(client_->GetServerInfo(&info).ok());
  EXPECT_EQ(info.limits().max_region_bytes(), kMaxBytes);
  ASSERT_TRUE(RegisterLogits("a").ok());
  ASSERT_TRUE(RegisterLogits("b").ok());
  const grpc::Status refused = client_->RegisterHostShm("c", shm_->key(), 0, 1);
  EXPECT_EQ(refused.error_code(), C::RESOURCE_EXHAUSTED);
  EXPECT_TRUE(MentionsAny(refused.error_message(),
                          {absl::StrCat("expected the registered regions to total at most ",
                                        kMaxBytes, " bytes (--max_region_bytes), got ",
                                        kMaxBytes + 1, " bytes with this region of 1")}))
      << refused.error_message();
  EXPECT_EQ(refused.error_message().find(kSecret), std::string::npos);
  std::vector<v1::RegionInfo> regions;
  ASSERT_TRUE(client_->ListRegions(&regions).ok());
  EXPECT_EQ(regions.size(), 2u);

  // The server keeps serving, from the registered regions too.
  v1::SampleResponse inline_response, response;
  ASSERT_TRUE(client_->Sample(logits_.Request(Params()), &inline_response).ok());
  ASSERT_TRUE(
      client_
          ->Sample(MakeRegionRequest("b", kLogitsOffset, v1::DTYPE_FP32, kBatch, kVocab, Params()),
                   &response)
          .ok());
  EXPECT_EQ(Tokens(response), Tokens(inline_response));

  // Unregistering frees the bytes.
  ASSERT_TRUE(client_->Unregister("a").ok());
  EXPECT_TRUE(RegisterLogits("c").ok());
  EXPECT_EQ(client_->RegisterHostShm("d", shm_->key(), 0, 1).error_code(), C::RESOURCE_EXHAUSTED);
}

// ---- --max_regions -----------------------------------------------------------------------------

// A server that takes two regions at once.
class RegionsWithMaxRegions : public Regions {
 protected:
  static void SetUpTestSuite() { StartWithFlag("--max_regions=2"); }
};

// GetServerInfo reports --max_regions (limits.max_regions, field 11), so a client can size its
// region cache before it is refused; it used to report nothing.
TEST_F(RegionsWithMaxRegions, GetServerInfoReportsItAndAThirdRegionIsResourceExhausted) {
  v1::GetServerInfoResponse info;
  ASSERT_TRUE(client_->GetServerInfo(&info).ok());
  EXPECT_EQ(info.limits().max_regions(), 2);
  ASSERT_TRUE(RegisterLogits("a").ok());
  ASSERT_TRUE(RegisterLogits("b").ok());
  const grpc::Status refused = RegisterLogits("c");
  EXPECT_EQ(refused.error_code(), C::RESOURCE_EXHAUSTED);
  EXPECT_EQ(refused.error_message(),
            "expected at most 2 registered regions (--max_regions), got a request for one more: "
            "unregister regions that are no longer used");

  // The server keeps serving, and unregistering makes room.
  v1::SampleResponse response;
  EXPECT_TRUE(client_->Sample(logits_.Request(Params()), &response).ok());
  ASSERT_TRUE(client_->Unregister("a").ok());
  EXPECT_TRUE(RegisterLogits("c").ok());
}

TEST(MaxRegionsFlag, ANegativeValueFailsStartup) {
  const std::string error = StartupErrorWith("--max_regions=-1");
  EXPECT_TRUE(MentionsAny(error, {"expected --max_regions >= 0 (0 = no limit), got -1"})) << error;
}

TEST(MaxRegionBytesFlag, ANegativeValueFailsStartup) {
  const std::string error = StartupErrorWith("--max_region_bytes=-1");
  EXPECT_TRUE(MentionsAny(error, {"expected --max_region_bytes >= 0 (0 = no limit), got -1"}))
      << error;
}

// ---- --shm_prefix ------------------------------------------------------------------------------

class RegionsWithAnotherPrefix : public Regions {
 protected:
  static void SetUpTestSuite() { StartWithFlag("--shm_prefix=/engine7-"); }
};

TEST_F(RegionsWithAnotherPrefix, OnlyKeysWithThatPrefixAreAccepted) {
  const grpc::Status refused = RegisterLogits();  // a "/samplerd-..." key
  EXPECT_EQ(refused.error_code(), C::INVALID_ARGUMENT);
  EXPECT_TRUE(MentionsAny(refused.error_message(), {"/engine7-"}));
  std::string error;
  std::unique_ptr<HostShmBuffer> engine =
      HostShmBuffer::Create("/engine7-" + std::to_string(getpid()), 4096, &error);
  ASSERT_NE(engine, nullptr) << error;
  EXPECT_TRUE(client_->RegisterHostShm("engine", engine->key(), 0, 4096).ok());
}

TEST(ShmPrefixFlag, AnUnsafePrefixFailsStartup) {
  const std::string error = StartupErrorWith("--shm_prefix=/a/b");
  EXPECT_TRUE(MentionsAny(error, {"status 2"}));
  EXPECT_TRUE(MentionsAny(error, {"--shm_prefix"}));
}

}  // namespace
}  // namespace samplerd::integration
