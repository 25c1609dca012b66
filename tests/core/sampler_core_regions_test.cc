// SamplerCore with regions: host shm logits, outputs and token bitmasks on the CPU backend (same
// tokens as inline), GPU IPC regions and IPC events on a fake GPU backend over a fake GpuIpc,
// the checks that bind a request to its memory, and an unregister while a request is in flight.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/synchronization/notification.h"
#include "service/core/backend/cpu_sampler.h"
#include "service/core/sampler_core.h"
#include "tests/core/fake_gpu_ipc.h"
#include "tests/core/shm_test_util.h"
#include "tests/core/test_util.h"

namespace samplerd::core {
namespace {

using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

const DeviceInfo kFakeGpu{0, "0000:3b:00.0", "GPU-0b5c6a1e", "Fake GPU", true, true};

// A backend that records the SampleIo it gets and may wait for `hold` first. With `inner` it
// delegates (a real CPU sampler); otherwise it is a fake GPU whose "device memory" is host
// memory: greedy argmax of fp32 rows, written to io.output, and no tokens with a done event.
class RecordingSampler : public Sampler {
 public:
  explicit RecordingSampler(std::unique_ptr<Sampler> inner) : inner_(std::move(inner)) {}
  RecordingSampler() = default;

  absl::Status Sample(const ValidatedBatch& batch, const SampleIo& io,
                      SampleResult* result) override {
    if (entered_ != nullptr) std::exchange(entered_, nullptr)->Notify();  // once
    if (hold_ != nullptr) hold_->WaitForNotification();
    last_io_ = io;
    if (inner_ != nullptr) return inner_->Sample(batch, io, result);
    std::vector<int32_t> tokens(batch.batch);
    const float* logits = static_cast<const float*>(io.logits);
    for (int64_t r = 0; r < batch.batch; ++r) {
      const float* row = logits + r * batch.row_stride;
      tokens[r] = static_cast<int32_t>(std::max_element(row, row + batch.vocab) - row);
    }
    if (io.output != nullptr) std::memcpy(io.output, tokens.data(), tokens.size() * 4);
    if (io.done_event != nullptr) return absl::OkStatus();
    result->token_ids = tokens;
    result->row_status.assign(batch.batch, kernels::RowStatus::kOk);
    return absl::OkStatus();
  }
  BackendKind kind() const override { return inner_ ? inner_->kind() : BackendKind::kGpu; }
  const DeviceInfo& device() const override { return inner_ ? inner_->device() : kFakeGpu; }

  std::unique_ptr<Sampler> inner_;
  absl::Notification* entered_ = nullptr;
  absl::Notification* hold_ = nullptr;
  SampleIo last_io_;
};

// fp32 [batch, vocab] logits from a fixed seed.
std::vector<float> RandomLogits(int64_t batch, int64_t vocab, uint32_t seed) {
  std::vector<float> v(batch * vocab);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (float& x : v) x = normal(rng);
  return v;
}

SampleRequest Shaped(int64_t batch, int64_t vocab) {
  SampleRequest r;
  r.dtype = kernels::DType::kFp32;
  r.shape = {batch, vocab};
  ParamsSpec p;
  p.seed = 7;
  p.top_k = 50;
  r.params = {p};
  return r;
}

SampleRequest FromRegion(const std::string& region, uint64_t offset, int64_t batch, int64_t vocab) {
  SampleRequest r = Shaped(batch, vocab);
  r.logits_region = RegionRef{region, offset};
  return r;
}

class CoreWithRegions : public ::testing::Test {
 protected:
  // A CPU core (real sampler), or a fake GPU core with a fake GpuIpc.
  void MakeCore(bool gpu) {
    CoreOptions options;
    std::unique_ptr<RecordingSampler> sampler;
    if (gpu) {
      auto ipc = std::make_shared<FakeGpuIpc>();
      ipc_ = ipc.get();
      options.gpu_ipc = ipc;
      sampler = std::make_unique<RecordingSampler>();
    } else {
      sampler = std::make_unique<RecordingSampler>(std::make_unique<CpuSampler>(1));
    }
    sampler_ = sampler.get();
    core_ = std::make_unique<SamplerCore>(options, std::move(sampler), /*seed_start=*/1);
  }

  absl::StatusOr<SampleResult> Run(SampleRequest r) { return SampleAndWait(*core_, std::move(r)); }

  FakeGpuIpc* ipc_ = nullptr;
  RecordingSampler* sampler_ = nullptr;
  std::unique_ptr<SamplerCore> core_;
};

// ---- Host shm on the CPU backend ---------------------------------------------------------------

TEST_F(CoreWithRegions, HostShmLogitsGiveTheInlineTokensAndFillTheOutput) {
  MakeCore(/*gpu=*/false);
  const int64_t b = 3, v = 1000;
  const std::vector<float> logits = RandomLogits(b, v, 11);
  const std::string bytes(reinterpret_cast<const char*>(logits.data()), logits.size() * 4);
  SampleRequest inline_request = Shaped(b, v);
  inline_request.inline_data = bytes;
  inline_request.has_inline_data = true;
  absl::StatusOr<SampleResult> expected = Run(inline_request);
  ASSERT_TRUE(expected.ok()) << expected.status();

  // Region at object offset 100, logits at region offset 4000 (unaligned, past a page).
  TestShm shm(100 + 4000 + bytes.size() + 64);
  ASSERT_TRUE(shm.ok());
  std::memcpy(shm.data() + 100 + 4000, bytes.data(), bytes.size());
  ASSERT_TRUE(core_->regions().RegisterHostShm("logits", shm.key(), 100, shm.size() - 100).ok());
  SampleRequest r = FromRegion("logits", 4000, b, v);
  r.output = RegionRef{"logits", 4000 + bytes.size() + 4};
  absl::StatusOr<SampleResult> got = Run(r);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->token_ids, expected->token_ids);
  EXPECT_FALSE(sampler_->last_io_.logits_on_device);
  std::vector<int32_t> written(b);
  std::memcpy(written.data(), shm.data() + 100 + 4000 + bytes.size() + 4, b * 4);
  EXPECT_THAT(written, ElementsAreArray(expected->token_ids));
}

TEST_F(CoreWithRegions, ARegionTooSmallForTheTensorIsOutOfRange) {
  MakeCore(false);
  TestShm shm(1000);
  ASSERT_TRUE(shm.ok());
  ASSERT_TRUE(core_->regions().RegisterHostShm("r", shm.key(), 0, 1000).ok());
  absl::StatusOr<SampleResult> got = Run(FromRegion("r", 0, 2, 126));  // 1008 bytes
  EXPECT_EQ(got.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(std::string(got.status().message()),
              HasSubstr("logits.region: expected 1008 bytes at offset 0, got a region of 1000"));
  EXPECT_TRUE(Run(FromRegion("r", 0, 2, 125)).ok());
  EXPECT_EQ(Run(FromRegion("r", 1, 2, 125)).status().code(), absl::StatusCode::kOutOfRange);
  SampleRequest strided = FromRegion("r", 0, 2, 100);
  strided.row_stride = 150;  // (150 + 100) * 4 = 1000 bytes: fits exactly
  EXPECT_TRUE(Run(strided).ok());
  strided.row_stride = 151;
  EXPECT_EQ(Run(strided).status().code(), absl::StatusCode::kOutOfRange);
  SampleRequest output = FromRegion("r", 0, 2, 100);
  output.output = RegionRef{"r", 993};  // 8 bytes of token ids: one short
  EXPECT_EQ(Run(output).status().code(), absl::StatusCode::kOutOfRange);
}

TEST_F(CoreWithRegions, UnknownRegionsAreNotFound) {
  MakeCore(false);
  EXPECT_EQ(Run(FromRegion("nope", 0, 1, 4)).status().code(), absl::StatusCode::kNotFound);
  std::string bytes(16, '\0');
  SampleRequest r = Shaped(1, 4);
  r.inline_data = bytes;
  r.has_inline_data = true;
  r.output = RegionRef{"nope", 0};
  absl::StatusOr<SampleResult> got = Run(r);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(got.status().message()), HasSubstr("output: expected"));
}

TEST_F(CoreWithRegions, EventsNeedAGpuServerWithIpcEvents) {
  MakeCore(false);
  TestShm shm(4096);
  ASSERT_TRUE(shm.ok());
  ASSERT_TRUE(core_->regions().RegisterHostShm("r", shm.key(), 0, 4096).ok());
  SampleRequest r = FromRegion("r", 0, 1, 16);
  r.ready_event = std::string(64, 'e');
  EXPECT_EQ(Run(r).status().code(), absl::StatusCode::kFailedPrecondition);
  r = FromRegion("r", 0, 1, 16);
  r.output = RegionRef{"r", 1024};
  r.done_event = std::string(64, 'e');
  EXPECT_EQ(Run(r).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(CoreWithRegions, AReadOnlyOutputIsFailedPrecondition) {
  TestShm shm(4096, 0444);
  ASSERT_TRUE(shm.ok());
  const std::string key = shm.key();
  EXPECT_EQ(RunUnprivileged([&]() -> std::string {
              MakeCore(false);
              if (!core_->regions().RegisterHostShm("ro", key, 0, 4096).ok()) return "register";
              SampleRequest r = FromRegion("ro", 0, 1, 16);
              if (!Run(r).ok()) return "reading a read-only region failed";
              r.output = RegionRef{"ro", 1024};
              const absl::Status status = Run(r).status();
              if (status.code() != absl::StatusCode::kFailedPrecondition) return status.ToString();
              return "";
            }),
            "");
}

TEST_F(CoreWithRegions, UnregisterInFlightKeepsTheMappingUntilTheRequestEnds) {
  MakeCore(false);
  const std::vector<float> logits = RandomLogits(2, 500, 12);
  TestShm shm(logits.size() * 4);
  ASSERT_TRUE(shm.ok());
  std::memcpy(shm.data(), logits.data(), shm.size());
  ASSERT_TRUE(core_->regions().RegisterHostShm("r", shm.key(), 0, shm.size()).ok());
  absl::StatusOr<SampleResult> expected = Run(FromRegion("r", 0, 2, 500));
  ASSERT_TRUE(expected.ok());

  absl::Notification entered, hold;
  sampler_->entered_ = &entered;
  sampler_->hold_ = &hold;
  Answer in_flight;
  ASSERT_TRUE(core_->SampleAsync(FromRegion("r", 0, 2, 500), in_flight.Callback()).ok());
  entered.WaitForNotification();
  ASSERT_TRUE(core_->regions().Unregister("r").ok());
  EXPECT_EQ(Run(FromRegion("r", 0, 2, 500)).status().code(), absl::StatusCode::kNotFound);
  hold.Notify();  // the held request now reads the (still mapped) region
  in_flight.done.WaitForNotification();
  ASSERT_TRUE(in_flight.result.ok()) << in_flight.result.status();
  EXPECT_EQ(in_flight.result->token_ids, expected->token_ids);
}

// A bitmask allowing `allowed[r]` alone in row r (-1: nothing), ceil(vocab / 32) words a row.
std::vector<uint32_t> OneTokenMask(int64_t vocab, const std::vector<int32_t>& allowed) {
  const int64_t words = (vocab + 31) / 32;
  std::vector<uint32_t> mask(allowed.size() * words, 0u);
  for (size_t r = 0; r < allowed.size(); ++r) {
    if (allowed[r] >= 0) mask[r * words + allowed[r] / 32] |= 1u << (allowed[r] % 32);
  }
  return mask;
}

TEST_F(CoreWithRegions, AHostShmBitmaskIsReadLikeShmLogits) {
  MakeCore(false);
  const int64_t b = 3, v = 100;  // 4 words, 16 bytes a row
  const std::vector<float> logits = RandomLogits(b, v, 14);
  const std::string bytes(reinterpret_cast<const char*>(logits.data()), logits.size() * 4);
  const std::vector<uint32_t> mask = OneTokenMask(v, {42, -1, 99});
  TestShm shm(4096);
  ASSERT_TRUE(shm.ok());
  std::memcpy(shm.data() + 256, mask.data(), mask.size() * 4);
  ASSERT_TRUE(core_->regions().RegisterHostShm("masks", shm.key(), 0, 4096).ok());
  SampleRequest r = Shaped(b, v);
  r.inline_data = bytes;
  r.has_inline_data = true;
  r.token_bitmask.emplace().region = RegionRef{"masks", 256};
  absl::StatusOr<SampleResult> got = Run(r);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->token_ids, (std::vector<int32_t>{42, -1, 99}));
  EXPECT_EQ(got->row_status[1], kernels::RowStatus::kNoAllowed);
  EXPECT_TRUE(sampler_->last_io_.bitmask_in_shm);
  EXPECT_FALSE(sampler_->last_io_.bitmask_on_device);
  EXPECT_NE(sampler_->last_io_.bitmask, nullptr);  // the registry's own mapping of the object

  // The same words inline, at an odd address: the same tokens.
  std::string inline_words(1 + mask.size() * 4, '\0');
  std::memcpy(inline_words.data() + 1, mask.data(), mask.size() * 4);
  r.token_bitmask.emplace().inline_words = std::string_view(inline_words).substr(1);
  r.token_bitmask->has_inline_words = true;
  got = Run(r);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->token_ids, (std::vector<int32_t>{42, -1, 99}));
  EXPECT_FALSE(sampler_->last_io_.bitmask_in_shm);
}

TEST_F(CoreWithRegions, ABitmaskSliceMustFitAndBeAligned) {
  MakeCore(false);
  const std::string bytes(2 * 40 * 4, '\0');  // [2, 40]: 2 words a row, 16 bytes
  TestShm shm(64);
  ASSERT_TRUE(shm.ok());
  ASSERT_TRUE(core_->regions().RegisterHostShm("masks", shm.key(), 0, 64).ok());
  SampleRequest r = Shaped(2, 40);
  r.inline_data = bytes;
  r.has_inline_data = true;
  r.token_bitmask.emplace().region = RegionRef{"masks", 52};
  absl::StatusOr<SampleResult> got = Run(r);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(std::string(got.status().message()),
              HasSubstr("token_bitmask.region: expected 16 bytes at offset 52, got a region of "
                        "64"));
  r.token_bitmask->region = RegionRef{"masks", 6};
  got = Run(r);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(got.status().message(),
            "token_bitmask.region: expected a slice aligned to 4 bytes (int32 words), got one "
            "at 2 bytes past a multiple of 4 (offset 6)");
  r.token_bitmask->region = RegionRef{"masks", 48};
  EXPECT_TRUE(Run(r).ok());
  r.token_bitmask->region = RegionRef{"nope", 0};
  EXPECT_EQ(Run(r).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(CoreWithRegions, InfoReportsNoIpcWithoutAGpuIpc) {
  MakeCore(false);
  for (const DeviceInfo& d : core_->Info().devices) EXPECT_FALSE(d.ipc_memory || d.ipc_events);
}

// ---- GPU IPC on a fake GPU backend -------------------------------------------------------------

class GpuCore : public CoreWithRegions {
 protected:
  void SetUp() override {
    MakeCore(/*gpu=*/true);
    const std::vector<float> logits = RandomLogits(2, 64, 13);
    memory_.assign(4096, 0);
    std::memcpy(memory_.data() + 1024, logits.data(), logits.size() * 4);
    expected_.resize(2);
    for (int r = 0; r < 2; ++r) {
      const float* row = logits.data() + r * 64;
      expected_[r] = static_cast<int32_t>(std::max_element(row, row + 64) - row);
    }
    ASSERT_TRUE(core_->regions()
                    .RegisterGpuIpc("gpu", ipc_->Export(&memory_), 512, 3584, kFakeGpu.uuid)
                    .ok());
  }

  // Logits at allocation offset 1024 = region offset 512; token ids at region offset 3000.
  SampleRequest GpuRequest() {
    SampleRequest r = FromRegion("gpu", 512, 2, 64);
    r.output = RegionRef{"gpu", 3000};
    return r;
  }

  std::vector<uint8_t> memory_;
  std::vector<int32_t> expected_;
};

TEST_F(GpuCore, IpcLogitsReachTheBackendAsDevicePointersOnItsDevice) {
  absl::StatusOr<SampleResult> got = Run(GpuRequest());
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->token_ids, expected_);
  const SampleIo& io = sampler_->last_io_;
  EXPECT_TRUE(io.logits_on_device);
  EXPECT_EQ(io.logits, memory_.data() + 1024);
  EXPECT_TRUE(io.output_on_device);
  EXPECT_EQ(io.output, memory_.data() + 512 + 3000);
  EXPECT_EQ(io.ready_event, nullptr);
  std::vector<int32_t> written(2);
  std::memcpy(written.data(), memory_.data() + 3512, 8);
  EXPECT_EQ(written, expected_);
}

TEST_F(GpuCore, EventsAreOpenedOncePerHandleAndClosedWithTheRegions) {
  SampleRequest r = GpuRequest();
  r.ready_event = std::string(64, 'a');
  ASSERT_TRUE(Run(r).ok());
  void* first = sampler_->last_io_.ready_event;
  EXPECT_NE(first, nullptr);
  ASSERT_TRUE(Run(r).ok());
  EXPECT_EQ(sampler_->last_io_.ready_event, first);
  EXPECT_EQ(ipc_->event_opens(), 1);
  r.ready_event = std::string(64, 'b');
  ASSERT_TRUE(Run(r).ok());
  EXPECT_EQ(ipc_->event_opens(), 2);
  core_->CloseRegions();
  EXPECT_EQ(ipc_->event_closes(), 2);
  EXPECT_EQ(ipc_->memory_closes(), 1);
}

TEST_F(GpuCore, ADoneEventRepliesWithoutTokens) {
  SampleRequest r = GpuRequest();
  r.done_event = std::string(64, 'd');
  absl::StatusOr<SampleResult> got = Run(r);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(got->token_ids.empty());
  EXPECT_NE(sampler_->last_io_.done_event, nullptr);
  std::vector<int32_t> written(2);
  std::memcpy(written.data(), memory_.data() + 3512, 8);
  EXPECT_EQ(written, expected_);  // the engine reads them from the output region
}

TEST_F(GpuCore, OutputAndLogitsMustShareTheirMemory) {
  TestShm shm(4096);
  ASSERT_TRUE(shm.ok());
  ASSERT_TRUE(core_->regions().RegisterHostShm("host", shm.key(), 0, 4096).ok());
  SampleRequest r = GpuRequest();
  r.output = RegionRef{"host", 0};
  EXPECT_EQ(Run(r).status().code(), absl::StatusCode::kFailedPrecondition);
  r = FromRegion("host", 0, 2, 64);
  r.output = RegionRef{"gpu", 3000};
  EXPECT_EQ(Run(r).status().code(), absl::StatusCode::kFailedPrecondition);
  // Host logits on the GPU backend are fine (copied to the device by the backend).
  r.output = RegionRef{"host", 2048};
  ASSERT_TRUE(Run(r).ok());
  EXPECT_FALSE(sampler_->last_io_.logits_on_device);
  EXPECT_FALSE(sampler_->last_io_.output_on_device);
  // Events need device memory on their side.
  r = FromRegion("host", 0, 2, 64);
  r.ready_event = std::string(64, 'a');
  EXPECT_EQ(Run(r).status().code(), absl::StatusCode::kInvalidArgument);
  r = FromRegion("gpu", 512, 2, 64);
  r.output = RegionRef{"host", 2048};
  r.done_event = std::string(64, 'd');
  EXPECT_EQ(Run(r).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(GpuCore, AGpuIpcBitmaskReachesTheBackendAsADevicePointer) {
  SampleRequest r = GpuRequest();
  r.token_bitmask.emplace().region = RegionRef{"gpu", 2048};  // 2 rows x 2 words
  ASSERT_TRUE(Run(r).ok());
  const SampleIo& io = sampler_->last_io_;
  EXPECT_TRUE(io.bitmask_on_device);
  EXPECT_FALSE(io.bitmask_in_shm);
  EXPECT_EQ(io.bitmask, memory_.data() + 512 + 2048);
  r.token_bitmask->region = RegionRef{"gpu", 2050};
  EXPECT_EQ(Run(r).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(GpuCore, TheRequestedDeviceMustBeTheRegionsDevice) {
  SampleRequest r = GpuRequest();
  r.device = "0000:3b:00.0";
  EXPECT_TRUE(Run(r).ok());
  r.device = "0000:3c:00.0";
  EXPECT_EQ(Run(r).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(GpuCore, UnregisterInFlightClosesAfterTheCompletion) {
  absl::Notification entered, hold, done;
  sampler_->entered_ = &entered;
  sampler_->hold_ = &hold;
  int closes_at_completion = -1;
  ASSERT_TRUE(core_
                  ->SampleAsync(GpuRequest(),
                                [&](absl::StatusOr<SampleResult> r) {
                                  EXPECT_TRUE(r.ok());
                                  closes_at_completion = ipc_->memory_closes();
                                  done.Notify();
                                })
                  .ok());
  entered.WaitForNotification();
  ASSERT_TRUE(core_->regions().Unregister("gpu").ok());
  EXPECT_EQ(ipc_->memory_closes(), 0);
  EXPECT_EQ(Run(GpuRequest()).status().code(), absl::StatusCode::kNotFound);
  hold.Notify();
  done.WaitForNotification();
  EXPECT_EQ(closes_at_completion, 0);
  EXPECT_TRUE(ipc_->WaitForMemoryCloses(1));
}

TEST_F(GpuCore, InfoReportsIpcWithAGpuIpc) {
  const ServerInfo info = core_->Info();
  ASSERT_EQ(info.devices.size(), 1u);
  EXPECT_TRUE(info.devices[0].ipc_memory);
  EXPECT_TRUE(info.devices[0].ipc_events);
}

}  // namespace
}  // namespace samplerd::core
