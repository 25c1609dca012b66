// CountingGpuIpc: every open through the runtime is counted by kind and result; the calls reach
// the wrapped GpuIpc unchanged.
#include "service/core/regions/counting_gpu_ipc.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "tests/core/fake_gpu_ipc.h"

namespace samplerd::core {
namespace {

using ::testing::HasSubstr;

IpcHandle ToHandle(const std::string& bytes) {
  IpcHandle handle;
  std::copy(bytes.begin(), bytes.end(), handle.begin());
  return handle;
}

TEST(CountingGpuIpc, CountsOpensByKindAndResultAndForwardsEveryCall) {
  metrics::Registry registry;
  std::unique_ptr<metrics::SamplerMetrics> metrics = *metrics::SamplerMetrics::Create(&registry);
  auto fake = std::make_shared<FakeGpuIpc>();
  std::shared_ptr<GpuIpc> ipc = WithOpenCounting(fake, metrics.get());
  std::vector<uint8_t> memory(256);
  const IpcHandle good = ToHandle(fake->Export(&memory));
  IpcHandle stale = good;
  stale[1] ^= 0xff;

  absl::StatusOr<IpcMapping> mapping = ipc->OpenMemory(0, good);
  ASSERT_TRUE(mapping.ok()) << mapping.status();
  EXPECT_EQ(mapping->base, memory.data());
  EXPECT_EQ(ipc->OpenMemory(0, stale).status().code(), absl::StatusCode::kInvalidArgument);
  ipc->CloseMemory(0, *mapping);
  absl::StatusOr<void*> event = ipc->OpenEvent(0, good);
  ASSERT_TRUE(event.ok());
  ipc->CloseEvent(0, *event);
  EXPECT_EQ(fake->memory_closes(), 1);
  EXPECT_EQ(fake->event_closes(), 1);

  const std::string text = registry.ExpositionText();
  EXPECT_THAT(text, HasSubstr("samplerd_ipc_opens_total{kind=\"memory\",result=\"ok\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("samplerd_ipc_opens_total{kind=\"memory\",result=\"error\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("samplerd_ipc_opens_total{kind=\"event\",result=\"ok\"} 1\n"));
}

TEST(CountingGpuIpc, WithoutMetricsOrIpcNothingIsWrapped) {
  auto fake = std::make_shared<FakeGpuIpc>();
  EXPECT_EQ(WithOpenCounting(fake, nullptr), fake);
  metrics::Registry registry;
  std::unique_ptr<metrics::SamplerMetrics> metrics = *metrics::SamplerMetrics::Create(&registry);
  EXPECT_EQ(WithOpenCounting(nullptr, metrics.get()), nullptr);
}

}  // namespace
}  // namespace samplerd::core
